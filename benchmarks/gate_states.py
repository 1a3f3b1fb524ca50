"""Every candidate case's verdict and performance-gate states of one or more runs, side by side.

Per candidate x scenario: the verdict in each run, then per performance gate (throughput
speedup, TTFT p95 ratio, E2E p95 ratio) its state (+ passed, x failed, ? undecided) with its
interval, half-width (half the interval's width over its estimate, in %), pairs and the
interval's method; at the end, per run, how many performance gates stayed undecided, how
many of those have a half-width under 10 %, and which verdicts differ between the runs.

    python benchmarks/gate_states.py RUN_A [RUN_B ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

PERFORMANCE_GATES = ("throughput_speedup", "ttft_ratio", "e2e_p95_ratio")
MARK = {"passed": "+", "failed": "x", "undecided": "?"}


def half_width(interval: dict[str, Any]) -> float:
    return (interval["high"] - interval["low"]) / 2 / interval["estimate"]


def cases(run: Path) -> dict[str, dict[str, Any]]:
    """``"<candidate> <scenario>"`` -> its scenario view, for every case with gates."""
    handoff = json.loads((run / "handoff.json").read_text(encoding="utf-8"))
    return {
        f"{name} {key}": view
        for name, candidate in handoff["candidates"].items()
        for key, view in candidate["scenarios"].items()
        if (view.get("decision") or {}).get("gates")
    }


def gate_cell(gate: dict[str, Any]) -> str:
    iv = gate.get("interval")
    if iv is None:
        return f"{MARK.get(gate['state'], '-')} {gate['value']}"
    method = next((m for m in ("pooled", "fallback") if m in iv["method"]), "rounds")
    return (
        f"{MARK.get(gate['state'], '-')} {iv['estimate']:.2f} [{iv['low']:.2f}, {iv['high']:.2f}] "
        f"±{100 * half_width(iv):.0f}% {iv['pairs']}p {method}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    runs = [(run.name, cases(run)) for run in args.runs]
    keys = sorted({k for _, c in runs for k in c})
    for key in keys:
        print(key)
        for label, found in runs:
            view = found.get(key)
            if view is None:
                print(f"  {label}: absent")
                continue
            decision = view["decision"]
            gates = {g["name"]: g for g in decision["gates"]}
            cells = "; ".join(f"{n} {gate_cell(gates[n])}" for n in PERFORMANCE_GATES if n in gates)
            print(f"  {label}: {decision['verdict']} ({decision['reason']}) | {cells}")
    for label, found in runs:
        gates = [g for v in found.values() for g in v["decision"]["gates"] if g["name"] in PERFORMANCE_GATES]
        open_ = [g for g in gates if g["state"] == "undecided"]
        tight = [g for g in open_ if g.get("interval") and half_width(g["interval"]) < 0.10]
        print(
            f"{label}: {len(open_)} of {len(gates)} performance gates undecided "
            f"({len(tight)} of them with a half-width under 10 %)"
        )
    if len(runs) > 1:
        differ = [
            k for k in keys if len({c[k]["decision"]["verdict"] if k in c else "absent" for _, c in runs}) > 1
        ]
        print(f"verdicts that differ between the runs: {', '.join(differ) or 'none'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
