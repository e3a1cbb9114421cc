//! A live replay of a spot market for one job: the bidder's decisions, the trace's evictions (with
//! their notice window, looked up ahead in the trace) and the bill, one grid slot at a time.
//!
//! The same bidder, grid and billing meters as `ebbflow simulate`; unlike the simulator it does not
//! model training progress: `ebbflow run` trains for real and asks the replay what the market did.

use ebbflow_bidbrain::bidder::{
    Allocation, AppModel, Bidder, BidderConfig, BidderInput, JobState, ReliableTier,
};
use ebbflow_bidbrain::billing::{BillingModel, EndReason, Meter};
use ebbflow_bidbrain::eviction::EvictionModel;
use ebbflow_bidbrain::market::{CapacityType, Timestamp};
use ebbflow_bidbrain::sim::grid::MarketGrid;

/// What the market or the bidder did at a slot.
#[derive(Debug, Clone, PartialEq)]
pub enum ReplayEvent {
    /// The bidder bought `count` instances of `pool`.
    Acquired {
        /// Allocation id.
        allocation: u64,
        /// Pool index in the grid.
        pool: usize,
        /// Instances.
        count: u32,
    },
    /// The bidder released an allocation (before a billing boundary, or to lower cost per work).
    Released {
        /// Allocation id.
        allocation: u64,
    },
    /// The bidder released `count` of the allocation's instances; the rest stay held.
    Shrunk {
        /// Allocation id.
        allocation: u64,
        /// Instances released.
        count: u32,
    },
    /// The provider announced it takes the allocation back at `leaves_at`.
    Notice {
        /// Allocation id.
        allocation: u64,
        /// Seconds of trace time until it leaves.
        lead_seconds: f64,
    },
    /// The allocation was taken back.
    Evicted {
        /// Allocation id.
        allocation: u64,
    },
}

#[derive(Clone)]
struct Live {
    allocation: Allocation,
    meter: Meter,
    noticed: bool,
}

/// Money so far, in dollars.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Bill {
    /// Spent under the billing model (reliable tier included).
    pub spent_usd: f64,
    /// The same instance-time at on-demand prices.
    pub on_demand_equivalent_usd: f64,
    /// Spot instance-hours that were free (refunded or evicted in the first hour).
    pub free_hours: f64,
    /// What those free hours would have cost at the spot price when they ended.
    pub free_usd: f64,
}

/// The replay of one job (see the module docs).
pub struct MarketReplay<'a> {
    grid: &'a MarketGrid,
    bidder: Bidder<'a>,
    app: AppModel,
    reliable: ReliableTier,
    billing: BillingModel,
    live: Vec<Live>,
    reliable_meter: Meter,
    closed_usd: f64,
    free_hours: f64,
    free_usd: f64,
    on_demand_equivalent_usd: f64,
    next_decision: Timestamp,
    next_id: u64,
    /// Time up to which meters and the on-demand equivalent are accrued.
    accrued_to: Timestamp,
    /// Slot whose prices apply from `accrued_to` on.
    price_slot: usize,
}

impl<'a> MarketReplay<'a> {
    /// A replay starting at `start_slot` with no transient allocation.
    pub fn new(
        grid: &'a MarketGrid,
        model: &'a EvictionModel,
        bidder: BidderConfig,
        billing: BillingModel,
        app: AppModel,
        reliable: ReliableTier,
        start_slot: usize,
    ) -> Self {
        let start = grid.time(start_slot);
        Self {
            grid,
            bidder: Bidder {
                config: bidder,
                billing,
                eviction: model,
            },
            app,
            reliable,
            billing,
            live: Vec::new(),
            reliable_meter: Meter::new(billing, start),
            closed_usd: 0.0,
            free_hours: 0.0,
            free_usd: 0.0,
            on_demand_equivalent_usd: 0.0,
            next_decision: start,
            next_id: 0,
            accrued_to: start,
            price_slot: start_slot,
        }
    }

    fn spot_price(&self, pool: usize, slot: usize) -> Option<f64> {
        self.grid.price(pool, slot)
    }

    fn keeps(&self, allocation: &Allocation, slot: usize) -> bool {
        match allocation.capacity {
            CapacityType::OnDemand => true,
            CapacityType::Spot => self
                .spot_price(allocation.pool, slot)
                .is_some_and(|p| p <= allocation.max_price.unwrap_or(f64::INFINITY)),
        }
    }

    /// Accrues every meter and the on-demand equivalent up to `to` at `price_slot`'s prices.
    fn accrue(&mut self, to: Timestamp) {
        if to <= self.accrued_to {
            return;
        }
        let hours = (to - self.accrued_to) as f64 / 3600.0;
        let slot = self.price_slot;
        for index in 0..self.live.len() {
            let allocation = &self.live[index].allocation;
            let on_demand = self.grid.pools[allocation.pool]
                .on_demand_usd_hr
                .unwrap_or(0.0);
            let price = match allocation.capacity {
                CapacityType::Spot => self.spot_price(allocation.pool, slot).unwrap_or(0.0),
                CapacityType::OnDemand => on_demand,
            };
            self.on_demand_equivalent_usd += f64::from(allocation.count) * on_demand * hours;
            self.live[index].meter.advance(to, price);
        }
        self.reliable_meter.advance(to, self.reliable.usd_hr);
        self.on_demand_equivalent_usd +=
            f64::from(self.reliable.count) * self.reliable.usd_hr * hours;
        self.accrued_to = to;
    }

    fn close(&mut self, index: usize, reason: EndReason) -> Live {
        let live = self.live.swap_remove(index);
        let charge = live.meter.clone().finish(reason);
        self.closed_usd += f64::from(live.allocation.count) * charge.usd;
        let free_hours = f64::from(live.allocation.count) * charge.free_seconds / 3600.0;
        let price = self
            .spot_price(live.allocation.pool, self.price_slot)
            .or(self.grid.pools[live.allocation.pool].on_demand_usd_hr)
            .unwrap_or(0.0);
        self.free_hours += free_hours;
        self.free_usd += free_hours * price;
        live
    }

    /// Advances to `slot`: evictions due now, notices of evictions within the billing model's
    /// notice window, then the bidder's decision if one is due.
    pub fn step(&mut self, slot: usize, job: &JobState) -> Vec<ReplayEvent> {
        let t = self.grid.time(slot);
        self.accrue(t);
        self.price_slot = slot;
        let mut events = Vec::new();
        let mut evicted = false;
        let mut index = 0;
        while index < self.live.len() {
            if self.keeps(&self.live[index].allocation, slot) {
                index += 1;
            } else {
                let live = self.close(index, EndReason::Evicted);
                events.push(ReplayEvent::Evicted {
                    allocation: live.allocation.id,
                });
                evicted = true;
            }
        }
        // Notices: the first slot within the window where the allocation cannot be kept.
        let window = self.billing.notice_seconds();
        let ahead = (window / self.grid.step as f64).ceil() as usize;
        for index in 0..self.live.len() {
            if self.live[index].noticed {
                continue;
            }
            let leaves = (slot + 1..=slot + ahead)
                .take_while(|&s| s < self.grid.slots)
                .find(|&s| !self.keeps(&self.live[index].allocation, s));
            if let Some(leaves) = leaves {
                self.live[index].noticed = true;
                events.push(ReplayEvent::Notice {
                    allocation: self.live[index].allocation.id,
                    lead_seconds: (self.grid.time(leaves) - t) as f64,
                });
            }
        }
        if evicted || t >= self.next_decision {
            let view = self.grid.view(slot);
            let allocations: Vec<Allocation> =
                self.live.iter().map(|l| l.allocation.clone()).collect();
            let decision = self.bidder.decide(&BidderInput {
                now: t,
                pools: &self.grid.pools,
                market: &view,
                allocations: &allocations,
                reliable: &self.reliable,
                app: &self.app,
                job,
            });
            for id in &decision.release {
                if let Some(i) = self.live.iter().position(|l| l.allocation.id == *id) {
                    self.close(i, EndReason::Released);
                    events.push(ReplayEvent::Released { allocation: *id });
                }
            }
            for cut in &decision.shrink {
                if let Some(index) = self.live.iter().position(|l| l.allocation.id == cut.id) {
                    let count = cut.count.min(self.live[index].allocation.count);
                    // the released part is charged as a live allocation of its own, closed now
                    let mut part = self.live[index].clone();
                    part.allocation.count = count;
                    self.live[index].allocation.count -= count;
                    self.live.push(part);
                    let last = self.live.len() - 1;
                    self.close(last, EndReason::Released);
                    events.push(ReplayEvent::Shrunk {
                        allocation: cut.id,
                        count,
                    });
                }
            }
            for request in decision.acquire {
                let allocation = Allocation {
                    id: self.next_id + 1,
                    pool: request.pool,
                    capacity: request.capacity,
                    count: request.count,
                    max_price: request.max_price,
                    launched_at: t,
                };
                if request.count == 0 || !self.keeps(&allocation, slot) {
                    continue;
                }
                self.next_id += 1;
                events.push(ReplayEvent::Acquired {
                    allocation: allocation.id,
                    pool: allocation.pool,
                    count: allocation.count,
                });
                self.live.push(Live {
                    allocation,
                    meter: Meter::new(self.billing, t),
                    noticed: false,
                });
            }
            self.next_decision = decision.next_decision_at.max(t + 1);
        }
        events
    }

    /// The bill up to trace time `at` (accrues to it).
    pub fn bill(&mut self, at: Timestamp) -> Bill {
        self.accrue(at);
        let live_usd: f64 = self
            .live
            .iter()
            .map(|l| f64::from(l.allocation.count) * l.meter.accrued_usd())
            .sum();
        Bill {
            spent_usd: self.closed_usd
                + live_usd
                + f64::from(self.reliable.count) * self.reliable_meter.accrued_usd(),
            on_demand_equivalent_usd: self.on_demand_equivalent_usd,
            free_hours: self.free_hours,
            free_usd: self.free_usd,
        }
    }

    /// Ends the job at `at`: every allocation is released and charged; returns the final bill.
    pub fn finish(mut self, at: Timestamp) -> Bill {
        self.accrue(at);
        while !self.live.is_empty() {
            self.close(0, EndReason::JobFinished);
        }
        let reliable = self.reliable_meter.clone().finish(EndReason::JobFinished);
        Bill {
            spent_usd: self.closed_usd + f64::from(self.reliable.count) * reliable.usd,
            on_demand_equivalent_usd: self.on_demand_equivalent_usd,
            free_hours: self.free_hours,
            free_usd: self.free_usd,
        }
    }

    /// The application model the bidder decides with.
    pub fn app(&self) -> &AppModel {
        &self.app
    }

    /// Decide with `app` from the next decision on (a model re-estimated from the run).
    pub fn set_app(&mut self, app: AppModel) {
        self.app = app;
    }

    /// The live allocations, each with whether the market gave notice on it.
    pub fn allocations(&self) -> impl Iterator<Item = (&Allocation, bool)> {
        self.live.iter().map(|l| (&l.allocation, l.noticed))
    }

    /// Instances held now, per pool index.
    pub fn held(&self) -> Vec<(usize, u32)> {
        self.live
            .iter()
            .map(|l| (l.allocation.pool, l.allocation.count))
            .collect()
    }
}
