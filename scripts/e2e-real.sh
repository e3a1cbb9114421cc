#!/usr/bin/env bash
# The real-pod stage of scripts/test.sh: the chart and TrainingJobs on real kubelets. Builds (or
# reuses, cached) the control plane, kubelet, kube-proxy and CoreDNS, the release images
# (scripts/build-images.sh) and the sandbox image (tests/cluster/pause); starts a control plane
# bound to this host's address (scripts/cluster.sh) with four real nodes (one never Ready) (scripts/real-nodes.sh);
# runs tests/tests/real_pods.rs against it; always tears both down. On failure the nodes' and
# control plane's logs are kept in $EBBFLOW_CACHE/e2e-real-logs.
#
# Needs root (containerd, kubelet, iptables, cgroups); without it, says so and skips.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
name="${EBBFLOW_E2E_REAL_CLUSTER:-ebbflow-real}"
mkdir -p "$EBBFLOW_CACHE"
if ((EUID != 0)); then
  echo "e2e-real: skipped: real kubelets need root (containerd, iptables, cgroups)" >&2
  exit 0
fi

# shellcheck source=../tests/cluster/versions.env
source tests/cluster/versions.env
bin_dir="$(scripts/setup-cluster-tools.sh)"
export EBBFLOW_HELM="$bin_dir/helm-$helm_version"
# Step 6 scrapes the real pods with a real Prometheus (Debian's, installed when missing).
export EBBFLOW_PROMETHEUS="${EBBFLOW_PROMETHEUS:-$(scripts/setup-prometheus.sh)}"

# Images: the release build the chart's users get, under a tag of this tree (never `latest`, so
# IfNotPresent uses the imported image), and the sandbox image.
tag="e2e-$(git rev-parse --short=12 HEAD 2>/dev/null || echo dev)"
[[ -z "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]] || tag+="-dirty"
images="$EBBFLOW_CACHE/e2e-real-images"
rm -rf "$images" && mkdir -p "$images"
# The Python runtime image needs a Python with numpy: the test venv (cached).
export EBBFLOW_PYTHON="${EBBFLOW_PYTHON:-$(scripts/setup-python.sh)}"
echo "e2e-real: building the images (scripts/build-images.sh $tag, the Python runtime image too)" >&2
scripts/build-images.sh "$tag" >&2
mv out/images/ebbflow-operator-"$tag".oci.tar out/images/ebbflow-runtime-"$tag".oci.tar \
  out/images/ebbflow-runtime-python-"$tag".oci.tar "$images/"
if ! command -v gcc >/dev/null || [[ ! -f /usr/lib/x86_64-linux-gnu/libc.a && ! -f /usr/lib/aarch64-linux-gnu/libc.a ]]; then
  echo "e2e-real: installing gcc and libc6-dev (apt) for the static sandbox binary" >&2
  DEBIAN_FRONTEND=noninteractive apt-get update -qq >&2 &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends gcc libc6-dev >&2 ||
    { echo "e2e-real: error: need gcc and a static libc (libc6-dev) to build tests/cluster/pause" >&2; exit 1; }
fi
gcc -Os -static -Wall -o "$images/pause" tests/cluster/pause/pause.c
python3 scripts/oci-image.py --pause "$images/pause" --out "$images" --tag 3.10 >&2

# The lock is this script's alone: what it starts runs with fd 8 closed (8>&-), so a process
# that outlives a killed run (a test's Prometheus) cannot hold the next run off for an hour.
exec 8>"$EBBFLOW_CACHE/e2e-$name.lock"
flock -w 3600 8 || { echo "e2e-real: error: another run held the lock for an hour" >&2; exit 1; }

finish() {
  local status=$?
  if ((status != 0)); then
    rm -rf "$EBBFLOW_CACHE/e2e-real-logs" && mkdir -p "$EBBFLOW_CACHE/e2e-real-logs"
    cp -r "$EBBFLOW_CACHE/kwok/clusters/$name/logs" "$EBBFLOW_CACHE/e2e-real-logs/control-plane" 2>/dev/null || true
    (cd "$EBBFLOW_CACHE/real-nodes/$name" 2>/dev/null &&
      find . -name '*.log' -exec cp --parents {} "$EBBFLOW_CACHE/e2e-real-logs/" \;) || true
    echo "e2e-real: logs of the failed run: $EBBFLOW_CACHE/e2e-real-logs" >&2
  fi
  scripts/real-nodes.sh down "$name" || echo "e2e-real: warning: could not stop the real nodes" >&2
  scripts/cluster.sh down "$name" || echo "e2e-real: warning: could not delete cluster $name" >&2
  exit "$status"
}
trap finish EXIT

die() { echo "e2e-real: error: $*" >&2; exit 1; }
# shellcheck source=lib/cluster-common.sh
source scripts/lib/cluster-common.sh
address="$(host_address)"
kubeconfig="$(EBBFLOW_CLUSTER_ADDRESS="$address" EBBFLOW_ONDEMAND_NODES=0 EBBFLOW_SPOT_NODES=0 scripts/cluster.sh up "$name" 8>&-)"
scripts/real-nodes.sh up "$name" "$images"/*.oci.tar 8>&-
EBBFLOW_REAL_KUBECONFIG="$kubeconfig" EBBFLOW_REAL_IMAGE_TAG="$tag" EBBFLOW_REAL_NODES_SCRIPT="$repo/scripts/real-nodes.sh" \
  EBBFLOW_REAL_CLUSTER="$name" cargo test -p ebbflow-tests --locked --test real_pods -- --test-threads 1 8>&-
