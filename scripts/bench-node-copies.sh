#!/usr/bin/env bash
# Background vs boundary BackupPS copies across real node processes (issue 4), both in one run:
# MF on MovieLens 100K (synthetic MF without the data), 1 reliable + 3 transient `ebbflow-runtime
# elastic-node` processes on 127.0.0.1 (stage 2: 3:1), 2 logical workers, BackupPS copy every
# BACKUP_EVERY clocks. Each mode runs ROUNDS times, alternating, so both see the same machine. Prints, per mode,
# segments, seconds per iteration in stage 2, boundaries included (median over the rounds), and
# the ratio.
#
#   scripts/bench-node-copies.sh [CLOCKS] [ROUNDS] [BACKUP_EVERY]
#
# Needs a release build of ebbflow-runtime (it builds one); data from scripts/fetch-data.sh.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
source scripts/lib/admin.sh
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
# 2 logical workers: the named MF app's learning rate diverges with 4 (NaN by clock 10).
flags=(--app "$app" --clocks "$clocks" --staleness 0 --partitions 4 --job-workers 2)

run_mode() { # MODE REPORT
  local mode="$1" report="$2" extra=()
  [[ "$mode" == boundary ]] && extra=(--boundary-copies)
  : >"$out/coordinator.out"
  "$bin" elastic-coordinator "${flags[@]}" --listen 127.0.0.1:0 --reliable-nodes 1 \
    --backup-every "$backup_every" --report-out "$report" "${extra[@]}" \
    >"$out/coordinator.out" 2>"$out/coordinator.log" &
  local coordinator=$!
  # The coordinator prints its bound address once it listens.
  local bound=""
  until bound="$(sed -n 's/^listening on //p' "$out/coordinator.out")" && [[ -n "$bound" ]]; do
    kill -0 "$coordinator" 2>/dev/null || { cat "$out/coordinator.log" >&2; exit 1; }
    sleep 0.05
  done
  local url nodes=()
  url="$(admin_url "$bound")"
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
    per_it, segments, stage2, rmse = [], [], [], []
    for r in range(1, rounds + 1):
        report = json.load(open(f"{out}/{mode}-{r}.json"))
        segs = report["segments"]
        seconds = report["run"]["clock_seconds"]
        # Every clock in stage 2 but the switch into it: a boundary's cost lands in the first
        # clock of the segment after it, so boundary copies are charged where they happen.
        stage2_segs = [s for s in segs if s["stage"] == 2]
        clocks = [c for s in stage2_segs for c in range(s["first_clock"], s["end_clock"])][1:]
        if not clocks:
            sys.exit(f"{mode} round {r}: no stage-2 clocks (did the transient nodes join?)")
        per_it.append(sum(seconds[c] for c in clocks) / len(clocks))
        segments.append(sum(1 for s in segs if s["stage"] == 2))
        stage2.append(len(clocks))
        rmse.append(report["run"]["eval"]["loss"])
    rows[mode] = (statistics.median(per_it), min(per_it), max(per_it),
                  statistics.median(segments), statistics.median(stage2), rmse)
print(f"| copies | stage-2 segments | stage-2 clocks | s/iteration, median (range) | final loss per run |")
print(f"|---|---|---|---|---|")
for mode, (med, lo, hi, segs, n, rmse) in rows.items():
    losses = ", ".join("diverged" if l is None else f"{l:.4f}" for l in rmse)
    print(f"| {mode} | {segs:g} | {n:g} | {med:.5f} ({lo:.5f}-{hi:.5f}) | {losses} |")
print()
print(f"background / boundary seconds per iteration: {rows['background'][0] / rows['boundary'][0]:.3f}")
PY
