//! AgileML: the ebbflow parameter-server runtime.

pub mod apps;
pub mod data;
