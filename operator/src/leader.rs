//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it:
//! the holder renews `renewTime`; anyone may take the lease over once it is older than
//! `leaseDurationSeconds`. Writes use the lease's resourceVersion, so two candidates can never
//! both win a round. Needs `get`, `create` and `update` on leases in one namespace.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::{SignedDuration, Timestamp},
};
use kube::{Api, Client, api::PostParams};
use tracing::{info, warn};

/// Leader election settings.
#[derive(Clone, Debug)]
pub struct LeaseConfig {
    /// Lease name.
    pub name: String,
    /// Lease namespace.
    pub namespace: String,
    /// This replica's identity (its pod name).
    pub identity: String,
    /// How long a lease is valid without renewal.
    pub lease_duration: Duration,
    /// The leader gives up if it cannot renew for this long (less than lease_duration).
    pub renew_deadline: Duration,
    /// Pause between attempts.
    pub retry_period: Duration,
}

/// What to do with the lease as observed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseDecision {
    /// No lease exists: create it, held by us.
    Create,
    /// We hold it: renew.
    Renew,
    /// Another holder let it expire (or it has none): take it over.
    TakeOver,
    /// Another holder has a valid lease.
    Wait {
        /// The current holder.
        holder: String,
    },
}

/// Decides (pure) what to do with `lease` at `now`.
pub fn decide(lease: Option<&Lease>, identity: &str, now: Timestamp) -> LeaseDecision {
    let Some(lease) = lease else {
        return LeaseDecision::Create;
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    if holder == identity {
        return LeaseDecision::Renew;
    }
    let duration = SignedDuration::from_secs(i64::from(spec.lease_duration_seconds.unwrap_or(0)));
    let expired = spec
        .renew_time
        .or(spec.acquire_time)
        .is_none_or(|renewed| renewed.0 + duration <= now);
    if holder.is_empty() || expired {
        LeaseDecision::TakeOver
    } else {
        LeaseDecision::Wait { holder }
    }
}

/// The lease after we take or renew it.
pub fn held_lease(previous: Option<&Lease>, config: &LeaseConfig, now: Timestamp) -> Lease {
    let previous_spec = previous.and_then(|l| l.spec.clone()).unwrap_or_default();
    let ours = previous_spec.holder_identity.as_deref() == Some(config.identity.as_str());
    let transitions = previous_spec.lease_transitions.unwrap_or(0);
    Lease {
        metadata: ObjectMeta {
            name: Some(config.name.clone()),
            namespace: Some(config.namespace.clone()),
            resource_version: previous.and_then(|l| l.metadata.resource_version.clone()),
            ..ObjectMeta::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(config.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(config.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: if ours {
                previous_spec.acquire_time
            } else {
                Some(MicroTime(now))
            },
            renew_time: Some(MicroTime(now)),
            lease_transitions: Some(if ours || previous.is_none() {
                transitions
            } else {
                transitions + 1
            }),
            ..LeaseSpec::default()
        }),
    }
}

/// Errors of leader election.
#[derive(Debug, thiserror::Error)]
pub enum LeaderError {
    /// The leader could not renew within the renew deadline.
    #[error("lost the leader lease {name}: not renewed within {deadline:?}")]
    Lost {
        /// Lease name.
        name: String,
        /// The renew deadline.
        deadline: Duration,
    },
}

/// Competes for one Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
}

impl LeaderElector {
    /// An elector for `config` using `client`.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        Self { api, config }
    }

    /// One round: true if we hold the lease afterwards. Conflicts and API errors are a lost
    /// round, not an error.
    pub async fn try_acquire_or_renew(&self) -> bool {
        let current = match self.api.get_opt(&self.config.name).await {
            Ok(lease) => lease,
            Err(error) => {
                warn!(%error, lease = %self.config.name, "read leader lease failed");
                return false;
            }
        };
        let now = Timestamp::now();
        let params = PostParams::default();
        let result = match decide(current.as_ref(), &self.config.identity, now) {
            LeaseDecision::Wait { .. } => return false,
            LeaseDecision::Create => {
                self.api
                    .create(&params, &held_lease(None, &self.config, now))
                    .await
            }
            LeaseDecision::Renew | LeaseDecision::TakeOver => {
                self.api
                    .replace(
                        &self.config.name,
                        &params,
                        &held_lease(current.as_ref(), &self.config, now),
                    )
                    .await
            }
        };
        match result {
            Ok(_) => true,
            Err(error) => {
                warn!(%error, lease = %self.config.name, "write leader lease failed");
                false
            }
        }
    }

    /// Waits until this replica holds the lease.
    pub async fn acquire(&self) {
        loop {
            if self.try_acquire_or_renew().await {
                info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
                return;
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the held lease until a renewal fails for longer than the renew deadline; then
    /// returns the error (the caller exits so a standby takes over).
    pub async fn keep(&self) -> LeaderError {
        let mut last_renewal = tokio::time::Instant::now();
        loop {
            tokio::time::sleep(self.config.retry_period).await;
            if self.try_acquire_or_renew().await {
                last_renewal = tokio::time::Instant::now();
            } else if last_renewal.elapsed() > self.config.renew_deadline {
                return LeaderError::Lost {
                    name: self.config.name.clone(),
                    deadline: self.config.renew_deadline,
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(identity: &str) -> LeaseConfig {
        LeaseConfig {
            name: "ebbflow-operator".into(),
            namespace: "ebbflow".into(),
            identity: identity.into(),
            lease_duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_800_000_000 + seconds).unwrap()
    }

    #[test]
    fn create_renew_wait_and_take_over() {
        assert_eq!(decide(None, "a", at(0)), LeaseDecision::Create);
        let lease = held_lease(None, &config("a"), at(0));
        assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(0));
        assert_eq!(decide(Some(&lease), "a", at(5)), LeaseDecision::Renew);
        assert_eq!(
            decide(Some(&lease), "b", at(14)),
            LeaseDecision::Wait { holder: "a".into() }
        );
        assert_eq!(decide(Some(&lease), "b", at(15)), LeaseDecision::TakeOver);

        let taken = held_lease(Some(&lease), &config("b"), at(16));
        let spec = taken.spec.as_ref().unwrap();
        assert_eq!(spec.holder_identity.as_deref(), Some("b"));
        assert_eq!(spec.lease_transitions, Some(1));
        assert_eq!(spec.acquire_time.as_ref().unwrap().0, at(16));

        let renewed = held_lease(Some(&taken), &config("b"), at(20));
        let spec = renewed.spec.as_ref().unwrap();
        assert_eq!(spec.lease_transitions, Some(1), "renewal is no transition");
        assert_eq!(spec.acquire_time.as_ref().unwrap().0, at(16));
        assert_eq!(spec.renew_time.as_ref().unwrap().0, at(20));
    }

    #[test]
    fn a_lease_without_holder_is_free() {
        let mut lease = held_lease(None, &config("a"), at(0));
        lease.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(decide(Some(&lease), "b", at(1)), LeaseDecision::TakeOver);
    }
}
