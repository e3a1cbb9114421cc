# Shared by scripts/cluster.sh and scripts/real-nodes.sh (sourced, after they define `die`, and
# set `bin_dir`, `cache` and `timeout_seconds`): the pinned tools, a cluster's kubeconfig and
# kubectl, polling, and this host's address.

# tool NAME VERSION: the path of a binary built by scripts/setup-cluster-tools.sh.
tool() {
  local path="$bin_dir/$1-$2"
  [[ -x "$path" ]] || die "$path is missing: run scripts/setup-cluster-tools.sh first"
  echo "$path"
}
# kwokctl keeps each cluster's state (pids, certs, logs, kubeconfig) under $cache/kwok/clusters.
kubeconfig_path() { echo "$cache/kwok/clusters/$1/kubeconfig.yaml"; }
kubectl_in() {
  local name="$1"
  shift
  "$(tool kubectl "$kube_version")" --kubeconfig "$(kubeconfig_path "$name")" "$@"
}

# poll_until DESCRIPTION COMMAND...: retries COMMAND (quietly) until it succeeds or the deadline.
poll_until() {
  local what="$1" deadline=$((SECONDS + timeout_seconds))
  shift
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "timed out after ${timeout_seconds}s waiting for $what"
    sleep 0.5
  done
}

# host_address: this host's IPv4 address on its default route (what real nodes and pods use).
host_address() {
  local address
  address="$(ip -4 route get 1.1.1.1 2>/dev/null | sed -n 's/.* src \([0-9.]*\).*/\1/p')"
  [[ -n "$address" ]] || die "no IPv4 address with a default route on this host"
  echo "$address"
}
