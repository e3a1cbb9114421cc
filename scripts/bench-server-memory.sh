#!/usr/bin/env bash
# Server memory in multi-process mode: a coordinator, one server-only node process and one
# worker-only node process (2 worker threads) of `ebbflow-runtime` on 127.0.0.1, running the
# integer-exact app over 1,000,000 rows x 16 f32 (61 MiB of parameters) for 5 BSP clocks.
# Prints the server process's peak RSS against the bound 1.5 x parameter bytes + 64 MiB, and checks
# the final table is exact.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
source scripts/lib/admin.sh
TARGET=${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}
cargo build --release -q -p ebbflow-runtime --bin ebbflow-runtime
BIN=$TARGET/release/ebbflow-runtime
export EBBFLOW_JOB_SECRET="bench-$RANDOM$RANDOM" RUST_LOG=warn
APP=(--app exact --exact-rows 1000000 --exact-width 16 --exact-tables 1 --exact-shared 4)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
exec 3< <("$BIN" coordinator --nodes 2 --clocks 5 --partitions 8 --report-out "$OUT/report.json" "${APP[@]}")
read -r _ _ ADDR <&3
"$BIN" node --coordinator "$(admin_url "$ADDR")" --name server --workers 0 "${APP[@]}" &
# Node ids follow join order: let the server join first so it is node 0 in the report.
until admin_get "$(admin_url "$ADDR")/status" | grep -q '"server"'; do sleep 0.05; done
"$BIN" node --coordinator "$(admin_url "$ADDR")" --name worker --workers 2 --no-serve "${APP[@]}" &
wait
python3 - "$OUT/report.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
mib = 1 << 20
params, rss = r["parameter_bytes"], r["node_peak_rss_bytes"]
bound = 1.5 * params + 64 * mib
print(f"final table: {dict(r['eval']['metrics'])}")
print(f"parameters {params / mib:.1f} MiB; server process peak RSS {rss[0] / mib:.1f} MiB; "
      f"bound 1.5x params + 64 MiB = {bound / mib:.1f} MiB; RSS / bound = {rss[0] / bound:.2f}")
print(f"worker process peak RSS {rss[1] / mib:.1f} MiB; {r['updates_per_second']:.3g} row updates/s")
PY
