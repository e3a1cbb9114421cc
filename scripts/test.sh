#!/usr/bin/env bash
# Runs every ebbflow test on a fresh machine: installs what the tests need (cached under
# $HOME/.cache/ebbflow), then runs the unit, integration and end-to-end suites.
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
export EBBFLOW_CACHE="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$EBBFLOW_CACHE/target}"
# Incremental artifacts only help edit-compile loops; in a test run they cost gigabytes of disk
# per session in the shared cache (a full disk once broke a link step here).
export CARGO_INCREMENTAL="${CARGO_INCREMENTAL:-0}"
mkdir -p "$EBBFLOW_CACHE"

# Every clone builds its test targets under a new path, so cargo links a new executable of up to
# 1 GB (debug info) per test target beside the old ones and never removes those: clean-clone runs
# of `.ci/run` filled this machine's disk (144 of them, 50 GB) and failed a run. Only the newest
# executable of each target is kept: the same name built from the same kind of crate root (a
# library's unit tests and a binary of that name are two targets).
prune_stale_test_binaries() {
  local deps="$CARGO_TARGET_DIR/debug/deps" freed=0 name root size
  [[ -d "$deps" ]] || return 0
  declare -A seen=()
  while read -r _ name; do
    root=""
    [[ -f "$deps/$name.d" ]] && root="$(head -n 1 "$deps/$name.d" | cut -d' ' -f2)"
    local key="${name%-*}|$(basename "$(dirname "$root")")/$(basename "$root")"
    if [[ -n "${seen[$key]:-}" ]]; then
      size=$(stat -c %s "$deps/$name")
      rm -f "$deps/$name" "$deps/$name.d" && freed=$((freed + size))
    else
      seen[$key]=1
    fi
  done < <(find "$deps" -maxdepth 1 -type f -executable ! -name '*.so' -printf '%T@ %f\n' | sort -rn)
  echo "test.sh: removed stale test executables: $((freed / 1000000)) MB"
}
prune_stale_test_binaries

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> no import cycles between the files of the operator and of BidBrain (scripts/check-imports.py)"
python3 scripts/check-imports.py --self-test
python3 scripts/check-imports.py operator/src operator/bidbrain/src operator/job/src

echo "==> the shared spot traces (EBBFLOW_SPOT_DATA, else ../shared/data/spot beside the repository)"
spot_data="${EBBFLOW_SPOT_DATA:-$repo/../shared/data/spot}"
if [[ ! -f "$spot_data/aws_p3.2xlarge_availability_price_9az_2023-02-15_to_03-09.csv" ]]; then
  echo "test.sh: error: no spot traces in $spot_data: put the shared data beside the repository (../shared/data/spot) or set EBBFLOW_SPOT_DATA to that directory" >&2
  exit 1
fi
export EBBFLOW_SPOT_DATA="$(cd "$spot_data" && pwd)"

echo "==> real data sets (scripts/fetch-data.sh) and the Python test venv (scripts/setup-python.sh)"
export EBBFLOW_DATA_DIR="${EBBFLOW_DATA_DIR:-$(scripts/fetch-data.sh)}"
export EBBFLOW_PYTHON="${EBBFLOW_PYTHON:-$(scripts/setup-python.sh)}"

echo "==> the Python SDK's wheel in that venv (scripts/setup-python-sdk.sh, rebuilt when its sources change)"
scripts/setup-python-sdk.sh "$EBBFLOW_PYTHON"

echo "==> amazon-ec2-metadata-mock for the node notice tests (scripts/setup-cluster-tools.sh, cached)"
# shellcheck source=../tests/cluster/versions.env
source tests/cluster/versions.env
if [[ -z "${EBBFLOW_EC2_METADATA_MOCK:-}" ]]; then
  mock_bin_dir="$(scripts/setup-cluster-tools.sh amazon-ec2-metadata-mock)"
  export EBBFLOW_EC2_METADATA_MOCK="$mock_bin_dir/amazon-ec2-metadata-mock-$ec2_metadata_mock_version"
fi

echo "==> iproute2 for the vanished-peer test (runtime/tests/data_plane.rs a_vanished_peer_is_let_go: ip netns, as root)"
if ! command -v ip >/dev/null && ((EUID == 0)) && command -v apt-get >/dev/null; then
  DEBIAN_FRONTEND=noninteractive apt-get update -qq && apt-get install -y -qq --no-install-recommends iproute2 ||
    echo "test.sh: warning: installing iproute2 failed; a_vanished_peer_is_let_go will say it skipped" >&2
fi

echo "==> cargo test (unit + integration, no cluster needed; Python apps in ebbflow run and the EC2 client too)"
# The embedded interpreter of the Python tests reads the test venv's packages (numpy, torch and
# the SDK) as `python` would inside it.
VIRTUAL_ENV="$(dirname "$(dirname "$EBBFLOW_PYTHON")")" \
  cargo test --workspace --locked --features ebbflow-operator/python,ebbflow-operator/ec2

echo "==> fuzzing: a short coverage-guided run of each target (scripts/fuzz.sh: AFL++ via cargo-afl, cached; the recorded 10 M executions per target are in BENCHMARKS.md)"
EBBFLOW_FUZZ_EXECS="${EBBFLOW_FUZZ_EXECS:-30000}" scripts/fuzz.sh

echo "==> helm chart: lint, template across value combinations, values schema rejections"
scripts/check-chart.sh

# A real control plane (built from Go modules, cached) with kwok nodes; EBBFLOW_SKIP_E2E=1 skips.
if [[ "${EBBFLOW_SKIP_E2E:-0}" == 1 ]]; then
  echo "==> end-to-end on a real control plane: skipped (EBBFLOW_SKIP_E2E=1)"
else
  echo "==> end-to-end on a real control plane (scripts/e2e.sh: kwok cluster on 127.0.0.1)"
  scripts/e2e.sh
fi

# The chart and TrainingJobs on four real kubelets with containerd (root; EBBFLOW_SKIP_REAL_PODS=1
# skips): release images, real SIGTERM and grace periods, Services through kube-proxy and CoreDNS.
if [[ "${EBBFLOW_SKIP_E2E:-0}" == 1 || "${EBBFLOW_SKIP_REAL_PODS:-0}" == 1 ]]; then
  echo "==> real pods on real kubelets: skipped (EBBFLOW_SKIP_E2E or EBBFLOW_SKIP_REAL_PODS)"
else
  echo "==> real pods on real kubelets (scripts/e2e-real.sh: containerd + kubelet x4, kube-proxy, CoreDNS)"
  scripts/e2e-real.sh
fi
