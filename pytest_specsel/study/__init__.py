"""The study file: TOML, merged over the defaults, audited with file:line locations. May import:
``core`` and ``files`` (the run-label rule).
"""
