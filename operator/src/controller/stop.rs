//! The stop criteria the operator enforces (pure). `spec.stop.iterations` is the runtime's own:
//! its coordinator finishes by itself. The others need what only the operator sees together:
//!
//! - `spec.stop.wallClockLimit`: wall time since training started (`status.startTime`);
//! - `spec.stop.targetLoss`: the coordinator's training loss of its last clock;
//! - `spec.bidding.budgetTotal`: `status.cost.spent`, both tiers together ([`super::cost`]).
//!
//! The first one met is kept in `status.stopReason` (a loss that rises again does not undo it),
//! and the operator posts `/stop` to the coordinator until it reports the job stopped; the job
//! then ends with the coordinator's final evaluation. A coordinator that does not confirm
//! within [`CONFIRM_WAIT`] (gone, unreachable) does not hold the job's capacity: the job ends
//! without a final evaluation. Reaching the wall-clock limit or the target loss is success; a
//! spent budget is a failure (reason `BudgetExhausted`), as for a Kubernetes Job past its
//! deadline.

use std::time::Duration;

use ebbflow_crds::TrainingJob;
use k8s_openapi::jiff::Timestamp;

/// How long after the first `/stop` the operator waits for the coordinator to confirm.
pub const CONFIRM_WAIT: Duration = Duration::from_secs(60);

/// A stop criterion the operator enforces.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Criterion {
    /// `spec.stop.wallClockLimit`.
    WallClockLimit,
    /// `spec.stop.targetLoss`.
    TargetLoss,
    /// `spec.bidding.budgetTotal`.
    BudgetTotal,
}

impl Criterion {
    /// The spec field's name (`status.stopReason`).
    pub fn field(self) -> &'static str {
        match self {
            Self::WallClockLimit => "wallClockLimit",
            Self::TargetLoss => "targetLoss",
            Self::BudgetTotal => "budgetTotal",
        }
    }

    /// The criterion named `field` in a status.
    pub fn from_field(field: &str) -> Option<Self> {
        [Self::WallClockLimit, Self::TargetLoss, Self::BudgetTotal]
            .into_iter()
            .find(|c| c.field() == field)
    }

    /// The condition and event reason of the job's end.
    pub fn reason(self) -> &'static str {
        match self {
            Self::WallClockLimit => "WallClockLimitReached",
            Self::TargetLoss => "TargetLossReached",
            Self::BudgetTotal => "BudgetExhausted",
        }
    }

    /// Whether the job succeeds when it stops on this criterion.
    pub fn succeeds(self) -> bool {
        self != Self::BudgetTotal
    }
}

/// What the criteria are checked against.
#[derive(Clone, Copy, Debug, Default)]
pub struct Progress {
    /// When training started (`status.startTime`).
    pub started: Option<Timestamp>,
    /// Training loss of the last clock, once a clock ran.
    pub loss: Option<f64>,
    /// USD spent so far, if the job is priced.
    pub spent: Option<f64>,
}

/// The first criterion of `job` that `progress` meets at `now`, with a message saying how.
pub fn reached(
    job: &TrainingJob,
    progress: &Progress,
    now: Timestamp,
) -> Option<(Criterion, String)> {
    let stop = &job.spec.stop;
    if let (Some(limit), Some(started)) = (
        stop.wall_clock_limit.as_ref().and_then(|d| d.to_duration()),
        progress.started,
    ) {
        let ran = now.duration_since(started);
        if ran.as_secs_f64() >= limit.as_secs_f64() {
            return Some((
                Criterion::WallClockLimit,
                format!(
                    "training ran {:.0} s, spec.stop.wallClockLimit is {} s",
                    ran.as_secs_f64(),
                    limit.as_secs()
                ),
            ));
        }
    }
    if let (Some(target), Some(loss)) = (stop.target_loss, progress.loss)
        && loss.is_finite()
        && loss <= target
    {
        return Some((
            Criterion::TargetLoss,
            format!("training loss {loss:.6} is at or below spec.stop.targetLoss {target}"),
        ));
    }
    if let (Some(budget), Some(spent)) = (job.spec.bidding.budget_total, progress.spent)
        && spent >= budget
    {
        return Some((
            Criterion::BudgetTotal,
            format!("${spent:.2} spent, spec.bidding.budgetTotal is ${budget:.2}"),
        ));
    }
    None
}

/// How long until a criterion of `job` may be met, for the next reconcile: the wall-clock
/// limit's end, or the budget's at `usd_per_second` (at least a second).
pub fn next_check(
    job: &TrainingJob,
    progress: &Progress,
    usd_per_second: f64,
    now: Timestamp,
) -> Option<Duration> {
    let wall = job
        .spec
        .stop
        .wall_clock_limit
        .as_ref()
        .and_then(|d| d.to_duration())
        .zip(progress.started)
        .map(|(limit, started)| limit.as_secs_f64() - now.duration_since(started).as_secs_f64());
    let budget = job
        .spec
        .bidding
        .budget_total
        .zip(progress.spent)
        .filter(|_| usd_per_second > 0.0)
        .map(|(budget, spent)| (budget - spent) / usd_per_second);
    [wall, budget]
        .into_iter()
        .flatten()
        .min_by(f64::total_cmp)
        .map(|seconds| Duration::from_secs_f64(seconds.max(1.0)))
}

/// Where a stop the operator decided stands.
#[derive(Clone, Debug, PartialEq)]
pub struct StopState {
    /// The criterion met.
    pub criterion: Criterion,
    /// Why, for the condition's message.
    pub message: String,
    /// When `/stop` was first posted.
    pub requested_at: Timestamp,
    /// The coordinator reported the job stopped (or finished), or did not confirm within
    /// [`CONFIRM_WAIT`]: the job is over.
    pub confirmed: bool,
}

/// Whether a stop first requested at `requested_at` is over: the coordinator confirmed, or it
/// has not within [`CONFIRM_WAIT`] and does not answer now.
pub fn confirmed(
    coordinator_stopped: bool,
    coordinator_answers: bool,
    requested_at: Timestamp,
    now: Timestamp,
) -> bool {
    coordinator_stopped
        || (!coordinator_answers
            && now.duration_since(requested_at).as_secs_f64() >= CONFIRM_WAIT.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(seconds: i64) -> Timestamp {
        Timestamp::from_second(1_700_000_000 + seconds).unwrap()
    }

    #[test]
    fn each_criterion_is_met_at_its_threshold_and_not_before() {
        let job = TrainingJob::test("stop")
            .with_wall_clock_limit("10m")
            .with_target_loss(0.5)
            .with_budget_total(2.0);
        let mut progress = Progress {
            started: Some(at(0)),
            loss: Some(0.6),
            spent: Some(1.99),
        };
        assert_eq!(reached(&job, &progress, at(599)), None);
        let (criterion, message) = reached(&job, &progress, at(600)).unwrap();
        assert_eq!(criterion, Criterion::WallClockLimit);
        assert!(message.contains("600 s"), "{message}");
        progress.loss = Some(0.5);
        assert_eq!(
            reached(&job, &progress, at(10)).map(|r| r.0),
            Some(Criterion::TargetLoss)
        );
        progress.loss = Some(f64::NAN);
        assert_eq!(reached(&job, &progress, at(10)), None);
        progress.spent = Some(2.0);
        let (criterion, message) = reached(&job, &progress, at(10)).unwrap();
        assert_eq!(criterion, Criterion::BudgetTotal);
        assert!(message.contains("$2.00 spent"), "{message}");
        assert!(!criterion.succeeds());
    }

    #[test]
    fn nothing_is_met_without_what_a_criterion_needs() {
        let job = TrainingJob::test("stop")
            .with_wall_clock_limit("1s")
            .with_target_loss(0.5)
            .with_budget_total(0.01);
        // not started, no loss yet, not priced
        assert_eq!(reached(&job, &Progress::default(), at(1_000_000)), None);
        // a job without those criteria never stops here
        let plain = TrainingJob::test("plain");
        let progress = Progress {
            started: Some(at(0)),
            loss: Some(0.0),
            spent: Some(1e9),
        };
        assert_eq!(reached(&plain, &progress, at(1_000_000)), None);
    }

    #[test]
    fn the_next_check_comes_when_a_limit_may_be_reached() {
        let job = TrainingJob::test("stop")
            .with_wall_clock_limit("10m")
            .with_budget_total(2.0);
        let progress = Progress {
            started: Some(at(0)),
            loss: None,
            spent: Some(1.0),
        };
        // the budget ($1 left at $0.01/s: 100 s) comes before the wall clock (590 s)
        assert_eq!(
            next_check(&job, &progress, 0.01, at(10)),
            Some(Duration::from_secs(100))
        );
        // nothing charged: the wall clock
        assert_eq!(
            next_check(&job, &progress, 0.0, at(10)),
            Some(Duration::from_secs(590))
        );
        // past a limit: soon
        assert_eq!(
            next_check(&job, &progress, 0.0, at(900)),
            Some(Duration::from_secs(1))
        );
        assert_eq!(
            next_check(&TrainingJob::test("plain"), &progress, 1.0, at(10)),
            None
        );
    }

    #[test]
    fn a_stop_is_over_when_confirmed_or_unanswered_past_the_wait() {
        let wait = CONFIRM_WAIT.as_secs() as i64;
        assert!(confirmed(true, true, at(0), at(1)));
        assert!(!confirmed(false, true, at(0), at(wait * 10)));
        assert!(!confirmed(false, false, at(0), at(wait - 1)));
        assert!(confirmed(false, false, at(0), at(wait)));
        for criterion in [
            Criterion::WallClockLimit,
            Criterion::TargetLoss,
            Criterion::BudgetTotal,
        ] {
            assert_eq!(Criterion::from_field(criterion.field()), Some(criterion));
        }
        assert_eq!(Criterion::from_field("iterations"), None);
    }
}
