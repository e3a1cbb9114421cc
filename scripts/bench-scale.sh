#!/usr/bin/env bash
# The operator at scale on a kwok cluster (issue 7's benchmark): JOBS TrainingJobs of PODS pods
# over ON_DEMAND + SPOT kwok nodes, then INTERRUPT spot nodes tainted the NTH way.
#
# Usage: scripts/bench-scale.sh [JOBS PODS ON_DEMAND SPOT INTERRUPT]   (default 50 20 50 150 20;
#        the issue's full size is 500 20 250 750 100)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$EBBFLOW_CACHE/target}"
jobs="${1:-50}" pods="${2:-20}" on_demand="${3:-50}" spot="${4:-150}" interrupt="${5:-20}"
name=ebbflow-scale
cargo build --release --locked -q -p ebbflow-tests --bin ebbflow-scale-bench
scripts/setup-cluster-tools.sh >/dev/null
trap 'scripts/cluster.sh down "$name" >/dev/null 2>&1 || true' EXIT
kubeconfig="$(EBBFLOW_ONDEMAND_NODES="$on_demand" EBBFLOW_SPOT_NODES="$spot" scripts/cluster.sh up "$name")"
echo "==> $jobs jobs x $pods pods over $on_demand on-demand + $spot spot kwok nodes" >&2
EBBFLOW_KUBECONFIG="$kubeconfig" RUST_LOG=warn "$CARGO_TARGET_DIR/release/ebbflow-scale-bench" \
  --jobs "$jobs" --pods "$pods" --interrupt "$interrupt"
