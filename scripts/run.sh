#!/usr/bin/env bash
# The README's main job on a fresh machine: `ebbflow run examples/quickstart.yaml`. Trains the
# quickstart TrainingJob (matrix factorization on seeded synthetic ratings, nothing to download)
# with the elastic runtime on 127.0.0.1 while BidBrain buys spot nodes on a replayed real
# p3.2xlarge trace (../shared/data/spot) at one trace hour per ten seconds; spot nodes join and
# leave on notice (at --speed 12000 notices come too late and nodes fail); the bill accrues next
# to the on-demand equivalent. Builds the release CLI once (cached under
# $HOME/.cache/ebbflow/target), shows a live progress line, and writes summary.json,
# timeseries.csv and chart.svg to OUT (default ./ebbflow-run-quickstart).
#
# Usage: scripts/run.sh [OUT] [extra `ebbflow run` flags, e.g. --speed 12000]
# (a first argument that starts with '-' is a flag: OUT is then the default)
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$EBBFLOW_CACHE/target}"
out=ebbflow-run-quickstart
if [[ $# -gt 0 && $1 != -* ]]; then
  out="$1"
  shift
fi
trace=../shared/data/spot/aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv
[[ -f "$trace" ]] || { echo "run: error: the quickstart's spot trace is missing: $repo/$trace" >&2; exit 1; }

echo "==> cargo build --release -p ebbflow-job --bin ebbflow" >&2
cargo build --release --locked -p ebbflow-job --bin ebbflow >&2
echo "==> ebbflow run examples/quickstart.yaml --out $out $*" >&2
exec "$CARGO_TARGET_DIR/release/ebbflow" run examples/quickstart.yaml --out "$out" "$@"
