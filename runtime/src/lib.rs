//! AgileML: the ebbflow parameter-server runtime.
//!
//! Module map: [`app`] is the interface apps implement; [`partition`], [`store`] and
//! [`optimizer`] are the server side; [`worker`] the clock loop and [`process_cache`] the read
//! cache and write-back buffer a process's worker threads share; [`local`] single-process mode;
//! [`frame`], [`message`], [`server`] and [`client`] the TCP data plane; [`node`] (node-side
//! building blocks and the in-process loopback mode), [`coordinator`] (static membership and the
//! admin HTTP API) and [`cluster`] (launching coordinator + node processes) multi-process mode;
//! [`elastic`] elastic training (tiers, stages, migration, backups,
//! rollback) in segments; [`exact`] the integer-exact test app; [`notices`] eviction notices raised inside a node
//! (instance metadata, SIGTERM); [`metrics`] the Prometheus metrics.

pub mod admin;
pub mod app;
pub mod apps;
pub mod bandwidth;
pub mod chaos;
pub mod checkpoint;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod control;
pub mod coordinator;
pub mod data;
pub mod divergence;
pub mod elastic;
pub mod elastic_coordinator;
pub mod elastic_node;
pub mod exact;
pub mod frame;
#[doc(hidden)]
pub mod fuzzing;
pub mod handshake;
pub mod heartbeat;
pub mod local;
pub mod message;
pub mod metrics;
pub mod node;
pub mod notices;
pub mod optimizer;
pub mod partition;
pub mod process_cache;
pub mod server;
pub mod snapshot;
pub mod store;
pub mod tls;
pub mod worker;
