#!/usr/bin/env bash
# Reproduces the rollback race of docs/elasticity.md (fixed in 297d665; kept as a regression
# loop: before the fix it hung 1 run in 12 to 1 in 8 with two CPU hogs): an exact-app job on
# 1 reliable + 3 transient `ebbflow-runtime elastic-node` processes; the transient node t0 has no
# grace period and gets SIGTERM soon after stage 2 starts (a too-late notice, so a rollback). One
# attempt per call: exits 0 when the job finishes within 20 s, 1 when it hangs. The processes and
# their debug logs stay in DIR for gdb.
#
#   scripts/repro-rollback-race.sh DIR            # BIN=path/to/ebbflow-runtime to pick a build
#   for i in $(seq 1 12); do scripts/repro-rollback-race.sh /tmp/race$i || break; done
set -uo pipefail
dir="${1:?usage: repro-rollback-race.sh DIR}"
bin="${BIN:-${CARGO_TARGET_DIR:-$HOME/.cache/ebbflow/target}/debug/ebbflow-runtime}"
BIN="$bin"
source "$(dirname "${BASH_SOURCE[0]}")/lib/admin.sh"
rm -rf "$dir" && mkdir -p "$dir" && cd "$dir" || exit 2
export EBBFLOW_JOB_SECRET=repro RUST_LOG=ebbflow_runtime=debug
flags=(--app exact --exact-clock-ms 15 --clocks 250 --staleness 0 --partitions 6 --job-workers 3)
"$bin" elastic-coordinator "${flags[@]}" --listen 127.0.0.1:0 --reliable-nodes 1 --backup-every 4 \
  --report-out report.json >coordinator.out 2>coordinator.log &
coordinator=$!
until grep -qs "listening on" coordinator.out; do
  kill -0 "$coordinator" 2>/dev/null || exit 2
  sleep 0.05
done
url="$(admin_url "$(sed -n 's/^listening on //p' coordinator.out)")"
for name in r0 t0 t1 t2; do
  tier=() grace=30
  [[ "$name" == t* ]] && tier=(--transient)
  [[ "$name" == t0 ]] && grace=0
  "$bin" elastic-node "${flags[@]}" --coordinator "$url" --name "$name" "${tier[@]}" \
    --grace-seconds "$grace" >"$name.out" 2>"$name.log" &
  echo $! >"$name.pid"
done
until admin_get "$url/status" | grep -q '"stage":2'; do sleep 0.05; done
sleep "0.$((RANDOM % 9))"
kill -TERM "$(cat t0.pid)"
for _ in $(seq 1 200); do
  kill -0 "$coordinator" 2>/dev/null || exit 0
  sleep 0.1
done
echo "hung: processes and logs in $dir" >&2
exit 1
