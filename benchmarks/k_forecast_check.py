"""Print a run's proposal-length sweep: the decomposition per K and scenario, and the
forecast against what was measured (README "Which proposal length").

    python benchmarks/k_forecast_check.py benchmarks/results/ksweep-20261207 [--table g1_ngram]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any


def _iv(found: dict[str, Any] | None) -> str:
    if not found:
        return "-"
    return f"{found['estimate']:.2f} [{found['low']:.2f}, {found['high']:.2f}]"


def _decompositions(handoff: dict[str, Any], table: str) -> list[str]:
    lines = ["| candidate | scenario | tokens/step counters | stream | step cost (chunks) | (engine) "
             "| explained | measured | residual |", "| --- " * 9 + "|"]  # fmt: skip
    for name, c in sorted(handoff["candidates"].items()):
        if c["group"] != table:
            continue
        for scenario, view in sorted(c["scenarios"].items()):
            d = view.get("speedup_decomposition")
            if not d:
                continue
            cells = [_iv(d.get(k)) for k in ("tokens_per_step_counters", "tokens_per_step_stream",
                     "step_cost_ratio", "step_cost_ratio_engine", "explained_speedup", "measured_speedup",
                     "residual")]  # fmt: skip
            lines.append(f"| {name} | {scenario} | " + " | ".join(cells) + " |")
    return lines


def _forecasts(handoff: dict[str, Any], table: str) -> list[str]:
    lines = []
    for scenario, f in sorted((handoff.get("k_forecast") or {}).get(table, {}).items()):
        if "points" not in f:
            lines.append(f"{scenario}: no forecast: {f.get('reason')}")
            continue
        fit = f["step_cost_fit"]
        lines += [
            f"{scenario}: step cost {fit['intercept']:.3f} + {fit['per_proposed_token']:.3f} K; "
            f"best K {f['best_k']} ({'measured' if f['best_k_measured'] else 'not measured'})",
            "| K | forecast | measured | held out | held-out error |",
            "| --- | --- | --- | --- | --- |",
        ]
        for p in f["points"]:
            err = p.get("held_out_error")
            cells = [_iv(p.get(k)) for k in ("predicted", "measured", "held_out")]
            lines.append(
                f"| {p['k']} | " + " | ".join(cells) + f" | {'-' if err is None else f'{100 * err:+.1f} %'} |"
            )
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run", type=Path, help="a run folder (holds handoff.json)")
    parser.add_argument("--table", default="g1_ngram", help="the table swept over K (default g1_ngram)")
    args = parser.parse_args(argv)
    path = args.run / "handoff.json"
    if not path.is_file():
        print(f"k_forecast_check: no handoff.json in {args.run}", file=sys.stderr)
        return 2
    handoff = json.loads(path.read_text())
    print("\n".join([*_decompositions(handoff, args.table), "", *_forecasts(handoff, args.table)]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
