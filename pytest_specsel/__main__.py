"""``python -m pytest_specsel``: rebuild a run's report page, or compare two runs.

    python -m pytest_specsel report RESULTS/LABEL
    python -m pytest_specsel compare RUN_A RUN_B

Exit status: 0 done (compare: no change that counts), 1 compare found a change that
counts (a verdict, a gate between passed and failed, a speedup beyond noise), 2 usage
error (a path that is not a run folder).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

_RUN_FILES = ("manifest.json", "handoff.json", "groups", "raw")


def run_folder(value: str) -> Path:
    """A folder holding a run's files (any of manifest, handoff, groups/, raw/)."""
    path = Path(value)
    if not path.is_dir():
        raise argparse.ArgumentTypeError(f"specsel: run folder {value!r} does not exist")
    if not any((path / name).exists() for name in _RUN_FILES):
        raise argparse.ArgumentTypeError(
            f"specsel: {value!r} is not a run folder: it has none of {', '.join(_RUN_FILES)}"
        )
    return path


def finished_run(value: str) -> Path:
    """A run folder with its handoff.json, which compare reads."""
    path = run_folder(value)
    if not (path / "handoff.json").is_file():
        raise argparse.ArgumentTypeError(f"specsel: {value!r} has no handoff.json to compare")
    return path


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_specsel",
        description="Rebuild a run's report page, or compare two runs of one study.",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{report,compare}")
    report = sub.add_parser("report", help="(re)build report.html in a run folder from its files")
    report.add_argument("run", type=run_folder, help="the run folder, e.g. benchmarks/results/LABEL")
    compare = sub.add_parser(
        "compare",
        help="print what changed between two runs of one study; writes RUN_B/compare-<RUN_A>.html",
    )
    compare.add_argument("run_a", type=finished_run, help="the earlier (reference) run folder")
    compare.add_argument("run_b", type=finished_run, help="the later run folder")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "report":
        from pytest_specsel.files.report import write_report

        path = write_report(args.run)
        print(f"specsel report: {path} ({path.stat().st_size} bytes)")
        return 0
    from pytest_specsel.files.compare import compare_runs
    from pytest_specsel.files.compare import format_table

    comparison, page = compare_runs(args.run_a, args.run_b)
    print("\n".join(format_table(comparison)))
    print(f"specsel compare page: {page}")
    return comparison.exit_status


if __name__ == "__main__":
    sys.exit(main())
