#!/usr/bin/env bash
# Suffix decoding for vLLM on this machine: the arctic-inference package, built from source.
# Not part of the default set-up (scripts/setup-cpu.sh); scripts/run-all-families.sh runs it.
#
# The version is vLLM 0.32's own pin (vllm/config/speculative.py: "pip install
# arctic-inference==0.1.1"). The registry has no wheel of it for CPython 3.11, only its source
# distribution: setuptools + CMake + nanobind, one C++20 extension (the suffix tree), no CUDA.
# It is built with --no-build-isolation against this venv's torch (its setup.py imports
# torch; an isolated build would fetch a second one), after installing into the venv the two
# build tools its pyproject names that the venv lacks (nanobind 2.9.2, wheel). grpcio-tools,
# also named there, only compiles an embedding service's .proto; its setup.py goes on when
# that step fails, and the suffix path never imports it: left out, so protobuf stays as vLLM
# has it. The package's vLLM plugin (entry point vllm.general_plugins) returns at once
# unless ARCTIC_INFERENCE_ENABLED=1, which nothing here sets.
#
# The outcome goes to $VENV/.specsel-build-arctic-inference.json (status, the step that
# failed, the log's decisive lines); the probe reads it, so a failed build makes `suffix`
# unsupported naming that step. Idempotent: a second run with the package importable at
# the pinned version does nothing.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${SPECSEL_VENV:-.venv}
VERSION=0.1.1
NANOBIND=2.9.2
# shellcheck disable=SC1091
. "$VENV/bin/activate"  # CMake's FindPython then finds this interpreter, the one with nanobind
mkdir -p .specsel
LOG="$PWD/.specsel/arctic-inference-build.log"
RECORD="$(python -c 'import sys; print(sys.prefix)')/.specsel-build-arctic-inference.json"

record() {  # record STATUS STEP: the outcome, with the log's decisive lines when it failed
  python - "$1" "$2" "$VERSION" "$LOG" "$RECORD" <<'EOF'
import json, re, sys
status, step, version, log, out = sys.argv[1:]
text = open(log, errors="replace").read().splitlines() if status == "failed" else []
decisive = []
for i, line in enumerate(text):
    if "gRPC code" in line:  # the embedding service's step, harmless (see above)
        continue
    if re.search(r"(CMake Error|error:|Error:|fatal|undefined reference|No matching distribution)", line):
        follow = [l.strip() for l in text[i + 1 : i + 4] if l.strip()][:2] if "CMake Error" in line else []
        decisive.append(" ".join([line.strip(), *follow])[:300])
json.dump({"package": "arctic-inference", "version": version, "status": status, "step": step,
           "log": log, "decisive": decisive[:4]}, open(out, "w"), indent=2)
EOF
}

have=$(python -c 'import importlib.metadata as m, arctic_inference.suffix_decoding; print(m.version("arctic-inference"))' 2>/dev/null || true)
if [ "$have" = "$VERSION" ]; then
  echo "[arctic] arctic-inference $VERSION is installed in $VENV: nothing to build"
  record installed none
  exit 0
fi
began=$(date +%s)
: >"$LOG"
step="build tools (nanobind==$NANOBIND, wheel)"
echo "[arctic] $step"
python -m pip install --quiet "nanobind==$NANOBIND" wheel >>"$LOG" 2>&1 || { record failed "$step"; cat "$RECORD"; exit 1; }
step="build arctic-inference==$VERSION from source (--no-build-isolation, torch $(python -c 'import torch; print(torch.__version__)'))"
echo "[arctic] $step"
python -m pip install --no-build-isolation --no-deps --no-binary arctic-inference --no-cache-dir -v \
  "arctic-inference==$VERSION" >>"$LOG" 2>&1 || { record failed "$step"; cat "$RECORD"; exit 1; }
step="import arctic_inference.suffix_decoding"
python -c 'from arctic_inference.suffix_decoding import SuffixDecodingCache' >>"$LOG" 2>&1 ||
  { record failed "$step"; cat "$RECORD"; exit 1; }
record installed none
echo "[arctic] arctic-inference $VERSION built and installed in $(( $(date +%s) - began )) s (log $LOG)"
