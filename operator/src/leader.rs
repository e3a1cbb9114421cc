//! Leader election on a `coordination.k8s.io/v1` Lease, as client-go's leaderelection does it:
//! the holder renews `renewTime`; anyone may take the lease over once it has seen it unchanged
//! for `leaseDurationSeconds` on its own monotonic clock (not by comparing `renewTime` with its
//! wall clock, which skew between nodes would break). Writes use the lease's resourceVersion, so two candidates can never
//! both win a round. Needs `get`, `create` and `update` on leases in one namespace.

use std::time::Duration;

use k8s_openapi::{
    api::coordination::v1::{Lease, LeaseSpec},
    apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta},
    jiff::Timestamp,
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

/// Decides (pure) what to do with `lease`, judging expiry as client-go does: by how long this
/// replica has seen the lease unchanged (`unchanged_for`, on its own monotonic clock since the
/// holder or `renewTime` last changed), not by comparing the holder's `renewTime` with this
/// replica's wall clock, which a clock skew between nodes would turn into an early takeover.
pub fn decide_seen(
    lease: Option<&Lease>,
    identity: &str,
    unchanged_for: Duration,
) -> LeaseDecision {
    let Some(lease) = lease else {
        return LeaseDecision::Create;
    };
    let spec = lease.spec.clone().unwrap_or_default();
    let holder = spec.holder_identity.unwrap_or_default();
    if holder == identity {
        return LeaseDecision::Renew;
    }
    let duration =
        Duration::from_secs(u64::try_from(spec.lease_duration_seconds.unwrap_or(0)).unwrap_or(0));
    if holder.is_empty() || unchanged_for >= duration {
        LeaseDecision::TakeOver
    } else {
        LeaseDecision::Wait { holder }
    }
}

/// What a replica last saw of a lease held by another: who held it, its `renewTime`, and when
/// (this replica's monotonic clock) it first saw them so.
#[derive(Clone, Debug, PartialEq)]
struct Seen {
    holder: Option<String>,
    renewed: Option<MicroTime>,
    at: tokio::time::Instant,
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

impl LeaseConfig {
    /// Refuses timings under which two replicas could lead at once: the leader must give up
    /// (after `renew_deadline`, noticed within one `retry_period`) before a standby may take
    /// the lease over (`lease_duration` after the last renewal), and every period must be set.
    pub fn validate(&self) -> Result<(), LeaderError> {
        let bad = |reason: String| Err(LeaderError::Config(reason));
        if self.lease_duration.is_zero()
            || self.renew_deadline.is_zero()
            || self.retry_period.is_zero()
        {
            return bad(
                "lease duration, renew deadline and retry period must all be at least 1 s".into(),
            );
        }
        // client-go asks renewDeadline > 1.2 · retryPeriod: a renewal must get a round or two
        // between the retry pause and the deadline
        if self.renew_deadline.as_secs_f64() <= 1.2 * self.retry_period.as_secs_f64() {
            return bad(format!(
                "renew deadline ({:?}) must be more than 1.2 × the retry period ({:?})",
                self.renew_deadline, self.retry_period
            ));
        }
        if self.renew_deadline + self.retry_period >= self.lease_duration {
            return bad(format!(
                "renew deadline ({:?}) plus retry period ({:?}) must be shorter than the lease \
                 duration ({:?}), or a standby could take over while the leader still leads",
                self.renew_deadline, self.retry_period, self.lease_duration
            ));
        }
        Ok(())
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
    /// Another replica holds the lease now.
    #[error("lost the leader lease {name}: {holder} holds it")]
    Taken {
        /// Lease name.
        name: String,
        /// The new holder.
        holder: String,
    },
    /// The lease timings are unsafe.
    #[error("leader election settings: {0}")]
    Config(String),
}

/// The outcome of one round.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Round {
    /// We hold the lease.
    Held,
    /// Another replica holds a valid lease.
    HeldBy(String),
    /// The lease could not be read or written (an API error, a conflict, a timeout).
    Failed,
}

/// Competes for one Lease.
pub struct LeaderElector {
    api: Api<Lease>,
    config: LeaseConfig,
    /// The lease as last seen ([`decide_seen`]).
    seen: parking_lot::Mutex<Option<Seen>>,
}

impl LeaderElector {
    /// An elector for `config` using `client`.
    pub fn new(client: Client, config: LeaseConfig) -> Self {
        let api = Api::namespaced(client, &config.namespace);
        Self {
            api,
            config,
            seen: parking_lot::Mutex::new(None),
        }
    }

    /// How long `lease` has looked as it does now to this replica.
    fn unchanged_for(&self, lease: Option<&Lease>) -> Duration {
        let spec = lease.and_then(|l| l.spec.clone()).unwrap_or_default();
        let now = tokio::time::Instant::now();
        let mut seen = self.seen.lock();
        let current = (spec.holder_identity, spec.renew_time);
        match seen.as_ref() {
            Some(s) if (s.holder.clone(), s.renewed.clone()) == current => now - s.at,
            _ => {
                *seen = Some(Seen {
                    holder: current.0,
                    renewed: current.1,
                    at: now,
                });
                Duration::ZERO
            }
        }
    }

    /// One round: true if we hold the lease afterwards. Conflicts and API errors are a lost
    /// round, not an error.
    pub async fn try_acquire_or_renew(&self) -> bool {
        self.round().await == Round::Held
    }

    /// One round (see [`Round`]).
    pub async fn round(&self) -> Round {
        let current = match self.api.get_opt(&self.config.name).await {
            Ok(lease) => lease,
            Err(error) => {
                warn!(%error, lease = %self.config.name, "read leader lease failed");
                return Round::Failed;
            }
        };
        let now = Timestamp::now();
        let params = PostParams::default();
        let unchanged_for = self.unchanged_for(current.as_ref());
        let result = match decide_seen(current.as_ref(), &self.config.identity, unchanged_for) {
            LeaseDecision::Wait { holder } => return Round::HeldBy(holder),
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
            Ok(_) => Round::Held,
            Err(error) => {
                warn!(%error, lease = %self.config.name, "write leader lease failed");
                Round::Failed
            }
        }
    }

    /// Gives the lease up if we hold it (on shutdown), as client-go's `ReleaseOnCancel`: no
    /// holder and a one-second duration, so a standby takes over at its next round instead of
    /// waiting out the lease. Best effort: an error is logged.
    pub async fn release(&self) {
        let Ok(Some(mut lease)) = self.api.get_opt(&self.config.name).await else {
            return;
        };
        let spec = lease.spec.get_or_insert_default();
        if spec.holder_identity.as_deref() != Some(self.config.identity.as_str()) {
            return;
        }
        spec.holder_identity = None;
        spec.lease_duration_seconds = Some(1);
        spec.renew_time = Some(MicroTime(Timestamp::now()));
        match self
            .api
            .replace(&self.config.name, &PostParams::default(), &lease)
            .await
        {
            Ok(_) => info!(lease = %self.config.name, "released the leader lease"),
            Err(error) => warn!(%error, lease = %self.config.name, "release leader lease failed"),
        }
    }

    /// Waits until this replica holds the lease; returns when the winning round started (the
    /// lease's `renewTime` is no earlier: what [`Self::keep`] counts its deadline from).
    pub async fn acquire(&self) -> tokio::time::Instant {
        loop {
            let started = tokio::time::Instant::now();
            if self.try_acquire_or_renew().await {
                info!(lease = %self.config.name, identity = %self.config.identity, "became leader");
                return started;
            }
            tokio::time::sleep(self.config.retry_period).await;
        }
    }

    /// Renews the held lease every retry period until it cannot be renewed by the deadline,
    /// or another replica holds it; then returns why (the caller exits so a standby takes
    /// over).
    ///
    /// The deadline is `renew_deadline + retry_period` after the start of the round that last
    /// renewed (`since` for the first: when the winning round of [`Self::acquire`] started).
    /// The lease others see was renewed no earlier than that start, and the settings keep the
    /// sum below the lease duration ([`LeaseConfig::validate`]), so this replica stops leading
    /// before a standby may take over, however slow the answers were. Each round gets only the
    /// time left: a request that hangs (no read timeout) cannot keep it leading past it.
    pub async fn keep(&self, since: tokio::time::Instant) -> LeaderError {
        let mut last_start = since;
        loop {
            let deadline = last_start + self.config.retry_period + self.config.renew_deadline;
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            if left.is_zero() {
                return LeaderError::Lost {
                    name: self.config.name.clone(),
                    deadline: self.config.renew_deadline,
                };
            }
            tokio::time::sleep(self.config.retry_period.min(left)).await;
            let started = tokio::time::Instant::now();
            let round = tokio::time::timeout_at(deadline, self.round())
                .await
                .unwrap_or(Round::Failed);
            match round {
                Round::Held => last_start = started,
                Round::HeldBy(holder) => {
                    return LeaderError::Taken {
                        name: self.config.name.clone(),
                        holder,
                    };
                }
                Round::Failed => {}
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
        let seen = Duration::from_secs;
        assert_eq!(decide_seen(None, "a", seen(0)), LeaseDecision::Create);
        let lease = held_lease(None, &config("a"), at(0));
        assert_eq!(lease.spec.as_ref().unwrap().lease_transitions, Some(0));
        assert_eq!(
            decide_seen(Some(&lease), "a", seen(5)),
            LeaseDecision::Renew
        );
        assert_eq!(
            decide_seen(Some(&lease), "b", seen(14)),
            LeaseDecision::Wait { holder: "a".into() }
        );
        assert_eq!(
            decide_seen(Some(&lease), "b", seen(15)),
            LeaseDecision::TakeOver
        );

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
    fn unsafe_timings_are_refused() {
        assert!(config("a").validate().is_ok());
        let mut short = config("a");
        short.lease_duration = Duration::from_secs(5);
        let error = short.validate().unwrap_err().to_string();
        assert!(error.contains("shorter than the lease duration"), "{error}");
        let mut zero = config("a");
        zero.retry_period = Duration::ZERO;
        assert!(zero.validate().is_err());
        // a renew deadline within one retry pause: every renewal would time out
        let mut tight = config("a");
        tight.renew_deadline = Duration::from_secs(2);
        let error = tight.validate().unwrap_err().to_string();
        assert!(error.contains("1.2"), "{error}");
    }

    /// The API server's answer carrying `lease`.
    fn lease_response(lease: &Lease) -> http::Response<kube::client::Body> {
        http::Response::builder()
            .status(200)
            .body(kube::client::Body::from(serde_json::to_vec(lease).unwrap()))
            .unwrap()
    }

    /// An elector over a mocked API server whose requests the returned handle answers (or not).
    fn elector(
        identity: &str,
    ) -> (
        LeaderElector,
        tower_test::mock::Handle<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >,
    ) {
        let (service, handle) = tower_test::mock::pair();
        let client = Client::new(service, "ebbflow");
        (LeaderElector::new(client, config(identity)), handle)
    }

    /// A renewal that hangs (the API server never answers) ends the leadership by the renew
    /// deadline: before, `keep` waited on the request as long as it took.
    #[tokio::test(start_paused = true)]
    async fn a_hung_renewal_steps_down_by_the_renew_deadline() {
        let (elector, mut handle) = elector("a");
        let _server = tokio::spawn(async move {
            let mut unanswered = Vec::new();
            while let Some(request) = handle.next_request().await {
                unanswered.push(request);
            }
        });
        let started = tokio::time::Instant::now();
        let cfg = config("a");
        let lost = tokio::time::timeout(
            cfg.renew_deadline + cfg.retry_period * 2,
            elector.keep(started),
        )
        .await
        .expect("keep returns by the deadline");
        assert!(matches!(lost, LeaderError::Lost { .. }), "{lost}");
        assert!(started.elapsed() <= cfg.renew_deadline + cfg.retry_period);
    }

    /// Renewals that answer keep the leadership with the shortest deadline the settings allow
    /// (before, a renew deadline no longer than the retry pause timed every renewal out).
    #[tokio::test(start_paused = true)]
    async fn renewals_that_answer_keep_the_leadership() {
        let (service, mut handle) = tower_test::mock::pair::<
            http::Request<kube::client::Body>,
            http::Response<kube::client::Body>,
        >();
        let mut cfg = config("a");
        cfg.renew_deadline = Duration::from_secs(3);
        cfg.retry_period = Duration::from_secs(2);
        cfg.validate().unwrap();
        let elector = LeaderElector::new(Client::new(service, "ebbflow"), cfg.clone());
        let _server = tokio::spawn(async move {
            let mut lease = held_lease(None, &cfg, Timestamp::now());
            while let Some((request, respond)) = handle.next_request().await {
                // answers take a second: the GET, then the PUT of the renewal
                tokio::time::sleep(Duration::from_millis(500)).await;
                if request.method() == http::Method::PUT {
                    lease = held_lease(Some(&lease), &cfg, Timestamp::now());
                }
                respond.send_response(lease_response(&lease));
            }
        });
        let kept = tokio::time::timeout(
            Duration::from_secs(60),
            elector.keep(tokio::time::Instant::now()),
        )
        .await;
        assert!(kept.is_err(), "gave up a lease it renewed: {kept:?}");
    }

    /// A leader that finds another replica holding the lease stops leading at once.
    #[tokio::test(start_paused = true)]
    async fn a_lease_taken_over_ends_the_leadership_at_once() {
        let (elector, mut handle) = elector("a");
        let server = tokio::spawn(async move {
            let (request, respond) = handle.next_request().await.unwrap();
            assert_eq!(request.method(), http::Method::GET);
            let lease = held_lease(None, &config("b"), Timestamp::now());
            respond.send_response(lease_response(&lease));
        });
        let lost = elector.keep(tokio::time::Instant::now()).await;
        assert!(
            matches!(&lost, LeaderError::Taken { holder, .. } if holder == "b"),
            "{lost}"
        );
        server.await.unwrap();
    }

    /// Expiry is how long this replica saw the lease unchanged, whatever the holder's clock
    /// wrote: a `renewTime` an hour in the past (a holder whose clock is behind) is not expired
    /// while it keeps changing.
    #[test]
    fn expiry_is_judged_on_this_replicas_clock() {
        let mut lease = held_lease(None, &config("a"), at(-3600));
        assert_eq!(
            decide_seen(Some(&lease), "b", Duration::ZERO),
            LeaseDecision::Wait { holder: "a".into() }
        );
        assert_eq!(
            decide_seen(Some(&lease), "b", Duration::from_secs(14)),
            LeaseDecision::Wait { holder: "a".into() }
        );
        assert_eq!(
            decide_seen(Some(&lease), "b", Duration::from_secs(15)),
            LeaseDecision::TakeOver
        );
        assert_eq!(
            decide_seen(Some(&lease), "a", Duration::from_secs(60)),
            LeaseDecision::Renew
        );
        assert_eq!(
            decide_seen(None, "b", Duration::ZERO),
            LeaseDecision::Create
        );
        lease.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(
            decide_seen(Some(&lease), "b", Duration::ZERO),
            LeaseDecision::TakeOver
        );
    }

    #[test]
    fn a_lease_without_holder_is_free() {
        let mut lease = held_lease(None, &config("a"), at(0));
        lease.spec.as_mut().unwrap().holder_identity = None;
        assert_eq!(
            decide_seen(Some(&lease), "b", Duration::from_secs(1)),
            LeaseDecision::TakeOver
        );
    }
}
