//! Divergence: a training loss that stops being a number, or that grows without bound, ends a
//! run as an error instead of a model of NaNs reported as done.
//!
//! Every worker watches its own clocks' training loss with a [`DivergenceGuard`] (a diverging
//! model diverges for every worker that shares its rows, so one worker's view suffices and needs
//! no extra coordination), and records the first [`Divergence`] in its report. Runners stop the
//! run at the next point where every worker agrees (single-process: the shared clock gate; the
//! elastic controller: the segment's end, which a node's background copy report brings forward)
//! and fail it with that divergence. A final evaluation whose loss or metrics are not finite is a
//! divergence too ([`check_eval`]).
//!
//! The rules: a clock's training loss that is NaN or infinite; or a window's mean loss above
//! [`GROWTH`] times the lowest window mean the worker has seen and above its first window's, for
//! [`PATIENCE`] windows in a row. A window is the clocks that together hold at least
//! [`WINDOW_TERMS`] loss terms: a clock is a slice of a pass, and one worker's slice may hold a
//! handful of examples (digits with 32 workers: 2 a clock), whose loss swings tenfold from one
//! clock to the next; a diverging model's grows by orders of magnitude within a few windows.

use serde::{Deserialize, Serialize};

use crate::app::{ClockStats, EvalReport};

/// A clock's loss above this many times the lowest loss seen counts toward divergence.
pub const GROWTH: f64 = 4.0;
/// Windows in a row above the bound that make a divergence.
pub const PATIENCE: u32 = 3;
/// Loss terms a window holds at least (the last clock completes it).
pub const WINDOW_TERMS: u64 = 256;

/// What stopped a run that a worker halted.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum HaltCause {
    /// The training loss or the evaluation diverged.
    #[default]
    Diverged,
    /// The app's own code failed (a Python hook raised, returned the wrong shape, or wrote a
    /// non-finite delta): [`crate::app::AppWorker::failure`].
    AppFailed,
}

/// Why and where a run diverged, or its app failed (see [`Divergence::cause`]): the worker that
/// saw it halts the run the same way in both cases.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Divergence {
    /// The clock at which the rule tripped.
    pub clock: u64,
    /// Divergence, or the app's failure.
    #[serde(default)]
    pub cause: HaltCause,
    /// What happened, in words (the loss and the rule).
    pub what: String,
    /// The last clock with a finite training loss, and that loss.
    pub last_finite: Option<(u64, f64)>,
}

impl std::fmt::Display for Divergence {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.cause == HaltCause::AppFailed {
            return write!(f, "the app failed at clock {}: {}", self.clock, self.what);
        }
        write!(
            f,
            "training diverged at clock {}: {}",
            self.clock, self.what
        )?;
        match self.last_finite {
            Some((clock, loss)) => {
                write!(f, "; last finite training loss {loss:.6} at clock {clock}")
            }
            None => write!(f, "; no clock had a finite training loss"),
        }
    }
}

/// Watches one worker's per-clock training loss.
#[derive(Debug, Clone, Default)]
pub struct DivergenceGuard {
    /// The open window: (loss sum, terms).
    window: (f64, u64),
    first: Option<f64>,
    lowest: Option<f64>,
    rising: u32,
    last_finite: Option<(u64, f64)>,
    tripped: bool,
}

impl DivergenceGuard {
    /// A guard that has seen nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// Takes clock `clock`'s stats; returns the divergence the first time a rule trips (and
    /// nothing after, so a run reports it once). Clocks without loss terms are skipped.
    pub fn observe(&mut self, clock: u64, stats: &ClockStats) -> Option<Divergence> {
        if self.tripped {
            return None;
        }
        let loss = stats.mean_loss()?;
        let what = if !loss.is_finite() {
            Some(format!("the mean training loss is {loss}"))
        } else {
            self.last_finite = Some((clock, loss));
            self.window.0 += stats.loss_sum;
            self.window.1 += stats.loss_count;
            if self.window.1 < WINDOW_TERMS {
                return None;
            }
            let loss = self.window.0 / self.window.1 as f64;
            self.window = (0.0, 0);
            let first = *self.first.get_or_insert(loss);
            let lowest = self.lowest.map_or(loss, |low| low.min(loss));
            self.lowest = Some(lowest);
            if loss > GROWTH * lowest && loss > first {
                self.rising += 1;
            } else {
                self.rising = 0;
            }
            (self.rising >= PATIENCE).then(|| {
                format!(
                    "the mean training loss {loss:.6} stayed above {GROWTH} times its lowest \
                     ({lowest:.6}) and above the first clocks' ({first:.6}) for {PATIENCE} \
                     windows of {WINDOW_TERMS} or more loss terms"
                )
            })
        };
        let what = what?;
        self.tripped = true;
        Some(Divergence {
            clock,
            cause: HaltCause::Diverged,
            what,
            last_finite: self.last_finite,
        })
    }

    /// The last clock with a finite loss, and that loss.
    pub fn last_finite(&self) -> Option<(u64, f64)> {
        self.last_finite
    }
}

impl Divergence {
    /// The status API's reason for a job this ended.
    pub fn reason(&self) -> ebbflow_runtime_api::FailureReason {
        match self.cause {
            HaltCause::Diverged => ebbflow_runtime_api::FailureReason::Diverged,
            HaltCause::AppFailed => ebbflow_runtime_api::FailureReason::AppFailed,
        }
    }

    /// The app's code failed at `clock` (`what` names the hook and the error).
    pub fn app_failed(clock: u64, what: String) -> Self {
        Self {
            clock,
            cause: HaltCause::AppFailed,
            what,
            last_finite: None,
        }
    }
}

/// The earliest divergence among workers' reports (by clock).
pub fn earliest<'a>(divergences: impl IntoIterator<Item = &'a Divergence>) -> Option<Divergence> {
    divergences.into_iter().min_by_key(|d| d.clock).cloned()
}

/// A final evaluation whose loss or a metric is not finite is a divergence at `clock`.
pub fn check_eval(
    eval: &EvalReport,
    clock: u64,
    last_finite: Option<(u64, f64)>,
) -> Option<Divergence> {
    let bad = std::iter::once(("loss", eval.loss))
        .chain(
            eval.metrics
                .iter()
                .map(|(name, value)| (name.as_str(), *value)),
        )
        .find(|(_, value)| !value.is_finite())?;
    Some(Divergence {
        clock,
        cause: HaltCause::Diverged,
        what: format!("the final evaluation's {} is {}", bad.0, bad.1),
        last_finite,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stats(loss: f64) -> ClockStats {
        ClockStats {
            updates: WINDOW_TERMS,
            loss_sum: loss * WINDOW_TERMS as f64,
            loss_count: WINDOW_TERMS,
        }
    }

    #[test]
    fn small_clocks_are_judged_by_windows() {
        // Two loss terms a clock: a lucky clock's 0.05 and an unlucky one's 3.0 are noise.
        let mut guard = DivergenceGuard::new();
        let small = |loss: f64| ClockStats {
            updates: 2,
            loss_sum: 2.0 * loss,
            loss_count: 2,
        };
        for clock in 0..2000u64 {
            let loss = match clock % 7 {
                0 => 0.05,
                3 => 3.0,
                _ => 0.4,
            };
            assert_eq!(guard.observe(clock, &small(loss)), None, "clock {clock}");
        }
        // A runaway loss trips within a few windows (128 clocks each).
        let tripped = (2000..3000u64)
            .find_map(|clock| guard.observe(clock, &small(50.0)))
            .unwrap();
        assert!(tripped.clock < 2000 + 4 * 128, "{tripped}");
    }

    #[test]
    fn a_non_finite_loss_trips_at_once_and_names_the_last_finite_one() {
        let mut guard = DivergenceGuard::new();
        assert_eq!(guard.observe(0, &stats(1.2)), None);
        assert_eq!(guard.observe(1, &stats(0.9)), None);
        let tripped = guard.observe(2, &stats(f64::NAN)).unwrap();
        assert_eq!(tripped.clock, 2);
        assert_eq!(tripped.last_finite, Some((1, 0.9)));
        assert!(tripped.to_string().contains("NaN"), "{tripped}");
        assert!(tripped.to_string().contains("at clock 1"), "{tripped}");
        // Once only.
        assert_eq!(guard.observe(3, &stats(f64::INFINITY)), None);
    }

    #[test]
    fn growth_trips_after_patience_clocks_in_a_row() {
        // The BSP run with 4 workers, before the fix.
        let losses = [1.17, 1.01, 1.12, 1.45, 2.65, 5.58, 12.1, 16.1];
        let mut guard = DivergenceGuard::new();
        let tripped = losses
            .iter()
            .enumerate()
            .find_map(|(clock, &loss)| guard.observe(clock as u64, &stats(loss)))
            .unwrap();
        // 5.58 > 4 x 1.01 at clock 5, then 12.1 and 16.1: three in a row at clock 7.
        assert_eq!(tripped.clock, 7);
        assert_eq!(tripped.last_finite, Some((7, 16.1)));
    }

    #[test]
    fn noise_and_a_dip_do_not_trip() {
        let mut guard = DivergenceGuard::new();
        // A converging run whose slices differ, with a lucky low slice.
        let losses = [1.1, 0.9, 0.2, 0.85, 0.9, 0.88, 0.95, 0.86, 0.9, 0.87];
        for (clock, loss) in losses.iter().enumerate() {
            assert_eq!(guard.observe(clock as u64, &stats(*loss)), None);
        }
        // Above 4x the lowest twice, then back: the count starts again.
        let mut guard = DivergenceGuard::new();
        for (clock, loss) in [1.0, 0.1, 0.5, 1.5, 1.6, 0.3, 1.5, 1.5].iter().enumerate() {
            assert_eq!(guard.observe(clock as u64, &stats(*loss)), None);
        }
        // No loss terms: skipped.
        assert_eq!(guard.observe(9, &ClockStats::default()), None);
    }

    #[test]
    fn a_non_finite_evaluation_is_a_divergence() {
        let fine = EvalReport {
            loss: 0.9,
            metrics: vec![("rmse".into(), 0.9)],
        };
        assert_eq!(check_eval(&fine, 10, None), None);
        let nan = EvalReport {
            loss: 0.9,
            metrics: vec![("accuracy".into(), f64::NAN)],
        };
        let found = check_eval(&nan, 10, Some((9, 0.5))).unwrap();
        assert!(found.what.contains("accuracy is NaN"), "{found}");
        assert_eq!(found.clock, 10);
    }
}
