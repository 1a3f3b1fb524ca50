"""The decision core imports no pytest, httpx, aiohttp, pynvml, vllm, prometheus_client, torch or
matplotlib (the report's charts); compare and the report's page logic neither."""

import subprocess
import sys

import pytest

CORE = [
    "pytest_specsel",
    "pytest_specsel.core.records",
    "pytest_specsel.core.families",
    "pytest_specsel.core.checkpoints",
    "pytest_specsel.core.admission",
    "pytest_specsel.core.evidence",
    "pytest_specsel.core.decision",
    "pytest_specsel.core.study",
    "pytest_specsel.study.file",
    "pytest_specsel.study.locator",
    "pytest_specsel.core.results",
    "pytest_specsel.core.pairing",
    "pytest_specsel.files.documents",
    "pytest_specsel.core.intervals",
    "pytest_specsel.core.interleave",
    "pytest_specsel.run.preflight",
    "pytest_specsel.run.replay",
    "pytest_specsel.run.servers",
    "pytest_specsel.run.meter",
    "pytest_specsel.core.workloads",
    "pytest_specsel.core.stats",
    "pytest_specsel.core.parity",
    "pytest_specsel.core.measurement",
    "pytest_specsel.files.artifacts",
    "pytest_specsel.core.gating",
    "pytest_specsel.run.runner",
    "pytest_specsel.glue.outcome",
    "pytest_specsel.core.protocol",
    "pytest_specsel.files.compare",
    "pytest_specsel.files.html",
    "pytest_specsel.files.run_folder",
    "pytest_specsel.files.run_facts",
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
    code = "import sys\nsys.modules['aiohttp'] = None\nimport pytest_specsel.backends.vllm.client\n"
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert proc.returncode != 0 and "aiohttp" in proc.stderr
