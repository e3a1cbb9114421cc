//! AgileML: the ebbflow parameter-server runtime.

pub mod app;
pub mod apps;
pub mod data;
pub mod exact;
