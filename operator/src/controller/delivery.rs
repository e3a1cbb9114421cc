//! Delivering an eviction notice to a job's coordinator, shared by the reconcile and the relay.

use ebbflow_crds::TrainingJob;
use k8s_openapi::jiff::Timestamp;
use kube::{
    ResourceExt,
    runtime::{events::EventType, reflector::ObjectRef},
};
use tracing::{info, warn};

use super::context::{Context, publish};
use crate::{
    coordinator::{CoordinatorError, notice_request},
    notices::Notice,
};

/// How a notice's delivery to the coordinator went.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Delivery {
    /// The coordinator took it.
    Delivered,
    /// The coordinator refused it (4xx: a node it does not know, its last reliable node).
    Refused,
    /// It did not get through (unreachable, timeout, 5xx): worth trying again soon.
    Failed,
}

/// Tells the job's coordinator at `base` about an eviction: on success the notice goes into
/// the job's ledger and an `EvictionNotice` event is published.
pub(super) async fn notify(
    ctx: &Context,
    job: &TrainingJob,
    base: &str,
    token: Option<&str>,
    notice: &Notice,
    now: Timestamp,
) -> Delivery {
    let namespace = job.namespace().unwrap_or_default();
    let delivered =
        deliver_notice(ctx, (&namespace, &job.name_any()), base, token, notice, now).await;
    if delivered == Delivery::Delivered {
        ctx.with_memory(&ObjectRef::from_obj(job), |memory| {
            memory.ledger.record(notice)
        });
        let note = format!(
            "pod {} leaves at {} ({})",
            notice.pod,
            notice.leaves_at,
            notice.source.as_str()
        );
        publish(
            ctx,
            job,
            EventType::Normal,
            "EvictionNotice",
            "Notify",
            note,
        )
        .await;
    }
    delivered
}

/// Sends one notice.
pub(super) async fn deliver_notice(
    ctx: &Context,
    job: (&str, &str),
    base: &str,
    token: Option<&str>,
    notice: &Notice,
    now: Timestamp,
) -> Delivery {
    let request = notice_request(&notice.pod, notice.leaves_at);
    match ctx.coordinator.notice(base, token, &request).await {
        Ok(()) => {
            let lead = notice.leaves_at.duration_since(now).as_secs_f64().max(0.0);
            let source = notice.source.as_str();
            ctx.metrics.notices_sent.with_label_values(&[source]).inc();
            ctx.metrics
                .notice_lead
                .with_label_values(&[source])
                .observe(lead);
            ctx.metrics.job.notice_delivered(job.0, job.1, lead);
            info!(pod = %notice.pod, source, lead_seconds = lead, "eviction notice delivered");
            Delivery::Delivered
        }
        Err(error) => {
            ctx.metrics.notice_failures.inc();
            warn!(pod = %notice.pod, %error, "eviction notice not delivered");
            match error {
                CoordinatorError::Rejected { status, .. } if (400..500).contains(&status) => {
                    Delivery::Refused
                }
                _ => Delivery::Failed,
            }
        }
    }
}
