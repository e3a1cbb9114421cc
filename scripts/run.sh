#!/usr/bin/env bash
# The README's main job on a fresh machine. Until `ebbflow run` (issue 9) lands, the best honest
# equivalent: the replayed-market cost study, `ebbflow simulate`, over the real spot traces in
# ../shared/data/spot (or EBBFLOW_SPOT_DATA): on-demand only, standard bidding with
# checkpoint/restart, standard + AgileML, BidBrain + AgileML and the hindsight bound, over many
# random start times. Builds the release CLI once (cached under $HOME/.cache/ebbflow/target) and
# writes report.txt, summary.csv, runs.csv and cost.svg per trace under OUT (default ./ebbflow-out).
#
# Usage: scripts/run.sh [OUT]
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$EBBFLOW_CACHE/target}"
out="${1:-ebbflow-out}"
spot="${EBBFLOW_SPOT_DATA:-$repo/../shared/data/spot}"
[[ -d "$spot" ]] || { echo "run: error: spot traces not found at $spot (set EBBFLOW_SPOT_DATA)" >&2; exit 1; }

echo "==> cargo build --release -p ebbflow-operator --bin ebbflow" >&2
cargo build --release --locked -p ebbflow-operator --bin ebbflow >&2
ebbflow="$CARGO_TARGET_DIR/release/ebbflow"

for trace in aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09 \
  aws_spotlake_hourly_2024-01_5regions gcp_spot_on_demand_price_history_2022-2026; do
  echo "==> ebbflow simulate --trace $spot/$trace.csv --out $out/$trace" >&2
  "$ebbflow" simulate --trace "$spot/$trace.csv" --out "$out/$trace"
  echo "--- $out/$trace/report.txt"
  cat "$out/$trace/report.txt"
done
