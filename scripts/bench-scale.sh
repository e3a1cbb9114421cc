#!/usr/bin/env bash
# The operator at scale on a kwok cluster (issue 7's benchmark): JOBS TrainingJobs of PODS pods
# over ON_DEMAND + SPOT kwok nodes, then INTERRUPT spot nodes tainted the NTH way.
#
# Usage: scripts/bench-scale.sh [JOBS PODS ON_DEMAND SPOT INTERRUPT [BENCH FLAGS...]]
#        (default 50 20 50 150 20; the issue's full size is 500 20 250 750 100). Further flags go
#        to ebbflow-scale-bench, e.g. `--operator WRAPPER` to run the operator under a profiler.
#
# Beside the run, every 10 s: the machine's available memory and its five largest processes, and
# the API server's request counters by resource and verb (the ten largest), in
# $EBBFLOW_CACHE/bench-scale.log. If available memory falls under EBBFLOW_BENCH_MIN_FREE_MIB
# (default 2048) the run is stopped there, before the kernel picks what to kill.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$EBBFLOW_CACHE/target}"
jobs="${1:-50}" pods="${2:-20}" on_demand="${3:-50}" spot="${4:-150}" interrupt="${5:-20}"
name=ebbflow-scale
cargo build --release --locked -q -p ebbflow-tests --bin ebbflow-scale-bench -p ebbflow-operator --bin ebbflow-operator
scripts/setup-cluster-tools.sh >/dev/null
source tests/cluster/versions.env
kubectl="$(scripts/setup-cluster-tools.sh)/kubectl-$kube_version"
log="$EBBFLOW_CACHE/bench-scale.log"
min_free="${EBBFLOW_BENCH_MIN_FREE_MIB:-2048}"
sampler=""
cleanup() {
  [[ -n "$sampler" ]] && kill "$sampler" 2>/dev/null
  scripts/cluster.sh down "$name" >/dev/null 2>&1 || true
}
trap cleanup EXIT
kubeconfig="$(EBBFLOW_ONDEMAND_NODES="$on_demand" EBBFLOW_SPOT_NODES="$spot" scripts/cluster.sh up "$name")"
echo "==> $jobs jobs x $pods pods over $on_demand on-demand + $spot spot kwok nodes (samples: $log)" >&2
EBBFLOW_KUBECONFIG="$kubeconfig" RUST_LOG=warn "$CARGO_TARGET_DIR/release/ebbflow-scale-bench" \
  --jobs "$jobs" --pods "$pods" --interrupt "$interrupt" "${@:6}" &
bench=$!
(
  : >"$log"
  while kill -0 "$bench" 2>/dev/null; do
    avail=$(awk '/MemAvailable/ {print int($2 / 1024)}' /proc/meminfo)
    {
      echo "=== $(date +%T) available ${avail} MiB, load $(cut -d' ' -f1 /proc/loadavg):" \
        "$(ps -eo rss,comm --sort=-rss | sed -n 2,6p | awk '{printf "%s %d MiB; ", $2, $1 / 1024}')"
      "$kubectl" --kubeconfig "$kubeconfig" get --raw /metrics 2>/dev/null |
        awk '/^apiserver_request_total\{/ {
          match($0, /resource="[^"]*"/); r = substr($0, RSTART + 10, RLENGTH - 11)
          match($0, /subresource="[^"]*"/); sr = substr($0, RSTART + 13, RLENGTH - 14)
          match($0, /verb="[^"]*"/); v = substr($0, RSTART + 6, RLENGTH - 7)
          n[v " " r (sr == "" ? "" : "/" sr)] += $NF
        } END { for (k in n) print n[k], k }' | sort -g -r | head -10
    } >>"$log"
    if ((avail < min_free)); then
      echo "bench-scale: error: available memory fell to ${avail} MiB (< $min_free); stopping the run (see $log)" >&2
      kill "$bench" 2>/dev/null
      break
    fi
    sleep 10
  done
) &
sampler=$!
wait "$bench"
