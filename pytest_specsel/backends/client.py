"""Streaming OpenAI-compatible chat client (httpx + httpx-sse) with per-request timings.

Each frozen prompt is sent once per repeat; warmup requests come first and are not
measured; concurrency is bounded by a semaphore; token counts come from the server's
``usage``. Failure is data (``RequestRecord.error``). Timings use an injected monotonic
clock (``time.perf_counter`` by default), never the wall clock.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
from httpx_sse import aconnect_sse

from pytest_specsel import stats
from pytest_specsel.backends.protocol import ClientRun
from pytest_specsel.backends.protocol import ReplayHooks
from pytest_specsel.backends.protocol import ReplaySpec
from pytest_specsel.backends.protocol import WarmupError
from pytest_specsel.measurement import ClientLoad
from pytest_specsel.measurement import RequestRecord
from pytest_specsel.measurement import TokenLogprob
from pytest_specsel.workloads import Prompt

__all__ = ["HttpBenchClient", "stream_one"]

Clock = Callable[[], float]


def _payload(
    model: str, prompt: Prompt, max_tokens: int, temperature: float, top_logprobs: int | None = None
) -> dict[str, Any]:
    extra: dict[str, Any] = {"logprobs": True, "top_logprobs": top_logprobs} if top_logprobs else {}
    return extra | {
        "model": model,
        "messages": [{"role": "user", "content": prompt.prompt}],
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


async def stream_one(
    client: httpx.AsyncClient,
    url: str,
    payload: dict[str, Any],
    prompt: Prompt,
    repeat: int,
    scenario_start: float,
    clock: Clock = time.perf_counter,
    sink: list[RequestRecord] | None = None,
) -> RequestRecord:
    """Send one streaming request and time it.

    On cancellation the partial record (what arrived, with ``error="cancelled"``) is
    appended to ``sink`` before the ``CancelledError`` propagates.
    """
    start = clock()
    ttft: float | None = None
    last: float | None = None
    #: time of the last event (content or usage): E2E ends there, as in vLLM's bench
    last_event: float | None = None
    itl: list[float] = []
    text: list[str] = []
    token_ids: list[int] = []
    logprobs: list[TokenLogprob] = []
    got_ids = False
    usage: dict[str, Any] = {}
    finish: str | None = None
    error: str | None = None

    def record(err: str | None) -> RequestRecord:
        end = last_event if last_event is not None else clock()
        return RequestRecord(
            request_id=prompt.request_id,
            repeat=repeat,
            prompt=prompt.prompt,
            output_text="".join(text),
            start_offset_s=start - scenario_start,
            ttft_ms=None if ttft is None else (ttft - start) * 1000,
            itl_ms=tuple(itl),
            e2e_ms=(end - start) * 1000 if err is None else None,
            prompt_tokens=usage.get("prompt_tokens"),
            output_tokens=usage.get("completion_tokens"),
            token_ids=tuple(token_ids) if got_ids else None,
            logprobs=tuple(logprobs) if logprobs else None,
            finish_reason=finish,
            error=err,
        )

    try:
        async with aconnect_sse(client, "POST", url, json=payload) as source:
            response = source.response
            if response.status_code != 200:
                body = (await response.aread()).decode("utf-8", "replace")[:500]
                return record(f"HTTP {response.status_code}: {body}")
            async for event in source.aiter_sse():
                if event.data == "[DONE]":
                    break
                chunk = json.loads(event.data)
                if "error" in chunk:
                    error = f"server error: {chunk['error']}"
                    break
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    last_event = clock()
                for choice in chunk.get("choices") or ():
                    delta = (choice.get("delta") or {}).get("content") or ""
                    logprobs.extend(_token_logprobs(choice.get("logprobs")))
                    ids = choice.get("token_ids")
                    if ids is not None:
                        got_ids = True
                        token_ids.extend(ids)
                    if choice.get("finish_reason"):
                        finish = choice["finish_reason"]
                    if not delta and not ids:
                        continue
                    now = clock()
                    last_event = now
                    if ttft is None:
                        ttft = now
                    elif last is not None:
                        itl.append((now - last) * 1000)
                    last = now
                    text.append(delta)
    except asyncio.CancelledError:
        if sink is not None:
            sink.append(record("cancelled"))
        raise
    except (httpx.HTTPError, json.JSONDecodeError) as exc:
        return record(f"{type(exc).__name__}: {exc}")
    if error is None and ttft is None:
        error = "empty stream: the server sent no content"
    if error is None and usage.get("completion_tokens") is None:
        error = "no usage: the server did not report completion_tokens"
    return record(error)


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
    """:class:`~pytest_specsel.backends.protocol.BenchClient` over HTTP."""

    def __init__(
        self,
        clock: Clock = time.perf_counter,
        transport: httpx.AsyncBaseTransport | None = None,
    ) -> None:
        self._clock = clock
        self._transport = transport

    def run(self, spec: ReplaySpec, hooks: ReplayHooks | None = None) -> ClientRun:
        return asyncio.run(self._run(spec, hooks or ReplayHooks()))

    async def _warmup(self, client: httpx.AsyncClient, url: str, spec: ReplaySpec) -> None:
        """Sequential, not measured; cycling is fine here, nothing is counted."""
        errors = []
        warm = spec.warmup_prompts or spec.prompts
        for i in range(spec.warmup):
            p = warm[i % len(warm)]
            payload = _payload(spec.model, p, spec.max_tokens, spec.temperature)
            r = await stream_one(client, url, payload, p, -1, self._clock(), self._clock)
            if not r.ok:
                errors.append(r.error)
        if spec.warmup and len(errors) == spec.warmup:
            raise WarmupError(
                f"specsel: all {spec.warmup} warmup requests to {url} failed; first error: {errors[0]}"
            )

    async def _run(self, spec: ReplaySpec, hooks: ReplayHooks) -> ClientRun:
        url = spec.base_url.rstrip("/") + "/v1/chat/completions"
        timeout = httpx.Timeout(spec.timeout_s, connect=10.0)
        limits = httpx.Limits(max_connections=spec.concurrency + 1)
        sink = hooks.sink if hooks.sink is not None else []
        jobs = [(rep, p) for rep in range(spec.repeats) for p in spec.prompts]
        async with httpx.AsyncClient(timeout=timeout, limits=limits, transport=self._transport) as client:
            await self._warmup(client, url, spec)
            gate = asyncio.Semaphore(spec.concurrency)
            done = 0
            if hooks.on_measured_start is not None:
                hooks.on_measured_start()
            probe = LoadProbe()
            probe.start()
            start = self._clock()

            async def one(rep: int, p: Prompt) -> None:
                nonlocal done
                payload = _payload(spec.model, p, spec.max_tokens, spec.temperature, spec.top_logprobs)
                async with gate:
                    r = await stream_one(client, url, payload, p, rep, start, self._clock, sink)
                sink.append(r)
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
        return ClientRun(tuple(ordered), spec.warmup, duration, load)
