"""Streaming OpenAI-compatible chat client (aiohttp on uvloop) with per-request timings.

Each frozen prompt is sent once per repeat; warmup requests come first and are not
measured; concurrency is bounded by a semaphore; token counts come from the server's
``usage``. Failure is data (``RequestRecord.error``). Timings use an injected monotonic
clock (``time.perf_counter`` by default), never the wall clock.

aiohttp and a small server-sent-events splitter, not httpx + httpx-sse: on a mock server of
known timing, at 64 and 256 streams on 2 cores, httpx (with or without uvloop) held its event
loop busy 99 % of the time and added 27-45 ms (c64) and 185-325 ms (c256) to the mean TTFT,
where aiohttp added 3-6 and 49-74 ms at 1.2-1.4x and 2.0-2.8x the throughput (README "Measuring
client").
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from collections.abc import Coroutine
from collections.abc import Mapping
from typing import Any
from typing import TypeVar

import aiohttp

from pytest_specsel.core import stats
from pytest_specsel.core.measurement import ClientLoad
from pytest_specsel.core.measurement import RequestRecord
from pytest_specsel.core.measurement import TokenLogprob
from pytest_specsel.core.protocol import ClientRun
from pytest_specsel.core.protocol import ReplayHooks
from pytest_specsel.core.protocol import ReplaySpec
from pytest_specsel.core.protocol import WarmupError
from pytest_specsel.core.workloads import Prompt

__all__ = ["NO_RETRY", "HttpBenchClient", "Retry", "SseSplitter", "run_loop", "stream_one"]

Clock = Callable[[], float]


def _payload(
    model: str,
    prompt: Prompt,
    max_tokens: int,
    temperature: float,
    top_logprobs: int | None = None,
    ignore_eos: bool = False,
) -> dict[str, Any]:
    extra: dict[str, Any] = {"logprobs": True, "top_logprobs": top_logprobs} if top_logprobs else {}
    if ignore_eos:  # vLLM's extension: generate max_tokens whatever the model ends with
        extra["ignore_eos"] = True
    return extra | {
        "model": model,
        "messages": prompt.chat(),
        "max_tokens": prompt.max_tokens or max_tokens,
        "temperature": temperature,
        "stream": True,
        "stream_options": {"include_usage": True},
        # vLLM returns the generated ids per chunk, so parity can name a token index.
        "return_token_ids": True,
    }


def _token_logprobs(data: Any) -> list[TokenLogprob]:
    """The OpenAI ``logprobs.content`` entries of one chunk."""
    if not isinstance(data, dict):
        return []
    out = []
    for entry in data.get("content") or ():
        top = tuple((str(t["token"]), float(t["logprob"])) for t in entry.get("top_logprobs") or ())
        out.append(TokenLogprob(str(entry["token"]), float(entry["logprob"]), top))
    return out


class SseSplitter:
    """Server-sent events from a byte stream, as the HTML standard splits them: lines end at
    LF or CRLF, ``data`` lines of one event are joined by LF, an empty line ends the event;
    comments and the other fields (``event``, ``id``, ``retry``) are not used here."""

    def __init__(self) -> None:
        self._partial = b""
        self._data: list[bytes] = []

    def feed(self, chunk: bytes) -> list[str]:
        """The ``data`` of every event that ``chunk`` completes, in order."""
        lines = (self._partial + chunk).split(b"\n")
        self._partial = lines.pop()
        events = []
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]
            if not line:
                if self._data:
                    events.append(b"\n".join(self._data).decode("utf-8"))
                    self._data = []
            elif line.startswith(b"data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(b" ") else value)
        return events


class _Stream:
    """What one request has received so far; ``record`` turns it into a RequestRecord."""

    def __init__(self, prompt: Prompt, repeat: int, scenario_start: float, start: float) -> None:
        self.prompt, self.repeat, self.scenario_start, self.start = prompt, repeat, scenario_start, start
        self.ttft: float | None = None
        self.last: float | None = None
        #: time of the last event (content or usage): E2E ends there, as in vLLM's bench
        self.last_event: float | None = None
        self.itl: list[float] = []
        self.text: list[str] = []
        self.token_ids: list[int] = []
        self.logprobs: list[TokenLogprob] = []
        self.got_ids = False
        self.prompt_ids: tuple[int, ...] | None = None
        self.usage: dict[str, Any] = {}
        self.finish: str | None = None

    def take(self, chunk: dict[str, Any], clock: Clock) -> None:
        """One parsed chunk: usage, or choices whose content or ids are timed as they arrive."""
        if chunk.get("usage"):
            self.usage = chunk["usage"]
            self.last_event = clock()
        if chunk.get("prompt_token_ids") is not None:  # the first chunk, with return_token_ids
            self.prompt_ids = tuple(chunk["prompt_token_ids"])
        for choice in chunk.get("choices") or ():
            delta = (choice.get("delta") or {}).get("content") or ""
            self.logprobs.extend(_token_logprobs(choice.get("logprobs")))
            ids = choice.get("token_ids")
            if ids is not None:
                self.got_ids = True
                self.token_ids.extend(ids)
            if choice.get("finish_reason"):
                self.finish = choice["finish_reason"]
            if not delta and not ids:
                continue
            now = clock()
            self.last_event = now
            if self.ttft is None:
                self.ttft = now
            elif self.last is not None:
                self.itl.append((now - self.last) * 1000)
            self.last = now
            self.text.append(delta)

    def record(self, error: str | None, clock: Clock, retries: int = 0) -> RequestRecord:
        end = self.last_event if self.last_event is not None else clock()
        return RequestRecord(
            request_id=self.prompt.request_id,
            repeat=self.repeat,
            prompt=self.prompt.prompt,
            output_text="".join(self.text),
            start_offset_s=self.start - self.scenario_start,
            ttft_ms=None if self.ttft is None else (self.ttft - self.start) * 1000,
            itl_ms=tuple(self.itl),
            e2e_ms=(end - self.start) * 1000 if error is None else None,
            prompt_tokens=self.usage.get("prompt_tokens"),
            output_tokens=self.usage.get("completion_tokens"),
            token_ids=tuple(self.token_ids) if self.got_ids else None,
            prompt_token_ids=self.prompt_ids,
            logprobs=tuple(self.logprobs) if self.logprobs else None,
            finish_reason=self.finish,
            error=error,
            retries=retries,
        )


async def _read_events(response: aiohttp.ClientResponse, stream: _Stream, clock: Clock) -> str | None:
    """Read the event stream into ``stream``; the error it ended with, or None."""
    splitter = SseSplitter()
    async for data in response.content.iter_any():
        for event in splitter.feed(data):
            if event == "[DONE]":
                return None
            chunk = json.loads(event)
            if "error" in chunk:
                return f"server error: {chunk['error']}"
            stream.take(chunk, clock)
    return None


@dataclasses.dataclass(frozen=True, slots=True)
class Retry:
    """Answers a shared server gives when it is busy (429 Too Many Requests, 503 Service
    Unavailable) are sent again, at most ``attempts`` times, after ``backoff_s`` doubling each
    time (or the server's ``Retry-After`` seconds, at most ``max_wait_s``); each retry is
    counted on the request (``RequestRecord.retries``) and the round is flagged."""

    attempts: int = 3
    backoff_s: float = 0.5
    max_wait_s: float = 10.0
    statuses: tuple[int, ...] = (429, 503)

    def wait_s(self, attempt: int, retry_after: str | None) -> float:
        try:
            asked = float(retry_after) if retry_after is not None else None
        except ValueError:
            asked = None
        return min(self.max_wait_s, asked if asked is not None else self.backoff_s * 2**attempt)


#: no retries: a server this run started answers or fails
NO_RETRY = Retry(attempts=0)


async def stream_one(
    session: aiohttp.ClientSession,
    url: str,
    payload: dict[str, Any],
    prompt: Prompt,
    repeat: int,
    scenario_start: float,
    clock: Clock = time.perf_counter,
    sink: list[RequestRecord] | None = None,
    retry: Retry = NO_RETRY,
) -> RequestRecord:
    """Send one streaming request and time it (from its first send, retries included).

    On cancellation the partial record (what arrived, with ``error="cancelled"``) is
    appended to ``sink`` before the ``CancelledError`` propagates.
    """
    stream = _Stream(prompt, repeat, scenario_start, clock())
    retries = 0
    try:
        while True:
            async with session.post(url, json=payload) as response:
                if response.status in retry.statuses and retries < retry.attempts:
                    await response.read()
                    wait = retry.wait_s(retries, response.headers.get("Retry-After"))
                    retries += 1
                    await asyncio.sleep(wait)
                    continue
                if response.status != 200:
                    body = (await response.read()).decode("utf-8", "replace")[:500]
                    return stream.record(f"HTTP {response.status}: {body}", clock, retries)
                error = await _read_events(response, stream, clock)
                break
    except asyncio.CancelledError:
        if sink is not None:
            sink.append(stream.record("cancelled", clock, retries))
        raise
    except (aiohttp.ClientError, TimeoutError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        return stream.record(f"{type(exc).__name__}: {exc}", clock, retries)
    if error is None and stream.ttft is None:
        error = "empty stream: the server sent no content"
    if error is None and stream.usage.get("completion_tokens") is None:
        error = "no usage: the server did not report completion_tokens"
    return stream.record(error, clock, retries)


T = TypeVar("T")


def run_loop(main: Coroutine[Any, Any, T]) -> T:
    """Run ``main`` on uvloop where it is installed (the event loop vLLM itself uses), else on
    asyncio's own; Ctrl-C cancels ``main`` either way, so partial records reach the sink."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


#: the lag probe's timer: short enough to see a busy loop, rare enough to cost nothing
LAG_PROBE_S = 0.005


class LoadProbe:
    """Measures the event loop it runs on over a window: how late a short timer fires (the
    delay every stream's next chunk also waits) and the CPU share of the loop's thread."""

    def __init__(self) -> None:
        self._lags: list[float] = []
        self._task: asyncio.Task[None] | None = None
        self._wall = self._cpu = self._due = 0.0

    async def _sample(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._due = loop.time() + LAG_PROBE_S
            await asyncio.sleep(LAG_PROBE_S)
            self._lags.append(max(loop.time() - self._due, 0.0) * 1000)

    def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._wall, self._cpu = time.perf_counter(), time.thread_time()
        self._due = loop.time() + LAG_PROBE_S
        self._task = loop.create_task(self._sample())

    def stop(self) -> ClientLoad | None:
        if self._task is None:
            return None
        self._task.cancel()
        wall = time.perf_counter() - self._wall
        cpu = time.thread_time() - self._cpu
        # The timer still pending is late by now, however long the loop never came back to it.
        late = asyncio.get_running_loop().time() - self._due
        lags = [*self._lags, late * 1000] if late > 0 else self._lags
        if not lags or wall <= 0:
            return None
        return ClientLoad(
            loop_lag_mean_ms=round(stats.mean(lags) or 0.0, 3),
            loop_lag_p99_ms=round(stats.percentile(lags, 99) or 0.0, 3),
            loop_cpu_share=round(min(cpu / wall, 1.0), 3),
        )


class HttpBenchClient:
    """:class:`~pytest_specsel.core.protocol.BenchClient` over HTTP: one event loop, one
    connection per concurrent stream, kept alive across the round."""

    def __init__(
        self,
        clock: Clock = time.perf_counter,
        session: Callable[[str], Mapping[str, Any]] | None = None,
        retry: Retry = NO_RETRY,
    ) -> None:
        self._clock = clock
        #: per base URL: extra ``aiohttp.ClientSession`` arguments (headers) and the
        #: connector's ``ssl`` (a deployed endpoint's key and TLS settings; never written)
        self._session = session or (lambda _url: {})
        self._retry = retry

    def run(self, spec: ReplaySpec, hooks: ReplayHooks | None = None) -> ClientRun:
        return run_loop(self._run(spec, hooks or ReplayHooks()))

    async def _warmup(self, session: aiohttp.ClientSession, url: str, spec: ReplaySpec) -> None:
        """Not measured: ``spec.warmup`` waves of ``spec.concurrency`` requests at once, each
        asking for ``spec.warmup_tokens`` tokens; cycling is fine here, nothing is counted."""
        warm = spec.warmup_prompts or spec.prompts
        errors: list[str | None] = []
        for wave in range(spec.warmup):
            prompts = [warm[(wave * spec.concurrency + i) % len(warm)] for i in range(spec.concurrency)]
            payloads = [_payload(spec.model, p, spec.warmup_tokens, spec.temperature) for p in prompts]
            now = self._clock()
            done = await asyncio.gather(
                *(
                    stream_one(session, url, q, p, -1, now, self._clock, retry=self._retry)
                    for q, p in zip(payloads, prompts, strict=True)
                )
            )
            errors += [r.error for r in done if not r.ok]
        if spec.warmup and len(errors) == spec.warmup_requests:
            raise WarmupError(
                f"specsel: all {spec.warmup_requests} warmup requests to {url} failed; "
                f"first error: {errors[0]}"
            )

    async def _run(self, spec: ReplaySpec, hooks: ReplayHooks) -> ClientRun:
        url = spec.base_url.rstrip("/") + "/v1/chat/completions"
        # as httpx's was: no overall limit, 10 s to connect, spec.timeout_s between reads
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10.0, sock_read=spec.timeout_s)
        extra = dict(self._session(spec.base_url))
        ssl = extra.pop("ssl", True)
        connector = aiohttp.TCPConnector(limit=spec.concurrency + 1, ssl=ssl)
        sink = hooks.sink if hooks.sink is not None else []
        jobs = [(rep, p) for rep in range(spec.repeats) for p in spec.prompts]
        if spec.arrivals and len(spec.arrivals) != len(jobs):
            raise ValueError(f"specsel: {len(spec.arrivals)} arrival times for {len(jobs)} requests")
        due = dict(zip(jobs, spec.arrivals, strict=False))
        async with aiohttp.ClientSession(connector=connector, timeout=timeout, **extra) as session:
            await self._warmup(session, url, spec)
            gate = asyncio.Semaphore(spec.concurrency)
            done = 0
            if hooks.on_measured_start is not None:
                hooks.on_measured_start()
            probe = LoadProbe()
            probe.start()
            start = self._clock()

            async def one(rep: int, p: Prompt) -> None:
                nonlocal done
                payload = _payload(
                    spec.model, p, spec.max_tokens, spec.temperature, spec.top_logprobs, spec.ignore_eos
                )
                at = due.get((rep, p))
                if at is not None:  # open loop: wait for its arrival, then for a free slot under the cap
                    await asyncio.sleep(max(0.0, start + at - self._clock()))
                async with gate:
                    r = await stream_one(session, url, payload, p, rep, start, self._clock, sink, self._retry)
                sink.append(r if at is None else dataclasses.replace(r, scheduled_offset_s=at))
                done += 1
                if hooks.progress is not None:
                    hooks.progress(done, len(jobs))

            try:
                await asyncio.gather(*(one(rep, p) for rep, p in jobs))
            finally:
                load = probe.stop()
            duration = self._clock() - start
        order = {(rep, p.request_id): i for i, (rep, p) in enumerate(jobs)}
        ordered = sorted(sink, key=lambda r: order.get((r.repeat, r.request_id), len(order)))
        return ClientRun(tuple(ordered), spec.warmup_requests, duration, load)
