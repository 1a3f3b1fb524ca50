"""The decision core imports no pytest, httpx, aiohttp, pynvml, vllm, prometheus_client, torch or
matplotlib (the report's charts); compare and the report's page logic neither."""

import subprocess
import sys

import pytest

CORE = [
    "pytest_specsel",
    "pytest_specsel.records",
    "pytest_specsel.families",
    "pytest_specsel.checkpoints",
    "pytest_specsel.admission",
    "pytest_specsel.evidence",
    "pytest_specsel.decision",
    "pytest_specsel.study",
    "pytest_specsel.study_file",
    "pytest_specsel.locator",
    "pytest_specsel.results",
    "pytest_specsel.pairing",
    "pytest_specsel.documents",
    "pytest_specsel.intervals",
    "pytest_specsel.interleave",
    "pytest_specsel.preflight",
    "pytest_specsel.replay",
    "pytest_specsel.servers",
    "pytest_specsel.meter",
    "pytest_specsel.workloads",
    "pytest_specsel.stats",
    "pytest_specsel.parity",
    "pytest_specsel.measurement",
    "pytest_specsel.artifacts",
    "pytest_specsel.gating",
    "pytest_specsel.runner",
    "pytest_specsel.outcome",
    "pytest_specsel.backends.protocol",
    "pytest_specsel.compare",
]
BLOCKED = [
    "pytest",
    "_pytest",
    "httpx",
    "aiohttp",
    "uvloop",
    "pynvml",
    "vllm",
    "prometheus_client",
    "torch",
    "huggingface_hub",
    "matplotlib",
    "transformers",
]


@pytest.mark.parametrize("module", CORE)
def test_core_module_imports_without_heavy_dependencies(module):
    code = (
        f"import sys\nfor name in {BLOCKED!r}:\n    sys.modules[name] = None\nimport {module}\nprint('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_the_boundary_check_can_fail():
    code = "import sys\nsys.modules['aiohttp'] = None\nimport pytest_specsel.backends.client\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "aiohttp" in proc.stderr
