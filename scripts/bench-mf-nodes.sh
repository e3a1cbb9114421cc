#!/usr/bin/env bash
# Two node processes over loopback against one process at the seed's scale (issue 36): one
# TrainingJob of 25 M planted ratings, two reliable nodes of one worker thread, trained by
# `ebbflow run` in one process and in node processes (bench/mf_nodes.py); prints the ratio of
# their training speeds and each node's peak RSS against the memory target.
#
# Usage: scripts/bench-mf-nodes.sh [bench/mf_nodes.py flags, e.g. --ratings 50000000 --clocks 60]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}"
spot="${EBBFLOW_SPOT_DATA:-$repo/../shared/data/spot}"
trace="$spot/aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv"
[[ -f "$trace" ]] || { echo "bench-mf-nodes: no spot trace at $trace (set EBBFLOW_SPOT_DATA)" >&2; exit 2; }
echo "==> cargo build --release -p ebbflow-job --bin ebbflow" >&2
cargo build --release --locked -q -p ebbflow-job --bin ebbflow
exec python3 bench/mf_nodes.py --ebbflow "$CARGO_TARGET_DIR/release/ebbflow" --trace "$trace" "$@"
