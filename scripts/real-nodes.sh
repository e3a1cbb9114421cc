#!/usr/bin/env bash
# Real nodes for a cluster from scripts/cluster.sh (made with EBBFLOW_CLUSTER_ADDRESS set to this
# host's address): one containerd and one kubelet per node, with its own root, state, sockets,
# runc root, CNI network and cgroup root (two kubelets sharing a containerd or a cgroup root
# delete each other's pods), plus one kube-proxy (iptables mode) and one CoreDNS for the host.
# Images come from OCI archives imported into every containerd (no registry), the sandbox image
# included (tests/cluster/pause, packaged by scripts/oci-image.py --pause).
#
#   scripts/real-nodes.sh up CLUSTER IMAGE.oci.tar...   start the nodes, import the images, wait
#                                                       until every node is Ready (the broken one:
#                                                       registered, NotReady)
#   scripts/real-nodes.sh down CLUSTER                  stop what `up` started (by pid) and undo
#                                                       what it changed on the host
#   scripts/real-nodes.sh kill CLUSTER NODE             a node that vanishes without notice: its
#                                                       kubelet and containerd SIGKILLed, its
#                                                       pods frozen (cgroup freezer)
#   scripts/real-nodes.sh nodes                         print the node names, one per line
#
# Nodes: real-od-0 (on-demand m5.large, untainted) and real-spot-0, real-spot-1 (spot p3.2xlarge
# in us-west-2a and us-west-2b, pools of the shared p3 trace; tainted
# karpenter.sh/capacity-type=spot:NoSchedule), labelled as Karpenter and EKS label them; and
# real-spot-broken (spot p3.2xlarge in us-west-2c), whose CNI configuration is never written, so
# it registers and never becomes Ready ("cni plugin not initialized"), as a node launched with a
# broken network setup does; no image is imported into it. Pod
# subnets 10.244.N.0/24 (ptp + host-local), Services 10.0.0.0/24, cluster DNS on this host's
# address. Needs root, containerd, runc, containernetworking-plugins, iptables and conntrack
# (installed through apt when missing) and the kubelet, kube-proxy and coredns builds of
# scripts/setup-cluster-tools.sh.
#
# Env: EBBFLOW_CACHE (default ~/.cache/ebbflow); EBBFLOW_REAL_NODES_TIMEOUT seconds (default 180).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../tests/cluster/versions.env
source "$repo/tests/cluster/versions.env"
cache="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
bin_dir="$cache/bin"
timeout_seconds="${EBBFLOW_REAL_NODES_TIMEOUT:-180}"
nodes=(real-od-0 real-spot-0 real-spot-1 real-spot-broken)
# The node that never becomes Ready (no CNI configuration).
broken_node=real-spot-broken
pause_image="localhost/ebbflow/pause:3.10"
# Host settings changed by `up` (ip_forward) or by every kubelet (setupKernelTunables).
sysctls=(net.ipv4.ip_forward vm.overcommit_memory kernel.panic kernel.panic_on_oops)
cgroup_controllers=(cpu cpuacct cpuset memory pids hugetlb devices freezer blkio systemd)

die() { echo "real-nodes.sh: error: $*" >&2; exit 1; }
log() { echo "real-nodes.sh: $*" >&2; }
usage() { die "usage: real-nodes.sh up CLUSTER IMAGE.oci.tar... | down CLUSTER | kill CLUSTER NODE | nodes"; }

# shellcheck source=lib/cluster-common.sh
source "$repo/scripts/lib/cluster-common.sh"

# Per-cluster state: disk (containerd roots, kubelet dirs, logs) and /run (sockets, runc state).
state_dir() { echo "$cache/real-nodes/$1"; }
run_dir() { echo "/run/ebbflow/$1"; }
node_index() {
  local i
  for i in "${!nodes[@]}"; do [[ "${nodes[$i]}" == "$1" ]] && { echo "$i"; return; }; done
  die "unknown node '$1' (nodes: ${nodes[*]})"
}

install_packages() {
  local missing=()
  command -v containerd >/dev/null || missing+=(containerd)
  command -v runc >/dev/null || missing+=(runc)
  [[ -x /usr/lib/cni/ptp ]] || missing+=(containernetworking-plugins)
  command -v iptables >/dev/null || missing+=(iptables)
  command -v conntrack >/dev/null || missing+=(conntrack)
  ((${#missing[@]} == 0)) && return 0
  ((EUID == 0)) && command -v apt-get >/dev/null || die "missing ${missing[*]} and cannot apt-get install them"
  log "installing ${missing[*]} (apt)"
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends "${missing[@]}" >&2 ||
    die "apt-get install ${missing[*]} failed"
}

# start NAME LOG COMMAND...: starts COMMAND in the background, its pid in $run/pids/NAME.
start() {
  local name="$1" logfile="$2"
  shift 2
  setsid "$@" >>"$logfile" 2>&1 </dev/null &
  echo $! >"$run/pids/$name"
}
running() { [[ -f "$run/pids/$1" ]] && kill -0 "$(cat "$run/pids/$1")" 2>/dev/null; }

write_containerd_config() {
  local node="$1" index="$2"
  local root="$state/$node" rdir="$run/$node"
  mkdir -p "$root/containerd" "$rdir/cni" "$root/logs"
  [[ "$node" == "$broken_node" ]] || cat >"$rdir/cni/10-ebbflow.conflist" <<EOF
{"cniVersion": "0.4.0", "name": "ebbflow-$node", "plugins": [
  {"type": "ptp", "ipMasq": false,
   "ipam": {"type": "host-local", "dataDir": "$rdir/ipam",
            "ranges": [[{"subnet": "10.244.$((index + 1)).0/24"}]],
            "routes": [{"dst": "0.0.0.0/0"}]}}]}
EOF
  cat >"$rdir/containerd.toml" <<EOF
version = 2
root = "$root/containerd"
state = "$rdir/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.zfs", "io.containerd.snapshotter.v1.devmapper",
  "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]
[grpc]
  address = "$rdir/containerd.sock"
[ttrpc]
  address = "$rdir/containerd.sock.ttrpc"
[metrics]
  address = ""
[plugins."io.containerd.internal.v1.opt"]
  path = "$root/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$pause_image"
  disable_apparmor = true
  # Root here lacks CAP_SYS_RESOURCE, so lowering oom_score_adj (the kubelet asks -998 for
  # sandboxes) fails in runc: keep it at containerd's own or above.
  restrict_oom_score_adj = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$rdir/cni"
    max_conf_num = 1
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        Root = "$rdir/runc"
        SystemdCgroup = false
EOF
}

write_kubelet_config() {
  local node="$1" index="$2" address="$3"
  local root="$state/$node" rdir="$run/$node" capacity=on-demand eks=ON_DEMAND taints="[]"
  local type=m5.large zone=us-west-2a
  if [[ "$node" == real-spot-* ]]; then
    # Spot nodes are pools of the shared p3.2xlarge trace (us-west-2a, us-west-2b), so a
    # trace-market job restricted to those zones gets its pools' pods placed on them.
    local spot_zones=(us-west-2a us-west-2b us-west-2c)
    capacity=spot eks=SPOT type=p3.2xlarge zone="${spot_zones[index - 1]}"
    taints="[{key: karpenter.sh/capacity-type, value: spot, effect: NoSchedule}]"
  fi
  mkdir -p "$root/kubelet" "$root/pod-logs"
  echo "node.kubernetes.io/instance-type=$type,topology.kubernetes.io/region=us-west-2,topology.kubernetes.io/zone=$zone,karpenter.sh/capacity-type=$capacity,eks.amazonaws.com/capacityType=$eks,ebbflow.dev/real-node=true" \
    >"$rdir/labels"
  cat >"$rdir/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
# This host's cgroups are v1 (a hybrid tmpfs at /sys/fs/cgroup); 1.35 refuses v1 unless told.
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /ebbflow-$node
containerRuntimeEndpoint: unix://$rdir/containerd.sock
address: $address
port: $((10250 + index))
healthzPort: 0
readOnlyPort: 0
podLogsDir: $root/pod-logs
providerID: ebbflow-real://$node
registerWithTaints: $taints
# The API server has no kubelet client certificate (kwokctl): anonymous, allowed.
authentication: {anonymous: {enabled: true}, webhook: {enabled: false}}
authorization: {mode: AlwaysAllow}
clusterDNS: [$address]
clusterDomain: cluster.local
resolvConf: /etc/resolv.conf
failSwapOn: false
maxPods: 30
# Every node reports the whole host; the tests' pods are small. The host's disk is shared with
# the build cache, so neither disk pressure nor image GC may evict the imported images.
evictionHard: {memory.available: 100Mi, nodefs.available: "0%", imagefs.available: "0%", nodefs.inodesFree: "0%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
}

up() {
  local name="$1"
  shift
  local images=("$@") address i node
  ((EUID == 0)) || die "real nodes need root (containerd, kubelet, iptables, cgroups)"
  [[ -f "$(kubeconfig_path "$name")" ]] || die "cluster $name does not exist: run EBBFLOW_CLUSTER_ADDRESS=<this host's address> scripts/cluster.sh up $name"
  for i in "${images[@]}"; do [[ -f "$i" ]] || die "image archive $i does not exist"; done
  install_packages
  address="$(host_address)"
  kubectl_in "$name" get endpoints kubernetes -o jsonpath='{.subsets[0].addresses[0].ip}' 2>/dev/null |
    grep -x "$address" >/dev/null ||
    die "the API server of $name does not advertise $address: recreate it with EBBFLOW_CLUSTER_ADDRESS=$address scripts/cluster.sh up $name"
  down "$name" quiet
  state="$(state_dir "$name")" run="$(run_dir "$name")"
  mkdir -p "$state" "$run/pids"

  # Host settings: saved once, restored by `down`.
  for i in "${sysctls[@]}"; do echo "$i=$(sysctl -n "$i")"; done >"$run/sysctls"
  sysctl -qw net.ipv4.ip_forward=1
  ip netns list 2>/dev/null | awk '{print $1}' | sort >"$run/netns-before"

  local kubelet kube_proxy coredns
  kubelet="$(tool kubelet "$kube_version")"
  kube_proxy="$(tool kube-proxy "$kube_version")"
  coredns="$(tool coredns "$coredns_version")"
  for i in "${!nodes[@]}"; do
    node="${nodes[$i]}"
    # The node's cgroup root in every v1 hierarchy (kubelet checks them); cpuset needs its
    # parent's cpus and mems before a task can join.
    local controller
    for controller in "${cgroup_controllers[@]}"; do
      [[ -d "/sys/fs/cgroup/$controller" ]] || continue
      mkdir -p "/sys/fs/cgroup/$controller/ebbflow-$node"
    done
    cat /sys/fs/cgroup/cpuset/cpuset.cpus >"/sys/fs/cgroup/cpuset/ebbflow-$node/cpuset.cpus"
    cat /sys/fs/cgroup/cpuset/cpuset.mems >"/sys/fs/cgroup/cpuset/ebbflow-$node/cpuset.mems"
    write_containerd_config "$node" "$i"
    start "containerd-$node" "$state/$node/logs/containerd.log" containerd --config "$run/$node/containerd.toml"
  done
  for node in "${nodes[@]}"; do
    local sock="$run/$node/containerd.sock"
    poll_until "containerd of $node" ctr --address "$sock" version
    [[ "$node" == "$broken_node" ]] && continue
    local image base tag
    for image in "${images[@]}"; do
      # ebbflow-runtime-0.1.0.oci.tar -> localhost/ebbflow/runtime:0.1.0 (the tag is the archive's
      # ref name); an image is pulled by nobody, so pods use these names with IfNotPresent.
      tag="$(tar -xOf "$image" index.json | python3 -c 'import json, sys; print(json.load(sys.stdin)["manifests"][0]["annotations"]["org.opencontainers.image.ref.name"])')" ||
        die "$image is not an OCI archive of scripts/oci-image.py (no ref name in its index.json)"
      base="$(basename "$image" .oci.tar)"
      base="${base%-"$tag"}"
      ctr --address "$sock" -n k8s.io images import --base-name "localhost/ebbflow/${base#ebbflow-}" "$image" >/dev/null ||
        die "importing $image into the containerd of $node failed"
    done
    ctr --address "$sock" -n k8s.io images ls -q | grep -x "$pause_image" >/dev/null ||
      die "the sandbox image $pause_image is not among the images given (build it with scripts/oci-image.py --pause)"
  done
  for i in "${!nodes[@]}"; do
    node="${nodes[$i]}"
    write_kubelet_config "$node" "$i" "$address"
    start "kubelet-$node" "$state/$node/logs/kubelet.log" "$kubelet" \
      --config "$run/$node/kubelet.yaml" --kubeconfig "$(kubeconfig_path "$name")" \
      --root-dir "$state/$node/kubelet" --hostname-override "$node" --node-ip "$address" \
      --node-labels "$(cat "$run/$node/labels")" --v=2
    # One at a time: every kubelet unlinks and binds the same device-plugin socket
    # (/var/lib/kubelet/device-plugins/kubelet.sock, not under --root-dir), and two doing it at
    # once fail ("address already in use") and exit. One after the other, the last holds it;
    # no test uses device plugins.
    if [[ "$node" == "$broken_node" ]]; then
      poll_until "node $node to register, NotReady for its network (logs: $state/$node/logs)" \
        node_not_ready_for_cni "$name" "$node"
    else
      poll_until "node $node to be Ready (logs: $state/$node/logs)" node_ready "$name" "$node"
    fi
  done

  # Cluster DNS: CoreDNS on this host's address, answering for Services and pods from the API.
  cat >"$run/Corefile" <<EOF
.:53 {
    bind $address
    errors
    ready 127.0.0.1:0
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        kubeconfig $(kubeconfig_path "$name")
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
    loadbalance
    forward . /etc/resolv.conf
}
EOF
  start coredns "$state/coredns.log" "$coredns" -conf "$run/Corefile"
  cat >"$run/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: 10.244.0.0/16
hostnameOverride: ${nodes[0]}
clientConnection: {kubeconfig: $(kubeconfig_path "$name")}
bindAddress: $address
healthzBindAddress: 127.0.0.1:10256
metricsBindAddress: 127.0.0.1:10249
conntrack: {maxPerCore: 0}
iptables: {localhostNodePorts: false}
EOF
  start kube-proxy "$state/kube-proxy.log" "$kube_proxy" --config "$run/kube-proxy.yaml" --v=2
  poll_until "CoreDNS to answer on $address:53" dns_answers "$address"
  log "nodes of $name are Ready: ${nodes[*]} (logs under $state)"
}
dns_answers() {
  python3 - "$1" <<'EOF'
import socket, struct, sys
q = struct.pack(">HHHHHH", 1, 0x100, 1, 0, 0, 0) + b"".join(
    bytes([len(p)]) + p.encode() for p in "kubernetes.default.svc.cluster.local".split(".")) + b"\0" + struct.pack(">HH", 1, 1)
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM); s.settimeout(1)
s.sendto(q, (sys.argv[1], 53)); r = s.recv(512)
sys.exit(0 if struct.unpack(">H", r[6:8])[0] > 0 else 1)
EOF
}
node_ready() {
  [[ "$(kubectl_in "$1" get node "$2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}')" == True ]]
}
node_not_ready_for_cni() {
  kubectl_in "$1" get node "$2" -o jsonpath='{.status.conditions[?(@.type=="Ready")].message}' 2>/dev/null |
    grep -q "cni plugin not initialized"
}

# Kills what `up` started and undoes its changes. With `quiet`, says nothing when there is nothing.
down() {
  local name="$1" quiet="${2:-}" node controller pid
  run="$(run_dir "$name")" state="$(state_dir "$name")"
  [[ -d "$run" || -d "$state" ]] || { [[ -n "$quiet" ]] || log "no real nodes for $name"; return 0; }
  log "stopping the real nodes of $name"
  # Frozen pods (see `kill`) cannot die until thawed.
  for node in "${nodes[@]}"; do
    [[ -f "/sys/fs/cgroup/freezer/ebbflow-$node/freezer.state" ]] && thaw "/sys/fs/cgroup/freezer/ebbflow-$node"
  done
  if [[ -d "$run/pids" ]]; then
    for pid in "$run"/pids/*; do
      [[ -f "$pid" ]] && kill -9 "$(cat "$pid")" 2>/dev/null || true
    done
  fi
  # Containers and their shims outlive containerd: kill every task in the nodes' cgroups, then
  # the shims that served these containerds.
  for node in "${nodes[@]}"; do
    for controller in pids memory; do
      [[ -d "/sys/fs/cgroup/$controller/ebbflow-$node" ]] || continue
      find "/sys/fs/cgroup/$controller/ebbflow-$node" -name cgroup.procs -exec cat {} + 2>/dev/null |
        xargs -r kill -9 2>/dev/null || true
    done
  done
  pkill -9 -f "containerd-shim-runc-v2 .*-address $run/" 2>/dev/null || true
  sleep 0.5
  # Mounts under the state and run dirs (overlay rootfs, shm, kubelet volumes), deepest first.
  awk '{print $2}' /proc/self/mounts | { grep -E "^($state|$run)/" || true; } | sort -r |
    while read -r mount; do umount -l "$mount" 2>/dev/null || true; done
  # Network namespaces the runs' sandboxes made (their veths and /32 routes go with them).
  if [[ -f "$run/netns-before" ]]; then
    comm -13 "$run/netns-before" <(ip netns list 2>/dev/null | awk '{print $1}' | sort) |
      while read -r ns; do ip netns delete "$ns" 2>/dev/null || true; done
  fi
  # kube-proxy's chains and rules, then the empty chains the kubelets make (their canary, which
  # tells them the tables were flushed, and the iptables-mode hint).
  if [[ -x "$bin_dir/kube-proxy-$kube_version" ]]; then
    "$bin_dir/kube-proxy-$kube_version" --cleanup >/dev/null 2>&1 || true
  fi
  local table chain command line rule
  for command in iptables ip6tables; do
    command -v "$command" >/dev/null || continue
    for table in nat mangle filter; do
      # Jumps from the built-in chains first (the kubelet's KUBE-FIREWALL from INPUT, OUTPUT).
      while read -r line; do
        read -ra rule <<<"${line/#-A /-D }"
        "$command" -t "$table" "${rule[@]}" 2>/dev/null || true
      done < <("$command" -t "$table" -S 2>/dev/null |
        grep -E '^-A (INPUT|OUTPUT|FORWARD|PREROUTING|POSTROUTING) .*-j KUBE-' || true)
      for chain in $("$command" -t "$table" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[A-Z-]*\)$/\1/p'); do
        "$command" -t "$table" -F "$chain" 2>/dev/null || true
      done
      for chain in $("$command" -t "$table" -S 2>/dev/null | sed -n 's/^-N \(KUBE-[A-Z-]*\)$/\1/p'); do
        "$command" -t "$table" -X "$chain" 2>/dev/null || true
      done
    done
  done
  # The nodes' cgroup roots, children first.
  for node in "${nodes[@]}"; do
    for controller in "${cgroup_controllers[@]}"; do
      [[ -d "/sys/fs/cgroup/$controller/ebbflow-$node" ]] || continue
      find "/sys/fs/cgroup/$controller/ebbflow-$node" -depth -type d -exec rmdir {} \; 2>/dev/null ||
        log "warning: could not remove /sys/fs/cgroup/$controller/ebbflow-$node"
    done
  done
  if [[ -f "$run/sysctls" ]]; then
    while IFS='=' read -r key value; do sysctl -qw "$key=$value" || true; done <"$run/sysctls"
  fi
  rm -rf "$run" "$state"
}
thaw() { echo THAWED >"$1/freezer.state" 2>/dev/null || true; }

kill_node() {
  local name="$1" node="$2"
  node_index "$node" >/dev/null
  run="$(run_dir "$name")"
  running "kubelet-$node" || die "node $node of $name is not running"
  kill -9 "$(cat "$run/pids/kubelet-$node")" "$(cat "$run/pids/containerd-$node")" 2>/dev/null || true
  echo FROZEN >"/sys/fs/cgroup/freezer/ebbflow-$node/freezer.state"
  log "node $node: kubelet and containerd killed, its pods frozen"
}

(($# >= 1)) || usage
command="$1"
shift
if [[ "$command" == nodes ]]; then
  printf '%s\n' "${nodes[@]}"
  exit 0
fi
(($# >= 1)) || usage
name="$1"
[[ "$name" =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "cluster name '$name' must be a DNS label"
case "$command" in
  up) shift; (($# >= 1)) || usage; up "$name" "$@" ;;
  down) (($# == 1)) || usage; down "$name" ;;
  kill) (($# == 2)) || usage; kill_node "$name" "$2" ;;
  *) usage ;;
esac
