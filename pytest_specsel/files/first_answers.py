"""Spec-Bench's second turns, with a first answer written once by the target and frozen.

Spec-Bench's two-turn questions record no first answer (its ``reference`` is a grading key),
so by default an import keeps the first turn only. With ``--answer-first-turns URL`` the
importer asks the target, served at ``URL`` (an OpenAI-compatible server, e.g. ``vllm serve``
of the target), for each kept question's first answer at temperature 0, once, and writes
the two-turn request: the first turn, that answer as the frozen assistant turn, and the
second turn for the measured server to answer. The provenance names the server's model id,
its ``root`` (the snapshot it serves), its version, and the settings.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import httpx

__all__ = ["FirstAnswers", "SECOND_TURN", "answer_first_turns"]

#: where a spec-bench line keeps its second turn until it is answered or dropped
SECOND_TURN = "_second_turn"


@dataclasses.dataclass(frozen=True, slots=True)
class FirstAnswers:
    """Who wrote the frozen first answers, and how."""

    url: str
    max_tokens: int = 256
    #: the served model's name (None: the server's first, from ``/v1/models``)
    model: str | None = None
    timeout_s: float = 300.0


def _served(client: httpx.Client, ask: FirstAnswers) -> dict[str, Any]:
    """The served model's id and root (its snapshot) and the server's version."""
    models = client.get("/v1/models").json().get("data") or []
    chosen = next((m for m in models if ask.model in (None, m.get("id"))), None)
    if chosen is None:
        served = ", ".join(str(m.get("id")) for m in models) or "none"
        raise ValueError(f"model {ask.model!r} is not served at {ask.url} (it serves: {served})")
    try:
        version = client.get("/version").json().get("version")
    except (httpx.HTTPError, ValueError):
        version = None
    return {"model": chosen.get("id"), "root": chosen.get("root"), "version": version}


def answer_first_turns(
    lines: Sequence[dict[str, Any]], ask: FirstAnswers, transport: httpx.BaseTransport | None = None
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Each line with a second turn becomes the two-turn request (``<id>-t2``); the others
    stay as they are. :return: the lines and the provenance of the answers.

    :raises ValueError: naming the server and the question when an answer cannot be had.
    """
    out: list[dict[str, Any]] = []
    answered = 0
    with httpx.Client(base_url=ask.url.rstrip("/"), timeout=ask.timeout_s, transport=transport) as client:
        served = _served(client, ask)
        for line in lines:
            second = line.get(SECOND_TURN)
            kept = {k: v for k, v in line.items() if k != SECOND_TURN}
            if second is None:
                out.append(kept)
                continue
            first = kept["messages"]
            body = {"model": served["model"], "messages": first, "temperature": 0.0, "seed": 0,
                    "max_tokens": ask.max_tokens}  # fmt: skip
            response = client.post("/v1/chat/completions", json=body)
            if response.status_code != 200:
                said = response.text[:200]
                raise ValueError(
                    f"{ask.url} answered {response.status_code} for {kept['request_id']}: {said}"
                )
            answer = response.json()["choices"][0]["message"]["content"] or ""
            if not answer.strip():
                raise ValueError(f"{ask.url} wrote an empty first answer for {kept['request_id']}")
            turns = [*first, {"role": "assistant", "content": answer}, {"role": "user", "content": second}]
            out.append({**kept, "request_id": f"{kept['request_id']}-t2", "messages": turns})
            answered += 1
    return out, {
        **served,
        "url": ask.url,
        "temperature": 0.0,
        "seed": 0,
        "max_tokens": ask.max_tokens,
        "answered": answered,
        "written_by": "the target at temperature 0, once; frozen as the assistant turn",
    }
