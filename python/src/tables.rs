//! What Python code sees of the parameters: [`Tables`] during a clock (the worker's cached rows,
//! SSP-fresh plus its own writes) and [`Reader`] during an evaluation (every row of the job).
//!
//! Two ways to touch rows during a clock:
//! - by key: `get` copies rows out as a float32 array and `inc` adds deltas into the cache,
//!   duplicate keys accumulating (`numpy.add.at` semantics); each call looks its keys up.
//! - by slot: `rows(table)` is a writable float32 array of every cached row of the table, and
//!   `slots(table, keys)` gives the row index of each key (stable for the worker's life: look
//!   them up once, in the optional `bind(tables)` hook). The array is a copy of the cache made at
//!   the first `rows` call of the clock and copied back when `clock` returns, one memcpy each way:
//!   a view into the cache itself could outlive the clock in Python's hands, and the runtime needs
//!   the cache back. After `rows(t)`, `get`/`inc` on `t` refuse (one source of truth per table).
//!
//! BENCHMARKS.md ("Python SDK") gives both ways' measured cost.

use std::collections::BTreeMap;

use ebbflow_runtime::app::{RowCache, TableId, TableReader, TableSpec};
use numpy::ndarray::Array2;
use numpy::{
    IntoPyArray, PyArray2, PyArrayMethods, PyReadonlyArray2, PyUntypedArray, PyUntypedArrayMethods,
};
use pyo3::exceptions::{PyKeyError, PyRuntimeError, PyValueError};
use pyo3::prelude::*;

use crate::app::keys_from;

/// A worker's rows for one clock (passed to `Worker.clock`).
#[pyclass(module = "ebbflow._core")]
pub struct Tables {
    /// The runtime's cache, lent for the call; `None` once given back.
    cache: Option<RowCache>,
    /// Table names by id, for messages.
    names: BTreeMap<TableId, String>,
    /// Arrays handed out by `rows`, copied back into the cache by `take_back`.
    views: BTreeMap<TableId, Py<PyArray2<f32>>>,
}

impl Tables {
    /// Lends `cache` to Python for one call.
    pub(crate) fn lend(cache: RowCache, specs: &[TableSpec]) -> Self {
        Self {
            cache: Some(cache),
            names: specs.iter().map(|s| (s.id, s.name.clone())).collect(),
            views: BTreeMap::new(),
        }
    }

    /// Takes the cache back, with what Python wrote into `rows` arrays (the object then refuses
    /// every call). An array whose shape or dtype Python changed is an error.
    pub(crate) fn take_back(&mut self, py: Python<'_>) -> (RowCache, Result<(), String>) {
        let mut cache = self.cache.take().unwrap_or_else(RowCache::empty);
        let mut result = Ok(());
        for (table, view) in std::mem::take(&mut self.views) {
            let (data, _) = cache.table_mut(table);
            let copied = view
                .bind(py)
                .try_readonly()
                .map_err(|e| e.to_string())
                .and_then(|array| {
                    let array = array.as_array();
                    if array.len() != data.len() {
                        return Err(format!(
                            "rows({table}) changed shape to {:?}",
                            array.shape()
                        ));
                    }
                    for (value, new) in data.iter_mut().zip(array.iter()) {
                        *value = *new;
                    }
                    Ok(())
                });
            if let Err(reason) = copied {
                result = Err(reason);
            }
        }
        (cache, result)
    }

    /// Refuses key access to a table whose rows Python holds as an array.
    fn by_key(&self, table: TableId) -> PyResult<()> {
        if self.views.contains_key(&table) {
            return Err(PyRuntimeError::new_err(format!(
                "table {table}: rows({table}) was taken this clock; read and write that array                  (with slots()) instead of get/inc"
            )));
        }
        Ok(())
    }

    fn cache(&mut self) -> PyResult<&mut RowCache> {
        self.cache.as_mut().ok_or_else(|| {
            PyRuntimeError::new_err(
                "these tables belong to a clock that has ended: use the tables passed to the \
                 current clock() call",
            )
        })
    }

    fn width(&mut self, table: TableId) -> PyResult<usize> {
        let known = self.names.keys().copied().collect::<Vec<_>>();
        self.cache()?.width(table).ok_or_else(|| {
            PyKeyError::new_err(format!(
                "table {table} is not declared (the app's tables are {known:?})"
            ))
        })
    }

    /// The key in each slot of `table`, in slot order.
    fn slot_keys(&mut self, table: TableId) -> PyResult<Vec<u64>> {
        self.width(table)?;
        let cache = self.cache()?;
        Ok((0..cache.len(table) as u32)
            .map(|slot| cache.key(table, slot))
            .collect())
    }

    /// Slots of `keys` in `table`, or an error naming the first key outside the working set.
    fn find_slots(&mut self, table: TableId, keys: &[u64]) -> PyResult<Vec<u32>> {
        let name = self.names.get(&table).cloned().unwrap_or_default();
        let cache = self.cache()?;
        keys.iter()
            .map(|&key| {
                cache.slot(table, key).ok_or_else(|| {
                    PyKeyError::new_err(format!(
                        "key {key} of table {table} ({name}) is not in this worker's \
                         working_set()"
                    ))
                })
            })
            .collect()
    }
}

#[pymethods]
impl Tables {
    /// Rows `keys` of `table` as a new float32 array of shape (len(keys), width).
    fn get<'py>(
        &mut self,
        py: Python<'py>,
        table: TableId,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let width = self.width(table)?;
        self.by_key(table)?;
        let keys = keys_from(keys).map_err(PyValueError::new_err)?;
        let slots = self.find_slots(table, &keys)?;
        let cache = self.cache()?;
        let mut out = Vec::with_capacity(slots.len() * width);
        for slot in slots {
            out.extend_from_slice(cache.row(table, slot));
        }
        let array = Array2::from_shape_vec((keys.len(), width), out)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(array.into_pyarray(py))
    }

    /// Adds `deltas[i]` to row `keys[i]` of `table` (float32, shape (len(keys), width)); rows
    /// named twice get both deltas. Non-finite deltas are refused and nothing is added.
    fn inc(
        &mut self,
        table: TableId,
        keys: &Bound<'_, PyAny>,
        deltas: &Bound<'_, PyAny>,
    ) -> PyResult<()> {
        let width = self.width(table)?;
        self.by_key(table)?;
        let keys = keys_from(keys).map_err(PyValueError::new_err)?;
        let deltas: PyReadonlyArray2<'_, f32> = deltas.extract().map_err(|_| {
            let found = deltas
                .cast::<PyUntypedArray>()
                .map(|a| format!("a {}-D {} array", a.ndim(), a.dtype()))
                .unwrap_or_else(|_| {
                    deltas
                        .get_type()
                        .name()
                        .map_or_else(|_| "?".into(), |n| n.to_string())
                });
            PyValueError::new_err(format!(
                "inc(table {table}): deltas must be a 2-D float32 array of shape ({}, {width}), \
                 got {found}",
                keys.len()
            ))
        })?;
        let view = deltas.as_array();
        if view.shape() != [keys.len(), width] {
            return Err(PyValueError::new_err(format!(
                "inc(table {table}): deltas must have shape ({}, {width}), got {:?}",
                keys.len(),
                view.shape()
            )));
        }
        if let Some(((row, column), value)) = view.indexed_iter().find(|(_, v)| !v.is_finite()) {
            return Err(PyValueError::new_err(format!(
                "inc(table {table}): delta for key {} column {column} is {value} (not finite)",
                keys[row]
            )));
        }
        let slots = self.find_slots(table, &keys)?;
        let cache = self.cache()?;
        let (data, _) = cache.table_mut(table);
        for (slot, delta) in slots.iter().zip(view.rows()) {
            let start = *slot as usize * width;
            for (value, d) in data[start..start + width].iter_mut().zip(delta) {
                *value += d;
            }
        }
        Ok(())
    }

    /// Every cached row of `table` as a writable float32 array (slots x width), copied back into
    /// the cache when `clock` returns; row `i` holds key `keys_by_slot(table)[i]`.
    fn rows<'py>(
        &mut self,
        py: Python<'py>,
        table: TableId,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let width = self.width(table)?;
        if let Some(view) = self.views.get(&table) {
            return Ok(view.bind(py).clone());
        }
        let cache = self.cache()?;
        let rows = cache.len(table);
        let (data, _) = cache.table_mut(table);
        let array = Array2::from_shape_vec((rows, width), data.to_vec())
            .map_err(|e| PyValueError::new_err(e.to_string()))?
            .into_pyarray(py);
        self.views.insert(table, array.clone().unbind());
        Ok(array)
    }

    /// Row index in `rows(table)` of each of `keys` (int64); a key outside the working set is an
    /// error.
    fn slots<'py>(
        &mut self,
        py: Python<'py>,
        table: TableId,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyAny>> {
        self.width(table)?;
        let keys = keys_from(keys).map_err(PyValueError::new_err)?;
        let slots: Vec<i64> = self
            .find_slots(table, &keys)?
            .into_iter()
            .map(i64::from)
            .collect();
        Ok(slots.into_pyarray(py).into_any())
    }

    /// Keys of `rows(table)`'s rows, in slot order.
    fn keys_by_slot<'py>(
        &mut self,
        py: Python<'py>,
        table: TableId,
    ) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.slot_keys(table)?.into_pyarray(py).into_any())
    }

    /// Keys of `table` in this worker's working set, sorted.
    fn keys<'py>(&mut self, py: Python<'py>, table: TableId) -> PyResult<Bound<'py, PyAny>> {
        let mut keys = self.slot_keys(table)?;
        keys.sort_unstable();
        Ok(keys.into_pyarray(py).into_any())
    }
}

/// One table of a [`Reader`]: the rows servers hold.
struct ReaderTable {
    spec: TableSpec,
    /// Materialised keys, sorted.
    keys: Vec<u64>,
    /// Their rows, `keys.len() * width`.
    data: Vec<f32>,
}

/// Every row of the job, for `App.evaluate(reader)`: a copy taken before the call, so the
/// evaluation runs with the runtime's tables free.
#[pyclass(module = "ebbflow._core")]
pub struct Reader {
    tables: BTreeMap<TableId, ReaderTable>,
}

impl Reader {
    /// Copies every materialised row of `specs`' tables out of `tables`.
    pub(crate) fn snapshot(specs: &[TableSpec], tables: &dyn TableReader) -> Self {
        let tables = specs
            .iter()
            .map(|spec| {
                let keys = tables.keys(spec.id);
                let mut data = vec![0.0; keys.len() * spec.width];
                for (row, &key) in data.chunks_exact_mut(spec.width).zip(&keys) {
                    if !tables.read_row(spec.id, key, row) {
                        spec.init.fill(spec.id, key, row);
                    }
                }
                let table = ReaderTable {
                    spec: spec.clone(),
                    keys,
                    data,
                };
                (spec.id, table)
            })
            .collect();
        Self { tables }
    }

    fn table(&self, table: TableId) -> PyResult<&ReaderTable> {
        self.tables.get(&table).ok_or_else(|| {
            PyKeyError::new_err(format!(
                "table {table} is not declared (the app's tables are {:?})",
                self.tables.keys().collect::<Vec<_>>()
            ))
        })
    }
}

#[pymethods]
impl Reader {
    /// Rows `keys` of `table` (float32, shape (len(keys), width)); a row no worker touched holds
    /// its initial value.
    fn get<'py>(
        &self,
        py: Python<'py>,
        table: TableId,
        keys: &Bound<'py, PyAny>,
    ) -> PyResult<Bound<'py, PyArray2<f32>>> {
        let t = self.table(table)?;
        let width = t.spec.width;
        let keys = keys_from(keys).map_err(PyValueError::new_err)?;
        let mut out = vec![0.0; keys.len() * width];
        for (row, &key) in out.chunks_exact_mut(width).zip(&keys) {
            match t.keys.binary_search(&key) {
                Ok(index) => row.copy_from_slice(&t.data[index * width..(index + 1) * width]),
                Err(_) => t.spec.init.fill(table, key, row),
            }
        }
        let array = Array2::from_shape_vec((keys.len(), width), out)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        Ok(array.into_pyarray(py))
    }

    /// Keys of `table` some worker touched, sorted.
    fn keys<'py>(&self, py: Python<'py>, table: TableId) -> PyResult<Bound<'py, PyAny>> {
        Ok(self.table(table)?.keys.clone().into_pyarray(py).into_any())
    }

    /// Width of `table`'s rows.
    fn width(&self, table: TableId) -> PyResult<usize> {
        Ok(self.table(table)?.spec.width)
    }
}
