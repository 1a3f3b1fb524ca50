"""The report page's judgement sections, each an HTML string built from a ``RunFolder``:
the recommendation (``report_recommendation``), the decision table, the candidates, one part
per scenario (figures and charts) and the parity failures (the environment, the study and the
files are ``run_facts``).

Every text from a file is escaped here (``esc``); the only markup is this module's own.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType
from typing import Any

from pytest_specsel.core.openloop import speed_key
from pytest_specsel.files.html import NO_CHARTS
from pytest_specsel.files.html import esc
from pytest_specsel.files.html import interval_text
from pytest_specsel.files.html import link
from pytest_specsel.files.html import number
from pytest_specsel.files.html import table
from pytest_specsel.files.report_recommendation import recommendation_html
from pytest_specsel.files.run_facts import run_facts
from pytest_specsel.files.run_folder import RunFolder
from pytest_specsel.files.run_folder import is_baseline

__all__ = ["sections"]

GATE_ORDER = ("throughput_speedup", "ttft_ratio", "e2e_p95_ratio", "peak_memory_mb")
GATE_RULE = (
    "A gate passes when its whole interval lies on the passing side, fails when it lies on the "
    "failing side, and is undecided otherwise (README 'Rounds and intervals')."
)
#: parity.first_divergence starts each excerpt this many characters before the divergence
_LEAD = 10


def sections(run: RunFolder, charts: ModuleType | None) -> list[tuple[str, str, str]]:
    """(anchor, title, html) of every section, in page order."""
    return [
        ("recommendation", "Recommendation", recommendation_html(run.handoff.get("recommendation"))),
        ("decision", "Decision", _decision(run)),
        ("candidates", "Candidates and admission", _candidates(run)),
        ("scenarios", "Scenarios", _scenarios(run, charts)),
        *_categories(run),
        ("parity", "Parity failures", _parity(run)),
        *run_facts(run),
    ]


# -- decision table --------------------------------------------------------------------
def _speed(evidence: dict[str, Any]) -> str:
    """The evidence key of the speed gate's figure: TPOT speedup at a request rate."""
    return speed_key(bool(evidence.get("open_loop")))


def _gate_cell(gate: dict[str, Any] | None) -> str:
    if gate is None:
        return "-"
    state = str(gate.get("state") or ("passed" if gate.get("passed") else "failed"))
    if gate.get("name") == "peak_memory_mb":
        value = f"{number(gate.get('value'), 0)} MB"
    else:
        value = interval_text(gate.get("value"), gate.get("interval"))
    threshold = gate.get("threshold")
    threshold = f"{threshold:g}" if isinstance(threshold, int | float) else threshold
    need = (
        f" · about {gate['pairs_needed']} pairs decide it"
        if state == "undecided" and gate.get("pairs_needed")
        else ""
    )
    return (
        f'<td class="{esc(state)}">{esc(value)}<br><small>{esc(gate.get("op"))} {esc(threshold)}'
        f" · <b>{esc(state)}</b>{esc(need)}</small></td>"
    )


def _parity_cell(view: dict[str, Any]) -> str:
    p = view.get("parity")
    if not p:
        return "-"
    text, cls = (
        f"{p.get('matched')}/{p.get('total')} identical",
        "passed" if p.get("quality_ok") else "failed",
    )
    if p.get("near_tie") is True:
        text, cls = f"{text} · near_tie (gap {number(p.get('logprob_gap'), 3)} nats)", "undecided"
    elif p.get("near_tie") is False:
        text += f" · not a near-tie ({p.get('tie_detail')})"
    own = view.get("baseline_self_check")
    if own:
        text += f" · baseline self-check {own.get('matched')}/{own.get('total')}"
    return f'<td class="{cls}">{esc(text)}</td>'


def _evidence_cell(view: dict[str, Any]) -> str:
    ev = view.get("evidence") or {}
    parts = [ev.get("status")]
    if ev.get("missing_evidence"):
        parts.append("missing: " + ", ".join(map(str, ev["missing_evidence"])))
    if ev.get("mismatches"):
        parts.append("mismatches: " + ", ".join(map(str, ev["mismatches"])))
    if view.get("pairing"):
        parts.append(f"{view['pairing']}, {view.get('rounds')} round pairs")
    if view.get("flags"):
        parts.append("flags: " + ", ".join(map(str, view["flags"])))
    if view.get("error"):
        parts.append("error: " + str(view["error"]).splitlines()[0])
    return "<br>".join(esc(p) for p in parts if p) or "-"


def _never_ran(views: dict[str, dict[str, Any]]) -> bool:
    return all(
        not v.get("rounds") and (v.get("decision") or {}).get("verdict") in (None, "not_evaluated")
        for v in views.values()
    )


def _decision(run: RunFolder) -> str:
    names = list(GATE_ORDER)
    candidates = [c for c in run.candidates() if not is_baseline(c)]
    for c in candidates:
        for view in run.views(c).values():
            names += [
                g["name"]
                for g in (view.get("decision") or {}).get("gates") or []
                if g.get("name") not in names
            ]
    rows = []
    for c in candidates:
        name, k, views = esc(c["candidate"]), esc(c.get("num_speculative_tokens")), run.views(c)
        if _never_ran(views):
            why = esc(f"{c.get('run_status')}: {c.get('reason')}")
            status = esc(c.get("run_status"))
            rows.append(
                [name, k, "every scenario", status, "<b>not_evaluated</b>", *["-"] * (len(names) + 2), why]
            )
            continue
        for scenario, view in views.items():
            decision = view.get("decision") or {}
            gates = {g.get("name"): g for g in decision.get("gates") or []}
            ev = view.get("evidence") or {}
            verdict = str(decision.get("verdict") or "not_evaluated")
            rows.append([
                name, k, esc(scenario), esc(view.get("run_status")),
                f'<td class="{esc(verdict)}"><b>{esc(verdict)}</b><br>'
                f'<small>{esc(decision.get("reason"))}</small></td>',
                esc(interval_text(ev.get(_speed(ev)), ev.get(f"{_speed(ev)}_interval"), "x")),
                *[_gate_cell(gates.get(n)) for n in names], _parity_cell(view), _evidence_cell(view),
            ])  # fmt: skip
    if not rows:
        return "<p>No candidate beside the baseline in this run.</p>"
    thresholds = ", ".join(f"{k} {v}" for k, v in sorted(run.gates.items())) or "see each gate's cell"
    note = f"<p><small>Gates: {esc(thresholds)}. {esc(GATE_RULE)}</small></p>"
    header = ["candidate", "K", "scenario", "run status", "verdict · reason", "speedup [interval]", *names,
              "parity", "evidence"]  # fmt: skip
    return table(header, rows, "decision") + note


# -- candidates ------------------------------------------------------------------------
def _candidates(run: RunFolder) -> str:
    rows = []
    for c in run.candidates():
        # a failure's first line; the whole text below it
        detail = esc(str(c["detail"]).splitlines()[0] if c.get("detail") else None)
        if c.get("proposer_quality"):
            detail += f"<br><small>proposer: {esc(c['proposer_quality'])}</small>"
        if c.get("pairing_reason"):
            detail += f"<br><small>pairing {esc(c.get('pairing'))}: {esc(c['pairing_reason'])}</small>"
        if c.get("failure"):
            detail += f"<details><summary>failure</summary><pre>{esc(c['failure'])}</pre></details>"
        status = str(c.get("run_status"))
        cls = {"completed": "passed", "failed": "failed"}.get(status, "")
        files = " ".join(link(c.get(k)) for k in ("summary_path", "backend_log") if c.get(k))
        rows.append([
            *(esc(c.get(k)) for k in ("candidate", "group", "family", "num_speculative_tokens", "track")),
            f'<td class="{cls}">{esc(status)}</td>', esc(c.get("reason")), detail, files or "-",
        ])  # fmt: skip
    if not rows:
        return "<p>No candidate recorded (no manifest and no group summaries).</p>"
    header = ["candidate", "group", "family", "K", "track", "run status", "reason", "detail", "files"]
    return table(header, rows, "candidates")


# -- per category ------------------------------------------------------------------------
def _categories(run: RunFolder) -> list[tuple[str, str, str]]:
    """The per-category figures of every candidate scenario (none: no section)."""
    rows = []
    for c in run.candidates():
        for scenario, view in sorted(run.views(c).items()):
            for name, f in sorted((view.get("by_category") or {}).items()):
                i = f.get("decode_rate_ratio_interval")
                ratio = f"{i['estimate']:.2f} [{i['low']:.2f}, {i['high']:.2f}]" if i else None
                rate = f.get("acceptance_rate")
                rows.append([
                    esc(c.get("candidate")), esc(scenario), esc(name),
                    esc(f"{f.get('baseline_requests')}/{f.get('candidate_requests')}"), esc(ratio),
                    esc(None if f.get("accepted_per_step") is None else f"{f['accepted_per_step']:.2f}"),
                    esc(None if rate is None else f"{rate:.2f}"), esc(f.get("note")),
                ])  # fmt: skip
    if not rows:
        return []
    header = ["candidate", "scenario", "category", "requests b/c", "decode rate ratio", "accepted/step",
              "acceptance", "note"]  # fmt: skip
    note = (
        "<p>Per request category: the decode-rate ratio over round pairs with its interval, and the "
        "accepted tokens per step read from the stream. They explain a scenario's decision; they do "
        "not make it.</p>"
    )
    return [("categories", "Per category", note + table(header, rows, "categories"))]


# -- scenarios ---------------------------------------------------------------------------
def _figures_row(c: dict[str, Any], view: dict[str, Any]) -> list[str]:
    fig, tel = view.get("figures") or {}, view.get("telemetry") or {}
    lat = fig.get("latency") or {}
    tok = number(fig.get("throughput_tokens_per_s"), 1)
    if view.get("baseline_figures"):
        tok += f" (baseline beside it {number(view['baseline_figures'].get('throughput_tokens_per_s'), 1)})"
    return [
        esc(c["candidate"]), *(esc(view.get(k)) for k in ("role", "run_status", "rounds")), esc(tok),
        *(esc(number(lat.get(f"{k}_ms"), 0)) for k in ("ttft_p50", "ttft_p95", "tpot_p50", "e2e_p50",
                                                        "e2e_p95")),
        esc(number(view.get("peak_memory_mb"), 0)), esc(number(tel.get("acceptance_rate"))),
        esc(number(tel.get("mean_accepted_length"))), link(view.get("raw_path")),
    ]  # fmt: skip


_LATENCY_KEYS = ("ttft_ms", "tpot_ms", "e2e_ms")


def _scenario_charts(run: RunFolder, scenario: str, charts: ModuleType, first: int) -> list[Any]:
    speedups, latencies, acceptance, memory, factors = [], [], [], [], []
    own: dict[str, list[float]] = {}
    # the study's gates; a run without its handoff still has each decision's thresholds
    thresholds = {"throughput_speedup": run.gates.get("min_throughput_speedup")}
    thresholds["peak_memory_mb"] = run.gates.get("max_peak_memory_mb")
    for c in run.candidates():
        view = run.views(c).get(scenario) or {}
        raw = run.raw(view.get("raw_path")) or {}
        name = str(c["candidate"])
        if view.get("peak_memory_mb") is not None:
            memory.append((name, float(view["peak_memory_mb"]), is_baseline(c)))
        if is_baseline(c):
            own = {k: charts.request_values(raw.get("rounds"), k) for k in _LATENCY_KEYS}
            continue
        ev, decision = view.get("evidence") or {}, view.get("decision") or {}
        gates = {g.get("name"): g for g in decision.get("gates") or []}
        for gate, value in thresholds.items():
            thresholds[gate] = value if value is not None else (gates.get(gate) or {}).get("threshold")
        speed = _speed(ev)
        if ev.get(speed) is not None:
            iv = ev.get(f"{speed}_interval") or {}
            # the speed gate's state; a candidate not gated (a parity reject) shows its verdict
            state = (gates.get(speed) or {}).get("state") or decision.get("verdict")
            speedups.append(charts.SpeedupRow(name, ev[speed], iv.get("low"), iv.get("high"), state))
        if raw:
            pick = {k: charts.request_values(raw.get("baseline_rounds"), k) for k in _LATENCY_KEYS}
            mine = {k: charts.request_values(raw.get("rounds"), k) for k in _LATENCY_KEYS}
            latencies.append(charts.LatencySeries(name, pick, mine))
        acceptance.append((name, (view.get("telemetry") or {}).get("acceptance_by_position") or []))
        if view.get("speedup_decomposition"):
            factors.append(_factors(charts, name, view["speedup_decomposition"]))
    if not latencies and any(own.values()):
        latencies.append(charts.LatencySeries("baseline (own rounds)", {}, own))
    threshold, budget = thresholds["throughput_speedup"], thresholds["peak_memory_mb"]
    drawn = [
        charts.speedup_chart(speedups, threshold, f"c{first}-"),
        charts.latency_chart(latencies, f"c{first + 1}-"),
        charts.acceptance_chart(acceptance, f"c{first + 2}-"),
        charts.memory_chart(memory, budget, f"c{first + 3}-"),
        charts.decomposition_chart(factors, f"c{first + 4}-"),
    ]
    return [chart for chart in drawn if chart is not None]


def _factors(charts: ModuleType, name: str, d: dict[str, Any]) -> Any:
    def iv(found: dict[str, Any] | None) -> tuple[float, float, float] | None:
        return (found["estimate"], found["low"], found["high"]) if found and found.get("estimate") else None

    tokens = {
        "counters, per drafted step": iv(d.get("tokens_per_step_counters")),
        "counters, every step": iv((d.get("tokens_per_step_by_k") or [None])[-1]),
        "stream": iv(d.get("tokens_per_step_stream")),
    }
    cost = {"chunk gaps": iv(d.get("step_cost_ratio")), "engine steps": iv(d.get("step_cost_ratio_engine"))}
    return charts.DecompositionRow(name, tokens, cost, (d.get("residual") or {}).get("estimate"))


def _scenarios(run: RunFolder, charts: ModuleType | None) -> str:
    parts = [] if charts is not None else [f'<p class="warn">{esc(NO_CHARTS)}</p>']
    header = ["server", "role", "run status", "rounds", "tok/s", "TTFT p50", "TTFT p95", "TPOT p50",
              "E2E p50", "E2E p95", "peak MB", "acceptance", "mean accepted len", "raw"]  # fmt: skip
    for i, scenario in enumerate(run.scenarios()):
        rows = []
        for c in run.candidates():
            view = run.views(c).get(scenario)
            if view and view.get("figures"):
                rows.append(_figures_row(c, view))
        parts.append(f'<h3 id="scenario-{esc(scenario)}">{esc(scenario)}</h3>')
        parts.append(table(header, rows, "figures") if rows else "<p>Nothing measured in this scenario.</p>")
        for chart in _scenario_charts(run, scenario, charts, 5 * i) if charts is not None else []:
            parts.append(
                f'<figure class="chart" data-chart="{esc(chart.kind)}" data-scenario="{esc(scenario)}">'
                f"{chart.svg}<figcaption>{esc(scenario)}: {esc(chart.title)}</figcaption></figure>"
            )
    return "\n".join(parts) if run.scenarios() else "<p>No scenario recorded.</p>"


# -- parity ------------------------------------------------------------------------------
def _marked(excerpt: Any, char_index: Any) -> str:
    text = str(excerpt or "")
    lead = min(int(char_index or 0), _LEAD)
    return f"{esc(text[:lead])}<mark>{esc(text[lead:]) or '(end of output)'}</mark>"


def _parity_entry(title: str, check: dict[str, Any], who: Sequence[str]) -> str:
    d = check.get("first_divergence") or {}
    facts = (
        f"{check.get('matched')}/{check.get('total')} identical; differing: "
        f"{', '.join(map(str, check.get('differing_request_ids') or [])) or '-'}; near_tie: "
        f"{check.get('near_tie')}; log-prob gap: {number(check.get('logprob_gap'), 3)}; "
        f"{check.get('tie_detail') or ''}"
    )
    if not d:
        return f"<h3>{esc(title)}</h3><p>{esc(facts)}</p><p>No first divergence recorded.</p>"
    token = f", token {d['token_index']}" if d.get("token_index") is not None else ""
    where = f"request {d.get('request_id')}, character {d.get('char_index')}{token}"
    rows = [
        [esc(who[0]), f'<pre class="text">{_marked(d.get("expected_excerpt"), d.get("char_index"))}</pre>'],
        [esc(who[1]), f'<pre class="text">{_marked(d.get("actual_excerpt"), d.get("char_index"))}</pre>'],
    ]
    return f"<h3>{esc(title)}</h3><p>{esc(where)}. {esc(facts)}</p>" + table(
        ["side", "text at the first divergence (marked from there)"], rows, "divergence"
    )


def _parity(run: RunFolder) -> str:
    parts = []
    for c in run.candidates():
        for scenario, view in run.views(c).items():
            if view.get("parity") and view["parity"].get("quality_ok") is False:
                diverges = view.get("baseline_self_diverges")
                own = (
                    " (the baseline diverges from itself there too)"
                    if diverges
                    else " (the baseline reproduces itself there)"
                )
                title = f"{c['candidate']} · {scenario}{'' if diverges is None else own}"
                parts.append(_parity_entry(title, view["parity"], ("baseline", str(c["candidate"]))))
            check = view.get("baseline_self_check")
            if is_baseline(c) and check and check.get("quality_ok") is False:
                parts.append(
                    _parity_entry(
                        f"{c['candidate']} · {scenario}: baseline self-check", check, ("round 0", "round 1")
                    )
                )
    if parts:
        return "\n".join(parts)
    compared = any(
        v.get("parity") or v.get("baseline_self_check")
        for c in run.candidates()
        for v in run.views(c).values()
    )
    return (
        "<p>No parity failure: every compared output matched its reference.</p>"
        if compared
        else "<p>No output was compared.</p>"
    )
