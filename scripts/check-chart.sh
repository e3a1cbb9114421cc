#!/usr/bin/env bash
# Checks the Helm chart: `helm lint` and `helm template` across the main value combinations, and
# values.yaml mistakes rejected by values.schema.json with the schema's message. Uses the helm
# built by scripts/setup-cluster-tools.sh (cached).
set -euo pipefail
repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
source "$repo/tests/cluster/versions.env"
bin_dir="$("$repo/scripts/setup-cluster-tools.sh")"
helm="$bin_dir/helm-$helm_version"
chart="$repo/charts/ebbflow"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
export HELM_CACHE_HOME="$work/cache" HELM_CONFIG_HOME="$work/config" HELM_DATA_HOME="$work/data"

fail() { echo "check-chart: error: $*" >&2; exit 1; }

combos=(
  ""
  "--set replicas=2"
  "--set leaderElection.enabled=false"
  "--set metrics.serviceMonitor.enabled=true --set metrics.podMonitor.enabled=true --set networkPolicy.enabled=true"
  "--set dashboards.enabled=false"
  "--set aws.region=us-east-1 --set aws.credentialsSecret=aws-creds"
  "--set-string serviceAccount.annotations.eks\\.amazonaws\\.com/role-arn=arn:aws:iam::123456789012:role/ebbflow"
  "--set capacityType.preset=custom --set capacityType.labelKey=example.com/capacity --set capacityType.onDemandValue=od --set capacityType.spotValue=spot"
  "--set capacityType.preset=gke"
  "--set capacityType.preset=custom --set capacityType.labelKey=example.com/spot --set-string capacityType.spotValue=true"
  "--set serviceAccount.create=false --set serviceAccount.name=ebbflow-existing"
  "--set watchNamespace=ml-jobs"
  "--set metrics.bindAddress=[::]"
  "--set traces.claimName=spot-traces --set traces.speed=60"
  "--set runtimeImage.repository=registry.example.com/ebbflow-runtime --set runtimeImage.tag=1.2.3"
)
for combo in "${combos[@]}"; do
  # shellcheck disable=SC2086
  "$helm" lint --strict "$chart" $combo >"$work/lint.out" 2>&1 || { cat "$work/lint.out" >&2; fail "helm lint failed with: ${combo:-defaults}"; }
  # shellcheck disable=SC2086
  "$helm" template ebbflow "$chart" --namespace ebbflow-system --include-crds $combo >"$work/out.yaml" 2>"$work/err" ||
    { cat "$work/err" >&2; fail "helm template failed with: ${combo:-defaults}"; }
  grep -q "kind: Deployment" "$work/out.yaml" || fail "no Deployment rendered with: ${combo:-defaults}"
  grep -q "kind: CustomResourceDefinition" "$work/out.yaml" || fail "no CRD rendered with: ${combo:-defaults}"
  echo "check-chart: ok: ${combo:-defaults}"
done

# The runtime image reaches the operator: the chart's appVersion by default, or as set.
"$helm" template ebbflow "$chart" >"$work/out.yaml" 2>/dev/null
app_version="$(sed -n 's/^appVersion: "\(.*\)"/\1/p' "$chart/Chart.yaml")"
grep -q -- "--runtime-image=ghcr.io/ebbflow/ebbflow-runtime:$app_version" "$work/out.yaml" ||
  fail "the default runtime image is not ghcr.io/ebbflow/ebbflow-runtime:$app_version"
"$helm" template ebbflow "$chart" --set runtimeImage.repository=registry.example.com/rt --set runtimeImage.tag=1.2.3 >"$work/out.yaml" 2>/dev/null
grep -q -- "--runtime-image=registry.example.com/rt:1.2.3" "$work/out.yaml" || fail "runtimeImage is not passed to the operator"
echo "check-chart: ok: runtime image flag"

# The ServiceMonitor keeps the per-job series' own namespace label.
"$helm" template ebbflow "$chart" --set metrics.serviceMonitor.enabled=true >"$work/out.yaml" 2>/dev/null
grep -q "honorLabels: true" "$work/out.yaml" || fail "the ServiceMonitor does not honor the jobs' namespace labels"
# Without leader election no replica is told to hold a lease; the readiness probe stays.
"$helm" template ebbflow "$chart" --set leaderElection.enabled=false >"$work/out.yaml" 2>/dev/null
if grep -q -- "--leader-election" "$work/out.yaml"; then fail "leader election flags rendered while disabled"; fi
# The retry period reaches the operator, and a faster one is accepted with a shorter renew deadline.
"$helm" template ebbflow "$chart" --set leaderElection.retryPeriodSeconds=1 --set leaderElection.renewDeadlineSeconds=2 --set leaderElection.leaseDurationSeconds=5 >"$work/out.yaml" 2>/dev/null ||
  fail "a 1 s retry period with a 2 s renew deadline and a 5 s lease was refused"
grep -q -- "--retry-period-seconds=1" "$work/out.yaml" || fail "leaderElection.retryPeriodSeconds is not passed to the operator"
echo "check-chart: ok: service monitor labels, leader election off, retry period"

# watchNamespace: the namespaced rights move from the ClusterRole to a Role in that namespace.
"$helm" template ebbflow "$chart" --set watchNamespace=ml-jobs --show-only templates/rbac.yaml >"$work/rbac.yaml" 2>/dev/null
# one file per document: the ClusterRole is the first, the namespaced Role follows the leader Role
awk -v dir="$work" '/^---/{n++} {print > (dir "/rbac-" n ".yaml")}' "$work/rbac.yaml"
cluster_role="$(grep -l "^kind: ClusterRole$" "$work"/rbac-*.yaml)"
scoped_role="$(grep -l "^  namespace: ml-jobs$" "$work"/rbac-*.yaml | xargs grep -l "^kind: Role$")"
if grep -q '"secrets"\|"pods"' "$cluster_role"; then fail "with watchNamespace the ClusterRole still grants pods or secrets"; fi
grep -q '"nodes"' "$cluster_role" || fail "with watchNamespace the ClusterRole lost nodes"
grep -q '"secrets"' "$scoped_role" && grep -q '"trainingjobs"' "$scoped_role" && grep -q '"events"' "$scoped_role" ||
  fail "with watchNamespace the Role in it lacks the jobs' rights"
"$helm" template ebbflow "$chart" --set watchNamespace=ml-jobs >"$work/out.yaml" 2>/dev/null
grep -q -- "--watch-namespace=ml-jobs" "$work/out.yaml" || fail "watchNamespace is not passed to the operator"
echo "check-chart: ok: watchNamespace scopes the RBAC"

# Each mistake must fail at render time with a message naming the offending key.
bad=(
  "--set replicas=two|replicas"
  "--set replicas=0|replicas"
  "--set unknownKey=1|unknownKey"
  "--set image.pullPolicy=Sometimes|pullPolicy"
  "--set metrics.port=80|port"
  "--set logFormat=xml|logFormat"
  "--set leaderElection.enabled=maybe|enabled"
  "--set capacityType.preset=azure|preset"
  "--set capacityType.preset=custom|capacityType.labelKey"
  "--set aws.interruptionPollSeconds=0|interruptionPollSeconds"
  "--set traces.speed=0|speed"
  "--set traces.claimName=Not_A_Name|claimName"
  "--set runtimeImage.repository=|repository"
  "--set serviceAccount.create=false|serviceAccount.name"
  "--set leaderElection.leaseDurationSeconds=5|renewDeadlineSeconds"
  "--set leaderElection.renewDeadlineSeconds=2|renewDeadlineSeconds"
  "--set leaderElection.retryPeriodSeconds=6|retryPeriodSeconds"
  "--set leaderElection.retryPeriodSeconds=0|retryPeriodSeconds"
  "--set watchNamespace=Not_A_Namespace|watchNamespace"
  "--set metrics.bindAddress=localhost|bindAddress"
)
for case in "${bad[@]}"; do
  args="${case%%|*}" want="${case##*|}"
  # shellcheck disable=SC2086
  if "$helm" template ebbflow "$chart" $args >/dev/null 2>"$work/err"; then
    fail "helm template accepted a bad value: $args"
  fi
  # helm warns that charts/ebbflow/dashboards is a symlink (to the top-level dashboards/): not the error.
  grep -v "found symbolic link in path" "$work/err" >"$work/why" || true
  grep -q "$want" "$work/why" || { cat "$work/err" >&2; fail "error for '$args' does not name '$want'"; }
  echo "check-chart: rejected as expected: $args: $(head -c 200 "$work/why" | tr '\n' ' ')"
done
echo "check-chart: all chart checks passed"
