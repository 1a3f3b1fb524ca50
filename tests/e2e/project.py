"""The real end-to-end tests' project: the packaged workloads, the benchmark file, the
set-up's model folder, and a study on the bundled target whose run table each test gives."""

import shutil
from pathlib import Path

from pytest_specsel.embedded.bundled import BUNDLED_REPO_ID

REPO = Path(__file__).resolve().parents[2]
#: the study's fixed part: the bundled target, float32, a small KV cache, the repetition workload
STUDY_HEAD = f"""
[specsel]
results_dir = "results"
warmup_workload = "workloads/speculative_warmup.jsonl"
[specsel.target]
model = "{BUNDLED_REPO_ID}"
served_name = "smol"
[specsel.backend]
dtype = "float32"
max_model_len = 1024
cpu_kvcache_space_gb = 1
# eager, as before the default became compiled: a server starts in about 40 s, not 2 minutes
enforce_eager = true
[specsel.workloads]
repetition = "workloads/speculative_repetition.jsonl"
"""


def e2e_project(pytester, tables: str) -> Path:
    """Lay the project out in ``pytester.path`` with ``STUDY_HEAD`` plus ``tables`` (the
    ``[specsel.run]`` table and any other) as its specsel.toml."""
    shutil.copytree(REPO / "pytest_specsel" / "data" / "workloads", pytester.path / "workloads")
    shutil.copy(REPO / "benchmarks" / "test_speculative_selection.py", pytester.path)
    (pytester.path / ".specsel").symlink_to(REPO / ".specsel")
    pytester.makefile(".toml", specsel=STUDY_HEAD + tables)
    return pytester.path
