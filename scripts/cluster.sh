#!/usr/bin/env bash
# A real Kubernetes control plane (etcd, kube-apiserver, kube-controller-manager, kube-scheduler
# built by setup-cluster-tools.sh) run as local processes by kwokctl, with kwok simulating
# on-demand and spot nodes. Everything listens on 127.0.0.1, on ports kwokctl picks free.
#
#   scripts/cluster.sh up NAME     create (replacing a leftover cluster of that name), add nodes,
#                                  wait until usable; prints the kubeconfig path
#   scripts/cluster.sh down NAME   delete the cluster (no error if it does not exist)
#   scripts/cluster.sh env NAME    print `export EBBFLOW_KUBECONFIG=...` for eval
#   scripts/cluster.sh nodes NAME ON_DEMAND SPOT   add kwok nodes (idempotent by name)
#
# Env: EBBFLOW_CACHE (default ~/.cache/ebbflow); EBBFLOW_ONDEMAND_NODES (default 2) and
# EBBFLOW_SPOT_NODES (default 4) for `up`; EBBFLOW_SPOT_TAINT (default
# karpenter.sh/capacity-type=spot:NoSchedule, empty for none); EBBFLOW_CLUSTER_TIMEOUT seconds
# (default 180); EBBFLOW_CLUSTER_ADDRESS (default 127.0.0.1): the address the control plane binds
# and advertises; a non-loopback one (scripts/real-nodes.sh passes the host's) also turns on
# admission, so pods of real kubelets get ServiceAccount tokens and reach the API server through
# the `kubernetes` Service.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../tests/cluster/versions.env
source "$repo/tests/cluster/versions.env"
cache="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
bin_dir="$cache/bin"
# kwokctl keeps each cluster's state (pids, certs, logs, kubeconfig) under $KWOK_WORKDIR/clusters.
export KWOK_WORKDIR="$cache/kwok"
timeout_seconds="${EBBFLOW_CLUSTER_TIMEOUT:-180}"

die() { echo "cluster.sh: error: $*" >&2; exit 1; }
log() { echo "cluster.sh: $*" >&2; }
usage() { die "usage: cluster.sh up|down|env NAME | nodes NAME ON_DEMAND SPOT"; }

# shellcheck source=lib/cluster-common.sh
source "$repo/scripts/lib/cluster-common.sh"
kwokctl() { "$(tool kwokctl "$kwok_version")" -v WARN "$@"; }

cluster_exists() { [[ -d "$KWOK_WORKDIR/clusters/$1" ]]; }

down() {
  local name="$1"
  if cluster_exists "$name"; then
    log "deleting cluster $name"
    # kwokctl stops the processes it recorded; remove the directory even if that half failed.
    kwokctl --name "$name" delete cluster >&2 || log "kwokctl delete cluster $name failed; removing its state"
    rm -rf "${KWOK_WORKDIR:?}/clusters/$name"
  fi
}

# One Node per line of YAML stream; kwok manages nodes annotated kwok.x-k8s.io/node=fake.
# Instance types and zones cycle so each tier spans several pools (instance type x zone).
node_manifests() {
  local capacity="$1" count="$2" i
  local -a types=(m5.2xlarge c5.2xlarge r5.2xlarge) zones=(us-east-1a us-east-1b us-east-1c)
  local -A memory=([m5.2xlarge]=32Gi [c5.2xlarge]=16Gi [r5.2xlarge]=64Gi)
  local karpenter eks gke_spot="" taints="" prefix
  if [[ "$capacity" == spot ]]; then
    karpenter=spot eks=SPOT prefix=kwok-spot
    gke_spot=$'\n    cloud.google.com/gke-spot: "true"'
    local spot_taint="${EBBFLOW_SPOT_TAINT-karpenter.sh/capacity-type=spot:NoSchedule}"
    if [[ -n "$spot_taint" ]]; then
      [[ "$spot_taint" =~ ^([^=:]+)=([^:]*):(NoSchedule|PreferNoSchedule|NoExecute)$ ]] ||
        die "EBBFLOW_SPOT_TAINT '$spot_taint' is not key=value:Effect"
      taints=$'\n  taints:\n  - key: '"${BASH_REMATCH[1]}"$'\n    value: "'"${BASH_REMATCH[2]}"$'"\n    effect: '"${BASH_REMATCH[3]}"
    fi
  else
    karpenter=on-demand eks=ON_DEMAND prefix=kwok-od
  fi
  for ((i = 0; i < count; i++)); do
    local type="${types[i % 3]}" zone="${zones[i % 3]}"
    [[ "$capacity" == spot ]] || type=m5.2xlarge
    cat <<EOF
---
apiVersion: v1
kind: Node
metadata:
  name: $prefix-$i
  annotations:
    kwok.x-k8s.io/node: fake
    node.alpha.kubernetes.io/ttl: "0"
  labels:
    type: kwok
    kubernetes.io/hostname: $prefix-$i
    kubernetes.io/os: linux
    kubernetes.io/arch: amd64
    node.kubernetes.io/instance-type: $type
    topology.kubernetes.io/region: us-east-1
    topology.kubernetes.io/zone: $zone
    karpenter.sh/capacity-type: $karpenter
    eks.amazonaws.com/capacityType: $eks$gke_spot
spec:
  providerID: kwok://$prefix-$i$taints
status:
  allocatable: {cpu: "8", memory: ${memory[$type]}, pods: "110"}
  capacity: {cpu: "8", memory: ${memory[$type]}, pods: "110"}
  nodeInfo: {architecture: amd64, operatingSystem: linux, kubeletVersion: fake, kubeProxyVersion: fake}
EOF
  done
}

nodes() {
  local name="$1" on_demand="$2" spot="$3"
  [[ "$on_demand" =~ ^[0-9]+$ && "$spot" =~ ^[0-9]+$ ]] || die "node counts must be numbers, got '$on_demand' '$spot'"
  cluster_exists "$name" || die "cluster $name does not exist: run cluster.sh up $name"
  ((on_demand + spot > 0)) || return 0
  log "adding $on_demand on-demand and $spot spot kwok nodes to $name"
  { node_manifests on-demand "$on_demand"; node_manifests spot "$spot"; } |
    kubectl_in "$name" apply --server-side --field-manager=ebbflow-cluster-sh -f - >/dev/null
  poll_until "every kwok node of $name to be Ready" nodes_ready "$name"
}
nodes_ready() {
  local statuses
  statuses="$(kubectl_in "$1" get nodes -l type=kwok \
    -o jsonpath='{range .items[*]}{.status.conditions[?(@.type=="Ready")].status}{"\n"}{end}')"
  ! grep -qv '^True$' <<<"$statuses"
}

up() {
  local name="$1"
  down "$name"
  local dir="$KWOK_WORKDIR/clusters/$name" config
  mkdir -p "$KWOK_WORKDIR"
  config="$(mktemp "$KWOK_WORKDIR/$name.config.XXXXXX.yaml")"
  local address="${EBBFLOW_CLUSTER_ADDRESS:-127.0.0.1}" real_node_options=""
  [[ "$address" =~ ^[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+$ ]] || die "EBBFLOW_CLUSTER_ADDRESS '$address' is not an IPv4 address"
  if [[ "$address" != 127.* ]]; then
    # For pods on real kubelets: ServiceAccount admission (tokens in pods), the API server on
    # every interface (kwokctl's kubeconfig keeps 127.0.0.1) with its endpoint, the `kubernetes`
    # Service's, at this address, and a serving certificate for the names and addresses pods use
    # (10.0.0.1: the Service's, first of the default service range). Other components stay on
    # loopback; kwok fakes only the nodes cluster.sh made (it would fake the real nodes' pods);
    # the API server reaches kubelets (logs, exec) at their node IP, not a hostname.
    real_node_options="  kubeAdmission: true
  kubeApiserverCertSANs: [$address, 10.0.0.1, kubernetes, kubernetes.default, kubernetes.default.svc, kubernetes.default.svc.cluster.local]
componentsPatches:
- name: kube-apiserver
  extraArgs:
  - {key: bind-address, value: 0.0.0.0}
  - {key: advertise-address, value: $address}
  - {key: kubelet-preferred-address-types, value: InternalIP}
- name: kwok-controller
  extraArgs:
  - {key: manage-all-nodes, value: \"false\"}
  - {key: manage-nodes-with-annotation-selector, value: kwok.x-k8s.io/node=fake}"
    address=127.0.0.1
  fi
  # Every binary is a local path (nothing is downloaded); every component binds 127.0.0.1.
  cat >"$config" <<EOF
apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokctlConfiguration
options:
  runtime: binary
  bindAddress: $address
  kubeVersion: $kube_version
  etcdVersion: ${etcd_version#v}
  kwokVersion: $kwok_version
  kubeApiserverBinary: $(tool kube-apiserver "$kube_version")
  kubeControllerManagerBinary: $(tool kube-controller-manager "$kube_version")
  kubeSchedulerBinary: $(tool kube-scheduler "$kube_version")
  kubectlBinary: $(tool kubectl "$kube_version")
  etcdBinary: $(tool etcd "$etcd_version")
  kwokControllerBinary: $(tool kwok "$kwok_version")
  cacheDir: $KWOK_WORKDIR/cache
$real_node_options
EOF
  log "creating cluster $name (kube $kube_version, etcd $etcd_version, kwok $kwok_version)"
  # kwokctl picks free ports just before the components bind them; another process can take one
  # in between, so a failed start is retried once on fresh ports.
  local attempt
  for attempt in 1 2; do
    if kwokctl --name "$name" create cluster --config "$config" --kubeconfig "" \
      --wait "${timeout_seconds}s" --timeout "${timeout_seconds}s" >&2; then
      break
    fi
    if ((attempt == 2)); then
      rm -f "$config"
      rm -rf "$cache/cluster-logs-$name"
      cp -r "$dir/logs" "$cache/cluster-logs-$name" 2>/dev/null &&
        log "logs of the failed cluster are in $cache/cluster-logs-$name"
      down "$name"
      die "kwokctl create cluster $name failed twice"
    fi
    log "kwokctl create cluster $name failed; retrying once"
    down "$name"
  done
  rm -f "$config"
  [[ -f "$(kubeconfig_path "$name")" ]] || die "kwokctl wrote no kubeconfig at $(kubeconfig_path "$name")"
  poll_until "the API server of $name to be ready" kubectl_in "$name" get --raw /readyz
  # Pods need the default ServiceAccount, which the controller manager creates.
  poll_until "the default ServiceAccount in $name" kubectl_in "$name" get serviceaccount default -n default
  nodes "$name" "${EBBFLOW_ONDEMAND_NODES:-2}" "${EBBFLOW_SPOT_NODES:-4}"
  log "cluster $name is up: $(kubectl_in "$name" version -o json | sed -n 's/.*"gitVersion": "\(v[^"]*\)".*/\1/p' | tail -1)"
  kubeconfig_path "$name"
}

(($# >= 2)) || usage
command="$1" name="$2"
[[ "$name" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "cluster name '$name' must be a DNS label"
case "$command" in
  up) (($# == 2)) || usage; up "$name" ;;
  down) (($# == 2)) || usage; down "$name" ;;
  env) (($# == 2)) || usage; cluster_exists "$name" || die "cluster $name does not exist"
    printf 'export EBBFLOW_KUBECONFIG=%q\n' "$(kubeconfig_path "$name")" ;;
  nodes) (($# == 4)) || usage; nodes "$name" "$3" "$4" ;;
  *) usage ;;
esac
