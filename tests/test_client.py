"""The streaming client against a scripted local HTTP server and a scripted clock."""

import asyncio
import json
import threading
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer

import aiohttp
import pytest

from pytest_specsel.backends.vllm.client import HttpBenchClient
from pytest_specsel.backends.vllm.client import SseSplitter
from pytest_specsel.backends.vllm.client import stream_one
from pytest_specsel.core.measurement import ClientLoad
from pytest_specsel.core.measurement import Round
from pytest_specsel.core.protocol import ReplayHooks
from pytest_specsel.core.protocol import ReplaySpec
from pytest_specsel.core.protocol import WarmupError
from pytest_specsel.core.records import Role
from pytest_specsel.core.workloads import Prompt


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


class ScriptedServer:
    """A real HTTP server on localhost (threads) answering every POST from a script:
    ``respond(request_json)`` returns ``(status, parts)``, each part ``bytes`` or a number of
    seconds to wait before the next. Requests are recorded in ``seen``; ``active``/``peak``
    count streams open at once."""

    def __init__(self):
        self.respond = lambda request: (200, [sse(content("x", [7]), usage(1))])
        self.seen = []
        self.active = self.peak = 0
        self.stop = threading.Event()
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["content-length"])))
                with owner._lock:
                    owner.seen.append(body)
                    owner.active += 1
                    owner.peak = max(owner.peak, owner.active)
                try:
                    status, parts = owner.respond(body)
                    kind = "text/event-stream" if status == 200 else "application/json"
                    self.send_response(status)
                    self.send_header("content-type", kind)
                    self.end_headers()
                    for part in parts:
                        if isinstance(part, bytes):
                            self.wfile.write(part)
                            self.wfile.flush()
                        elif owner.stop.wait(part):
                            return
                finally:
                    with owner._lock:
                        owner.active -= 1

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, args=(0.01,), daemon=True).start()

    def answer(self, body, status=200):
        self.respond = lambda request: (status, [body])

    def close(self):
        if self.stop.is_set():
            return
        self.stop.set()
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = ScriptedServer()
    yield s
    s.close()


async def _stream(server, clock, sink=None):
    async with aiohttp.ClientSession() as session:
        return await stream_one(
            session, server.url + "/v1/chat/completions", {}, Prompt("r1", "p"), 0, 0.0, clock, sink
        )


def _one(server, body, clock, status=200):
    server.answer(body, status)
    return asyncio.run(_stream(server, clock))


def test_latency_minus_ttft_is_the_sum_of_inter_token_latencies(server):
    body = sse(content("A", [1]), content("B", [2]), content("C D", [3, 4], "stop"), usage(4))
    # start, chunk A, chunk B, chunk CD, usage (same instant as the last chunk)
    clock = ScriptedClock([10.0, 10.2, 10.25, 10.4, 10.4])
    r = _one(server, body, clock)
    assert r.ok and r.output_text == "ABC D" and r.token_ids == (1, 2, 3, 4)
    assert r.ttft_ms == pytest.approx(200.0)
    assert r.itl_ms == pytest.approx((50.0, 150.0))
    assert r.e2e_ms - r.ttft_ms == pytest.approx(sum(r.itl_ms))
    assert r.output_tokens == 4 and r.tpot_ms == pytest.approx(200.0 / 3)


def test_the_prompt_as_the_server_tokenized_it_is_kept_and_its_chunk_is_not_the_first_token(server):
    """vLLM sends the prompt's ids once, in the first (role) chunk, with return_token_ids: an
    offline agreement check reads the exact prompt the server saw from them."""
    role = {"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}
    role["prompt_token_ids"] = [1, 9, 9, 2]
    body = sse(role, content("A", [5]), content("B", [6], "stop"), usage(2))
    clock = ScriptedClock([10.0, 10.3, 10.4, 10.4])  # start, A, B, usage: the role chunk is not timed
    r = _one(server, body, clock)
    assert r.prompt_token_ids == (1, 9, 9, 2) and r.token_ids == (5, 6)
    assert r.ttft_ms == pytest.approx(300.0)


def test_a_usage_chunk_after_the_last_token_extends_e2e_by_its_gap(server):
    body = sse(content("A", [1]), content("B", [2], "stop"), usage(2))
    r = _one(server, body, ScriptedClock([0.0, 0.1, 0.3, 0.35]))
    assert r.e2e_ms - r.ttft_ms - sum(r.itl_ms) == pytest.approx(50.0)


def test_an_empty_stream_is_an_error(server):
    r = _one(server, sse(usage(0)), ScriptedClock([0.0, 1.0]))
    assert r.error == "empty stream: the server sent no content"
    assert not r.ok and r.e2e_ms is None


def test_missing_usage_is_an_error_not_a_guess(server):
    r = _one(server, sse(content("A", [1], "stop")), ScriptedClock([0.0, 0.1]))
    assert r.error == "no usage: the server did not report completion_tokens"
    assert r.output_tokens is None


def test_http_errors_are_data(server):
    r = _one(server, b'{"error": "model not found"}', ScriptedClock([0.0]), status=404)
    assert r.error.startswith("HTTP 404: ") and "model not found" in r.error


def test_a_server_error_event_is_data(server):
    r = _one(server, sse({"error": {"message": "boom"}}), ScriptedClock([0.0, 0.1]))
    assert r.error == "server error: {'message': 'boom'}"


def test_a_connection_refused_is_data(server):
    server.close()
    r = asyncio.run(_stream(server, ScriptedClock([0.0])))
    assert r.error.startswith("ClientConnectorError") and not r.ok


def test_events_split_anywhere_in_the_byte_stream_are_reassembled(server):
    # one byte at a time, CRLF line ends, a comment and a two-line data field
    body = sse(content("A", [1]), content("B", [2], "stop"), usage(2)).replace(b"\n", b"\r\n")
    body = b": keep-alive\r\n\r\n" + body
    server.respond = lambda request: (200, [body[i : i + 1] for i in range(len(body))])
    r = asyncio.run(_stream(server, ScriptedClock([0.0, 0.1, 0.2, 0.3])))
    assert r.ok and r.output_text == "AB" and r.output_tokens == 2
    splitter = SseSplitter()
    assert splitter.feed(b"data: a\ndata:b\n") == [] and splitter.feed(b"\nid: 3\n\n") == ["a\nb"]


def test_cancel_keeps_the_partial_stream(server):
    first = sse(content("Hel", [1]), done=False) + sse(content("lo", [2]), done=False)
    server.respond = lambda request: (200, [first, 3600])

    clock = ScriptedClock([0.0, 0.1, 0.2, 0.3])

    async def main():
        sink = []
        task = asyncio.create_task(_stream(server, clock, sink))
        for _ in range(500):  # until both chunks are in: the clock was read at the start and at each
            await asyncio.sleep(0.01)
            if clock.calls >= 3:
                break
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return sink

    sink = asyncio.run(main())
    assert len(sink) == 1
    assert (sink[0].output_text, sink[0].error, sink[0].token_ids) == ("Hello", "cancelled", (1, 2))


def run_client(client, server, prompts, on_measured_start=None, **overrides):
    """``client.run`` with the settings most tests share; a test overrides what it is about."""
    settings = dict(concurrency=1, warmup=0, repeats=1, max_tokens=8, temperature=0.0, timeout_s=5)
    spec = ReplaySpec(server.url, "m", tuple(prompts), **{**settings, **overrides})
    return client.run(spec, ReplayHooks(on_measured_start=on_measured_start))


class TestRun:
    prompts = [Prompt(f"r{i}", f"prompt {i}") for i in range(3)]

    def test_each_prompt_once_per_repeat_in_order_with_warmup_excluded(self, server):
        run = run_client(HttpBenchClient(), server, self.prompts, concurrency=2, warmup=2, repeats=2)
        assert [(r.repeat, r.request_id) for r in run.requests] == [
            (0, "r0"),
            (0, "r1"),
            (0, "r2"),
            (1, "r0"),
            (1, "r1"),
            (1, "r2"),
        ]
        seen = server.seen
        # warm-up: 2 waves of 2 (the round's concurrency)
        assert len(seen) == 4 + 6 and run.warmup_requests == 4
        assert {s["temperature"] for s in seen} == {0.0}
        assert seen[0]["stream"] is True and seen[0]["stream_options"] == {"include_usage": True}
        assert seen[0]["max_tokens"] == 8 and seen[0]["return_token_ids"] is True

    def test_the_measured_window_opens_after_warmup(self, server):
        events = []

        def respond(request):
            events.append(f"request {len(server.seen) - 1}")
            return 200, [sse(content("x"), usage(1))]

        server.respond = respond
        run_client(
            HttpBenchClient(),
            server,
            self.prompts,
            warmup=2,
            on_measured_start=lambda: events.append("window"),
        )
        assert events == ["request 0", "request 1", "window", "request 2", "request 3", "request 4"]

    def test_a_prompts_own_max_tokens_wins(self, server):
        run_client(HttpBenchClient(), server, [Prompt("a", "p", max_tokens=3)])
        assert server.seen[0]["max_tokens"] == 3

    def test_all_warmups_failing_stops_the_run(self, server):
        server.answer(b"nope", status=500)
        with pytest.raises(WarmupError, match="all 2 warmup requests .* failed; first error: HTTP 500"):
            run_client(HttpBenchClient(), server, self.prompts, warmup=2)

    def test_concurrency_is_bounded(self, server):
        server.respond = lambda request: (200, [0.05, sse(content("x"), usage(1))])
        prompts = [Prompt(f"r{i}", "p") for i in range(8)]
        run = run_client(HttpBenchClient(), server, prompts, concurrency=3)
        assert len(run.requests) == 8 and all(r.ok for r in run.requests)
        assert server.peak == 3


def test_warmup_runs_waves_at_the_rounds_concurrency_with_few_tokens(server):
    """A round at concurrency C warms the batch it will run: each wave is C requests at
    once, each asking for ``warmup_max_tokens`` (the measured requests keep max_tokens)."""
    server.respond = lambda request: (200, [0.05, sse(content("x"), usage(1))])
    warm = tuple(Prompt(f"w{i}", f"warm {i}") for i in range(4))
    spec = ReplaySpec(
        server.url, "m", (Prompt("m1", "measured"),), 3, 2, 1, 48, 0.0, 5, warm, warmup_max_tokens=4
    )
    run = HttpBenchClient().run(spec)
    assert run.warmup_requests == 6 and len(server.seen) == 7
    assert [s["max_tokens"] for s in server.seen] == [4] * 6 + [48]
    assert server.peak == 3  # a wave's requests were in flight together


def test_warmup_sends_the_warmup_prompts_never_the_measured_ones(server):
    measured = [Prompt("m1", "measured one")]
    spec = ReplaySpec(
        server.url, "m", tuple(measured), 1, 3, 1, 8, 0.0, 5, (Prompt("w1", "warm a"), Prompt("w2", "warm b"))
    )
    HttpBenchClient().run(spec)
    assert [s["messages"][0]["content"] for s in server.seen] == [
        "warm a",
        "warm b",
        "warm a",
        "measured one",
    ]


class TestClientLoad:
    """The client measures its own event loop over the measured window, so a round can say
    when the client, not the server, may have shaped its figures. The clock, called as each
    chunk arrives, stands for the client's own work per chunk."""

    prompts = [Prompt(f"r{i}", "p") for i in range(4)]

    @pytest.fixture(autouse=True)
    def _paced(self, server):
        stream = [sse(content("x", [i]), done=False) for i in range(6)]
        parts = [p for chunk in stream for p in (0.02, chunk)] + [sse(usage(6))]
        server.respond = lambda request: (200, parts)

    def test_a_client_waiting_on_the_server_is_not_saturated(self, server):
        run = run_client(HttpBenchClient(), server, self.prompts, concurrency=2)
        load = run.client_load
        assert load is not None and load.loop_cpu_share < 0.5
        assert not load.saturated(itl_p50_ms=20.0)

    def test_a_loop_blocked_at_each_chunk_shows_as_lag(self, server):
        def blocking_clock():
            time.sleep(0.02)  # work that holds the loop without using the CPU (a blocking call)
            return time.perf_counter()

        run = run_client(HttpBenchClient(blocking_clock), server, self.prompts, concurrency=2)
        load = run.client_load
        assert load is not None and load.loop_lag_mean_ms > 5 and load.loop_lag_p99_ms >= 15
        assert load.loop_cpu_share < 0.5 and load.saturated(itl_p50_ms=20.0)

    def test_a_loop_busy_computing_shows_as_its_cpu_share(self, server):
        def spinning_clock():
            end = time.perf_counter() + 0.03
            while time.perf_counter() < end:
                pass
            return time.perf_counter()

        idle = run_client(HttpBenchClient(), server, self.prompts, concurrency=2).client_load
        busy = run_client(HttpBenchClient(spinning_clock), server, self.prompts, concurrency=2).client_load
        # alone on a core the share is near 1.0; a shared machine lowers both runs alike
        assert idle is not None and busy is not None
        assert busy.loop_cpu_share > 3 * idle.loop_cpu_share and busy.loop_cpu_share > 0.3


def test_a_saturated_client_flags_its_round():
    def flags(load):
        return Round(Role.CANDIDATE, 0, (), 1.0, None, None, None, client_load=load).flags

    assert flags(ClientLoad(0.2, 0.5, 0.95)) == ("client_saturated",)  # busy loop
    assert flags(ClientLoad(3.0, 9.0, 0.3)) == ("client_saturated",)  # late beyond 1 ms (no ITL known)
    assert flags(ClientLoad(0.5, 2.0, 0.3)) == ()
    assert flags(None) == ()
    assert ClientLoad(3.0, 9.0, 0.3).saturated(itl_p50_ms=50.0) is False  # 3 ms is 6 % of a 50 ms gap
    assert ClientLoad(6.0, 9.0, 0.3).saturated(itl_p50_ms=50.0) is True


def test_an_open_loop_round_sends_each_request_at_its_scheduled_time_under_the_cap(server):
    """Arrivals at 0, 0.2, 0.4 s with a cap of 1 and answers of 0.3 s: the second waits for
    the first to finish (sent late, at ~0.3 s), the third is sent on time; each record keeps
    its scheduled time, and ignore_eos reaches the server."""
    server.respond = lambda request: (200, [0.3, sse(content("x"), usage(1))])
    prompts = tuple(Prompt(f"r{i}", "p") for i in range(3))
    spec = ReplaySpec(
        server.url,
        "m",
        prompts,
        1,
        0,
        1,
        8,
        0.0,
        5,
        arrivals=(0.0, 0.2, 0.65),
        request_rate=5.0,
        ignore_eos=True,
    )
    run = HttpBenchClient().run(spec)
    sent = {r.request_id: r.start_offset_s for r in run.requests}
    assert [r.scheduled_offset_s for r in run.requests] == [0.0, 0.2, 0.65]
    assert sent["r0"] < 0.1
    assert 0.28 < sent["r1"] < 0.45  # held by the cap of 1, not sent at 0.2
    assert 0.64 < sent["r2"] < 0.8  # on schedule: the slot was free
    assert all(s["ignore_eos"] is True for s in server.seen)


def test_arrival_times_that_do_not_match_the_requests_are_refused(server):
    spec = ReplaySpec(server.url, "m", (Prompt("r0", "p"),), 1, 0, 1, 8, 0.0, 5, arrivals=(0.0, 1.0))
    with pytest.raises(ValueError, match="2 arrival times for 1 requests"):
        HttpBenchClient().run(spec)
