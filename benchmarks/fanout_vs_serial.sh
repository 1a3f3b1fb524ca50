#!/usr/bin/env bash
# The same selection fanned out over two pytest-xdist workers (one core each) and run
# serially, one after the other in one sitting, each with the machine's peak memory
# (MemTotal - MemAvailable, sampled every 2 s) and its wall time (README "More than one
# device"). Usage: bash benchmarks/fanout_vs_serial.sh LABEL [extra pytest args]
set -euo pipefail
cd "$(dirname "$0")/.."
label=${1:?usage: fanout_vs_serial.sh LABEL}
shift
VENV=${SPECSEL_VENV:-.venv}
profile=benchmarks/profiles/cpu_fanout.toml
used_mb() { awk '/^MemTotal:/{t=$2} /^MemAvailable:/{a=$2} END{printf "%d", (t-a)/1024}' /proc/meminfo; }
measure() {  # name, then the pytest arguments
  local name=$1; shift
  local peak_file; peak_file=$(mktemp)
  echo "$(used_mb)" >"$peak_file"
  ( while sleep 2; do u=$(used_mb); p=$(cat "$peak_file"); [ "$u" -gt "$p" ] && echo "$u" >"$peak_file"; done ) &
  local sampler=$!
  local t0; t0=$(date +%s)
  local rc=0
  "$VENV/bin/python" -m pytest benchmarks --specsel-cpu --specsel-config "$profile" -p no:cacheprovider \
    -rsxf "$@" || rc=$?
  local t1; t1=$(date +%s)
  kill "$sampler" 2>/dev/null || true
  echo "[fanout_vs_serial] $name: wall $((t1 - t0)) s, machine peak used $(cat "$peak_file") MiB (before: $before MiB), rc $rc"
  rm -f "$peak_file"
}
before=$(used_mb)
measure "fanned out (-n 2)" -n 2 --specsel-label "$label-fanout" "$@"
before=$(used_mb)
measure "serial" --specsel-label "$label-serial" "$@"
