//! Helpers for the integration and end-to-end suites (real components only).

pub mod cluster;
pub mod operator;
pub mod prometheus;
