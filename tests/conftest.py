"""Load matplotlib once for the whole test session.

pytester's in-process runs forget the modules a run imported when it ends; matplotlib does
not survive being imported a second time in one process ("'Figure' object has no attribute
'items'"), and every plugin run draws its report. Imported here, it outlives every run.
"""

import contextlib

with contextlib.suppress(ImportError):
    import pytest_specsel.files.report_charts  # noqa: F401
