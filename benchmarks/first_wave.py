"""Does a round after idling still open slowly? Reads a run folder's raw files.

In ABBA order (B0 C0 | C1 B1 | B2 C2 | ...) a round that follows the other server's round
(not a side's first) comes after its own server sat idle. Per paired scenario and side, this
prints the mean TTFT of such rounds' first wave (their first ``concurrency`` requests)
divided by that of the side's other rounds (the first excluded: it always warmed up), and
the geometric mean, min and max of that ratio over all cases, by concurrency. Around 1.0:
a round after idling opens like any other.

    python benchmarks/first_wave.py benchmarks/results/LABEL [more run folders]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
from pathlib import Path
from typing import Any


def order(pairs: int) -> list[tuple[str, int]]:
    """The ABBA sequence of (side, index) for ``pairs`` round pairs."""
    out: list[tuple[str, int]] = []
    for k in range(pairs):
        out += [("B", k), ("C", k)] if k % 2 == 0 else [("C", k), ("B", k)]
    return out


def first_wave_ms(round_: dict[str, Any], concurrency: int) -> float | None:
    requests = sorted(round_["requests"], key=lambda r: r["start_offset_s"])[:concurrency]
    ttfts = [r["ttft_ms"] for r in requests if r.get("ttft_ms") is not None]
    return statistics.fmean(ttfts) if ttfts else None


def ratios(raw: dict[str, Any]) -> dict[str, float]:
    """Per side: first wave after idling / first wave of the side's other later rounds."""
    concurrency = int(raw["scenario"]["concurrency"])
    sides = {"B": raw["baseline_rounds"], "C": raw["rounds"]}
    pairs = min(len(sides["B"]), len(sides["C"]))
    idle: dict[str, list[float]] = {"B": [], "C": []}
    busy: dict[str, list[float]] = {"B": [], "C": []}
    previous = None
    for side, index in order(pairs):
        wave = first_wave_ms(sides[side][index], concurrency)
        if wave is not None and index > 0:
            (idle if previous != side else busy)[side].append(wave)
        previous = side
    return {
        side: statistics.fmean(idle[side]) / statistics.fmean(busy[side])
        for side in ("B", "C")
        if idle[side] and busy[side]
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path)
    args = parser.parse_args()
    for run in args.runs:
        by_c: dict[int, list[float]] = {}
        for path in sorted((run / "raw").glob("*.json")):
            raw = json.loads(path.read_text())
            if not raw.get("baseline_rounds"):
                continue
            found = ratios(raw)
            for side, value in found.items():
                print(f"{run.name} {path.stem} {side}: first wave after idling / other rounds {value:.2f}")
            by_c.setdefault(int(raw["scenario"]["concurrency"]), []).extend(found.values())
        for c, values in sorted(by_c.items()):
            gm = math.exp(statistics.fmean(math.log(v) for v in values))
            spread = f"[{min(values):.2f}, {max(values):.2f}]"
            print(f"{run.name} c{c}: {len(values)} sides, geometric mean {gm:.2f} {spread}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
