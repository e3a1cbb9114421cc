#!/usr/bin/env bash
# One app (mf: MovieLens 100K, the default; mlr: digits; lda: reuters): one server process + one
# worker process (1 thread) of `ebbflow-runtime` over loopback vs the bare single-thread loop
# (measured by `ebbflow-bench` in the same run).
# Needs the data of scripts/fetch-data.sh in EBBFLOW_DATA_DIR (default ~/.cache/ebbflow/data).
#
# Usage: scripts/bench-two-processes.sh [mf|mlr|lda]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/admin.sh
TARGET=${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}
export EBBFLOW_DATA_DIR=${EBBFLOW_DATA_DIR:-$HOME/.cache/ebbflow/data}
cargo build --release -q -p ebbflow-runtime --bin ebbflow-runtime --bin ebbflow-bench
BIN=$TARGET/release/ebbflow-runtime
APP=${1:-mf}
case "$APP" in mf|mlr|lda) ;; *) echo "bench-two-processes: unknown app '$APP' (mf, mlr or lda)" >&2; exit 2 ;; esac
# An LDA clock (one Gibbs sweep over reuters) takes milliseconds: run as many as the bare loop's
# throughput measurement (200); MF and MLR clocks are longer.
case "$APP" in lda) CLOCKS=200 ;; *) CLOCKS=20 ;; esac
# Without EBBFLOW_BENCH_PYTHON ebbflow-bench runs no peers: for LDA it then prints the throughput
# rows only (the peer's log-likelihood is its quality target), which is all this script reads.
bare=$(env -u EBBFLOW_BENCH_PYTHON "$TARGET/release/ebbflow-bench" --data "$EBBFLOW_DATA_DIR" --apps "$APP" --lda-iterations 1 2>/dev/null \
  | awk -F'|' -v app="$APP" '$2 ~ "^ "app" $" && $3 ~ /bare loop: updates\/s/ { gsub(/[^0-9.]/, "", $4); print $4 }')
[[ -n "$bare" ]] || { echo "bench-two-processes: no bare-loop figure from ebbflow-bench for $APP" >&2; exit 1; }
export EBBFLOW_JOB_SECRET="bench-$RANDOM$RANDOM" RUST_LOG=warn
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
exec 3< <("$BIN" coordinator --nodes 2 --clocks "$CLOCKS" --partitions 2 --report-out "$OUT/report.json" --app "$APP")
read -r _ _ ADDR <&3
"$BIN" node --coordinator "$(admin_url "$ADDR")" --name server --workers 0 --app "$APP" &
until admin_get "$(admin_url "$ADDR")/status" | grep -q '"server"'; do sleep 0.05; done
"$BIN" node --coordinator "$(admin_url "$ADDR")" --name worker --workers 1 --no-serve --app "$APP" &
wait
python3 - "$OUT/report.json" "$bare" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
bare = float(sys.argv[2]) * 1e6
steady = r["clock_seconds"][1:]
updates = r["updates"] / r["clocks"]
print(f"bare loop {bare / 1e6:.2f} M updates/s")
print(f"2 processes, all {r['clocks']} clocks: {r['updates_per_second'] / 1e6:.2f} M updates/s = {r['updates_per_second'] / bare:.2f}x bare "
      f"(first clock includes connecting and registering: {r['clock_seconds'][0] * 1e3:.1f} ms)")
print(f"2 processes, clocks 2..{r['clocks']}: {updates * len(steady) / sum(steady) / 1e6:.2f} M updates/s = "
      f"{updates * len(steady) / sum(steady) / bare:.2f}x bare; final evaluation loss {r['eval']['loss']:.4f}")
PY
