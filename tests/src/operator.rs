//! The operator's controller run in the test process against the end-to-end cluster.

use std::sync::Arc;
use std::time::Duration;

use ebbflow_job::provision::Ec2Provisioner;
use ebbflow_operator::controller::capacity::{CapacityPlanner, SpecCapacityPlanner};
use ebbflow_operator::controller::{self, Config, Context};
use ebbflow_operator::coordinator::CoordinatorClient;
use ebbflow_operator::metrics::Metrics;
use kube::Client;
use kube::runtime::events::{Recorder, Reporter};

use crate::cluster::BoxError;

/// Starts the controller with its metrics on `registry`; it runs until the returned sender is
/// used or dropped. Jobs' coordinators are pointed at a closed port on 127.0.0.1 (kwok pods run
/// no process), so they report the coordinator unreachable.
pub async fn start(
    client: &Client,
    registry: &prometheus::Registry,
) -> Result<tokio::sync::oneshot::Sender<()>, BoxError> {
    start_with_coordinator(client, registry, "http://127.0.0.1:9").await
}

/// As [`start`] with every job's coordinator at `coordinator_url` (a real coordinator the test
/// runs on 127.0.0.1).
pub async fn start_with_coordinator(
    client: &Client,
    registry: &prometheus::Registry,
    coordinator_url: &str,
) -> Result<tokio::sync::oneshot::Sender<()>, BoxError> {
    start_custom(
        client,
        registry,
        coordinator_url,
        Custom {
            capacity: Arc::new(SpecCapacityPlanner),
            ec2: None,
            namespace: None,
        },
    )
    .await
}

/// What [`start_custom`] varies.
pub struct Custom {
    /// Decides transient pool counts.
    pub capacity: Arc<dyn CapacityPlanner>,
    /// ec2 provisioning, when given.
    pub ec2: Option<Ec2Provisioner>,
    /// Reconcile only this namespace's jobs (`None`: all).
    pub namespace: Option<String>,
}

/// As [`start_with_coordinator`] with the capacity planner, ec2 provisioning and namespace scope
/// of `custom`.
pub async fn start_custom(
    client: &Client,
    registry: &prometheus::Registry,
    coordinator_url: &str,
    custom: Custom,
) -> Result<tokio::sync::oneshot::Sender<()>, BoxError> {
    let Custom {
        capacity,
        ec2,
        namespace,
    } = custom;
    let metrics = Metrics::register(registry)?;
    let mut config = Config::new("ghcr.io/ebbflow/ebbflow-runtime:e2e");
    config.coordinator_url_override = Some(coordinator_url.to_owned());
    config.provisioning_requeue = Duration::from_secs(1);
    config.status_interval = Duration::from_secs(2);
    config.namespace = namespace;
    // Every job gets its NetworkPolicy, as the chart's operator makes them (kwok enforces
    // none: what is tested here is that it is applied, owned and cleaned up).
    config.plan.network_policy = Some(
        controller::plan::OperatorPeer::parse(
            "ebbflow-system",
            "app.kubernetes.io/name=ebbflow,app.kubernetes.io/component=operator",
        )
        .map_err(|e| format!("the operator pod selector: {e}"))?,
    );
    let reporter = Reporter {
        controller: controller::MANAGER.to_owned(),
        instance: Some("e2e".into()),
    };
    let mut ctx = Context::new(
        client.clone(),
        Recorder::new(client.clone(), reporter),
        metrics,
        config,
        CoordinatorClient::new(Duration::from_millis(300))?,
        capacity,
    );
    if let Some(provisioner) = ec2 {
        ctx = ctx.with_ec2(provisioner);
    }
    let ctx = Arc::new(ctx);
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(ctx, async move {
        let _ = stopped.await;
    }));
    Ok(stop)
}
