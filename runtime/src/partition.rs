//! Partitions of the key space and the map of which server holds each.
//!
//! The key space of every table is split into `P` partitions fixed at job start by a hash of the
//! key; keys never change partition (scaling moves whole partitions, it never re-hashes). Each
//! partition has an owner (a server node) and an epoch that increases every time the owner changes,
//! so a request carrying an old epoch can be detected and redirected (issue 4's migrations).

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::app::mix64;

/// Index of a partition, `0..P`.
pub type PartitionId = u32;

/// Identifies a node process (server and/or workers) within a job.
pub type NodeId = u32;

/// The partition holding `key` among `num_partitions` (a fixed hash; never changes in a job).
pub fn partition_of(key: u64, num_partitions: u32) -> PartitionId {
    debug_assert!(num_partitions > 0);
    // Mixed so consecutive keys (dense ids) spread evenly; multiply-shift avoids a division.
    ((u128::from(mix64(key ^ 0x5eed_0f_ebbf_1000)) * u128::from(num_partitions)) >> 64) as u32
}

/// Errors building or querying a partition map.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum PartitionError {
    /// A map needs at least one partition.
    #[error("a partition map needs at least one partition")]
    BuildEmpty,
    /// A map needs at least one server node.
    #[error("a partition map needs at least one server node")]
    BuildNoServers,
    /// The partition does not exist.
    #[error("partition {partition} out of range (job has {num_partitions})")]
    LookupPartition {
        /// The requested partition.
        partition: PartitionId,
        /// Partitions in the job.
        num_partitions: u32,
    },
}

impl PartitionError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            PartitionError::BuildEmpty => "build_empty",
            PartitionError::BuildNoServers => "build_no_servers",
            PartitionError::LookupPartition { .. } => "lookup_partition",
        }
    }
}

/// Owner and epoch of one partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionEntry {
    /// Node serving the partition.
    pub owner: NodeId,
    /// Incremented on every ownership change.
    pub epoch: u64,
}

/// Which node serves each partition, with epochs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionMap {
    entries: Vec<PartitionEntry>,
}

impl PartitionMap {
    /// Spreads `num_partitions` round-robin over `servers` (epoch 1 everywhere).
    pub fn round_robin(num_partitions: u32, servers: &[NodeId]) -> Result<Self, PartitionError> {
        if num_partitions == 0 {
            return Err(PartitionError::BuildEmpty);
        }
        if servers.is_empty() {
            return Err(PartitionError::BuildNoServers);
        }
        let entries = (0..num_partitions as usize)
            .map(|p| PartitionEntry {
                owner: servers[p % servers.len()],
                epoch: 1,
            })
            .collect();
        Ok(Self { entries })
    }

    /// Builds a map from explicit entries (e.g. received from the coordinator).
    pub fn from_entries(entries: Vec<PartitionEntry>) -> Result<Self, PartitionError> {
        if entries.is_empty() {
            return Err(PartitionError::BuildEmpty);
        }
        Ok(Self { entries })
    }

    /// Number of partitions.
    pub fn num_partitions(&self) -> u32 {
        self.entries.len() as u32
    }

    /// Owner and epoch of `partition`.
    pub fn entry(&self, partition: PartitionId) -> Result<PartitionEntry, PartitionError> {
        self.entries
            .get(partition as usize)
            .copied()
            .ok_or(PartitionError::LookupPartition {
                partition,
                num_partitions: self.num_partitions(),
            })
    }

    /// All entries, indexed by partition.
    pub fn entries(&self) -> &[PartitionEntry] {
        &self.entries
    }

    /// Partitions owned by `node`, ascending.
    pub fn owned_by(&self, node: NodeId) -> Vec<PartitionId> {
        (0..self.num_partitions())
            .filter(|&p| self.entries[p as usize].owner == node)
            .collect()
    }

    /// Distinct owners, ascending.
    pub fn owners(&self) -> Vec<NodeId> {
        let mut owners: Vec<NodeId> = self.entries.iter().map(|e| e.owner).collect();
        owners.sort_unstable();
        owners.dedup();
        owners
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_spread_evenly_and_stably() {
        let mut counts = [0u32; 8];
        for key in 0..80_000u64 {
            let p = partition_of(key, 8);
            assert_eq!(p, partition_of(key, 8));
            counts[p as usize] += 1;
        }
        assert!(
            counts.iter().all(|&c| (9_000..11_000).contains(&c)),
            "{counts:?}"
        );
    }

    #[test]
    fn round_robin_map_and_errors() {
        let map = PartitionMap::round_robin(5, &[3, 7]).unwrap();
        assert_eq!(map.owned_by(3), vec![0, 2, 4]);
        assert_eq!(map.owners(), vec![3, 7]);
        assert_eq!(map.entry(1).unwrap(), PartitionEntry { owner: 7, epoch: 1 });
        assert_eq!(map.entry(5).unwrap_err().category(), "lookup_partition");
        assert_eq!(
            PartitionMap::round_robin(0, &[1]).unwrap_err(),
            PartitionError::BuildEmpty
        );
        assert_eq!(
            PartitionMap::round_robin(2, &[]).unwrap_err(),
            PartitionError::BuildNoServers
        );
    }
}
