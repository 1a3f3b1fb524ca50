"""The run's report: one self-contained HTML page (``report.html`` in the run folder),
built from the run's files alone, so ``python -m pytest_specsel report RESULTS/LABEL``
rebuilds it byte for byte.

The page loads nothing (no script, style, font or image from anywhere): CSS is inline and
charts are inline SVG from ``report_charts`` (each in ``<figure class="chart">``). It reads
whatever exists: a run that was interrupted or failed, or a folder missing a file, gives a
page that shows what is there and says what is not. Without matplotlib the page is written
without charts and says so.
"""

from __future__ import annotations

import dataclasses
import html
import json
from collections.abc import Iterable
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType
from typing import Any

from pytest_specsel.artifacts import write_atomic

__all__ = ["REPORT_NAME", "RunFolder", "esc", "link", "page", "render_report", "run_facts", "write_report"]

REPORT_NAME = "report.html"
_WHAT_FILES = (
    "Relative to this page: raw files hold every request, "
    "logs each server's own output (first line: its argv)."
)

INTERRUPTED = "This run was interrupted: the figures cover what was measured before it stopped."
NO_CHARTS = (
    "Charts not drawn: matplotlib is not installed here (it comes with pytest-specsel[measure]). "
    "Rebuild the page once it is: python -m pytest_specsel report <run folder>."
)
_CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:1.5em auto;max-width:1200px;padding:0 1em;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:13px}
th,td{border:1px solid #ccc;padding:3px 6px;vertical-align:top;text-align:left}
td small,td:last-child{overflow-wrap:anywhere}
th{background:#f2f2f2}small{color:#555}code,pre{font-size:12px}
pre{white-space:pre-wrap;background:#f7f7f7;padding:.5em;max-height:30em;overflow:auto}
.passed,.accept{background:#e3f4e4}.failed,.reject{background:#fbe3e3}
.undecided,.tune{background:#fff1dc}.warn{background:#fff1dc;padding:.5em;border:1px solid #e0b060}
figure.chart{display:inline-block;margin:.3em 1em .8em 0;vertical-align:top}
figure.chart svg{max-width:100%;height:auto}figcaption{font-size:12px;color:#555}
mark{background:#ffd54f}nav a{margin-right:1em}
"""


def esc(value: object) -> str:
    """Escaped text of a value; None is '-'."""
    return html.escape("-" if value is None else str(value))


def page(title: str, body: str) -> str:
    """A complete page: inline style, no script, nothing fetched."""
    return (
        f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8">'
        f'<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{esc(title)}</title><style>{_CSS}</style></head>\n<body>\n{body}\n</body></html>\n"
    )


def table(header: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """An HTML table; cells are HTML already (escape them with :func:`esc`)."""
    head = "".join(f"<th>{esc(h)}</th>" for h in header)
    body = "".join(
        "<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>\n" for r in rows
    )
    return f'<table class="{cls}"><thead><tr>{head}</tr></thead><tbody>\n{body}</tbody></table>'


def number(value: Any, digits: int = 2) -> str:
    return f"{value:.{digits}f}" if isinstance(value, int | float) and not isinstance(value, bool) else "-"


def interval_text(estimate: Any, interval: Any, unit: str = "") -> str:
    """``1.26x [0.91, 1.76]`` (interval present) or ``1.26x``; '-' when not measured."""
    if not isinstance(estimate, int | float):
        return "-"
    text = f"{estimate:.2f}{unit}"
    if isinstance(interval, dict) and interval.get("low") is not None:
        text += f" [{interval['low']:.2f}, {interval['high']:.2f}]"
    return text


@dataclasses.dataclass
class RunFolder:
    """What a run folder holds, read leniently: a file that is missing or unreadable is
    recorded in ``problems`` and read as empty."""

    root: Path
    manifest: dict[str, Any]
    handoff: dict[str, Any]
    groups: dict[str, dict[str, Any]]
    problems: list[str]
    _raw: dict[str, dict[str, Any] | None] = dataclasses.field(default_factory=dict)
    _raw_views: dict[str, dict[str, dict[str, Any]]] | None = None

    @classmethod
    def read(cls, root: Path) -> RunFolder:
        problems: list[str] = []
        groups = {p.stem: _read(p, root, problems) for p in sorted((root / "groups").glob("*.json"))}
        return cls(
            root,
            _read(root / "manifest.json", root, problems),
            _read(root / "handoff.json", root, problems),
            {name: doc for name, doc in groups.items() if doc},
            problems,
        )

    @property
    def label(self) -> str:
        return str(self.manifest.get("run_label") or self.handoff.get("run_label") or self.root.name)

    @property
    def complete(self) -> bool | None:
        value = self.manifest.get("complete", self.handoff.get("complete"))
        return value if isinstance(value, bool) else None

    @property
    def gates(self) -> dict[str, Any]:
        return dict(self.handoff.get("gates") or (self.manifest.get("config") or {}).get("gates") or {})

    def candidates(self) -> list[dict[str, Any]]:
        """Every candidate in run order: the manifest's entry merged over its summary."""
        entries = {str(g.get("candidate") or g.get("group")): g for g in self.manifest.get("groups") or []}
        names = list(entries) + [n for n in self.groups if n not in entries]
        names += [n for n in self.raw_views() if n not in names]
        out = []
        for name in names:
            # a candidate known from its raw files alone (the run stopped before its summary)
            first = next(iter(self.raw_views().get(name, {}).values()), {})
            summary = self.groups.get(name) or {
                "run_status": first.get("run_status"),
                "track": first.get("track"),
                "config": {"family": "baseline" if first.get("role") == "baseline" else None},
            }
            admission = summary.get("admission") or {}
            config = summary.get("config") or {}
            merged = {
                "candidate": name,
                "family": config.get("family"),
                # v2 summaries name K; older ones only in their config
                "num_speculative_tokens": None
                if config.get("family") == "baseline"
                else summary.get("num_speculative_tokens", config.get("num_speculative_tokens")),
                "reason": admission.get("reason"),
                "detail": admission.get("detail"),
                **{k: v for k, v in summary.items() if k != "num_speculative_tokens"},
                **entries.get(name, {}),
            }
            out.append(merged)
        return out

    def views(self, candidate: dict[str, Any]) -> dict[str, dict[str, Any]]:
        """The candidate's scenario views by scenario (group summary, else the handoff, else
        the raw files)."""
        name = candidate["candidate"]
        found = (self.groups.get(name) or {}).get("scenarios")
        if not found and is_baseline(candidate):
            found = (self.handoff.get("baseline") or {}).get(candidate.get("track") or "")
        if not found:
            found = ((self.handoff.get("candidates") or {}).get(name) or {}).get("scenarios")
        return dict(found or self.raw_views().get(name) or {})

    def raw_views(self) -> dict[str, dict[str, dict[str, Any]]]:
        """The scenario view each raw file holds, by candidate and scenario."""
        if self._raw_views is None:
            self._raw_views = {}
            for path in sorted((self.root / "raw").glob("*.json")):
                view = (self.raw(f"raw/{path.name}") or {}).get("scenario") or {}
                if view.get("candidate") and view.get("scenario"):
                    self._raw_views.setdefault(str(view["candidate"]), {})[str(view["scenario"])] = view
        return self._raw_views

    def scenarios(self) -> list[str]:
        seen: dict[str, None] = {}
        for candidate in self.candidates():
            seen.update(dict.fromkeys(self.views(candidate)))
        return list(seen)

    def raw(self, rel: str | None) -> dict[str, Any] | None:
        """A raw file by its path relative to the run folder, read once."""
        if not rel:
            return None
        if rel not in self._raw:
            self._raw[rel] = _read(self.root / rel, self.root, self.problems) or None
        return self._raw[rel]

    def files(self) -> list[str]:
        """The run's own files (not pages built from them), relative, sorted."""
        found = [p for p in ("manifest.json", "handoff.json") if (self.root / p).is_file()]
        for folder, pattern in (("groups", "*.json"), ("raw", "*.json"), ("logs", "*.log")):
            found += [f"{folder}/{p.name}" for p in sorted((self.root / folder).glob(pattern))]
        return found


def _read(path: Path, root: Path, problems: list[str]) -> dict[str, Any]:
    rel = path.relative_to(root)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append(f"{rel} is missing")
        return {}
    except (OSError, ValueError) as exc:
        problems.append(f"{rel} could not be read: {exc}")
        return {}
    if not isinstance(data, dict):
        problems.append(f"{rel} is not a JSON object")
        return {}
    return data


def is_baseline(candidate: dict[str, Any]) -> bool:
    return candidate.get("family") == "baseline"


def _charts_module() -> ModuleType | None:
    try:
        from pytest_specsel import report_charts
    except ImportError:  # matplotlib missing: the page says so
        return None
    return report_charts


def write_report(run_dir: Path) -> Path:
    """Build ``report.html`` in ``run_dir`` from its files; returns its path."""
    from pytest_specsel import report_sections

    run = RunFolder.read(run_dir)
    text = render_report(run, report_sections.sections(run, _charts_module()))
    path = run_dir / REPORT_NAME
    write_atomic(path, text)
    return path


def render_report(run: RunFolder, sections: Sequence[tuple[str, str, str]]) -> str:
    """The page: a header, a contents line, then each (anchor, title, html) section."""
    config = run.manifest.get("config") or {}
    status = {True: "complete", False: "interrupted", None: "completeness unknown (no manifest)"}[
        run.complete
    ]
    facts = [
        f"run <b>{esc(run.label)}</b>",
        f"target <code>{esc(run.handoff.get('target_model') or config.get('target_model'))}</code>",
        f"backend {esc(run.manifest.get('backend'))} on {esc(run.manifest.get('device'))}",
        "real experiment" if run.manifest.get("real_experiment") else "dry run (no server) or unknown",
        esc(status),
    ]
    warn = "".join(f'<p class="warn">{esc(p)}</p>' for p in run.problems)
    if run.complete is False:
        warn = f'<p class="warn">{esc(INTERRUPTED)}</p>' + warn
    nav = " ".join(f'<a href="#{esc(a)}">{esc(t)}</a>' for a, t, _ in sections)
    body = "".join(f'<section id="{esc(a)}"><h2>{esc(t)}</h2>\n{h}</section>\n' for a, t, h in sections)
    head = f"<h1>Speculative-decoding selection: {esc(run.label)}</h1><p>{' · '.join(facts)}</p>"
    return page(f"specsel report {run.label}", f"{head}{warn}<nav>{nav}</nav>\n{body}")


# -- what the run was: environment, study, files -------------------------------------------
def link(rel: Any) -> str:
    """A relative link to one of the run's files (as written in its documents)."""
    return f'<a href="{esc(rel)}">{esc(rel)}</a>' if rel else "-"


def run_facts(run: RunFolder) -> list[tuple[str, str, str]]:
    """The sections that describe the run rather than judge it."""
    return [
        ("environment", "Environment", _environment(run)),
        ("study", "Study", _study(run)),
        ("files", "Files", _files(run)),
    ]


def _kv(rows: Sequence[tuple[str, Any]]) -> str:
    return table(["", ""], ([esc(k), esc(v)] for k, v in rows if v is not None), "kv")


def _environment(run: RunFolder) -> str:
    env = run.manifest.get("environment") or {}
    rt = env.get("runtime") or {}
    if not env:
        return "<p>No environment recorded (no manifest, or preflight did not run).</p>"
    rows: list[tuple[str, Any]] = [
        ("backend", f"{env.get('backend')} {env.get('version')}"), ("device", env.get("device")),
        ("device name", env.get("device_name")), ("device memory MB", number(env.get("device_memory_mb"), 0)),
        ("python", rt.get("python")), ("platform", rt.get("platform")), ("CPU", rt.get("cpu_model")),
        ("CPU count", rt.get("cpu_count")), ("host memory MB", number(rt.get("host_memory_mb"), 0)),
        ("CUDA", rt.get("cuda")), ("driver", rt.get("driver")), ("vLLM platform", rt.get("vllm_platform")),
        ("backend python", rt.get("backend_python")), ("probe error", env.get("error")),
    ]  # fmt: skip
    rows += [
        (f"package {name}", version or "not installed")
        for name, version in sorted((rt.get("packages") or {}).items())
    ]
    methods = ", ".join(map(str, env.get("methods") or []))
    return (
        _kv(rows)
        + "<details><summary>speculative methods the backend declares</summary>"
        + f"<p>{esc(methods)}</p></details>"
    )


def _study(run: RunFolder) -> str:
    config = run.manifest.get("config") or {}
    if not config:
        return "<p>No study configuration recorded (no manifest).</p>"
    keys = ("target_model", "source", "workloads", "concurrency", "num_prompts", "max_tokens", "temperature",
            "sampling_key", "backend", "policy", "gates", "parity_epsilon", "strict_parity")  # fmt: skip
    rows = [
        (k, json.dumps(config[k], sort_keys=True) if isinstance(config[k], dict | list) else config[k])
        for k in keys
        if k in config
    ]
    whole = json.dumps(config, sort_keys=True, indent=2)
    timings = json.dumps(run.manifest.get("timings_s") or {}, sort_keys=True, indent=2)
    return (
        _kv(rows)
        + f"<details><summary>the whole study configuration</summary><pre>{esc(whole)}</pre></details>"
        + f"<details><summary>timings (s)</summary><pre>{esc(timings)}</pre></details>"
    )


def _files(run: RunFolder) -> str:
    files = run.files()
    if not files:
        return "<p>No result file found.</p>"
    items = "".join(f"<li>{link(f)}</li>" for f in files)
    return f"<p>{esc(_WHAT_FILES)}</p><ul>{items}</ul>"
