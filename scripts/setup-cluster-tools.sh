#!/usr/bin/env bash
# Builds the real components the end-to-end suite runs, from the Go module proxy at the versions
# pinned in tests/cluster/versions.env: kube-apiserver, kube-controller-manager, kube-scheduler,
# kubectl, kubelet and kube-proxy (tests/cluster/go.mod), etcd (tests/cluster/etcd), CoreDNS
# (tests/cluster/coredns), kwok, kwokctl, helm and
# amazon-ec2-metadata-mock (tests/cluster/ec2-metadata-mock). Each lands in
# $EBBFLOW_CACHE/bin/<name>-<version> and is skipped when already there. Prints the bin dir on
# stdout (progress goes to stderr).
#
# Usage: setup-cluster-tools.sh [NAME...]   only the named tools (e.g. helm); default all.
#
# Env: EBBFLOW_CACHE (default ~/.cache/ebbflow); EBBFLOW_GO_JOBS, parallel Go compiles (default 2;
# use 1 when others compile on the same machine).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
# shellcheck source=../tests/cluster/versions.env
source "$repo/tests/cluster/versions.env"
bin_dir="${EBBFLOW_CACHE:-$HOME/.cache/ebbflow}/bin"
mkdir -p "$bin_dir"

log() { echo "setup-cluster-tools: $*" >&2; }
die() { echo "setup-cluster-tools: error: $*" >&2; exit 1; }

# Debian-style installs put Go outside the default PATH.
command -v go >/dev/null || [[ ! -x /usr/local/go/bin/go ]] || PATH="/usr/local/go/bin:$PATH"
command -v go >/dev/null || die "go not found on PATH or in /usr/local/go/bin (need Go >= 1.26)"
export GOTOOLCHAIN=local
export GOFLAGS="-p=${EBBFLOW_GO_JOBS:-2} -trimpath -buildvcs=false"

# One setup at a time per cache (concurrent runs would build the same thing twice).
exec 9>"$bin_dir/.setup.lock"
flock 9

all_tools=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy etcd coredns kwok kwokctl helm
  amazon-ec2-metadata-mock)
for requested in "$@"; do
  [[ " ${all_tools[*]} " == *" $requested "* ]] || die "unknown tool '$requested' (known: ${all_tools[*]})"
done
requested_tools=("$@")
wanted() { ((${#requested_tools[@]} == 0)) || [[ " ${requested_tools[*]} " == *" $1 "* ]]; }
# have NAME VERSION: nothing to do for NAME (already built, or not asked for).
have() { [[ -x "$bin_dir/$1-$2" ]] || ! wanted "$1"; }

# Builds go to a temp dir and move into place only when they succeeded, so an interrupted build
# never leaves a half-written binary.
staging_dir="$(mktemp -d "$bin_dir/.build.XXXXXX")"
trap 'rm -rf "$staging_dir"' EXIT
install_built() {
  local built="$1" name="$2" version="$3"
  [[ -x "$built" ]] || die "build of $name $version produced no binary at $built"
  mv -f "$built" "$bin_dir/$name-$version"
  log "built $name-$version"
}
timed() {
  local what="$1" start=$SECONDS
  shift
  log "building $what"
  nice -n 15 "$@" >&2 || die "building $what failed (command: $*)"
  log "$what took $((SECONDS - start)) s"
}

# --- Kubernetes control plane, kubectl, kubelet and kube-proxy: one go build so shared packages compile once -------
kube_cmds=(kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet kube-proxy)
missing_kube=()
for name in "${kube_cmds[@]}"; do
  have "$name" "$kube_version" || missing_kube+=("$name")
done
if (( ${#missing_kube[@]} > 0 )); then
  grep -Eq "^(require)?[[:space:]]*k8s.io/kubernetes $kube_version( |\$)" "$repo/tests/cluster/go.mod" ||
    die "tests/cluster/go.mod is not for $kube_version: run tests/cluster/gen-go-mod.sh"
  [[ "$kube_version" =~ ^v([0-9]+)\.([0-9]+)\. ]] || die "bad kube_version $kube_version"
  kube_ldflags=""
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    kube_ldflags+=" -X $pkg.gitVersion=$kube_version -X $pkg.gitMajor=${BASH_REMATCH[1]}"
    kube_ldflags+=" -X $pkg.gitMinor=${BASH_REMATCH[2]} -X $pkg.gitTreeState=clean"
    kube_ldflags+=" -X $pkg.buildDate=1970-01-01T00:00:00Z"
  done
  pkgs=()
  for name in "${missing_kube[@]}"; do pkgs+=("k8s.io/kubernetes/cmd/$name"); done
  timed "${missing_kube[*]} $kube_version" \
    go -C "$repo/tests/cluster" build -ldflags "-s -w $kube_ldflags" -o "$staging_dir/" "${pkgs[@]}"
  for name in "${missing_kube[@]}"; do
    install_built "$staging_dir/$name" "$name" "$kube_version"
  done
fi

# --- etcd ----------------------------------------------------------------------------------------
if ! have etcd "$etcd_version"; then
  grep -Eq "go.etcd.io/etcd/server/v3 $etcd_version( |\$)" "$repo/tests/cluster/etcd/go.mod" ||
    die "tests/cluster/etcd/go.mod does not require etcd server $etcd_version"
  timed "etcd $etcd_version" \
    go -C "$repo/tests/cluster/etcd" build -ldflags "-s -w" -o "$staging_dir/etcd" .
  install_built "$staging_dir/etcd" etcd "$etcd_version"
fi

# --- CoreDNS, the real-node stage's cluster DNS (a wrapper module with the plugins it uses) ------
if ! have coredns "$coredns_version"; then
  grep -Eq "github.com/coredns/coredns $coredns_version( |\$)" "$repo/tests/cluster/coredns/go.mod" ||
    die "tests/cluster/coredns/go.mod does not require coredns $coredns_version"
  timed "coredns $coredns_version" \
    go -C "$repo/tests/cluster/coredns" build -ldflags "-s -w" -o "$staging_dir/coredns" .
  install_built "$staging_dir/coredns" coredns "$coredns_version"
fi

# --- go install'ed tools --------------------------------------------------------------------------
# go_install NAME VERSION BUILT_NAME LDFLAGS PACKAGE@VERSION
go_install() {
  local name="$1" version="$2" built_name="$3" ldflags="$4" package="$5"
  have "$name" "$version" && return 0
  timed "$name $version" env GOBIN="$staging_dir" go install -ldflags "-s -w $ldflags" "$package"
  install_built "$staging_dir/$built_name" "$name" "$version"
}
kwok_consts="-X sigs.k8s.io/kwok/pkg/consts.Version=${kwok_version#v}"
go_install kwok "$kwok_version" kwok "$kwok_consts" "sigs.k8s.io/kwok/cmd/kwok@$kwok_version"
go_install kwokctl "$kwok_version" kwokctl "$kwok_consts" "sigs.k8s.io/kwok/cmd/kwokctl@$kwok_version"

if ! have helm "$helm_version"; then
  # helm's Makefile stamps its version and the Kubernetes minor of the client-go it links
  # (the default "kube version" of helm template / lint).
  helm_mod="$(go mod download -json "helm.sh/helm/v3@$helm_version" | sed -n 's/^[[:space:]]*"GoMod": "\(.*\)",$/\1/p')"
  helm_kube_minor="$(sed -n 's/^[[:space:]]*k8s.io\/client-go v0\.\([0-9]*\)\..*/\1/p' "$helm_mod")"
  [[ -n "$helm_kube_minor" ]] || die "could not read client-go's version from helm $helm_version's go.mod"
  helm_ldflags="-X helm.sh/helm/v3/internal/version.version=$helm_version"
  helm_ldflags+=" -X helm.sh/helm/v3/internal/version.metadata= -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$helm_kube_minor"
  done
  go_install helm "$helm_version" helm "$helm_ldflags" "helm.sh/helm/v3/cmd/helm@$helm_version"
fi

# The module proxy serves no version list for the mock, which `go install pkg@version` needs, so
# it builds from a wrapper module (tests/cluster/ec2-metadata-mock) like etcd.
if ! have amazon-ec2-metadata-mock "$ec2_metadata_mock_version"; then
  grep -q "github.com/aws/amazon-ec2-metadata-mock $ec2_metadata_mock_version" \
    "$repo/tests/cluster/ec2-metadata-mock/go.mod" ||
    die "tests/cluster/ec2-metadata-mock/go.mod does not require $ec2_metadata_mock_version"
  timed "amazon-ec2-metadata-mock $ec2_metadata_mock_version" \
    go -C "$repo/tests/cluster/ec2-metadata-mock" build -ldflags "-s -w" \
    -o "$staging_dir/amazon-ec2-metadata-mock" github.com/aws/amazon-ec2-metadata-mock/cmd
  install_built "$staging_dir/amazon-ec2-metadata-mock" amazon-ec2-metadata-mock "$ec2_metadata_mock_version"
fi

echo "$bin_dir"
