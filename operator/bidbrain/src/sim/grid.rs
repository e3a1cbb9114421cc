//! A market laid on a fixed time grid, for fast replay: one buyable price (or none) per pool
//! per slot, read in O(1).

use crate::market::{Market, MarketError, MarketView, PoolInfo, Quote, Timestamp};

/// Buyable spot prices per pool per slot (`NaN`: cannot be bought or kept).
#[derive(Clone, Debug)]
pub struct MarketGrid {
    /// Time of slot 0.
    pub t0: Timestamp,
    /// Seconds per slot.
    pub step: i64,
    /// Number of slots.
    pub slots: usize,
    /// Static facts per pool.
    pub pools: Vec<PoolInfo>,
    /// `prices[pool][slot]`.
    prices: Vec<Vec<f32>>,
    /// `run_start[pool][slot]`: first slot of the pool's current buyable run, `u32::MAX` when
    /// unknown (buyable since slot 0) or not buyable. Only for pools with availability data.
    run_start: Vec<Vec<u32>>,
}

impl MarketGrid {
    /// Lay `market` on a grid of `step` seconds from its first to its last sample.
    pub fn new(market: &Market, step: i64) -> Result<Self, MarketError> {
        let (first, last) = market.span()?;
        let slots = ((last - first) / step + 1) as usize;
        let prices = market
            .pools
            .iter()
            .map(|pool| {
                (0..slots)
                    .map(|slot| {
                        pool.quote_at(first + slot as i64 * step, market.gap)
                            .buyable_price()
                            .map_or(f32::NAN, |p| p as f32)
                    })
                    .collect()
            })
            .collect();
        let run_start = market
            .pools
            .iter()
            .zip(&prices)
            .map(|(pool, prices): (_, &Vec<f32>)| {
                let mut out = vec![u32::MAX; slots];
                if !pool.has_availability {
                    return out;
                }
                let mut current = u32::MAX;
                for slot in 0..slots {
                    if prices[slot].is_nan() {
                        current = u32::MAX;
                    } else {
                        if slot > 0 && prices[slot - 1].is_nan() {
                            current = slot as u32;
                        }
                        out[slot] = current;
                    }
                }
                out
            })
            .collect();
        Ok(Self {
            t0: first,
            step,
            slots,
            pools: market.infos(),
            prices,
            run_start,
        })
    }

    /// A grid step suited to `market`: a third of its median sampling interval, in whole
    /// minutes, between one and fifteen minutes.
    pub fn step_for(market: &Market) -> i64 {
        let mut intervals: Vec<i64> = market
            .pools
            .iter()
            .flat_map(|p| p.samples.windows(2).map(|w| w[1].at - w[0].at))
            .collect();
        intervals.sort_unstable();
        let median = intervals.get(intervals.len() / 2).copied().unwrap_or(60);
        ((median / 3) / 60 * 60).clamp(60, 900)
    }

    /// Time of `slot`.
    pub fn time(&self, slot: usize) -> Timestamp {
        self.t0 + slot as i64 * self.step
    }

    /// The slot holding time `t`, clamped to the grid.
    pub fn slot_at(&self, t: Timestamp) -> usize {
        (((t - self.t0) / self.step.max(1)).max(0) as usize).min(self.slots.saturating_sub(1))
    }

    /// Buyable price of `pool` at `slot`, if any.
    pub fn price(&self, pool: usize, slot: usize) -> Option<f64> {
        let p = self.prices[pool][slot];
        if p.is_nan() { None } else { Some(f64::from(p)) }
    }

    /// The market view at `slot`, as the bidder sees it.
    pub fn view(&self, slot: usize) -> MarketView {
        MarketView {
            at: self.time(slot),
            quotes: (0..self.pools.len())
                .map(|pool| {
                    let price = self.price(pool, slot);
                    let start = self.run_start[pool][slot];
                    Quote {
                        price,
                        available: price.is_some(),
                        up_since: (start != u32::MAX).then(|| self.time(start as usize)),
                    }
                })
                .collect(),
        }
    }
}
