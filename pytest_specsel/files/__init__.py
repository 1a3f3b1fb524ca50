"""The run's files: atomic JSON and paths, the raw / summary / manifest / handoff documents,
``compare`` and the HTML report. Reads the records the run returns. May import: ``core`` (and
matplotlib for the charts).
"""
