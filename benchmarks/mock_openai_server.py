"""An OpenAI-compatible streaming chat server of known timing, for measuring clients.

    python benchmarks/mock_openai_server.py --port 8123 --ttft-ms 20 --itl-ms 2 --tokens 64

Every ``POST /v1/chat/completions`` with ``"stream": true`` is answered as vLLM answers it:
the role arrives in the same chunk as the first token, one chunk per token, each carrying
``token_ids`` (vLLM's ``return_token_ids``), ``finish_reason`` on the last one, then a
usage chunk (``stream_options.include_usage``) and ``data: [DONE]``. Token ``i`` (0-based)
is sent at ``arrival + ttft + i * itl`` on the server's clock, scheduled against absolute
deadlines so that the gaps do not drift; these are the truth a client's TTFT and ITL are
compared with. The request's ``max_completion_tokens`` or ``max_tokens`` caps ``--tokens``.

Plain asyncio streams on uvloop, HTTP/1.1 keep-alive with chunked bodies: the server must
cost less than the clients it measures. ``GET /v1/models`` and ``GET /health`` answer too.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

from pytest_specsel.backends.vllm.client import run_loop

MODEL = "mock"


def _chunk(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


def _event(data: dict[str, object] | str) -> bytes:
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return _chunk(b"data: " + text.encode() + b"\n\n")


def _plain(status: str, body: dict[str, object]) -> bytes:
    data = json.dumps(body).encode()
    head = f"HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {len(data)}\r\n\r\n"
    return head.encode() + data


class MockServer:
    def __init__(self, ttft_s: float, itl_s: float, tokens: int) -> None:
        self.ttft_s, self.itl_s, self.tokens = ttft_s, itl_s, tokens
        self.served = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                arrival = time.perf_counter()
                lines = head.decode("latin-1").split("\r\n")
                method, path, _ = lines[0].split(" ", 2)
                fields = (h.partition(":") for h in lines[1:] if h)
                headers = {k.strip().lower(): v.strip() for k, _, v in fields}
                body = await reader.readexactly(int(headers.get("content-length", "0") or 0))
                if method == "GET":
                    listing = {"object": "list", "data": [{"id": MODEL, "object": "model"}]}
                    writer.write(_plain("200 OK", listing if path.startswith("/v1/models") else {}))
                elif method == "POST" and path.startswith("/v1/chat/completions"):
                    await self._stream(json.loads(body or b"{}"), arrival, writer)
                else:
                    writer.write(_plain("404 Not Found", {"error": f"no route {method} {path}"}))
                await writer.drain()
                if headers.get("connection", "").lower() == "close":
                    break
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _stream(self, request: dict[str, object], arrival: float, writer: asyncio.StreamWriter) -> None:
        model = str(request.get("model") or MODEL)
        asked = request.get("max_completion_tokens") or request.get("max_tokens") or self.tokens
        n = min(self.tokens, int(asked))  # type: ignore[call-overload]
        rid = f"chatcmpl-mock-{self.served}"
        self.served += 1
        writer.write(
            b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\n"
            b"transfer-encoding: chunked\r\n\r\n"
        )
        base = {"id": rid, "object": "chat.completion.chunk", "created": int(time.time()), "model": model}
        for i in range(n):
            delay = arrival + self.ttft_s + i * self.itl_s - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            delta: dict[str, object] = {"content": f" t{i}"}
            if i == 0:
                delta = {"role": "assistant", **delta}
            finish = "length" if i == n - 1 else None
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish, "token_ids": [i]}
            writer.write(_event({**base, "choices": [choice]}))
            await writer.drain()
        usage = {"prompt_tokens": 8, "completion_tokens": n, "total_tokens": 8 + n}
        writer.write(_event({**base, "choices": [], "usage": usage}))
        writer.write(_event("[DONE]") + _chunk(b""))


async def serve(host: str, port: int, server: MockServer) -> None:
    listener = await asyncio.start_server(server.handle, host, port, backlog=1024)
    print(f"mock: listening on http://{host}:{port}", flush=True)
    async with listener:
        await listener.serve_forever()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8123)
    parser.add_argument("--ttft-ms", type=float, default=20.0)
    parser.add_argument("--itl-ms", type=float, default=2.0)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    server = MockServer(args.ttft_ms / 1000, args.itl_ms / 1000, args.tokens)
    run_loop(serve(args.host, args.port, server))  # uvloop where installed, as the client


if __name__ == "__main__":
    main()
