//! Server-side optimizers: how a summed delta from workers is applied to a row.
//!
//! With [`Optimizer::Add`] the delta is added as is (workers run their own SGD and send parameter
//! changes; the default and the only choice for count tables such as LDA's). The others treat the
//! delta as a descent direction (a negative gradient scaled by the worker) and keep per-value state
//! on the server.

use serde::{Deserialize, Serialize};

/// A server-side update rule.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize, Default)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Optimizer {
    /// `row += delta`.
    #[default]
    Add,
    /// `row += lr * delta`.
    Sgd {
        /// Learning rate.
        lr: f32,
    },
    /// `v = momentum * v + delta; row += lr * v`.
    Momentum {
        /// Learning rate.
        lr: f32,
        /// Momentum coefficient in `[0, 1)`.
        momentum: f32,
    },
    /// `g2 += delta^2; row += lr * delta / (sqrt(g2) + eps)`.
    AdaGrad {
        /// Learning rate.
        lr: f32,
        /// Numerical floor of the denominator.
        eps: f32,
    },
}

impl Optimizer {
    /// Heavy-ball momentum 0.9 with step 0.1 (= 1 − momentum): a delta repeated every clock
    /// moves the row as far as plain addition would, earlier deltas decaying into later steps.
    pub const MOMENTUM: Optimizer = Optimizer::Momentum {
        lr: 0.1,
        momentum: 0.9,
    };

    /// AdaGrad over the workers' deltas: each coordinate's step is 0.05 times its delta over the
    /// root of its summed squared deltas.
    pub const ADAGRAD: Optimizer = Optimizer::AdaGrad {
        lr: 0.05,
        eps: 1e-8,
    };

    /// True if the rule keeps one state value per parameter value.
    pub fn has_state(&self) -> bool {
        matches!(self, Optimizer::Momentum { .. } | Optimizer::AdaGrad { .. })
    }

    /// Applies `delta` to `row`, using `state` (same length as `row`, or empty without state).
    pub fn apply(&self, row: &mut [f32], state: &mut [f32], delta: &[f32]) {
        debug_assert_eq!(row.len(), delta.len());
        match *self {
            Optimizer::Add => {
                for (value, d) in row.iter_mut().zip(delta) {
                    *value += d;
                }
            }
            Optimizer::Sgd { lr } => {
                for (value, d) in row.iter_mut().zip(delta) {
                    *value += lr * d;
                }
            }
            Optimizer::Momentum { lr, momentum } => {
                debug_assert_eq!(state.len(), row.len());
                for ((value, v), d) in row.iter_mut().zip(state.iter_mut()).zip(delta) {
                    *v = momentum * *v + d;
                    *value += lr * *v;
                }
            }
            Optimizer::AdaGrad { lr, eps } => {
                debug_assert_eq!(state.len(), row.len());
                for ((value, g2), d) in row.iter_mut().zip(state.iter_mut()).zip(delta) {
                    *g2 += d * d;
                    *value += lr * d / (g2.sqrt() + eps);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rules_match_their_formulas() {
        let mut row = [1.0f32, 2.0];
        Optimizer::Add.apply(&mut row, &mut [], &[0.5, -1.0]);
        assert_eq!(row, [1.5, 1.0]);
        Optimizer::Sgd { lr: 0.1 }.apply(&mut row, &mut [], &[1.0, 2.0]);
        assert_eq!(row, [1.6, 1.2]);
        let (mut row, mut state) = ([0.0f32], [0.0f32]);
        let momentum = Optimizer::Momentum {
            lr: 1.0,
            momentum: 0.5,
        };
        momentum.apply(&mut row, &mut state, &[1.0]);
        momentum.apply(&mut row, &mut state, &[1.0]);
        assert_eq!((row, state), ([2.5], [1.5]));
        let (mut row, mut state) = ([0.0f32], [0.0f32]);
        Optimizer::AdaGrad { lr: 1.0, eps: 0.0 }.apply(&mut row, &mut state, &[3.0]);
        assert_eq!((row, state), ([1.0], [9.0]));
        assert!(!Optimizer::Sgd { lr: 1.0 }.has_state());
    }
}
