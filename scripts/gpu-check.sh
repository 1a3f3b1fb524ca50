#!/usr/bin/env bash
# The prepared GPU check (issue 23): two stand-in servers on one device through the real
# launcher; writes OUTDIR/gpu-check.json and exits 0 when its "ok" holds. Under 5 minutes.
#   bash scripts/gpu-check.sh OUTDIR [--fake]
# On a CUDA machine it uses torch and the real NVML; elsewhere a fake NVML (as in CI).
# A GPU machine without this package's dependencies (httpx, prometheus-client, packaging, ...)
# takes them from SPECSEL_GPU_DEPS, a folder made here with
#   pip install --target .gpu-deps httpx prometheus-client packaging huggingface-hub
# and carried along.
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { echo "usage: bash scripts/gpu-check.sh OUTDIR [--fake]" >&2; exit 2; }
PY=${PYTHON:-}
if [ -z "$PY" ]; then
  if [ -x "${SPECSEL_VENV:-.venv}/bin/python" ]; then PY="${SPECSEL_VENV:-.venv}/bin/python"; else PY=python3; fi
fi
export PYTHONPATH="$PWD${SPECSEL_GPU_DEPS:+:$SPECSEL_GPU_DEPS}${PYTHONPATH:+:$PYTHONPATH}"
exec timeout 300 "$PY" scripts/gpu_check.py "$@"
