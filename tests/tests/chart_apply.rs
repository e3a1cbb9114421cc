//! The Helm chart's rendered manifests against a real kube-apiserver (end-to-end; skipped without
//! `EBBFLOW_KUBECONFIG` and `EBBFLOW_HELM`, which scripts/e2e.sh sets): for the main value
//! combinations, every object `helm template` renders is accepted by a server-side apply dry run
//! with strict field validation, so a misspelt field or a wrong type fails here, not at install.

use std::{path::Path, process::Command};

use ebbflow_tests::cluster::{
    BoxError, FIELD_MANAGER, TestNamespace, client_or_skip, install_crd, repo_root,
};
use kube::{
    Api, Client, ResourceExt,
    api::{DynamicObject, GroupVersionKind, Patch, PatchParams},
    discovery::{self, Scope},
};
use serde::Deserialize as _;

/// Environment variable naming the helm binary (scripts/e2e.sh sets it from the cache).
const HELM_ENV: &str = "EBBFLOW_HELM";

/// API groups the suite's cluster does not serve (the Prometheus operator's CRDs); objects in
/// them are skipped with a note instead of failing.
const OPTIONAL_GROUPS: &[&str] = &["monitoring.coreos.com"];

/// `--set` arguments of the value combinations rendered (as in scripts/check-chart.sh).
const VALUE_COMBINATIONS: &[&[&str]] = &[
    &[],
    &["replicas=2"],
    &["leaderElection.enabled=false"],
    &["networkPolicy.enabled=true", "dashboards.enabled=false"],
    &["aws.region=us-east-1", "aws.credentialsSecret=aws-creds"],
    &["capacityType.preset=gke"],
    &["traces.claimName=spot-traces", "traces.speed=60"],
];

fn helm_template(
    helm: &Path,
    namespace: &str,
    set: &[&str],
    work: &Path,
) -> Result<String, BoxError> {
    let mut command = Command::new(helm);
    command
        .args(["template", "ebbflow"])
        .arg(repo_root().join("charts/ebbflow"))
        .args(["--namespace", namespace])
        .env("HELM_CACHE_HOME", work.join("cache"))
        .env("HELM_CONFIG_HOME", work.join("config"))
        .env("HELM_DATA_HOME", work.join("data"));
    for value in set {
        command.args(["--set", value]);
    }
    let output = command
        .output()
        .map_err(|e| format!("run {}: {e}", helm.display()))?;
    if !output.status.success() {
        return Err(format!(
            "helm template with {set:?} failed: {}",
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8(output.stdout)?)
}

/// Dry-run server-side applies one rendered object; `Ok(false)` if its group is optional and
/// not served.
async fn dry_run_apply(
    client: &Client,
    namespace: &str,
    object: DynamicObject,
) -> Result<bool, BoxError> {
    let types = object.types.clone().ok_or_else(|| {
        format!(
            "rendered object {} has no apiVersion/kind",
            object.name_any()
        )
    })?;
    let gvk = GroupVersionKind::try_from(&types)?;
    let (resource, capabilities) = match discovery::pinned_kind(client, &gvk).await {
        Ok(found) => found,
        Err(_) if OPTIONAL_GROUPS.contains(&gvk.group.as_str()) => return Ok(false),
        Err(e) => {
            return Err(format!(
                "{}/{} {}: kind not served: {e}",
                gvk.group,
                gvk.kind,
                object.name_any()
            )
            .into());
        }
    };
    let api: Api<DynamicObject> = match capabilities.scope {
        Scope::Namespaced => Api::namespaced_with(client.clone(), namespace, &resource),
        Scope::Cluster => Api::all_with(client.clone(), &resource),
    };
    let name = object.name_any();
    let params = PatchParams::apply(FIELD_MANAGER)
        .validation_strict()
        .dry_run();
    api.patch(&name, &params, &Patch::Apply(&object))
        .await
        .map_err(|e| format!("{} {name} rejected: {e}", gvk.kind))?;
    Ok(true)
}

#[tokio::test]
async fn rendered_chart_is_accepted_by_the_api_server() -> Result<(), BoxError> {
    let test = "rendered_chart_is_accepted_by_the_api_server";
    let Some(client) = client_or_skip(test).await? else {
        return Ok(());
    };
    let Some(helm) = std::env::var_os(HELM_ENV).filter(|p| !p.is_empty()) else {
        return Err(
            format!("{HELM_ENV} must name the helm binary when EBBFLOW_KUBECONFIG is set").into(),
        );
    };
    install_crd(&client).await?;
    let namespace = TestNamespace::create(&client, "chart").await?;
    let work = std::env::temp_dir().join(format!("ebbflow-chart-{}", std::process::id()));

    let mut failures = Vec::new();
    let mut skipped = Vec::new();
    let mut applied = 0;
    for set in VALUE_COMBINATIONS {
        let rendered = helm_template(Path::new(&helm), namespace.name(), set, &work)?;
        for document in serde_yaml::Deserializer::from_str(&rendered) {
            let value = serde_json::Value::deserialize(document)?;
            if value.is_null() {
                continue;
            }
            let object: DynamicObject = serde_json::from_value(value)?;
            let label = format!("{set:?} {}", object.name_any());
            match dry_run_apply(&client, namespace.name(), object).await {
                Ok(true) => applied += 1,
                Ok(false) => skipped.push(label),
                Err(e) => failures.push(format!("with {set:?}: {e}")),
            }
        }
    }
    let _ = std::fs::remove_dir_all(&work);
    assert!(
        failures.is_empty(),
        "{} rendered objects rejected:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(
        applied >= VALUE_COMBINATIONS.len() * 5,
        "only {applied} objects rendered"
    );
    println!("dry-run applied {applied} rendered objects; skipped (group not served): {skipped:?}");
    namespace.delete().await
}
