//! A full copy of a job's parameters, gathered from every server for evaluation and tests.

use std::collections::BTreeMap;

use crate::app::{TableId, TableReader, TableSpec};

/// One table's materialised rows, sorted by key.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SnapshotTable {
    /// Sorted keys.
    pub keys: Vec<u64>,
    /// `keys.len() * width` values.
    pub data: Vec<f32>,
}

/// All tables of a job (rows never written are served from the table's initialiser).
#[derive(Debug, Clone, PartialEq)]
pub struct ParamSnapshot {
    specs: Vec<TableSpec>,
    tables: BTreeMap<TableId, SnapshotTable>,
}

impl ParamSnapshot {
    /// An empty snapshot of the given tables.
    pub fn new(specs: Vec<TableSpec>) -> Self {
        Self {
            specs,
            tables: BTreeMap::new(),
        }
    }

    /// Adds rows of `table` (from one partition); unknown tables and ragged data are ignored.
    pub fn add_rows(&mut self, table: TableId, keys: &[u64], data: &[f32]) {
        let Some(spec) = self.specs.iter().find(|s| s.id == table) else {
            return;
        };
        if data.len() != keys.len() * spec.width {
            return;
        }
        let entry = self.tables.entry(table).or_default();
        entry.keys.extend_from_slice(keys);
        entry.data.extend_from_slice(data);
    }

    /// Sorts every table by key (call once after the last `add_rows`).
    pub fn finish(&mut self) {
        for (table, rows) in &mut self.tables {
            let width = self
                .specs
                .iter()
                .find(|s| s.id == *table)
                .map_or(1, |s| s.width);
            let mut order: Vec<usize> = (0..rows.keys.len()).collect();
            order.sort_unstable_by_key(|&i| rows.keys[i]);
            let keys = order.iter().map(|&i| rows.keys[i]).collect();
            let mut data = Vec::with_capacity(rows.data.len());
            for &i in &order {
                data.extend_from_slice(&rows.data[i * width..(i + 1) * width]);
            }
            *rows = SnapshotTable { keys, data };
        }
    }

    /// Sum and sum of absolute values of every materialised value, in key order (deterministic).
    pub fn sums(&self) -> (f64, f64) {
        self.tables
            .values()
            .flat_map(|t| t.data.iter())
            .fold((0.0, 0.0), |(sum, abs), v| {
                (sum + f64::from(*v), abs + f64::from(v.abs()))
            })
    }

    /// Bytes of all materialised values (what the servers hold, without optimizer state).
    pub fn parameter_bytes(&self) -> u64 {
        self.tables.values().map(|t| t.data.len() as u64 * 4).sum()
    }

    /// Rows of `table`, if any were materialised.
    pub fn table(&self, table: TableId) -> Option<&SnapshotTable> {
        self.tables.get(&table)
    }
}

impl TableReader for ParamSnapshot {
    fn width(&self, table: TableId) -> Option<usize> {
        self.specs.iter().find(|s| s.id == table).map(|s| s.width)
    }

    fn read_row(&self, table: TableId, key: u64, out: &mut [f32]) -> bool {
        let Some(spec) = self.specs.iter().find(|s| s.id == table) else {
            return false;
        };
        if out.len() != spec.width {
            return false;
        }
        match self
            .tables
            .get(&table)
            .and_then(|t| t.keys.binary_search(&key).ok().map(|i| (t, i)))
        {
            Some((rows, i)) => {
                out.copy_from_slice(&rows.data[i * spec.width..(i + 1) * spec.width])
            }
            None => spec.init.fill(table, key, out),
        }
        true
    }

    fn keys(&self, table: TableId) -> Vec<u64> {
        self.tables
            .get(&table)
            .map(|t| t.keys.clone())
            .unwrap_or_default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::app::RowInit;

    #[test]
    fn rows_are_found_sorted_or_initialised() {
        let init = RowInit::Uniform {
            low: 0.0,
            high: 1.0,
            seed: 3,
        };
        let mut snapshot = ParamSnapshot::new(vec![TableSpec {
            id: 1,
            name: "t".into(),
            width: 2,
            init,
        }]);
        snapshot.add_rows(1, &[9, 2], &[9.0, 9.5, 2.0, 2.5]);
        snapshot.add_rows(1, &[5], &[5.0]);
        snapshot.finish();
        assert_eq!(snapshot.keys(1), vec![2, 9]);
        let mut row = [0.0; 2];
        assert!(snapshot.read_row(1, 9, &mut row));
        assert_eq!(row, [9.0, 9.5]);
        assert!(snapshot.read_row(1, 4, &mut row));
        let mut expected = [0.0; 2];
        init.fill(1, 4, &mut expected);
        assert_eq!(row, expected);
        assert!(!snapshot.read_row(2, 4, &mut row));
        assert!(!snapshot.read_row(1, 4, &mut [0.0; 3]));
    }
}
