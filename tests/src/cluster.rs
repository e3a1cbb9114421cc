//! Access to the end-to-end cluster that `scripts/cluster.sh up` starts (a real kube-apiserver,
//! etcd, controller manager and scheduler on 127.0.0.1, with kwok nodes).
//!
//! A test calls [`client_or_skip`] first: without `EBBFLOW_KUBECONFIG` it prints why it is skipped
//! and returns `None`, so plain `cargo test` never needs a cluster.

use std::{
    future::Future,
    io::Write as _,
    path::PathBuf,
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use k8s_openapi::{
    api::core::v1::{Namespace, Secret},
    apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
};
use kube::{
    Api, Client, Config, ResourceExt,
    api::{DeleteParams, Patch, PatchParams, PostParams},
    config::{KubeConfigOptions, Kubeconfig},
};

/// Environment variable holding the kubeconfig path of the end-to-end cluster.
pub const KUBECONFIG_ENV: &str = "EBBFLOW_KUBECONFIG";

/// Field manager of everything the suites apply.
pub const FIELD_MANAGER: &str = "ebbflow-tests";

/// Error type of the end-to-end helpers: what failed, in words.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// A free port on 127.0.0.1 for a process that cannot report the port it bound (Prometheus,
/// a spawned operator): the kernel picks it, then it is released for that process (a small
/// window in which another process could take it).
pub fn free_port() -> Result<u16, BoxError> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Runs the helm built by scripts/setup-cluster-tools.sh (`EBBFLOW_HELM`) with `args` against
/// the cluster of `kubeconfig`; its stdout, or an error with the command and helm's stderr.
pub fn helm(kubeconfig: &str, args: &[&str]) -> Result<String, BoxError> {
    let helm = std::env::var("EBBFLOW_HELM").map_err(|_| "EBBFLOW_HELM is unset")?;
    let output = std::process::Command::new(&helm)
        .args(args)
        .args(["--kubeconfig", kubeconfig])
        .output()?;
    if !output.status.success() {
        return Err(format!(
            "helm {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr)
        )
        .into());
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The repository root (the tests crate sits one level below it).
pub fn repo_root() -> PathBuf {
    // `cargo test` sets the variable when it runs the test too: the checkout it runs in, even
    // when a build of another checkout with the same sources (a shared target directory) is
    // reused and the compile-time path names a directory that may be gone.
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| env!("CARGO_MANIFEST_DIR").into(), PathBuf::from);
    manifest_dir
        .parent()
        .expect("tests crate has a parent directory")
        .to_path_buf()
}

/// `examples/quickstart.yaml` as job `name` in `namespace`.
pub fn quickstart_job(name: &str, namespace: &str) -> Result<ebbflow_crds::TrainingJob, BoxError> {
    let text = std::fs::read_to_string(repo_root().join("examples/quickstart.yaml"))?;
    let mut job: ebbflow_crds::TrainingJob = serde_yaml::from_str(&text)?;
    job.metadata.name = Some(name.into());
    job.metadata.namespace = Some(namespace.into());
    Ok(job)
}

/// A client for the cluster named by `EBBFLOW_KUBECONFIG`, or `None` after printing a line
/// saying `test` is skipped because the variable is unset.
pub async fn client_or_skip(test: &str) -> Result<Option<Client>, BoxError> {
    let Some(path) = std::env::var_os(KUBECONFIG_ENV).filter(|p| !p.is_empty()) else {
        // Straight to stderr, past the test harness's capture, so the skip is always visible.
        let _ = writeln!(
            std::io::stderr(),
            "skipped {test}: {KUBECONFIG_ENV} is unset (scripts/test.sh starts a cluster and sets it)"
        );
        return Ok(None);
    };
    Ok(Some(Client::try_from(config_at(&path).await?)?))
}

async fn config_at(path: &std::ffi::OsStr) -> Result<Config, BoxError> {
    let kubeconfig = Kubeconfig::read_from(path)
        .map_err(|e| format!("read kubeconfig {}: {e}", PathBuf::from(path).display()))?;
    Ok(
        Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .map_err(|e| format!("load kubeconfig {}: {e}", PathBuf::from(path).display()))?,
    )
}

/// A client for the cluster named by `EBBFLOW_KUBECONFIG` that answers a 429 at once: kube's
/// default client retries 429s (an eviction a PodDisruptionBudget refuses) for minutes.
pub async fn client_without_retries() -> Result<Client, BoxError> {
    let path = std::env::var_os(KUBECONFIG_ENV).ok_or("EBBFLOW_KUBECONFIG is unset")?;
    let mut config = config_at(&path).await?;
    config.default_retry = false;
    Ok(Client::try_from(config)?)
}

/// Polls `check` every 100 ms until it returns `Some`, failing with `what` after `timeout`.
pub async fn poll_until<T, F, Fut>(
    what: &str,
    timeout: Duration,
    mut check: F,
) -> Result<T, BoxError>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Result<Option<T>, BoxError>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(value) = check().await? {
            return Ok(value);
        }
        if Instant::now() >= deadline {
            return Err(format!("timed out after {timeout:?} waiting for {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Creates job `job`'s token Secret in `namespace` holding `token`, before the operator makes
/// one (it keeps an existing token), so a coordinator the test runs can share it.
pub async fn create_job_token(
    client: &Client,
    namespace: &str,
    job: &str,
    token: &str,
) -> Result<(), BoxError> {
    use ebbflow_operator::controller::plan::{TOKEN_KEY, secret_name};
    let secrets: Api<Secret> = Api::namespaced(client.clone(), namespace);
    let mut secret = Secret::default();
    secret.metadata.name = Some(secret_name(job));
    secret.string_data = Some([(TOKEN_KEY.to_owned(), token.to_owned())].into());
    secrets.create(&PostParams::default(), &secret).await?;
    Ok(())
}

/// Server-side applies the committed TrainingJob CRD (idempotent) and waits until the API
/// server reports it Established.
pub async fn install_crd(client: &Client) -> Result<CustomResourceDefinition, BoxError> {
    let path = repo_root().join(ebbflow_crds::CRD_YAML_PATH);
    let yaml = std::fs::read_to_string(&path)
        .map_err(|e| format!("read CRD YAML {}: {e}", path.display()))?;
    let crd: CustomResourceDefinition = serde_yaml::from_str(&yaml)
        .map_err(|e| format!("parse CRD YAML {}: {e}", path.display()))?;
    let name = crd.name_any();
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    crds.patch(
        &name,
        &PatchParams::apply(FIELD_MANAGER).force(),
        &Patch::Apply(&crd),
    )
    .await
    .map_err(|e| format!("apply CRD {name}: {e}"))?;
    poll_until(
        &format!("CRD {name} to be Established"),
        Duration::from_secs(30),
        || {
            let crds = crds.clone();
            let name = name.clone();
            async move {
                let current = crds.get(&name).await?;
                let established = current
                    .status
                    .as_ref()
                    .and_then(|status| status.conditions.as_ref())
                    .is_some_and(|conditions| {
                        conditions
                            .iter()
                            .any(|c| c.type_ == "Established" && c.status == "True")
                    });
                Ok(established.then_some(current))
            }
        },
    )
    .await
}

/// A namespace that exists for one test; [`TestNamespace::delete`] removes it and what is in it
/// (a failed test leaves it behind, for inspection, until the cluster is torn down).
pub struct TestNamespace {
    client: Client,
    name: String,
}

impl TestNamespace {
    /// Creates a fresh namespace whose name starts with `prefix`.
    pub async fn create(client: &Client, prefix: &str) -> Result<Self, BoxError> {
        let nanos = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or_default();
        let name = format!("{prefix}-{}-{nanos:x}", std::process::id());
        let namespace: Namespace = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1",
            "kind": "Namespace",
            "metadata": { "name": name, "labels": { "ebbflow.dev/test": prefix } },
        }))?;
        Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .map_err(|e| format!("create namespace {name}: {e}"))?;
        Ok(Self {
            client: client.clone(),
            name,
        })
    }

    /// The namespace's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Deletes the namespace (the namespace controller removes its contents in the background).
    pub async fn delete(self) -> Result<(), BoxError> {
        Api::<Namespace>::all(self.client)
            .delete(&self.name, &DeleteParams::background())
            .await
            .map_err(|e| format!("delete namespace {}: {e}", self.name))?;
        Ok(())
    }
}

/// Sets node `node`'s interruption taint to `taint` (a key such as the Node Termination Handler's
/// or Karpenter's, effect NoSchedule), or removes every interruption taint with `None`; other
/// taints stay.
pub async fn set_interruption_taint(
    nodes: &Api<k8s_openapi::api::core::v1::Node>,
    node: &str,
    taint: Option<&str>,
) -> Result<(), BoxError> {
    use ebbflow_operator::notices::{KARPENTER_DISRUPTED_TAINT, NTH_SPOT_ITN_TAINT};
    let current = nodes.get(node).await?;
    let mut taints = current.spec.and_then(|s| s.taints).unwrap_or_default();
    taints.retain(|t| t.key != NTH_SPOT_ITN_TAINT && t.key != KARPENTER_DISRUPTED_TAINT);
    if let Some(key) = taint {
        taints.push(k8s_openapi::api::core::v1::Taint {
            key: key.to_owned(),
            effect: "NoSchedule".to_owned(),
            value: None,
            time_added: None,
        });
    }
    nodes
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "taints": taints } })),
        )
        .await
        .map_err(|e| format!("taint node {node}: {e}"))?;
    Ok(())
}
