"""The handoff's recommendation as people and tools read it: the terminal's block, the report
page's opening section, and the measured ``vllm serve`` command of one choice (what
``python -m pytest_specsel serve-command`` prints or runs).

Everything here reads the handoff's JSON (``handoff["recommendation"]``), so the terminal,
the page and the command show what the deployment step gets.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pytest_specsel.core.protocol import ServeCommand
from pytest_specsel.files.html import esc
from pytest_specsel.files.html import link
from pytest_specsel.files.html import table

__all__ = [
    "ServeError",
    "levels_of",
    "recommendation_html",
    "recommendation_lines",
    "serve_command",
    "shell_line",
]

NO_RECOMMENDATION = "no recommendation in this handoff (written before it, or no baseline was measured)"


class ServeError(ValueError):
    """No measured argv for the asked workload and level; the message says why."""


def levels_of(recommendation: Mapping[str, Any] | None) -> dict[tuple[str, str], dict[str, Any]]:
    """Every choice by (workload, concurrency as written)."""
    workloads = (recommendation or {}).get("workloads") or {}
    return {
        (w, c): dict(choice)
        for w, doc in workloads.items()
        for c, choice in (doc.get("levels") or {}).items()
    }


def _command(choice: Mapping[str, Any], run_dir: Path | None) -> str:
    serve = choice.get("serve") or {}
    if not serve.get("argv"):
        return f"no measured argv: {serve.get('problem')}"
    if choice.get("request_rate") is not None:  # serve-command names closed-loop levels
        return f"as measured: {shell_line(serve.get('env') or {}, serve['argv'])}"
    where = str(run_dir) if run_dir is not None else "RUN_FOLDER"
    return (
        f"python -m pytest_specsel serve-command {shlex.quote(where)} --workload {choice['workload']} "
        f"--concurrency {choice['concurrency']} --port PORT"
    )


def recommendation_lines(recommendation: Mapping[str, Any] | None, run_dir: Path | None = None) -> list[str]:
    """The terminal's short block: per workload and level the choice, why, the runner-up,
    how to start it, and what each comparable candidate would need."""
    if not recommendation:
        return [NO_RECOMMENDATION]
    prefer = ", ".join(recommendation.get("preference") or []) or "none"
    lines = [
        f"rule: accepted candidates of the baseline's track only; a tie goes to the preference ({prefer})"
    ]
    for workload, doc in (recommendation.get("workloads") or {}).items():
        for choice in _choices(doc):
            tie = " (a tie)" if choice.get("tie") else ""
            lines.append(f"{workload} {_level(choice)}: {choice['choice']}{tie} [{choice['rule']}]")
            lines.append(f"  why: {choice['reason']}")
            if choice.get("runner_up"):
                lines.append(f"  runner-up {choice['runner_up']}: {choice['runner_up_lost']}")
            lines.append(f"  start it: {_command(choice, run_dir)}")
            for reading in choice.get("would_need") or []:
                lines.append(f"  would need, {reading['candidate']}: {reading['text']}")
        schedule = doc.get("per_batch_size_schedule")
        if schedule:
            entries = ", ".join(f"{a}-{b}: K={k}" for a, b, k in schedule["entries"])
            lines.append(
                f"{workload} per-batch-size schedule: {entries} (rests on {', '.join(schedule['levels'])})"
            )
        else:
            lines.append(
                f"{workload} per-batch-size schedule: none: {doc.get('per_batch_size_schedule_reason')}"
            )
        lines += [f"{workload} {name} against load: {_sweep_text(x)}" for name, x in _crossovers(doc)]
    lines.append(f"(would need: {recommendation.get('would_need_label')})")
    return lines


def _choices(doc: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """A workload's choices: its closed-loop levels, then its request rates."""
    return [*(doc.get("levels") or {}).values(), *(doc.get("rates") or {}).values()]


def _level(choice: Mapping[str, Any]) -> str:
    """``c4``, ``r0.5/s (cap 4)`` for a request rate, ``recorded (mean 1.57/s, cap 4)`` for a
    replay of recorded arrivals."""
    rate, cap = choice.get("request_rate"), choice["concurrency"]
    if choice.get("recorded"):
        return f"recorded (mean {rate:.2f}/s, cap {cap})" if rate is not None else f"recorded (cap {cap})"
    return f"c{cap}" if rate is None else f"r{rate:g}/s (cap {cap})"


def _crossovers(doc: Mapping[str, Any]) -> list[tuple[str, Mapping[str, Any]]]:
    return [*(doc.get("crossover") or {}).items(), *(doc.get("rate_crossover") or {}).items()]


def _sweep_text(x: Mapping[str, Any]) -> str:
    """``c1 1.20x [1.10, 1.31], c4 0.81x [0.75, 0.88]: <statement>``; at request rates the
    TPOT speedup, ``r0.5 ...``."""
    unit, figure = ("r", "TPOT speedup ") if x.get("load") == "request_rate" else ("c", "")
    levels = ", ".join(
        f"{unit}{level} {s['speedup']:.2f}x [{s['low']:.2f}, {s['high']:.2f}]"
        for level, s in x["levels"].items()
    )
    return f"{figure}{levels}: {x['statement']}"


def shell_line(env: Mapping[str, str], argv: Sequence[str]) -> str:
    """``K=V ... argv``: the command as one line a POSIX shell runs."""
    return ServeCommand(tuple(argv), env).shell_line()


def _choice_row(choice: Mapping[str, Any], run_dir: Path | None) -> list[str]:
    serve = choice.get("serve") or {}
    argv = serve.get("argv")
    start = (
        # in <small>: the page's style wraps a cell's small text anywhere (an argv has long paths)
        f"<small><code>{esc(shell_line(serve.get('env') or {}, argv))}</code></small>"
        if argv
        else esc(f"no measured argv: {serve.get('problem')}")
    )
    cls = "accept" if choice.get("choice") != "target_only" else ""
    readings = "".join(
        f"<li>{esc(r['candidate'])}: {esc(r['text'])}</li>" for r in choice.get("would_need") or []
    )
    runner = f"{choice['runner_up']}: {choice['runner_up_lost']}" if choice.get("runner_up") else None
    rule = esc(choice.get("rule")) + (" · a tie" if choice.get("tie") else "")
    return [
        esc(_level(choice)),
        f'<td class="{cls}"><b>{esc(choice.get("choice"))}</b><br><small>{rule}</small></td>',
        esc(choice.get("reason")),
        esc(runner),
        f"{start}<br><small>{esc(_command(choice, run_dir))}</small>",
        f"<ul>{readings}</ul>" if readings else "-",
        " ".join(link(p) for p in choice.get("raw_files") or []) or "-",
    ]


def recommendation_html(recommendation: Mapping[str, Any] | None, run_dir: Path | None = None) -> str:
    """The report's opening section: per workload a table of its levels, then its schedule
    (``run_dir`` None: the command names RUN_FOLDER, so the page does not depend on where
    it was built from)."""
    if not recommendation:
        return f"<p>{esc(NO_RECOMMENDATION)}</p>"
    out = [f"<p><small>{esc(recommendation.get('rule'))}</small></p>"]
    header = ["level", "choice", "why", "runner-up", "start it", "would need", "rests on"]
    for workload, doc in (recommendation.get("workloads") or {}).items():
        rows = [_choice_row(c, run_dir) for c in _choices(doc)]
        out.append(f"<h3>{esc(workload)}</h3>" + table(header, rows, "recommendation"))
        schedule = doc.get("per_batch_size_schedule")
        if schedule:
            entries = ", ".join(f"batch {a}-{b}: K={k}" for a, b, k in schedule["entries"])
            rests = f"{entries} (rests on {', '.join(schedule['levels'])}); {schedule['note']}"
            out.append(f"<p>per-batch-size schedule: {esc(rests)}</p>")
        else:
            out.append(
                f"<p>per-batch-size schedule: none: {esc(doc.get('per_batch_size_schedule_reason'))}</p>"
            )
        out += [f"<p>{esc(name)} against load: {esc(_sweep_text(x))}</p>" for name, x in _crossovers(doc)]
    out.append(f"<p><small>would need: {esc(recommendation.get('would_need_label'))}</small></p>")
    return "".join(out)


def serve_command(
    handoff: Mapping[str, Any], workload: str, concurrency: int | None = None, port: int | None = None
) -> tuple[dict[str, str], list[str]]:
    """The measured command of the recommendation for ``workload`` (at ``concurrency``;
    needed when several levels were measured): the environment the launcher set and the
    argv, with ``port`` in place of the measured port.

    :raises ServeError: for no recommendation, no such workload or level, or no argv.
    """
    levels = levels_of(handoff.get("recommendation"))
    if not levels:
        raise ServeError(f"specsel: {NO_RECOMMENDATION}")
    known = sorted({w for w, _ in levels})
    if workload not in known:
        raise ServeError(
            f"specsel: no workload {workload!r} in the recommendation; it has {', '.join(known)}"
        )
    mine: Sequence[str] = sorted((c for w, c in levels if w == workload), key=int)
    if concurrency is None and len(mine) > 1:
        raise ServeError(
            f"specsel: {workload!r} was measured at several levels: pass --concurrency ({', '.join(mine)})"
        )
    level = str(concurrency) if concurrency is not None else mine[0]
    if level not in mine:
        raise ServeError(f"specsel: {workload!r} has no level c{level}; it has c{', c'.join(mine)}")
    serve = levels[(workload, level)].get("serve") or {}
    if not serve.get("argv"):
        raise ServeError(f"specsel: no measured argv for {workload} c{level}: {serve.get('problem')}")
    argv = [str(a) for a in serve["argv"]]
    if port is not None and serve.get("port_index") is not None:
        argv[int(serve["port_index"])] = str(port)
    return {str(k): str(v) for k, v in (serve.get("env") or {}).items()}, argv


def forecast_lines(k_forecast: Mapping[str, Any] | None) -> list[str]:
    """One line per swept table and load level: the forecast speedup per proposal length,
    the measured one beside it, the best K and the held-out check (README "Which proposal
    length"). Tables with one K say nothing: there is nothing to forecast."""
    lines = []
    for strategy, scenarios in sorted((k_forecast or {}).items()):
        for scenario, f in sorted(scenarios.items()):
            if not f.get("points"):
                continue
            per_k = []
            for p in f["points"]:
                said = f"K={p['k']} {_x(p.get('predicted'))}"
                per_k.append(said + (f" (measured {_x(p['measured'])})" if p.get("measured") else ""))
            held = [
                f"K={p['k']} {100 * p['held_out_error']:+.1f} %"
                for p in f["points"]
                if p.get("held_out_error") is not None
            ]
            best = f"best K {f['best_k']} ({'measured' if f['best_k_measured'] else 'not measured'})"
            check = f"; held out from the other K: {', '.join(held)}" if held else ""
            told = "; ".join(per_k)
            lines.append(f"{strategy} {scenario} proposal length (forecast): {told}; {best}{check}")
    return lines


def _x(interval: Mapping[str, Any] | None) -> str:
    return f"{interval['estimate']:.2f}x" if interval else "-"
