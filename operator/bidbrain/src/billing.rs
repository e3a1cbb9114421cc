//! How instances are charged, and what the bidder expects to pay (seed 003 eq. 4.1).
//!
//! - `aws-hourly-2016` (the Proteus setting): each instance-hour is charged at its start at
//!   the price then in force; if EC2 evicts the instance, the partial hour is refunded; if the
//!   user terminates it, the whole hour is charged.
//! - `aws` (today): per second at the price in force, 60 s minimum; a Linux spot instance that
//!   EC2 interrupts within its first hour costs nothing; after that, or when the user
//!   terminates it, it is charged per second.
//! - `gcp`: per second, 60 s minimum, no refund, 30 s notice.
//! - `fixed`: per second at a flat price, no minimum, no refund (private clusters).
//!
//! [`Meter`] charges one instance as time passes; [`BillingModel::expected_charge`] is the
//! bidder's expectation over a decision window.

use std::fmt;
use std::str::FromStr;

use crate::market::Timestamp;

/// One hour in seconds.
const HOUR: f64 = 3600.0;

/// A billing model (see the module docs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum BillingModel {
    /// Hourly, evicted partial hour refunded.
    AwsHourly2016,
    /// Per second, free if EC2 interrupts within the first hour.
    Aws,
    /// Per second, no refund.
    Gcp,
    /// Per second, flat price.
    Fixed,
}

/// Errors naming a billing model.
#[derive(Debug, thiserror::Error)]
pub enum BillingError {
    /// The name is not a billing model.
    #[error("parse billing model {name:?}: expected aws, aws-hourly-2016, gcp or fixed")]
    ParseModel {
        /// The name given.
        name: String,
    },
}

impl FromStr for BillingModel {
    type Err = BillingError;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        match name {
            "aws-hourly-2016" => Ok(Self::AwsHourly2016),
            "aws" => Ok(Self::Aws),
            "gcp" => Ok(Self::Gcp),
            "fixed" => Ok(Self::Fixed),
            _ => Err(BillingError::ParseModel {
                name: name.to_string(),
            }),
        }
    }
}

impl fmt::Display for BillingModel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::AwsHourly2016 => "aws-hourly-2016",
            Self::Aws => "aws",
            Self::Gcp => "gcp",
            Self::Fixed => "fixed",
        })
    }
}

/// Why an instance stopped being charged.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EndReason {
    /// The provider took it back (spot interruption, price above the max price).
    Evicted,
    /// The user terminated it.
    Released,
    /// The job ended; the rest of a started billing period goes to the next job in the
    /// queue, so the job is charged pro rata (the Proteus accounting, seed 003 §4.5.2).
    JobFinished,
}

/// What one instance cost.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Charge {
    /// USD charged.
    pub usd: f64,
    /// Seconds the instance ran and was paid for.
    pub paid_seconds: f64,
    /// Seconds the instance ran free of charge (refunded).
    pub free_seconds: f64,
}

/// Charges one instance as time passes: call [`Meter::advance`] for consecutive intervals
/// with the price in force, then [`Meter::finish`].
#[derive(Clone, Debug)]
pub struct Meter {
    model: BillingModel,
    launched: Timestamp,
    /// Charges of completed periods (hourly) or seconds so far (per-second models).
    usd: f64,
    /// Hourly model: start and charge of the current hour.
    hour_start: Timestamp,
    hour_usd: f64,
    last_price: f64,
    until: Timestamp,
}

impl Meter {
    /// Start charging an instance launched at `launched`.
    pub fn new(model: BillingModel, launched: Timestamp) -> Self {
        Self {
            model,
            launched,
            usd: 0.0,
            hour_start: launched,
            hour_usd: 0.0,
            last_price: 0.0,
            until: launched,
        }
    }

    /// When the instance was launched.
    pub fn launched(&self) -> Timestamp {
        self.launched
    }

    /// The instance ran from the end of the previous interval to `to` at `price_usd_hr`.
    pub fn advance(&mut self, to: Timestamp, price_usd_hr: f64) {
        debug_assert!(to >= self.until, "meter intervals must be consecutive");
        debug_assert!(price_usd_hr.is_finite() && price_usd_hr >= 0.0);
        let from = self.until;
        match self.model {
            BillingModel::AwsHourly2016 => {
                // every hour mark in [from, to) starts a new hour charged at its start price
                let mut mark = self.next_hour_mark(from);
                while mark < to {
                    self.usd += self.hour_usd;
                    self.hour_start = mark;
                    self.hour_usd = price_usd_hr;
                    mark += HOUR as i64;
                }
            }
            BillingModel::Aws | BillingModel::Gcp | BillingModel::Fixed => {
                self.usd += price_usd_hr * (to - from) as f64 / HOUR;
            }
        }
        self.last_price = price_usd_hr;
        self.until = to;
    }

    fn next_hour_mark(&self, at: Timestamp) -> Timestamp {
        let age = at - self.launched;
        if age <= 0 {
            return self.launched;
        }
        let hours = (age + HOUR as i64 - 1) / HOUR as i64;
        self.launched + hours * HOUR as i64
    }

    /// Charges so far if the instance kept running (for budget checks).
    pub fn accrued_usd(&self) -> f64 {
        self.usd + self.hour_usd
    }

    /// Stop charging at the end of the last interval, for `reason`.
    pub fn finish(mut self, reason: EndReason) -> Charge {
        let ran = (self.until - self.launched) as f64;
        match self.model {
            BillingModel::AwsHourly2016 => {
                let in_hour = (self.until - self.hour_start) as f64;
                match reason {
                    // an hour that ran to its end was complete when the eviction came: paid
                    // (only a partial hour is refunded)
                    EndReason::Evicted if in_hour >= HOUR => Charge {
                        usd: self.usd + self.hour_usd,
                        paid_seconds: ran,
                        free_seconds: 0.0,
                    },
                    EndReason::Evicted => Charge {
                        usd: self.usd,
                        paid_seconds: ran - in_hour,
                        free_seconds: in_hour,
                    },
                    EndReason::Released => Charge {
                        usd: self.usd + self.hour_usd,
                        paid_seconds: ran,
                        free_seconds: 0.0,
                    },
                    EndReason::JobFinished => Charge {
                        usd: self.usd + self.hour_usd * in_hour / HOUR,
                        paid_seconds: ran,
                        free_seconds: 0.0,
                    },
                }
            }
            BillingModel::Aws if reason == EndReason::Evicted && ran < HOUR => Charge {
                usd: 0.0,
                paid_seconds: 0.0,
                free_seconds: ran,
            },
            BillingModel::Aws | BillingModel::Gcp => {
                if ran < 60.0 && reason != EndReason::JobFinished {
                    self.usd += self.last_price * (60.0 - ran) / HOUR;
                }
                Charge {
                    usd: self.usd,
                    paid_seconds: ran,
                    free_seconds: 0.0,
                }
            }
            BillingModel::Fixed => Charge {
                usd: self.usd,
                paid_seconds: ran,
                free_seconds: 0.0,
            },
        }
    }
}

impl BillingModel {
    /// Warning the provider gives before taking an instance back.
    pub fn notice_seconds(&self) -> f64 {
        match self {
            Self::AwsHourly2016 | Self::Aws => 120.0,
            Self::Gcp => 30.0,
            Self::Fixed => 0.0,
        }
    }

    /// The next instant after `now` at which keeping an instance launched at `launched`
    /// changes its bill: the next hour mark (hourly), the end of the free first hour (aws),
    /// none for gcp and fixed.
    pub fn next_boundary(&self, launched: Timestamp, now: Timestamp) -> Option<Timestamp> {
        let age = now - launched;
        match self {
            Self::AwsHourly2016 => Some(launched + (age.div_euclid(HOUR as i64) + 1) * HOUR as i64),
            Self::Aws if age < HOUR as i64 => Some(launched + HOUR as i64),
            Self::Aws | Self::Gcp | Self::Fixed => None,
        }
    }

    /// The window over which the bidder weighs an instance of age `age_s` at a decision: up
    /// to its next billing boundary, or `horizon_s` where the model has none.
    pub fn decision_window(&self, age_s: f64, horizon_s: f64) -> f64 {
        match self {
            Self::AwsHourly2016 => HOUR - age_s.rem_euclid(HOUR),
            Self::Aws if age_s < HOUR => HOUR - age_s,
            Self::Aws | Self::Gcp | Self::Fixed => horizon_s,
        }
    }

    /// Expected charge in USD for one instance over a decision window of `window_s` seconds
    /// (seed 003 eq. 4.1): with probability `beta` it is evicted within the window, and
    /// `expected_uptime_s` is its expected running time in the window.
    ///
    /// Where an eviction in the window is refunded (hourly model; aws in the first hour) the
    /// charge is `(1 − β) · P · t_r`; otherwise the instance is paid while it runs, `P · E[up]`.
    pub fn expected_charge(
        &self,
        price_usd_hr: f64,
        age_s: f64,
        window_s: f64,
        beta: f64,
        expected_uptime_s: f64,
    ) -> f64 {
        let refunded = match self {
            Self::AwsHourly2016 => true,
            Self::Aws => age_s < HOUR,
            Self::Gcp | Self::Fixed => false,
        };
        if refunded {
            (1.0 - beta) * price_usd_hr * window_s / HOUR
        } else {
            price_usd_hr * expected_uptime_s / HOUR
        }
    }

    /// Expected charge in USD for one instance of age `age_s` kept for the next `horizon_s`
    /// seconds (renewed at every billing boundary in between), at `price_usd_hr`: eq. 4.1
    /// applied to each billing period the horizon covers, each weighted by the probability
    /// that the instance is still running then.
    ///
    /// `survival(t)` is the probability that the instance still runs at age `t` given that it
    /// runs at `age_s`; `uptime(t0, t1)` its expected running seconds between ages `t0` and
    /// `t1` on the same condition. Per period:
    ///
    /// - `aws-hourly-2016`: an hour is charged unless the instance is evicted before the hour
    ///   ends, so the part of each hour inside the horizon costs `P · part · S(hour end)`;
    /// - `aws`: the part of the first hour inside the horizon costs `P · part · S(1 h)` (an
    ///   interruption in the first hour refunds it), every later second `P` while it runs;
    /// - `gcp`, `fixed`: `P` while it runs.
    ///
    /// With a horizon that ends at the next boundary this is [`BillingModel::expected_charge`].
    pub fn expected_charge_over(
        &self,
        price_usd_hr: f64,
        age_s: f64,
        horizon_s: f64,
        survival: &dyn Fn(f64) -> f64,
        uptime: &dyn Fn(f64, f64) -> f64,
    ) -> f64 {
        let end = age_s + horizon_s.max(0.0);
        match self {
            Self::AwsHourly2016 => {
                let mut usd = 0.0;
                let mut from = age_s;
                while from < end {
                    let hour_end = ((from / HOUR).floor() + 1.0) * HOUR;
                    let to = hour_end.min(end);
                    usd += price_usd_hr * (to - from) / HOUR * survival(hour_end);
                    from = to;
                }
                usd
            }
            Self::Aws => {
                let mut usd = 0.0;
                if age_s < HOUR {
                    usd += price_usd_hr * (end.min(HOUR) - age_s) / HOUR * survival(HOUR);
                }
                let paid_from = age_s.max(HOUR);
                if end > paid_from {
                    usd += price_usd_hr * uptime(paid_from, end) / HOUR;
                }
                usd
            }
            Self::Gcp | Self::Fixed => price_usd_hr * uptime(age_s, end) / HOUR,
        }
    }

    /// What terminating an instance of age `age_s` now still costs in USD: the rest of its
    /// started hour under `aws-hourly-2016` (a terminated partial hour is charged in full;
    /// nothing on an hour mark), nothing under the per-second models.
    pub fn release_charge(&self, price_usd_hr: f64, age_s: f64) -> f64 {
        let into_hour = age_s.rem_euclid(HOUR);
        match self {
            Self::AwsHourly2016 if into_hour > 0.0 => price_usd_hr * (HOUR - into_hour) / HOUR,
            Self::AwsHourly2016 | Self::Aws | Self::Gcp | Self::Fixed => 0.0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(model: BillingModel, prices: &[(i64, f64)], reason: EndReason) -> Charge {
        let mut meter = Meter::new(model, 0);
        for &(to, price) in prices {
            meter.advance(to, price);
        }
        meter.finish(reason)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn hourly_2016_charges_each_hour_at_its_start_price() {
        // 2.5 h: hours at 1.0 (start), 2.0 (price at 3600), 3.0 (price at 7200)
        let prices = [(3600, 1.0), (7200, 2.0), (9000, 3.0)];
        let released = run(BillingModel::AwsHourly2016, &prices, EndReason::Released);
        assert!(close(released.usd, 6.0), "{released:?}");
        assert_eq!(released.free_seconds, 0.0);
    }

    #[test]
    fn hourly_2016_refunds_an_evicted_partial_hour() {
        let prices = [(3600, 1.0), (7200, 2.0), (9000, 3.0)];
        let evicted = run(BillingModel::AwsHourly2016, &prices, EndReason::Evicted);
        assert!(close(evicted.usd, 3.0), "{evicted:?}");
        assert_eq!(evicted.free_seconds, 1800.0);
        assert_eq!(evicted.paid_seconds, 7200.0);
        // evicted within the first hour: entirely free
        let early = run(
            BillingModel::AwsHourly2016,
            &[(1200, 1.0)],
            EndReason::Evicted,
        );
        assert_eq!(early.usd, 0.0);
        assert_eq!(early.free_seconds, 1200.0);
        // evicted exactly at an hour mark: that hour was complete, so it is paid (before, it
        // was refunded whole; the simulator checks evictions at slot starts, which fall on
        // hour marks whenever the step divides an hour)
        let on_the_mark = run(
            BillingModel::AwsHourly2016,
            &[(3600, 1.0)],
            EndReason::Evicted,
        );
        assert!(close(on_the_mark.usd, 1.0), "{on_the_mark:?}");
        assert_eq!(on_the_mark.free_seconds, 0.0);
        assert_eq!(on_the_mark.paid_seconds, 3600.0);
        let second_mark = run(
            BillingModel::AwsHourly2016,
            &[(3600, 1.0), (7200, 2.0)],
            EndReason::Evicted,
        );
        assert!(close(second_mark.usd, 3.0), "{second_mark:?}");
    }

    #[test]
    fn hourly_2016_prorates_the_last_hour_when_the_job_ends() {
        let done = run(
            BillingModel::AwsHourly2016,
            &[(5400, 1.0)],
            EndReason::JobFinished,
        );
        assert!(close(done.usd, 1.5), "{done:?}");
    }

    #[test]
    fn aws_is_free_when_interrupted_in_the_first_hour_only() {
        let early = run(BillingModel::Aws, &[(3599, 1.0)], EndReason::Evicted);
        assert_eq!(early.usd, 0.0);
        assert_eq!(early.free_seconds, 3599.0);
        let late = run(
            BillingModel::Aws,
            &[(3600, 1.0), (5400, 2.0)],
            EndReason::Evicted,
        );
        assert!(close(late.usd, 2.0), "{late:?}");
        assert_eq!(late.free_seconds, 0.0);
        // terminating it yourself within the first hour is charged per second
        let released = run(BillingModel::Aws, &[(1800, 1.0)], EndReason::Released);
        assert!(close(released.usd, 0.5), "{released:?}");
    }

    #[test]
    fn aws_and_gcp_charge_at_least_a_minute() {
        let aws = run(BillingModel::Aws, &[(10, 3.6)], EndReason::Released);
        assert!(close(aws.usd, 0.06), "{aws:?}");
        let gcp = run(BillingModel::Gcp, &[(10, 3.6)], EndReason::Evicted);
        assert!(close(gcp.usd, 0.06), "{gcp:?}");
    }

    #[test]
    fn gcp_never_refunds() {
        let evicted = run(
            BillingModel::Gcp,
            &[(1800, 1.0), (2700, 2.0)],
            EndReason::Evicted,
        );
        assert!(close(evicted.usd, 1.0), "{evicted:?}");
        assert_eq!(evicted.free_seconds, 0.0);
    }

    #[test]
    fn fixed_is_per_second_without_minimum() {
        let fixed = run(BillingModel::Fixed, &[(36, 1.0)], EndReason::Evicted);
        assert!(close(fixed.usd, 0.01), "{fixed:?}");
    }

    #[test]
    fn boundaries_and_windows_follow_the_model() {
        assert_eq!(
            BillingModel::AwsHourly2016.next_boundary(100, 100),
            Some(3700)
        );
        assert_eq!(
            BillingModel::AwsHourly2016.next_boundary(100, 3700),
            Some(7300)
        );
        assert_eq!(BillingModel::Aws.next_boundary(0, 10), Some(3600));
        assert_eq!(BillingModel::Aws.next_boundary(0, 3600), None);
        assert_eq!(BillingModel::Gcp.next_boundary(0, 10), None);
        assert_eq!(
            BillingModel::AwsHourly2016.decision_window(4000.0, 600.0),
            3200.0
        );
        assert_eq!(BillingModel::Aws.decision_window(4000.0, 600.0), 600.0);
        assert_eq!(BillingModel::Aws.decision_window(600.0, 600.0), 3000.0);
    }

    #[test]
    fn expected_charge_applies_refunds_only_where_the_model_has_them() {
        // eq. 4.1: (1 − β) P t_r
        assert!(close(
            BillingModel::AwsHourly2016.expected_charge(2.0, 0.0, 3600.0, 0.25, 3000.0),
            1.5
        ));
        assert!(close(
            BillingModel::Aws.expected_charge(2.0, 0.0, 3600.0, 0.25, 3000.0),
            1.5
        ));
        // past the first hour, or without refunds: pay while it runs
        assert!(close(
            BillingModel::Aws.expected_charge(2.0, 3600.0, 3600.0, 0.25, 3000.0),
            2.0 * 3000.0 / 3600.0
        ));
        assert!(close(
            BillingModel::Gcp.expected_charge(2.0, 0.0, 3600.0, 0.25, 1800.0),
            1.0
        ));
    }

    #[test]
    fn expected_charge_over_a_horizon_weighs_each_period_by_survival() {
        // survival from age 1800: 0.8 at 3600, 0.5 at 7200, linear in between; uptime is its
        // integral (trapezoids)
        let s = |t: f64| {
            if t <= 1800.0 {
                1.0
            } else if t <= 3600.0 {
                1.0 - 0.2 * (t - 1800.0) / 1800.0
            } else {
                (0.8 - 0.3 * (t - 3600.0) / 3600.0).max(0.0)
            }
        };
        let up = |t0: f64, t1: f64| {
            let n = 10_000;
            let h = (t1 - t0) / n as f64;
            (0..n)
                .map(|i| 0.5 * (s(t0 + i as f64 * h) + s(t0 + (i + 1) as f64 * h)) * h)
                .sum::<f64>()
        };
        let p = 2.0;
        // hourly: the rest of the current hour pays if it survives to 3600, the next half hour
        // is half of an hour that pays if it survives to 7200
        let hourly = BillingModel::AwsHourly2016.expected_charge_over(p, 1800.0, 3600.0, &s, &up);
        assert!(close(hourly, p * 0.5 * 0.8 + p * 0.5 * 0.5), "{hourly}");
        // ending at the boundary it is eq. 4.1 over one window
        let one = BillingModel::AwsHourly2016.expected_charge_over(p, 1800.0, 1800.0, &s, &up);
        let eq41 = BillingModel::AwsHourly2016.expected_charge(p, 1800.0, 1800.0, 0.2, 0.0);
        assert!(close(one, eq41), "{one} vs {eq41}");
        // aws: the rest of the first hour pays if it survives the hour, then per second
        let aws = BillingModel::Aws.expected_charge_over(p, 1800.0, 3600.0, &s, &up);
        assert!(
            close(aws, p * 0.5 * 0.8 + p * up(3600.0, 5400.0) / 3600.0),
            "{aws}"
        );
        // past the first hour, and under gcp, per second while it runs
        let late = BillingModel::Aws.expected_charge_over(p, 3600.0, 3600.0, &s, &up);
        assert!(close(late, p * up(3600.0, 7200.0) / 3600.0), "{late}");
        let gcp = BillingModel::Gcp.expected_charge_over(p, 1800.0, 3600.0, &s, &up);
        assert!(close(gcp, p * up(1800.0, 5400.0) / 3600.0), "{gcp}");
        assert!(gcp > aws && aws > hourly, "{gcp} {aws} {hourly}");
    }

    #[test]
    fn a_release_pays_the_rest_of_the_hour_only_under_hourly_billing() {
        assert!(close(
            BillingModel::AwsHourly2016.release_charge(2.0, 3300.0),
            2.0 * 300.0 / 3600.0
        ));
        assert!(close(
            BillingModel::AwsHourly2016.release_charge(2.0, 5400.0),
            1.0
        ));
        assert_eq!(BillingModel::AwsHourly2016.release_charge(2.0, 7200.0), 0.0);
        assert_eq!(BillingModel::Aws.release_charge(2.0, 1800.0), 0.0);
        assert_eq!(BillingModel::Gcp.release_charge(2.0, 1800.0), 0.0);
    }

    #[test]
    fn names_round_trip() {
        for model in [
            BillingModel::AwsHourly2016,
            BillingModel::Aws,
            BillingModel::Gcp,
            BillingModel::Fixed,
        ] {
            assert_eq!(model.to_string().parse::<BillingModel>().unwrap(), model);
        }
        assert!("hourly".parse::<BillingModel>().is_err());
    }
}
