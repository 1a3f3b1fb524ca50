"""Progress of a long set-up step, as plain lines a CI log keeps: how far, how long, and the
time left where the step's length is known."""

from __future__ import annotations

import time
from collections.abc import Callable

__all__ = ["Progress"]


class Progress:
    """Says ``specsel: <what>: <done>/<total> <unit>, <s> s, about <s> s left`` every
    ``every`` units (default: each tenth) and at the end."""

    def __init__(
        self,
        what: str,
        total: int,
        unit: str,
        every: int | None = None,
        say: Callable[[str], None] = lambda line: print(line, flush=True),
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.what, self.total, self.unit = what, total, unit
        self.every = max(1, every if every is not None else total // 10)
        self._say, self._clock = say, clock
        self._start = clock()
        self.done = 0

    def advance(self, count: int = 1) -> None:
        before = self.done
        self.done = min(self.total, self.done + count)
        if self.done == self.total or self.done // self.every > before // self.every:
            self._say(self.line())

    def line(self) -> str:
        elapsed = self._clock() - self._start
        text = f"specsel: {self.what}: {self.done}/{self.total} {self.unit}, {elapsed:.0f} s"
        if 0 < self.done < self.total:
            text += f", about {elapsed / self.done * (self.total - self.done):.0f} s left"
        return text
