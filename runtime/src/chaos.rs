//! Seeded chaos: schedules of mixed membership events that the elasticity tests drive the
//! integer-exact apps through (the Rust one in `tests/elastic.rs`, the Python one in
//! `python/tests`), so both face the very same schedules.

use std::time::Duration;

use rand::{RngExt, SeedableRng};

use crate::elastic::{ElasticEvent, ScheduledEvent};

/// A seeded schedule of `count` mixed events over `clocks` clocks: bulk adds, partial and full
/// evictions with notice, failures and late notices.
pub fn random_schedule(
    seed: u64,
    count: usize,
    clocks: u64,
    initial: &[&str],
) -> Vec<ScheduledEvent> {
    let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(seed);
    let mut alive: Vec<String> = initial.iter().map(|s| s.to_string()).collect();
    let mut next_name = 0;
    let mut events = Vec::new();
    for i in 0..count {
        let at_clock = 1 + (i as u64 * (clocks - 1)) / count as u64;
        let kind = if alive.is_empty() {
            0
        } else {
            rng.random_range(0..5)
        };
        let event = match kind {
            0 => {
                let n = rng.random_range(1..=4);
                let joined: Vec<String> = (0..n)
                    .map(|_| {
                        next_name += 1;
                        format!("r-{next_name}")
                    })
                    .collect();
                alive.extend(joined.iter().cloned());
                ElasticEvent::Join { names: joined }
            }
            kind => {
                let n = if kind == 4 {
                    alive.len()
                } else {
                    rng.random_range(1..=alive.len())
                };
                let mut leaving = Vec::new();
                for _ in 0..n {
                    let index = rng.random_range(0..alive.len());
                    leaving.push(alive.swap_remove(index));
                }
                match kind {
                    1 | 4 => ElasticEvent::Notice {
                        names: leaving,
                        lead: Duration::from_secs(60),
                    },
                    2 => ElasticEvent::Fail { names: leaving },
                    _ => ElasticEvent::Notice {
                        names: leaving,
                        lead: Duration::ZERO,
                    },
                }
            }
        };
        events.push(ScheduledEvent { at_clock, event });
    }
    events
}
