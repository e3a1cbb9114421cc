//! The operator's controller run in the test process against the end-to-end cluster.

use std::sync::Arc;
use std::time::Duration;

use ebbflow_operator::controller::capacity::SpecCapacityPlanner;
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
    let metrics = Metrics::register(registry)?;
    let mut config = Config::new("ghcr.io/ebbflow/ebbflow-runtime:e2e");
    config.coordinator_url_override = Some(coordinator_url.to_owned());
    config.provisioning_requeue = Duration::from_secs(1);
    config.status_interval = Duration::from_secs(2);
    let reporter = Reporter {
        controller: controller::MANAGER.to_owned(),
        instance: Some("e2e".into()),
    };
    let ctx = Arc::new(Context::new(
        client.clone(),
        Recorder::new(client.clone(), reporter),
        metrics,
        config,
        CoordinatorClient::new(Duration::from_millis(300))?,
        Arc::new(SpecCapacityPlanner),
    ));
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    tokio::spawn(controller::run(ctx, async move {
        let _ = stopped.await;
    }));
    Ok(stop)
}
