#!/usr/bin/env bash
# The end-to-end stage of scripts/test.sh: builds (or reuses, cached by version) the real control
# plane and tools, starts a kwok cluster on 127.0.0.1 (scripts/cluster.sh), runs the ebbflow-tests
# suites against it with EBBFLOW_KUBECONFIG set, and always deletes the cluster. On failure the
# cluster's component logs are kept in $EBBFLOW_CACHE/e2e-logs.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
name="${EBBFLOW_E2E_CLUSTER:-ebbflow-e2e}"
mkdir -p "$EBBFLOW_CACHE"

# shellcheck source=../tests/cluster/versions.env
source tests/cluster/versions.env
bin_dir="$(scripts/setup-cluster-tools.sh)"
export EBBFLOW_HELM="$bin_dir/helm-$helm_version"
# A real Prometheus (Debian's package; the service is never started) for tests/tests/prometheus.rs.
export EBBFLOW_PROMETHEUS="${EBBFLOW_PROMETHEUS:-$(scripts/setup-prometheus.sh)}"

# One run per cluster name on this machine at a time (a second run would delete the first's
# cluster when it replaces a leftover).
# The lock is this script's alone: what it starts runs with fd 8 closed (8>&-), so a process
# that outlives a killed run (a test's Prometheus) cannot hold the next run off for an hour.
exec 8>"$EBBFLOW_CACHE/e2e-$name.lock"
flock -w 3600 8 || { echo "e2e: error: another end-to-end run held the lock for an hour" >&2; exit 1; }

finish() {
  local status=$?
  if ((status != 0)) && [[ -d "$EBBFLOW_CACHE/kwok/clusters/$name/logs" ]]; then
    rm -rf "$EBBFLOW_CACHE/e2e-logs"
    cp -r "$EBBFLOW_CACHE/kwok/clusters/$name/logs" "$EBBFLOW_CACHE/e2e-logs" &&
      echo "e2e: component logs of the failed run: $EBBFLOW_CACHE/e2e-logs" >&2
  fi
  scripts/cluster.sh down "$name" || echo "e2e: warning: could not delete cluster $name" >&2
  exit "$status"
}
trap finish EXIT

kubeconfig="$(scripts/cluster.sh up "$name" 8>&-)"
EBBFLOW_KUBECONFIG="$kubeconfig" cargo test -p ebbflow-tests --locked 8>&-
