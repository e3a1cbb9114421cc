#!/usr/bin/env bash
# Notice -> safe across real node processes (issue 4): the integer-exact app with MIB mebibytes
# of parameters over 4 `ebbflow-runtime elastic-node` processes on 127.0.0.1 (1 reliable + 3
# transient), a partial eviction with notice (SIGTERM to the transient node serving the most
# partitions) and then a full one (SIGTERM to the other two). Prints the coordinator's
# notice -> every affected partition safe per round, and checks the table is exact.
#
#   scripts/bench-notice-to-safe.sh [MIB] [ROUNDS] [BANDWIDTH_LIMIT_MBPS]
#
# Builds a release ebbflow-runtime; bench/notice_to_safe.py runs the rounds.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
mib="${1:-64}"
rounds="${2:-3}"
limit="${3:-0}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}"
cargo build --release --quiet -p ebbflow-runtime --bin ebbflow-runtime
exec python3 bench/notice_to_safe.py "$CARGO_TARGET_DIR/release/ebbflow-runtime" \
  --mib "$mib" --rounds "$rounds" --bandwidth-limit-mbps "$limit"
