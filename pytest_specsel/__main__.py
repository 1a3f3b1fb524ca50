"""``python -m pytest_specsel``: rebuild a run's report page, compare two runs, or print
(or start) the measured server of a run's recommendation.

    python -m pytest_specsel report RESULTS/LABEL
    python -m pytest_specsel compare RUN_A RUN_B
    python -m pytest_specsel serve-command RESULTS/LABEL --workload W [--concurrency C]
        [--port P] [--exec]
    python -m pytest_specsel workload import FORMAT SOURCE --out FILE [--sample N]
        [--per-category N] [--seed S] [--max-prompt-tokens N --tokenizer DIR] [--categories A,B]
        [--answer-first-turns URL [--answer-max-tokens N] [--answer-model NAME]]

Exit status: 0 done (compare: no change that counts), 1 compare found a change that
counts (a verdict, a gate between passed and failed, a speedup beyond noise, a
recommendation), 2 usage error (a path that is not a run folder; serve-command: no argv
for that workload and level, named in the message; workload import: a source it cannot
read, named with its line or item).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

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


def handoff_file(value: str) -> Path:
    """A run folder with its handoff.json, or the handoff.json itself."""
    path = Path(value)
    if path.is_file():
        return path
    return finished_run(value) / "handoff.json"


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m pytest_specsel",
        description="Rebuild a run's report page, compare two runs of one study, or print the "
        "server command of a run's recommendation.",
    )
    sub = parser.add_subparsers(
        dest="command", required=True, metavar="{report,compare,serve-command,workload}"
    )
    report = sub.add_parser("report", help="(re)build report.html in a run folder from its files")
    report.add_argument("run", type=run_folder, help="the run folder, e.g. benchmarks/results/LABEL")
    compare = sub.add_parser(
        "compare",
        help="print what changed between two runs of one study; writes RUN_B/compare-<RUN_A>.html",
    )
    compare.add_argument("run_a", type=finished_run, help="the earlier (reference) run folder")
    compare.add_argument("run_b", type=finished_run, help="the later run folder")
    serve = sub.add_parser(
        "serve-command",
        help="print (or --exec) the measured vllm serve command of the recommendation for a workload",
    )
    serve.add_argument("handoff", type=handoff_file, help="the run folder, or its handoff.json")
    serve.add_argument("--workload", required=True, help="a workload of the study, e.g. repetition")
    serve.add_argument("--concurrency", type=int, help="the load level (needed when several were measured)")
    serve.add_argument("--port", type=int, help="serve on this port instead of the one measured on")
    serve.add_argument("--exec", action="store_true", help="start the server in place of this process")
    _workload_parser(sub)
    return parser


def _workload_parser(sub: Any) -> None:
    from pytest_specsel.files.imports import FORMATS

    workload = sub.add_parser("workload", help="frozen workloads: import a public request set")
    verbs = workload.add_subparsers(dest="verb", required=True, metavar="{import}")
    imp = verbs.add_parser("import", help="convert a request set into frozen JSONL with a provenance file")
    imp.add_argument("format", choices=sorted(FORMATS), help="the source's format")
    imp.add_argument("source", type=Path, help="the source file")
    imp.add_argument(
        "--out", type=Path, required=True, help="the JSONL to write (FILE.provenance.json beside it)"
    )
    imp.add_argument("--sample", type=int, help="keep this many requests, drawn with --seed (default: all)")
    imp.add_argument(
        "--per-category", type=int, help="keep at most this many per category (default: no quota)"
    )
    imp.add_argument("--seed", type=int, default=0, help="the seed of every draw (default: 0)")
    imp.add_argument(
        "--max-prompt-tokens", type=int, help="drop requests longer than this in the target's tokens"
    )
    imp.add_argument("--tokenizer", help="the target's folder: its tokenizer and chat template count tokens")
    imp.add_argument(
        "--categories", default="", help="keep only these categories, comma-separated (default: all)"
    )
    imp.add_argument(
        "--answer-first-turns",
        metavar="URL",
        help="spec-bench: have the target served at URL write each two-turn question's first answer "
        "at temperature 0, once, and freeze it (default: first turns only)",
    )
    imp.add_argument("--answer-max-tokens", type=int, default=256, help="tokens of each first answer (256)")
    imp.add_argument("--answer-model", help="the served model's name at URL (default: its first)")


def _import(args: argparse.Namespace) -> int:
    from pytest_specsel.files.first_answers import FirstAnswers
    from pytest_specsel.files.imports import ImportOptions
    from pytest_specsel.files.imports import WorkloadImportError
    from pytest_specsel.files.imports import describe
    from pytest_specsel.files.imports import import_workload

    categories = tuple(c for c in args.categories.split(",") if c)
    answers = None
    if args.answer_first_turns:
        if args.format != "spec-bench":
            print("specsel: --answer-first-turns is for spec-bench's two-turn questions", file=sys.stderr)
            return 2
        answers = FirstAnswers(args.answer_first_turns, args.answer_max_tokens, args.answer_model)
    options = ImportOptions(
        args.sample, args.per_category, args.seed, args.max_prompt_tokens, args.tokenizer, categories, answers
    )
    try:
        provenance = import_workload(args.format, args.source, args.out, options)
    except WorkloadImportError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    print(describe(provenance, args.out))
    return 0


def _serve_command(args: argparse.Namespace) -> int:
    from pytest_specsel.files.report_recommendation import ServeError
    from pytest_specsel.files.report_recommendation import serve_command
    from pytest_specsel.files.report_recommendation import shell_line

    handoff = json.loads(args.handoff.read_text(encoding="utf-8"))
    try:
        env, argv = serve_command(handoff, args.workload, args.concurrency, args.port)
    except ServeError as exc:
        print(str(exc), file=sys.stderr)
        return 2
    if args.exec:
        os.execvpe(argv[0], argv, {**os.environ, **env})
    print(shell_line(env, argv))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.command == "serve-command":
        return _serve_command(args)
    if args.command == "workload":
        return _import(args)
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
