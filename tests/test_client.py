"""The streaming client against a scripted transport and a scripted clock."""

import asyncio
import json
import time

import httpx
import pytest

from pytest_specsel.backends.client import HttpBenchClient
from pytest_specsel.backends.client import stream_one
from pytest_specsel.backends.protocol import ReplayHooks
from pytest_specsel.backends.protocol import ReplaySpec
from pytest_specsel.backends.protocol import WarmupError
from pytest_specsel.workloads import Prompt

SSE_HEADERS = {"content-type": "text/event-stream"}


class ScriptedClock:
    """Each call returns the next scripted time."""

    def __init__(self, times):
        self.times = list(times)
        self.calls = 0

    def __call__(self):
        value = self.times[min(self.calls, len(self.times) - 1)]
        self.calls += 1
        return value


def sse(*chunks, done=True):
    body = "".join(f"data: {json.dumps(c)}\n\n" for c in chunks)
    if done:
        body += "data: [DONE]\n\n"
    return body.encode()


def content(text, ids=None, finish=None):
    choice = {"index": 0, "delta": {"content": text}, "finish_reason": finish}
    if ids is not None:
        choice["token_ids"] = ids
    return {"choices": [choice]}


def usage(n):
    return {"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": n}}


def transport(body, status=200, seen=None):
    def handler(request):
        if seen is not None:
            seen.append(json.loads(request.content))
        return httpx.Response(status, content=body, headers=SSE_HEADERS)

    return httpx.MockTransport(handler)


async def _one(body, clock, status=200):
    async with httpx.AsyncClient(transport=transport(body, status)) as client:
        return await stream_one(client, "http://x/v1/chat/completions", {}, Prompt("r1", "p"), 0, 0.0, clock)


def test_latency_minus_ttft_is_the_sum_of_inter_token_latencies():
    body = sse(content("A", [1]), content("B", [2]), content("C D", [3, 4], "stop"), usage(4))
    # start, chunk A, chunk B, chunk CD, usage (same instant as the last chunk)
    clock = ScriptedClock([10.0, 10.2, 10.25, 10.4, 10.4])
    r = asyncio.run(_one(body, clock))
    assert r.ok and r.output_text == "ABC D" and r.token_ids == (1, 2, 3, 4)
    assert r.ttft_ms == pytest.approx(200.0)
    assert r.itl_ms == pytest.approx((50.0, 150.0))
    assert r.e2e_ms - r.ttft_ms == pytest.approx(sum(r.itl_ms))
    assert r.output_tokens == 4 and r.tpot_ms == pytest.approx(200.0 / 3)


def test_a_usage_chunk_after_the_last_token_extends_e2e_by_its_gap():
    body = sse(content("A", [1]), content("B", [2], "stop"), usage(2))
    r = asyncio.run(_one(body, ScriptedClock([0.0, 0.1, 0.3, 0.35])))
    assert r.e2e_ms - r.ttft_ms - sum(r.itl_ms) == pytest.approx(50.0)


def test_an_empty_stream_is_an_error():
    r = asyncio.run(_one(sse(usage(0)), ScriptedClock([0.0, 1.0])))
    assert r.error == "empty stream: the server sent no content"
    assert not r.ok and r.e2e_ms is None


def test_missing_usage_is_an_error_not_a_guess():
    r = asyncio.run(_one(sse(content("A", [1], "stop")), ScriptedClock([0.0, 0.1])))
    assert r.error == "no usage: the server did not report completion_tokens"
    assert r.output_tokens is None


def test_http_errors_are_data():
    r = asyncio.run(_one(b'{"error": "model not found"}', ScriptedClock([0.0]), status=404))
    assert r.error.startswith("HTTP 404: ") and "model not found" in r.error


def test_a_server_error_event_is_data():
    r = asyncio.run(_one(sse({"error": {"message": "boom"}}), ScriptedClock([0.0, 0.1])))
    assert r.error == "server error: {'message': 'boom'}"


def test_cancel_keeps_the_partial_stream():
    arrived = asyncio.Event()

    async def body():
        yield f"data: {json.dumps(content('Hel', [1]))}\n\n".encode()
        yield f"data: {json.dumps(content('lo', [2]))}\n\n".encode()
        arrived.set()
        await asyncio.sleep(3600)

    async def main():
        sink = []
        tp = httpx.MockTransport(lambda request: httpx.Response(200, content=body(), headers=SSE_HEADERS))
        async with httpx.AsyncClient(transport=tp) as client:
            task = asyncio.create_task(
                stream_one(
                    client,
                    "http://x",
                    {},
                    Prompt("r1", "p"),
                    0,
                    0.0,
                    ScriptedClock([0.0, 0.1, 0.2, 0.3]),
                    sink,
                )
            )
            await asyncio.wait_for(arrived.wait(), 5)
            await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        return sink

    sink = asyncio.run(main())
    assert len(sink) == 1
    assert (sink[0].output_text, sink[0].error, sink[0].token_ids) == ("Hello", "cancelled", (1, 2))


def run_client(client, prompts, on_measured_start=None, **overrides):
    """``client.run`` with the settings most tests share; a test overrides what it is about."""
    settings = dict(concurrency=1, warmup=0, repeats=1, max_tokens=8, temperature=0.0, timeout_s=5)
    spec = ReplaySpec("http://x", "m", tuple(prompts), **{**settings, **overrides})
    return client.run(spec, ReplayHooks(on_measured_start=on_measured_start))


class TestRun:
    prompts = [Prompt(f"r{i}", f"prompt {i}") for i in range(3)]

    def test_each_prompt_once_per_repeat_in_order_with_warmup_excluded(self):
        seen = []
        client = HttpBenchClient(transport=transport(sse(content("x", [7]), usage(1)), seen=seen))
        run = run_client(client, self.prompts, concurrency=2, warmup=2, repeats=2)
        assert [(r.repeat, r.request_id) for r in run.requests] == [
            (0, "r0"),
            (0, "r1"),
            (0, "r2"),
            (1, "r0"),
            (1, "r1"),
            (1, "r2"),
        ]
        assert len(seen) == 2 + 6 and run.warmup_requests == 2
        assert {s["temperature"] for s in seen} == {0.0}
        assert seen[0]["stream"] is True and seen[0]["stream_options"] == {"include_usage": True}
        assert seen[0]["max_tokens"] == 8

    def test_the_measured_window_opens_after_warmup(self):
        seen = []
        events = []

        def handler(request):
            events.append(f"request {len(seen)}")
            seen.append(request)
            return httpx.Response(200, content=sse(content("x"), usage(1)), headers=SSE_HEADERS)

        client = HttpBenchClient(transport=httpx.MockTransport(handler))
        run_client(client, self.prompts, warmup=2, on_measured_start=lambda: events.append("window"))
        assert events == ["request 0", "request 1", "window", "request 2", "request 3", "request 4"]

    def test_a_prompts_own_max_tokens_wins(self):
        seen = []
        client = HttpBenchClient(transport=transport(sse(content("x"), usage(1)), seen=seen))
        run_client(client, [Prompt("a", "p", max_tokens=3)])
        assert seen[0]["max_tokens"] == 3

    def test_all_warmups_failing_stops_the_run(self):
        client = HttpBenchClient(transport=transport(b"nope", status=500))
        with pytest.raises(WarmupError, match="all 2 warmup requests .* failed; first error: HTTP 500"):
            run_client(client, self.prompts, warmup=2)

    def test_concurrency_is_bounded(self):
        active, peak = 0, 0

        async def body():
            nonlocal active, peak
            active += 1
            peak = max(peak, active)
            await asyncio.sleep(0.02)
            active -= 1
            yield sse(content("x"), usage(1))

        client = HttpBenchClient(
            transport=httpx.MockTransport(lambda r: httpx.Response(200, content=body(), headers=SSE_HEADERS))
        )
        prompts = [Prompt(f"r{i}", "p") for i in range(8)]
        run = run_client(client, prompts, concurrency=3)
        assert len(run.requests) == 8 and all(r.ok for r in run.requests)
        assert peak == 3


def test_warmup_sends_the_warmup_prompts_never_the_measured_ones():
    seen = []
    client = HttpBenchClient(transport=transport(sse(content("x"), usage(1)), seen=seen))
    measured = [Prompt("m1", "measured one")]
    spec = ReplaySpec(
        "http://x", "m", tuple(measured), 1, 3, 1, 8, 0.0, 5, (Prompt("w1", "warm a"), Prompt("w2", "warm b"))
    )
    client.run(spec)
    assert [s["messages"][0]["content"] for s in seen] == ["warm a", "warm b", "warm a", "measured one"]


def _timed_stream(hold):
    """A transport whose every response sends 6 chunks, calling ``hold()`` before each."""

    async def body():
        for i in range(6):
            await hold()
            yield sse(content("x", [i]), done=False)
        yield sse(usage(6))

    return httpx.MockTransport(lambda r: httpx.Response(200, content=body(), headers=SSE_HEADERS))


class TestClientLoad:
    """The client measures its own event loop over the measured window, so a round can say
    when the client, not the server, may have shaped its figures."""

    prompts = [Prompt(f"r{i}", "p") for i in range(4)]

    def test_a_client_waiting_on_the_server_is_not_saturated(self):
        async def wait():
            await asyncio.sleep(0.02)

        run = run_client(HttpBenchClient(transport=_timed_stream(wait)), self.prompts, concurrency=2)
        load = run.client_load
        assert load is not None and load.loop_cpu_share < 0.5
        assert not load.saturated(itl_p50_ms=20.0)

    @pytest.mark.parametrize("hands_back", [True, False], ids=["hands-back", "never-hands-back"])
    def test_a_loop_blocked_between_chunks_shows_as_lag(self, hands_back):
        async def block():
            time.sleep(0.02)  # stands for work that holds the loop (parsing, too many streams)
            if hands_back:
                await asyncio.sleep(0)  # a read hands the loop back, as a socket's would

        run = run_client(HttpBenchClient(transport=_timed_stream(block)), self.prompts, concurrency=2)
        load = run.client_load
        assert load is not None and load.loop_lag_mean_ms > 5 and load.loop_lag_p99_ms >= 15
        assert load.saturated(itl_p50_ms=20.0)

    def test_a_loop_busy_computing_shows_as_its_cpu_share(self):
        async def spin():
            end = time.perf_counter() + 0.02
            while time.perf_counter() < end:
                pass
            await asyncio.sleep(0)

        run = run_client(HttpBenchClient(transport=_timed_stream(spin)), self.prompts, concurrency=2)
        assert run.client_load is not None and run.client_load.loop_cpu_share > 0.9
        assert run.client_load.saturated(itl_p50_ms=1000.0)


def test_a_saturated_client_flags_its_round():
    from pytest_specsel.measurement import ClientLoad
    from pytest_specsel.measurement import Round
    from pytest_specsel.records import Role

    def flags(load):
        return Round(Role.CANDIDATE, 0, (), 1.0, None, None, None, client_load=load).flags

    assert flags(ClientLoad(0.2, 0.5, 0.95)) == ("client_saturated",)  # busy loop
    assert flags(ClientLoad(3.0, 9.0, 0.3)) == ("client_saturated",)  # late beyond 1 ms (no ITL known)
    assert flags(ClientLoad(0.5, 2.0, 0.3)) == ()
    assert flags(None) == ()
    assert ClientLoad(3.0, 9.0, 0.3).saturated(itl_p50_ms=50.0) is False  # 3 ms is 6 % of a 50 ms gap
    assert ClientLoad(6.0, 9.0, 0.3).saturated(itl_p50_ms=50.0) is True
