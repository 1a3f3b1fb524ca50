"""What a server's own counters counted over a measured window against what this client
sent: on a deployed endpoint that other clients share, more requests or tokens than were sent
is foreign traffic, and the window's counter-based figures are not the candidate's alone.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

__all__ = ["FOREIGN_TRAFFIC", "RETRIED", "UNSETTLED", "ServerTraffic", "traffic_of"]

#: the round's flags (``Round.flags``)
FOREIGN_TRAFFIC = "foreign_traffic"
RETRIED = "retried_requests"
UNSETTLED = "counters_unsettled"
#: tokens the server may count beyond ours before it is foreign traffic: a request that this
#: client cancelled may have generated a token or two more than it received
TOKEN_SLACK = 2


@dataclasses.dataclass(frozen=True, slots=True)
class ServerTraffic:
    """One window: the server's counter deltas beside what this client sent (None: unread)."""

    sent_requests: int
    sent_prompt_tokens: int
    sent_output_tokens: int
    server_requests: float | None
    server_prompt_tokens: float | None
    server_output_tokens: float | None
    #: read on a deployed endpoint: only there is an excess judged foreign traffic
    remote: bool = False
    #: the counters came to rest after the window (two reads agreed) before the deltas were taken
    settled: bool = True
    #: requests answered 429 / 503 and sent again, and the retries in all
    retried_requests: int = 0
    retries: int = 0

    def excess(self) -> dict[str, float]:
        """What the server counted beyond what was sent, where it did (empty: nothing)."""
        out: dict[str, float] = {}
        rows = (
            ("requests", self.server_requests, self.sent_requests, 0),
            ("prompt_tokens", self.server_prompt_tokens, self.sent_prompt_tokens, TOKEN_SLACK),
            ("output_tokens", self.server_output_tokens, self.sent_output_tokens, TOKEN_SLACK),
        )
        for name, counted, sent, slack in rows:
            if counted is not None and counted - sent > slack:
                out[name] = round(counted - sent, 3)
        return out

    def flags(self) -> tuple[str, ...]:
        found = []
        if self.remote and self.excess():
            found.append(FOREIGN_TRAFFIC)
        if self.remote and not self.settled:
            found.append(UNSETTLED)
        if self.retried_requests:
            found.append(RETRIED)
        return tuple(found)

    def as_json(self) -> dict[str, Any]:
        return {
            "sent": {
                "requests": self.sent_requests,
                "prompt_tokens": self.sent_prompt_tokens,
                "output_tokens": self.sent_output_tokens,
            },
            "server": {
                "requests": self.server_requests,
                "prompt_tokens": self.server_prompt_tokens,
                "output_tokens": self.server_output_tokens,
            },
            "excess": self.excess(),
            "remote": self.remote,
            "settled": self.settled,
            "retried_requests": self.retried_requests,
            "retries": self.retries,
        }


def traffic_of(
    requests: Sequence[Any],
    deltas: tuple[float | None, float | None, float | None],
    *,
    remote: bool,
    settled: bool = True,
) -> ServerTraffic:
    """A window's traffic from its requests (``RequestRecord``: what the server answered to
    this client, by its own ``usage``) and the server's (requests, prompt tokens, generation
    tokens) counter deltas."""
    return ServerTraffic(
        sent_requests=len(requests),
        sent_prompt_tokens=sum(r.prompt_tokens or 0 for r in requests),
        sent_output_tokens=sum(r.output_tokens or 0 for r in requests),
        server_requests=deltas[0],
        server_prompt_tokens=deltas[1],
        server_output_tokens=deltas[2],
        remote=remote,
        settled=settled,
        retried_requests=sum(1 for r in requests if r.retries),
        retries=sum(r.retries for r in requests),
    )
