#!/usr/bin/env bash
# Background vs boundary BackupPS copies across real node processes (issue 4), both in one run:
# MF on MovieLens 100K (synthetic MF without the data), 1 reliable + 3 transient `ebbflow-runtime
# elastic-node` processes on 127.0.0.1 (stage 2: 3:1), BackupPS copy every --backup-every
# clocks. Each mode runs ROUNDS times, alternating, so both see the same machine. Prints, per mode,
# segments, seconds per iteration in stage 2 (median over the rounds) and the ratio.
#
#   scripts/bench-node-copies.sh [CLOCKS] [ROUNDS] [BACKUP_EVERY]
#
# Needs a release build of ebbflow-runtime (it builds one); data from scripts/fetch-data.sh.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
clocks="${1:-300}"
rounds="${2:-3}"
backup_every="${3:-5}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}"
cargo build --release --quiet -p ebbflow-runtime --bin ebbflow-runtime
bin="$CARGO_TARGET_DIR/release/ebbflow-runtime"
export EBBFLOW_DATA_DIR="${EBBFLOW_DATA_DIR:-$(scripts/fetch-data.sh)}"
export EBBFLOW_JOB_SECRET=bench-node-copies
app=mf
[[ -s "$EBBFLOW_DATA_DIR/ml-100k.inter" ]] || app=mf-synthetic
out="$(mktemp -d)"
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$out"' EXIT
flags=(--app "$app" --clocks "$clocks" --staleness 0 --partitions 4 --job-workers 4)

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }

run_mode() { # MODE REPORT
  local mode="$1" report="$2" port extra=()
  port="$(free_port)"
  [[ "$mode" == boundary ]] && extra=(--boundary-copies)
  "$bin" elastic-coordinator "${flags[@]}" --listen "127.0.0.1:$port" --reliable-nodes 1 \
    --backup-every "$backup_every" --report-out "$report" "${extra[@]}" 2>"$out/coordinator.log" &
  local coordinator=$!
  local url="http://127.0.0.1:$port" nodes=()
  for name in r0 t0 t1 t2; do
    local tier=()
    [[ "$name" == t* ]] && tier=(--transient)
    "$bin" elastic-node "${flags[@]}" --coordinator "$url" --name "$name" "${tier[@]}" \
      2>"$out/$name.log" &
    nodes+=($!)
  done
  wait "$coordinator"
  wait "${nodes[@]}" || true
}

for round in $(seq 1 "$rounds"); do
  for mode in background boundary; do
    run_mode "$mode" "$out/$mode-$round.json"
  done
done

python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rows = {}
for mode in ("background", "boundary"):
    per_it, segments, stage2 = [], [], []
    for r in range(1, rounds + 1):
        report = json.load(open(f"{out}/{mode}-{r}.json"))
        segs = report["segments"]
        seconds = report["run"]["clock_seconds"]
        clocks = [c for s in segs if s["stage"] == 2
                  for c in range(s["first_clock"] + 1, s["end_clock"])]
        if not clocks:
            sys.exit(f"{mode} round {r}: no stage-2 clocks (did the transient nodes join?)")
        per_it.append(sum(seconds[c] for c in clocks) / len(clocks))
        segments.append(sum(1 for s in segs if s["stage"] == 2))
        stage2.append(len(clocks))
    rows[mode] = (statistics.median(per_it), min(per_it), max(per_it),
                  statistics.median(segments), statistics.median(stage2))
print(f"| copies | stage-2 segments | stage-2 clocks | s/iteration, median (range) |")
print(f"|---|---|---|---|")
for mode, (med, lo, hi, segs, n) in rows.items():
    print(f"| {mode} | {segs:g} | {n:g} | {med:.5f} ({lo:.5f}-{hi:.5f}) |")
print()
print(f"background / boundary seconds per iteration: {rows['background'][0] / rows['boundary'][0]:.3f}")
PY
