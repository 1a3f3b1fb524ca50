"""What changed between two runs of one study: per candidate and scenario, the verdict,
each gate's state, and the throughput speedup with its interval, and whether a change is
beyond noise (the two intervals are disjoint); per workload and level, the recommendation.

``compare_documents`` is pure (two handoffs in, a ``Comparison`` out); ``compare_runs``
reads two run folders and writes the comparison page into the second one.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from typing import Literal

from pytest_specsel.core.openloop import speed_key
from pytest_specsel.files.report_recommendation import levels_of

__all__ = [
    "CaseChange",
    "ChoiceChange",
    "Comparison",
    "Speedup",
    "compare_documents",
    "compare_runs",
    "format_table",
]

#: a candidate or scenario that one of the two runs does not have
ABSENT = "absent"
#: keys of the study whose difference makes two runs different studies (reported, not fatal)
STUDY_KEYS = ("target_model", "gates", "workloads", "concurrency", "num_prompts", "max_tokens", "temperature",
              "sampling_key", "backend", "policy", "strict_parity", "recommendation_preference")  # fmt: skip
NO_CHANGE = (
    "no change that counts: same verdicts, no gate between passed and failed, no speedup beyond noise, "
    "same recommendations"
)
COUNTS = "a verdict, a gate passed <-> failed, a speedup beyond noise, a recommendation"
NoiseCall = Literal["beyond noise", "within noise", "no interval", "-"]


@dataclasses.dataclass(frozen=True, slots=True)
class Speedup:
    estimate: float
    low: float | None = None
    high: float | None = None

    def text(self) -> str:
        bounds = (
            f" [{self.low:.2f}, {self.high:.2f}]" if self.low is not None and self.high is not None else ""
        )
        return f"{self.estimate:.2f}x{bounds}"


@dataclasses.dataclass(frozen=True, slots=True)
class CaseChange:
    """One candidate x scenario in both runs."""

    candidate: str
    scenario: str
    verdict_a: str
    verdict_b: str
    reason_a: str | None
    reason_b: str | None
    #: (gate, state in A, state in B) for every gate either run evaluated
    gates: tuple[tuple[str, str, str], ...]
    speedup_a: Speedup | None
    speedup_b: Speedup | None

    @property
    def verdict_changed(self) -> bool:
        return self.verdict_a != self.verdict_b

    @property
    def gates_flipped(self) -> tuple[str, ...]:
        """Gates that moved between passed and failed (undecided on either side is no flip)."""
        return tuple(name for name, a, b in self.gates if {a, b} == {"passed", "failed"})

    @property
    def gates_moved(self) -> tuple[str, ...]:
        return tuple(f"{name} {a} -> {b}" for name, a, b in self.gates if a != b)

    @property
    def speedup_shift(self) -> NoiseCall:
        a, b = self.speedup_a, self.speedup_b
        if a is None or b is None:
            return "-"
        if None in (a.low, a.high, b.low, b.high):
            return "no interval"
        assert a.low is not None and a.high is not None and b.low is not None and b.high is not None
        return "beyond noise" if a.high < b.low or b.high < a.low else "within noise"

    def why(self) -> list[str]:
        """What makes this case a change that counts (empty: none)."""
        out = []
        if self.verdict_changed:
            out.append(f"verdict {self.verdict_a} -> {self.verdict_b}")
        out += [f"gate {name} moved between passed and failed" for name in self.gates_flipped]
        if self.speedup_shift == "beyond noise":
            assert self.speedup_a is not None and self.speedup_b is not None
            out.append(f"speedup {self.speedup_a.text()} -> {self.speedup_b.text()} (disjoint intervals)")
        return out


@dataclasses.dataclass(frozen=True, slots=True)
class ChoiceChange:
    """The recommendation for one workload at one level in both runs (``absent``: not there)."""

    workload: str
    concurrency: str
    choice_a: str
    choice_b: str

    @property
    def changed(self) -> bool:
        return self.choice_a != self.choice_b

    def text(self) -> str:
        moved = f"{self.choice_a} -> {self.choice_b}" if self.changed else self.choice_a
        return f"recommendation {self.workload} c{self.concurrency}: {moved}"


@dataclasses.dataclass(frozen=True, slots=True)
class Comparison:
    label_a: str
    label_b: str
    cases: tuple[CaseChange, ...]
    #: how the two studies differ (empty: the same study)
    study_notes: tuple[str, ...] = ()
    #: per workload and level (empty when a handoff has no recommendation: see the note)
    choices: tuple[ChoiceChange, ...] = ()
    choice_note: str | None = None

    @property
    def changes(self) -> list[CaseChange]:
        return [c for c in self.cases if c.why()]

    @property
    def changed_choices(self) -> list[ChoiceChange]:
        return [c for c in self.choices if c.changed]

    @property
    def exit_status(self) -> int:
        """1 when a verdict changed, a gate flipped, a speedup moved beyond noise or a
        recommendation changed; else 0."""
        return 1 if self.changes or self.changed_choices else 0


def _speedup(view: Mapping[str, Any]) -> Speedup | None:
    ev = view.get("evidence") or {}
    speed = speed_key(bool(ev.get("open_loop")))  # the speed gate's figure
    estimate = ev.get(speed)
    if not isinstance(estimate, int | float):
        return None
    interval = ev.get(f"{speed}_interval") or {}
    return Speedup(float(estimate), interval.get("low"), interval.get("high"))


def _gate_states(view: Mapping[str, Any]) -> dict[str, str]:
    gates = (view.get("decision") or {}).get("gates") or []
    return {
        str(g.get("name")): str(g.get("state") or ("passed" if g.get("passed") else "failed")) for g in gates
    }


def _case(
    candidate: str, scenario: str, a: Mapping[str, Any] | None, b: Mapping[str, Any] | None
) -> CaseChange:
    def verdict(view: Mapping[str, Any] | None) -> tuple[str, str | None]:
        if view is None:
            return ABSENT, None
        decision = view.get("decision") or {}
        return str(decision.get("verdict") or "not_evaluated"), decision.get("reason")

    (va, ra), (vb, rb) = verdict(a), verdict(b)
    ga, gb = _gate_states(a or {}), _gate_states(b or {})
    names = list(ga) + [n for n in gb if n not in ga]
    gates = tuple((n, ga.get(n, "-"), gb.get(n, "-")) for n in names)
    return CaseChange(candidate, scenario, va, vb, ra, rb, gates, _speedup(a or {}), _speedup(b or {}))


def _study_notes(a: Mapping[str, Any], b: Mapping[str, Any]) -> tuple[str, ...]:
    notes = []
    for key in STUDY_KEYS:
        if key in a or key in b:
            va, vb = a.get(key), b.get(key)
            if va != vb:
                notes.append(f"{key}: {json.dumps(va, sort_keys=True)} -> {json.dumps(vb, sort_keys=True)}")
    return tuple(notes)


def compare_documents(
    handoff_a: Mapping[str, Any],
    handoff_b: Mapping[str, Any],
    config_a: Mapping[str, Any] | None = None,
    config_b: Mapping[str, Any] | None = None,
    labels: tuple[str, str] = ("A", "B"),
) -> Comparison:
    """Every candidate x scenario of either handoff, in A's order then B's new ones.

    :param config_a: the manifest's ``config`` of run A (its study), to say how studies differ.
    """
    cand_a = dict(handoff_a.get("candidates") or {})
    cand_b = dict(handoff_b.get("candidates") or {})
    cases = []
    for name in list(cand_a) + [n for n in cand_b if n not in cand_a]:
        sa = dict((cand_a.get(name) or {}).get("scenarios") or {})
        sb = dict((cand_b.get(name) or {}).get("scenarios") or {})
        for scenario in list(sa) + [s for s in sb if s not in sa]:
            cases.append(_case(name, scenario, sa.get(scenario), sb.get(scenario)))
    study_a = {
        "target_model": handoff_a.get("target_model"),
        "gates": handoff_a.get("gates"),
        **(config_a or {}),
    }
    study_b = {
        "target_model": handoff_b.get("target_model"),
        "gates": handoff_b.get("gates"),
        **(config_b or {}),
    }
    choices, note = _choices(handoff_a, handoff_b, labels)
    return Comparison(labels[0], labels[1], tuple(cases), _study_notes(study_a, study_b), choices, note)


def _choices(
    a: Mapping[str, Any], b: Mapping[str, Any], labels: tuple[str, str]
) -> tuple[tuple[ChoiceChange, ...], str | None]:
    """Each level's choice in A and B; a level only one run has counts as a change. A
    handoff written before the recommendation has none: not compared, and said so."""
    missing = [label for label, doc in zip(labels, (a, b), strict=True) if not doc.get("recommendation")]
    if missing:
        return (), f"recommendations not compared: no recommendation in {' and '.join(missing)}'s handoff"
    la, lb = levels_of(a["recommendation"]), levels_of(b["recommendation"])
    keys = list(la) + [k for k in lb if k not in la]
    choice = (
        {k: str(v.get("choice")) for k, v in la.items()},
        {k: str(v.get("choice")) for k, v in lb.items()},
    )
    return tuple(
        ChoiceChange(w, c, choice[0].get((w, c), ABSENT), choice[1].get((w, c), ABSENT)) for w, c in keys
    ), None


_HEADER = ("case", "verdict A -> B", "speedup A", "speedup B", "speedup change", "what else moved")


def _quiet(c: CaseChange) -> bool:
    return c.verdict_a == c.verdict_b == "not_evaluated" and c.speedup_a is None and c.speedup_b is None


def rows(comparison: Comparison) -> list[tuple[bool, tuple[str, ...]]]:
    """(counts, cells) per case; a candidate not evaluated in either run is one row."""
    out: list[tuple[bool, tuple[str, ...]]] = []
    by_candidate: dict[str, list[CaseChange]] = {}
    for c in comparison.cases:
        by_candidate.setdefault(c.candidate, []).append(c)
    for name, cases in by_candidate.items():
        if len(cases) > 1 and all(_quiet(c) for c in cases):
            out.append((False, (f"{name} (all {len(cases)} scenarios)", "not_evaluated", "-", "-", "-", "-")))
            continue
        for c in cases:
            verdict = c.verdict_a if not c.verdict_changed else f"{c.verdict_a} -> {c.verdict_b}"
            moved = list(c.gates_moved)
            if not c.verdict_changed and c.reason_a != c.reason_b:
                moved.insert(0, f"reason {c.reason_a} -> {c.reason_b}")
            out.append((bool(c.why()), (
                f"{c.candidate} {c.scenario}", verdict,
                c.speedup_a.text() if c.speedup_a else "-", c.speedup_b.text() if c.speedup_b else "-",
                c.speedup_shift, "; ".join(moved) or "-",
            )))  # fmt: skip
    return out


def format_table(comparison: Comparison) -> list[str]:
    """The printed comparison: a title, study notes, the table, what counts and the status."""
    cells: list[tuple[str, ...]] = [("  " + _HEADER[0], *_HEADER[1:])]
    cells += [(("! " if counts else "  ") + r[0], *r[1:]) for counts, r in rows(comparison)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(_HEADER))]
    lines = [f"specsel compare: {comparison.label_a} -> {comparison.label_b}"]
    lines += [f"warning: the studies differ: {note}" for note in comparison.study_notes]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
    lines += [("! " if c.changed else "  ") + c.text() for c in comparison.choices]
    lines += [f"note: {comparison.choice_note}"] if comparison.choice_note else []
    changes, choices = comparison.changes, comparison.changed_choices
    count = len(changes) + len(choices)
    lines.append(f"{count} change(s) that count ({COUNTS}):" if count else NO_CHANGE)
    lines += [f"  {c.candidate} {c.scenario}: {'; '.join(c.why())}" for c in changes]
    lines += [f"  {c.text()}" for c in choices]
    return lines


def _page(comparison: Comparison) -> str:
    from pytest_specsel.files.html import esc
    from pytest_specsel.files.html import page
    from pytest_specsel.files.html import table

    def row(counts: bool, cells: Sequence[str]) -> list[str]:
        return [
            f'<td class="{"failed" if counts else ""}">{esc(cells[0])}</td>',
            *(esc(c) for c in cells[1:]),
        ]

    body = table(_HEADER, (row(counts, cells) for counts, cells in rows(comparison)))
    notes = "".join(f'<p class="warn">the studies differ: {esc(n)}</p>' for n in comparison.study_notes)
    changes = "".join(
        f"<li>{esc(c.candidate)} {esc(c.scenario)}: {esc('; '.join(c.why()))}</li>"
        for c in comparison.changes
    ) + "".join(f"<li>{esc(c.text())}</li>" for c in comparison.changed_choices)
    choices = "".join(f"<li>{esc(c.text())}</li>" for c in comparison.choices)
    choices = (
        f"<h2>Recommendations</h2><ul>{choices}</ul>" if choices else f"<p>{esc(comparison.choice_note)}</p>"
    )
    summary = f"<ul>{changes}</ul>" if changes else f"<p>{esc(NO_CHANGE)}</p>"
    title = f"specsel compare: {comparison.label_a} -> {comparison.label_b}"
    status = f"<p>exit status {comparison.exit_status} (1: a change that counts; 0: none)</p>"
    return page(
        title, f"<h1>{esc(title)}</h1>{notes}{body}{choices}<h2>Changes that count</h2>{summary}{status}"
    )


def _read(run_dir: Path, name: str) -> dict[str, Any]:
    path = run_dir / name
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def compare_runs(run_a: Path, run_b: Path) -> tuple[Comparison, Path]:
    """Compare two run folders (each needs its handoff.json); the page is written into
    ``run_b`` as ``compare-<name of run_a>.html``."""
    from pytest_specsel.files.artifacts import write_atomic

    labels = (run_a.resolve().name, run_b.resolve().name)
    comparison = compare_documents(
        _read(run_a, "handoff.json"),
        _read(run_b, "handoff.json"),
        _read(run_a, "manifest.json").get("config"),
        _read(run_b, "manifest.json").get("config"),
        labels,
    )
    path = run_b / f"compare-{labels[0]}.html"
    write_atomic(path, _page(comparison))
    return comparison, path
