"""A run folder as the report and ``compare`` read it: leniently, every missing or unreadable
file recorded in ``problems``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

__all__ = ["RunFolder", "is_baseline"]


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
