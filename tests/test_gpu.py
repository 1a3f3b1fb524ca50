"""CUDA checks, off unless ``--specsel-gpu`` (and then they need CUDA vLLM and a GPU)."""

import pytest

pytestmark = pytest.mark.gpu


def test_probe_sees_a_cuda_device_and_the_speculative_interface():
    from pytest_specsel.backends.vllm.probe import probe_vllm

    cap = probe_vllm("cuda")
    assert cap.error is None, cap.error
    assert cap.device_name and cap.device_memory_mb and cap.device_memory_mb > 1000
    assert cap.has_speculative_config and "ngram" in cap.methods


def test_nvml_sampler_reads_device_memory():
    import os

    from pytest_specsel.backends.vllm.telemetry import NvmlMemorySampler

    class Handle:
        def pids(self):
            return [os.getpid()]

    sampler = NvmlMemorySampler(interval_s=0.05)
    sampler.start(Handle())
    reading = sampler.stop()
    assert reading.measured == "nvml_server_processes" and reading.samples >= 1
