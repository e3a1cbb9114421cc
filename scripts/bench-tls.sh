#!/usr/bin/env bash
# What TLS costs the data plane: one server process + one worker process (1 thread) of
# `ebbflow-runtime` over loopback, as scripts/bench-two-processes.sh runs them, with transport
# security "none" and "tls" alternating (ROUNDS of each, default 3) in one run. Prints each
# round's steady throughput (clocks 2..N: the first includes connecting) and the ratio of the
# medians, tls / none.
# Needs the data of scripts/fetch-data.sh in EBBFLOW_DATA_DIR (default ~/.cache/ebbflow/data).
#
# Usage: [EBBFLOW_BENCH_CLOCKS=200] scripts/bench-tls.sh [mf|lda] [ROUNDS]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/admin.sh
TARGET=${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}
export EBBFLOW_DATA_DIR=${EBBFLOW_DATA_DIR:-$HOME/.cache/ebbflow/data}
cargo build --release -q -p ebbflow-runtime --bin ebbflow-runtime
BIN=$TARGET/release/ebbflow-runtime
APP=${1:-mf}
ROUNDS=${2:-3}
case "$APP" in mf|lda) ;; *) echo "bench-tls: unknown app '$APP' (mf or lda)" >&2; exit 2 ;; esac
# Clocks of a few milliseconds (an LDA sweep, an MF pass over 100K ratings): 200 of them, so a
# run's steady part spans about a second, not the 0.1 s that 20 MF clocks took, which the
# machine's noise (±25% between runs) swamped.
CLOCKS=${EBBFLOW_BENCH_CLOCKS:-200}
export RUST_LOG=warn
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT

# One run with transport security $1; its report goes to $OUT/$2.json.
run_pair() {
  export EBBFLOW_TRANSPORT_SECURITY=$1 EBBFLOW_JOB_SECRET="bench-$RANDOM$RANDOM"
  exec 3< <("$BIN" coordinator --nodes 2 --clocks "$CLOCKS" --partitions 2 --report-out "$OUT/$2.json" --app "$APP")
  read -r _ _ ADDR <&3
  "$BIN" node --coordinator "$(admin_url "$ADDR")" --name server --workers 0 --app "$APP" &
  until admin_get "$(admin_url "$ADDR")/status" | grep -q '"server"'; do sleep 0.05; done
  "$BIN" node --coordinator "$(admin_url "$ADDR")" --name worker --workers 1 --no-serve --app "$APP" &
  wait
  exec 3<&-
}

for round in $(seq 1 "$ROUNDS"); do
  run_pair none "none-$round"
  run_pair tls "tls-$round"
done
python3 - "$OUT" "$APP" "$ROUNDS" <<'PY'
import json, statistics, sys
out, app, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
def steady(name):
    r = json.load(open(f"{out}/{name}.json"))
    clocks = r["clock_seconds"][1:]
    return r["updates"] / r["clocks"] * len(clocks) / sum(clocks), r["eval"]["loss"]
figures = {}
for security in ("none", "tls"):
    runs = [steady(f"{security}-{i}") for i in range(1, rounds + 1)]
    figures[security] = statistics.median(u for u, _ in runs)
    print(f"{app} {security:>4}: " + ", ".join(f"{u / 1e6:.3f}" for u, _ in runs)
          + f" M updates/s (median {figures[security] / 1e6:.3f}); final losses "
          + ", ".join(f"{l:.4f}" for _, l in runs))
print(f"{app}: tls / none = {figures['tls'] / figures['none']:.3f} (median of {rounds} rounds each, interleaved)")
PY
