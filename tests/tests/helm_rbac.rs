//! `helm install` of `charts/ebbflow` on the real control plane, then the operator running with a
//! token of the chart's ServiceAccount, so the chart's RBAC is what is tested (issue 7): with it
//! the controller reconciles a TrainingJob end to end (pods, status, events, cleanup) and holds
//! its Lease; without cluster-admin it cannot, for instance, delete a node or read another
//! namespace's ConfigMaps. Installed with `watchNamespace`, the same holds with the namespaced
//! rights in a Role there: the operator scoped to that namespace reconciles its job, and cannot
//! read Secrets anywhere else.
//!
//! Skipped (with a line saying so) unless `EBBFLOW_KUBECONFIG` and `EBBFLOW_HELM` are set
//! (`scripts/e2e.sh` sets both).

use std::io::Write as _;
use std::time::Duration;

use ebbflow_crds::TrainingJob;
use ebbflow_operator::controller;
use ebbflow_operator::leader::{LeaderElector, LeaseConfig};
use ebbflow_tests::cluster::{
    BoxError, FIELD_MANAGER, KUBECONFIG_ENV, TestNamespace, client_or_skip, install_crd,
    poll_until, repo_root,
};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::networking::v1::NetworkPolicy;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::config::{AuthInfo, KubeConfigOptions, Kubeconfig};
use kube::{Api, Client, Config};

fn helm(args: &[&str]) -> Result<String, BoxError> {
    ebbflow_tests::cluster::helm(&std::env::var(KUBECONFIG_ENV)?, args)
}

/// A client for the same API server that authenticates as `namespace/service_account` with a
/// short-lived token from the TokenRequest API.
async fn service_account_client(
    admin: &Client,
    namespace: &str,
    service_account: &str,
) -> Result<Client, BoxError> {
    let accounts: Api<ServiceAccount> = Api::namespaced(admin.clone(), namespace);
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: Vec::new(),
            expiration_seconds: Some(3600),
            ..TokenRequestSpec::default()
        },
        ..TokenRequest::default()
    };
    let issued: TokenRequest = accounts
        .create_subresource("token", service_account, &PostParams::default(), &request)
        .await?;
    let token = issued
        .status
        .ok_or("token request returned no status")?
        .token;
    let path = std::env::var(KUBECONFIG_ENV)?;
    let kubeconfig = Kubeconfig::read_from(&path)?;
    let mut config =
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default()).await?;
    config.auth_info = AuthInfo {
        token: Some(token.into()),
        ..AuthInfo::default()
    };
    Ok(Client::try_from(config)?)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_chart_installs_and_its_rbac_is_enough_and_no_more() -> Result<(), BoxError> {
    chart_rbac_scenario(
        "the_chart_installs_and_its_rbac_is_enough_and_no_more",
        "ebbflow",
        false,
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_watch_namespace_the_rights_are_a_role_in_that_namespace() -> Result<(), BoxError> {
    chart_rbac_scenario(
        "with_watch_namespace_the_rights_are_a_role_in_that_namespace",
        "ebbflow-scoped",
        true,
    )
    .await
}

/// Installs the chart as release `release` (with `watchNamespace` set to the jobs' namespace if
/// `scoped`) and runs a job through the operator authenticated as its ServiceAccount.
async fn chart_rbac_scenario(test: &str, release: &str, scoped: bool) -> Result<(), BoxError> {
    if std::env::var_os("EBBFLOW_HELM").is_none() {
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: EBBFLOW_HELM is unset (scripts/e2e.sh sets it)"
        );
        return Ok(());
    }
    let Some(admin) = client_or_skip(test).await? else {
        return Ok(());
    };
    install_crd(&admin).await?;
    let prefix = if scoped {
        "e2e-helm-scoped"
    } else {
        "e2e-helm"
    };
    let release_namespace = TestNamespace::create(&admin, prefix).await?;
    let jobs_namespace = TestNamespace::create(&admin, &format!("{prefix}-jobs")).await?;
    let release_ns = release_namespace.name().to_owned();
    let jobs_ns = jobs_namespace.name().to_owned();

    let chart = repo_root().join("charts/ebbflow");
    let watch = format!("watchNamespace={jobs_ns}");
    let mut install = vec![
        "install",
        release,
        chart.to_str().ok_or("chart path")?,
        "--namespace",
        &release_ns,
    ];
    if scoped {
        install.extend(["--set", &watch]);
    }
    helm(&install)?;
    let deployments: Api<Deployment> = Api::namespaced(admin.clone(), &release_ns);
    let deployment = deployments.get(release).await?;
    let pod_spec = deployment
        .spec
        .and_then(|s| s.template.spec)
        .ok_or("the chart's Deployment has no pod spec")?;
    assert_eq!(pod_spec.service_account_name.as_deref(), Some(release));

    // The operator as the chart's ServiceAccount.
    let operator = service_account_client(&admin, &release_ns, release).await?;
    controller::check_crd(&operator)
        .await
        .map_err(|e| format!("the CRD check as the ServiceAccount failed: {e}"))?;
    let lease = LeaderElector::new(
        operator.clone(),
        LeaseConfig {
            name: release.into(),
            namespace: release_ns.clone(),
            identity: "e2e".into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(1),
        },
    );
    assert!(
        lease.try_acquire_or_renew().await,
        "the ServiceAccount cannot take its Lease"
    );
    let stop = ebbflow_tests::operator::start_custom(
        &operator,
        &prometheus::Registry::new(),
        "http://127.0.0.1:9",
        ebbflow_tests::operator::Custom {
            capacity: std::sync::Arc::new(controller::capacity::SpecCapacityPlanner),
            ec2: None,
            namespace: scoped.then(|| jobs_ns.clone()),
        },
    )
    .await?;

    // A job reconciled end to end by the ServiceAccount-authenticated operator.
    let quickstart = std::fs::read_to_string(repo_root().join("examples/quickstart.yaml"))?;
    let mut job: TrainingJob = serde_yaml::from_str(&quickstart)?;
    job.metadata.namespace = Some(jobs_ns.clone());
    job.spec.transient.min_nodes = 1;
    let jobs: Api<TrainingJob> = Api::namespaced(admin.clone(), &jobs_ns);
    jobs.patch(
        "quickstart",
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&job),
    )
    .await?;
    let pods: Api<Pod> = Api::namespaced(admin.clone(), &jobs_ns);
    let budgets: Api<PodDisruptionBudget> = Api::namespaced(admin.clone(), &jobs_ns);
    let policies: Api<NetworkPolicy> = Api::namespaced(admin.clone(), &jobs_ns);
    let selector =
        ListParams::default().labels(&format!("{}=quickstart", controller::plan::JOB_LABEL));
    let policy = poll_until(
        "pods, the coordinator's disruption budget, the job's NetworkPolicy and a status written \
         under the chart's RBAC",
        Duration::from_secs(60),
        || {
            let (pods, jobs, selector) = (pods.clone(), jobs.clone(), selector.clone());
            let (budgets, policies) = (budgets.clone(), policies.clone());
            async move {
                let count = pods.list(&selector).await?.items.len();
                let status = jobs.get("quickstart").await?.status.unwrap_or_default();
                let budget = budgets.get_opt("quickstart-coordinator").await?;
                let policy = policies.get_opt("quickstart-coordinator").await?;
                Ok(policy
                    .filter(|_| count >= 2 && !status.conditions.is_empty() && budget.is_some()))
            }
        },
    )
    .await?;
    // The API server took it as the operator built it: the job's pods, three ingress rules.
    let spec = policy.spec.ok_or("the NetworkPolicy has no spec")?;
    let selected = spec
        .pod_selector
        .and_then(|s| s.match_labels)
        .unwrap_or_default();
    assert_eq!(
        selected
            .get(controller::plan::JOB_LABEL)
            .map(String::as_str),
        Some("quickstart")
    );
    assert_eq!(spec.ingress.map(|rules| rules.len()), Some(3));
    // The job's token is in its Secret and nowhere a reader of jobs and events looks.
    let secrets: Api<Secret> = Api::namespaced(admin.clone(), &jobs_ns);
    let token = secrets
        .get("quickstart-token")
        .await?
        .data
        .and_then(|data| data.get("token").cloned())
        .ok_or("the job's Secret has no token")?;
    let token = String::from_utf8(token.0)?;
    assert!(token.len() >= 32, "a short token");
    let job_json = serde_json::to_string(&jobs.get("quickstart").await?)?;
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::namespaced(admin.clone(), &jobs_ns);
    let events_json = serde_json::to_string(&events.list(&ListParams::default()).await?.items)?;
    let policy_json = serde_json::to_string(&policies.get("quickstart-coordinator").await?)?;
    for (what, text) in [
        ("the job (spec and status)", &job_json),
        ("the namespace's events", &events_json),
        ("the NetworkPolicy", &policy_json),
    ] {
        assert!(
            what.contains("events") || text.contains("quickstart"),
            "{what} was not read"
        );
        assert!(!text.contains(&token), "the job's token is in {what}");
    }
    jobs.delete("quickstart", &DeleteParams::default()).await?;
    poll_until(
        "the job cleaned up under the chart's RBAC",
        Duration::from_secs(60),
        || {
            let (jobs, budgets, policies) = (jobs.clone(), budgets.clone(), policies.clone());
            async move {
                let job = jobs.get_opt("quickstart").await?;
                let budget = budgets.get_opt("quickstart-coordinator").await?;
                let policy = policies.get_opt("quickstart-coordinator").await?;
                Ok((job.is_none() && budget.is_none() && policy.is_none()).then_some(()))
            }
        },
    )
    .await?;

    // No more than it needs.
    let nodes: Api<Node> = Api::all(operator.clone());
    let node = nodes
        .list(&ListParams::default().limit(1))
        .await?
        .items
        .into_iter()
        .next()
        .ok_or("no node")?;
    let name = node.metadata.name.unwrap_or_default();
    let refused = nodes.delete(&name, &DeleteParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.code == 403),
        "the ServiceAccount could delete node {name}: {refused:?}"
    );
    let config_maps: Api<ConfigMap> = Api::namespaced(operator.clone(), "kube-system");
    let refused = config_maps.list(&ListParams::default()).await;
    assert!(
        matches!(&refused, Err(kube::Error::Api(status)) if status.code == 403),
        "the ServiceAccount could list ConfigMaps in kube-system: {refused:?}"
    );

    if scoped {
        // the rights on Secrets are the jobs' namespace's only
        let secrets: Api<Secret> = Api::namespaced(operator.clone(), &release_ns);
        let refused = secrets.list(&ListParams::default()).await;
        assert!(
            matches!(&refused, Err(kube::Error::Api(status)) if status.code == 403),
            "the scoped ServiceAccount could list Secrets in {release_ns}: {refused:?}"
        );
    }

    let _ = stop.send(());
    helm(&["uninstall", release, "--namespace", &release_ns])?;
    release_namespace.delete().await?;
    jobs_namespace.delete().await?;
    Ok(())
}
