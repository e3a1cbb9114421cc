#!/usr/bin/env bash
# Runs COPIES copies of `ebbflow run`'s end-to-end test binary (operator/job/tests/run.rs) at once,
# ROUNDS times, and prints per round the wall time, the most `ebbflow node` processes alive at
# once and the least MemAvailable. Each copy replays the p3 market against the wall clock, so a
# loaded machine makes each run see more market (more joins, releases and replacements): three
# copies on 2 cores is the load under which joined nodes once piled up until the OOM killer
# ended a run (docs/elasticity.md). Exits 1 at the first round that passes LIMIT seconds or fails.
#
#   scripts/stress-parallel-runs.sh [COPIES=3] [ROUNDS=6] [LIMIT=400]
set -uo pipefail
copies="${1:-3}" rounds="${2:-6}" limit="${3:-400}"
root="$(cd "$(dirname "$0")/.." && pwd)"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}"
export EBBFLOW_SPOT_DATA="${EBBFLOW_SPOT_DATA:-$root/../shared/data/spot}"
bin="$(cd "$root" && cargo test --workspace --locked --no-run --message-format=json 2>/dev/null |
  python3 -c 'import json,sys
for line in sys.stdin:
    m = json.loads(line)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "run" and m.get("executable"):
        print(m["executable"])')"
[[ -x "$bin" ]] || { echo "the run test binary did not build" >&2; exit 2; }
logs="$(mktemp -d)"
trap 'pkill -9 -f "$bin" 2>/dev/null; pkill -9 -f "ebbflow node" 2>/dev/null' EXIT
for round in $(seq 1 "$rounds"); do
  pids=()
  for copy in $(seq 1 "$copies"); do
    (cd "$root/operator/job" && "$bin" --test-threads 1 >"$logs/$round-$copy.log" 2>&1) &
    pids+=($!)
  done
  start=$SECONDS most=0 least=$((1 << 40))
  while :; do
    sleep 2
    n=$(pgrep -fc "ebbflow node")
    mem=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
    ((n > most)) && most=$n
    ((mem < least)) && least=$mem
    running=0
    for pid in "${pids[@]}"; do kill -0 "$pid" 2>/dev/null && running=1; done
    ((running)) || break
    if ((SECONDS - start > limit)); then
      echo "round $round: still running after $limit s; $most node processes at most," \
        "$least MiB available at least; logs in $logs"
      exit 1
    fi
  done
  failed=0
  for pid in "${pids[@]}"; do wait "$pid" || failed=$((failed + 1)); done
  echo "round $round: $((SECONDS - start)) s, $failed of $copies failed; $most node processes" \
    "at most, $least MiB available at least"
  ((failed == 0)) || { echo "logs in $logs"; exit 1; }
done
