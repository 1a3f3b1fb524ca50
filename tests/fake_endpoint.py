"""An OpenAI-compatible server in a thread, speaking as a deployed vLLM endpoint does:
``/v1/models``, ``/version``, ``/metrics`` (its own request and token counters, spec-decode
counters when it speculates, ``vllm:cache_config_info``) and streaming chat completions with
token ids, log-probabilities and usage. Knobs make it misbehave the ways a deployment can.

A "gateway" spreads requests over ``replicas`` counter sets, each with its own metrics page
(``/metrics/0``, ``/metrics/1``); ``/metrics`` then shows the first replica only.
"""

from __future__ import annotations

import dataclasses
import json
import math
import threading
import time
from http.server import BaseHTTPRequestHandler
from http.server import ThreadingHTTPServer


@dataclasses.dataclass
class Counters:
    requests: int = 0
    prompt_tokens: int = 0
    generation_tokens: int = 0
    drafts: int = 0
    draft_tokens: int = 0
    accepted: int = 0
    per_pos: list[int] = dataclasses.field(default_factory=list)


@dataclasses.dataclass
class Knobs:
    model: str = "fake/target"
    root: str = "/models/fake-target"
    #: proposal length; 0: a target-only server (no spec-decode counters)
    k: int = 0
    #: seconds per streamed token
    token_s: float = 0.002
    version: str | None = "0.32.0"
    metrics: bool = True
    #: answer every n-th chat request with 429 (0: never)
    throttle: int = 0
    api_key: str | None = None
    #: shift every log-probability by this much (a different target: > epsilon)
    logprob_shift: float = 0.0
    #: the shift only on the first n chat requests (0: on every one): a batch that moved once
    shift_requests: int = 0
    #: a different first token: another model
    other_model: bool = False
    replicas: int = 1
    #: extra requests the counters count that this client never sent (another client)
    phantom_requests: int = 0
    #: a DCGM-style framebuffer gauge per GPU, in MiB (empty: none exported)
    fb_used_mib: tuple[float, ...] = ()


class FakeEndpoint:
    def __init__(self, knobs: Knobs | None = None) -> None:
        self.knobs = knobs or Knobs()
        self.replicas = [Counters(per_pos=[0] * self.knobs.k) for _ in range(self.knobs.replicas)]
        self.lock = threading.Lock()
        self.seen_auth: list[str | None] = []
        self.throttled = 0
        self.posts = 0
        self.chat_requests = 0
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> FakeEndpoint:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    # -- what it says --------------------------------------------------------------
    def metrics_text(self, replica: int) -> str:
        c, k = self.replicas[replica], self.knobs.k
        lines = [
            "# TYPE vllm:request_success counter",
            f'vllm:request_success_total{{finished_reason="length",model_name="m"}} {c.requests}',
            "# TYPE vllm:prompt_tokens counter",
            f'vllm:prompt_tokens_total{{model_name="m"}} {c.prompt_tokens}',
            "# TYPE vllm:generation_tokens counter",
            f'vllm:generation_tokens_total{{model_name="m"}} {c.generation_tokens}',
            "# TYPE vllm:cache_config_info gauge",
            'vllm:cache_config_info{block_size="16",num_gpu_blocks="100"} 1.0',
            *(["# TYPE DCGM_FI_DEV_FB_USED gauge"] if self.knobs.fb_used_mib else []),
            *(f'DCGM_FI_DEV_FB_USED{{gpu="{i}"}} {v}' for i, v in enumerate(self.knobs.fb_used_mib)),
        ]
        if k:
            lines += [
                "# TYPE vllm:spec_decode_num_drafts counter",
                f'vllm:spec_decode_num_drafts_total{{engine="0"}} {c.drafts}',
                "# TYPE vllm:spec_decode_num_draft_tokens counter",
                f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {c.draft_tokens}',
                "# TYPE vllm:spec_decode_num_accepted_tokens counter",
                f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {c.accepted}',
                "# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter",
                *(
                    f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {n}'
                    for i, n in enumerate(c.per_pos)
                ),
            ]
        return "\n".join(lines) + "\n"

    def tokens(self, prompt: str, n: int) -> list[tuple[str, float, list[tuple[str, float]]]]:
        """n deterministic tokens of a prompt, each with its log-probability and top five."""
        words = [w for w in prompt.replace(",", " ").split() if w] or ["x"]
        out = []
        for i in range(n):
            token = words[i % len(words)] + ("!" if self.knobs.other_model and i == 0 else "")
            shifted = not self.knobs.shift_requests or self.posts <= self.knobs.shift_requests
            lp = -0.1 - 0.01 * (i % 7) + (self.knobs.logprob_shift if shifted else 0.0)
            alts = [(token, lp), *((f"{token}~{j}", lp - 3.0 - j) for j in range(4))]
            out.append((token, lp, alts))
        return out

    # -- serving -------------------------------------------------------------------
    def _count(self, prompt_tokens: int, generated: int) -> None:
        with self.lock:
            self.chat_requests += 1
            c = self.replicas[self.chat_requests % len(self.replicas)]
            c.requests += 1 + self.knobs.phantom_requests
            c.prompt_tokens += prompt_tokens
            c.generation_tokens += generated
            if self.knobs.k:
                steps = math.ceil(generated / 2)
                c.drafts += steps
                c.draft_tokens += steps * self.knobs.k
                c.accepted += generated - steps
                for i in range(self.knobs.k):
                    c.per_pos[i] += max(0, (generated - steps) // (i + 1) // self.knobs.k)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                return None

            def _json(self, status: int, body: object) -> None:
                data = json.dumps(body).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _authorized(self) -> bool:
                got = self.headers.get("Authorization")
                fake.seen_auth.append(got)
                key = fake.knobs.api_key
                if key is not None and got != f"Bearer {key}":
                    self._json(401, {"error": "bad key"})
                    return False
                return True

            def do_GET(self) -> None:
                k = fake.knobs
                if not self._authorized():
                    return
                if self.path == "/v1/models":
                    self._json(200, {"data": [{"id": k.model, "root": k.root, "max_model_len": 2048}]})
                elif self.path == "/version" and k.version is not None:
                    self._json(200, {"version": k.version})
                elif self.path.startswith("/metrics") and k.metrics:
                    replica = int(self.path.rsplit("/", 1)[1]) if self.path.count("/") == 2 else 0
                    body = fake.metrics_text(replica).encode()
                    self.send_response(200)
                    self.send_header("Content-Type", "text/plain; version=0.0.4")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                else:
                    self._json(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                if not self._authorized():
                    return
                with fake.lock:
                    fake.posts += 1
                    throttle = bool(fake.knobs.throttle) and fake.posts % fake.knobs.throttle == 0
                    fake.throttled += throttle
                if throttle:
                    self.send_response(429)
                    self.send_header("Retry-After", "0")
                    self.send_header("Content-Length", "2")
                    self.end_headers()
                    self.wfile.write(b"{}")
                    return
                if body.get("model") != fake.knobs.model:
                    self._json(404, {"error": f"model {body.get('model')} does not exist"})
                    return
                prompt = body["messages"][-1]["content"]
                n = int(body.get("max_tokens") or 16)
                tokens = fake.tokens(prompt, n)
                prompt_tokens = len(prompt.split())
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for i, (token, lp, alts) in enumerate(tokens):
                    time.sleep(fake.knobs.token_s)
                    choice = {"index": 0, "delta": {"content": token + " "}, "token_ids": [i]}
                    if body.get("logprobs"):
                        top = [{"token": t, "logprob": v} for t, v in alts[: body.get("top_logprobs") or 1]]
                        choice["logprobs"] = {
                            "content": [{"token": token, "logprob": lp, "top_logprobs": top}]
                        }
                    if i == n - 1:
                        choice["finish_reason"] = "length"
                    self.wfile.write(f"data: {json.dumps({'choices': [choice]})}\n\n".encode())
                    self.wfile.flush()
                usage = {"prompt_tokens": prompt_tokens, "completion_tokens": n}
                self.wfile.write(f"data: {json.dumps({'choices': [], 'usage': usage})}\n\n".encode())
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()
                fake._count(prompt_tokens, n)

        return Handler
