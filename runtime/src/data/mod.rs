//! Dataset loaders (MovieLens, digits, LDA-C, libsvm/CSV) and seeded synthetic generators.
//!
//! Every loader reports malformed input as a [`DataError`] naming the file, the 1-based line and
//! what was expected there; none of them panics on bad input. Real data sets are fetched by
//! `scripts/fetch-data.sh` (never committed); [`data_dir`] finds them through `EBBFLOW_DATA_DIR`.

mod classification;
mod corpus;
mod planted;
mod planted_corpus;
mod planted_examples;
mod ratings;
mod rng;
mod synthetic;

use std::io::BufRead;
use std::path::{Path, PathBuf};

use thiserror::Error;

pub use classification::{Examples, LabelColumn, load_csv, load_digits, load_libsvm};
pub use corpus::{Corpus, load_ldac, load_vocab};
pub use planted::{NETFLIX, PlantedRatings, PlantedSplit, available_memory};
pub use planted_corpus::{PlantedCorpus, PlantedDocs};
pub use planted_examples::{MAX_TEST_EXAMPLES, PlantedExampleSplit, PlantedExamples};
pub use ratings::{Rating, Ratings, load_movielens_inter, load_ratings_csv};
pub use rng::Rng;
pub use synthetic::{
    SyntheticCorpus, SyntheticExamples, SyntheticRatings, synthetic_classification,
    synthetic_corpus, synthetic_ratings,
};

/// Items of `shard` of `shards` when item `g` of `total` belongs to shard `g mod shards` (the
/// planted generators' rule).
pub(crate) fn shard_size(total: u64, shard: usize, shards: usize) -> u64 {
    let (shards, shard) = (shards.max(1) as u64, shard as u64);
    total / shards + u64::from(shard < total % shards)
}

/// A planted generator (ratings, a corpus, examples): what it needs in memory, and the check
/// every one makes before it allocates.
pub trait Planted {
    /// Bytes a generation of `shard` of `shards` (everything for `None`) allocates.
    fn bytes_needed(&self, shard: Option<(usize, usize)>) -> u64;

    /// What it generates, for messages: `25000000 planted ratings (…)`.
    fn describe(&self) -> String;

    /// Refuses sizes no generation can use, naming them.
    fn check(&self) -> Result<(), DataError>;

    /// What a generation of `shard` of `shards` (all for `None`) refuses: bad sizes
    /// ([`Planted::check`]), a shard that does not exist, a size over `memory_limit`
    /// ([`Planted::fits`]).
    fn check_request(
        &self,
        shard: Option<(usize, usize)>,
        memory_limit: Option<u64>,
    ) -> Result<(), DataError> {
        self.check()?;
        if let Some((shard, shards)) = shard
            && (shards == 0 || shard >= shards)
        {
            return Err(DataError::Parameters {
                what: format!("shard {shard} of {shards} does not exist"),
            });
        }
        self.fits(shard, memory_limit)
    }

    /// Whether a generation of `shard` (all for `None`) fits in `memory_limit` bytes:
    /// [`DataError::TooLarge`] with the size it needs where not.
    fn fits(
        &self,
        shard: Option<(usize, usize)>,
        memory_limit: Option<u64>,
    ) -> Result<(), DataError> {
        let needed = self.bytes_needed(shard);
        match memory_limit {
            Some(limit) if needed > limit => Err(DataError::TooLarge {
                what: match shard {
                    Some((s, n)) => format!("{}, shard {s} of {n}", self.describe()),
                    None => self.describe(),
                },
                needed,
                available: limit,
            }),
            _ => Ok(()),
        }
    }
}

/// Runs `work(index, task, scratch)` once for every task, in parallel on up to `threads` scoped
/// threads (at least one): each thread takes the next task by index and keeps one `scratch()` of
/// its own. The generators hand out disjoint slices of their outputs as tasks, so every value is
/// written in place, by one thread, and the result does not depend on the thread count.
pub(crate) fn parallel_tasks<T: Send, S>(
    tasks: Vec<T>,
    threads: usize,
    scratch: impl Fn() -> S + Sync,
    work: impl Fn(usize, T, &mut S) + Sync,
) {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let tasks: Vec<std::sync::Mutex<Option<T>>> = tasks
        .into_iter()
        .map(|t| std::sync::Mutex::new(Some(t)))
        .collect();
    let next = AtomicUsize::new(0);
    std::thread::scope(|scope| {
        for _ in 0..threads.clamp(1, tasks.len().max(1)) {
            scope.spawn(|| {
                let mut scratch = scratch();
                loop {
                    let index = next.fetch_add(1, Ordering::Relaxed);
                    let Some(task) = tasks.get(index) else { break };
                    let task = task
                        .lock()
                        .expect("a task's lock is never held across a panic")
                        .take()
                        .expect("each task is taken once");
                    work(index, task, &mut scratch);
                }
            });
        }
    });
}

/// Name of the environment variable that points at the fetched real data sets.
pub const DATA_DIR_ENV: &str = "EBBFLOW_DATA_DIR";

/// Errors loading or generating data.
#[derive(Debug, Error)]
pub enum DataError {
    /// The file could not be opened.
    #[error("cannot open {path}: {source}")]
    Open {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// Reading failed part-way (I/O error, bad gzip stream, invalid UTF-8).
    #[error("{path}:{line}: cannot read: {source}")]
    Read {
        /// The file.
        path: PathBuf,
        /// 1-based line being read.
        line: usize,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A line does not have the expected form.
    #[error("{path}:{line}: expected {expected}, found {found:?}")]
    Parse {
        /// The file.
        path: PathBuf,
        /// 1-based line number.
        line: usize,
        /// What the line should have held.
        expected: String,
        /// The offending text (truncated to 80 characters).
        found: String,
    },
    /// The file holds no records.
    #[error("{path}: expected {expected}, found no records")]
    Empty {
        /// The file.
        path: PathBuf,
        /// What kind of records were expected.
        expected: String,
    },
    /// Generator or split parameters out of range.
    #[error("invalid data parameters: {what}")]
    Parameters {
        /// What is wrong.
        what: String,
    },
    /// Generated data that would not fit in memory, refused before allocating it.
    #[error(
        "{what} need {:.2} GiB, but only {:.2} GiB of memory is available: generate fewer, or \
         shard them over more nodes",
        *.needed as f64 / GIB, *.available as f64 / GIB
    )]
    TooLarge {
        /// The data asked for.
        what: String,
        /// Bytes it needs.
        needed: u64,
        /// Bytes available.
        available: u64,
    },
}

const GIB: f64 = (1u64 << 30) as f64;

impl DataError {
    /// Static label for metrics and logs.
    pub fn category(&self) -> &'static str {
        match self {
            DataError::Open { .. } => "open",
            DataError::Read { .. } => "read",
            DataError::Parse { .. } => "parse",
            DataError::Empty { .. } => "empty",
            DataError::Parameters { .. } => "parameters",
            DataError::TooLarge { .. } => "too_large",
        }
    }

    pub(crate) fn parse(
        path: &Path,
        line: usize,
        expected: impl Into<String>,
        found: &str,
    ) -> Self {
        let found: String = found.chars().take(80).collect();
        DataError::Parse {
            path: path.to_path_buf(),
            line,
            expected: expected.into(),
            found,
        }
    }
}

/// The directory holding the fetched real data sets (`EBBFLOW_DATA_DIR`), if set.
pub fn data_dir() -> Option<PathBuf> {
    std::env::var_os(DATA_DIR_ENV)
        .filter(|value| !value.is_empty())
        .map(PathBuf::from)
}

/// Calls `each(line_number, line)` for every line of `path`, transparently gunzipping `*.gz`.
pub(crate) fn for_each_line(
    path: &Path,
    mut each: impl FnMut(usize, &str) -> Result<(), DataError>,
) -> Result<(), DataError> {
    let file = std::fs::File::open(path).map_err(|source| DataError::Open {
        path: path.to_path_buf(),
        source,
    })?;
    let reader: Box<dyn BufRead> = if path.extension().is_some_and(|ext| ext == "gz") {
        Box::new(std::io::BufReader::new(flate2::read::GzDecoder::new(
            std::io::BufReader::new(file),
        )))
    } else {
        Box::new(std::io::BufReader::new(file))
    };
    let mut buffer = String::new();
    let mut reader = reader;
    let mut line_number = 0;
    loop {
        buffer.clear();
        line_number += 1;
        let read = reader
            .read_line(&mut buffer)
            .map_err(|source| DataError::Read {
                path: path.to_path_buf(),
                line: line_number,
                source,
            })?;
        if read == 0 {
            return Ok(());
        }
        each(line_number, buffer.trim_end_matches(['\n', '\r']))?;
    }
}

/// Splits `0..len` into (train, test) index lists: a seeded shuffle, the last
/// `round(len * test_fraction)` indices are the test set.
pub fn split_indices(
    len: usize,
    test_fraction: f64,
    seed: u64,
) -> Result<(Vec<usize>, Vec<usize>), DataError> {
    if !(0.0..1.0).contains(&test_fraction) {
        return Err(DataError::Parameters {
            what: format!("test fraction must be in [0, 1), got {test_fraction}"),
        });
    }
    let mut order: Vec<usize> = (0..len).collect();
    Rng::new(seed).shuffle(&mut order);
    let test_len = (len as f64 * test_fraction).round() as usize;
    let test = order.split_off(len - test_len);
    Ok((order, test))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_is_seeded_disjoint_and_complete() {
        let (train, test) = split_indices(100, 0.2, 7).unwrap();
        assert_eq!((train.len(), test.len()), (80, 20));
        let mut all: Vec<usize> = train.iter().chain(&test).copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..100).collect::<Vec<_>>());
        assert_eq!(split_indices(100, 0.2, 7).unwrap().1, test);
        assert_ne!(split_indices(100, 0.2, 8).unwrap().1, test);
        assert!(split_indices(10, 1.5, 1).is_err());
    }

    #[test]
    fn lines_of_a_gzip_file_are_read_and_a_corrupt_one_is_an_error() {
        use std::io::Write;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("a.txt.gz");
        let mut encoder = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        encoder.write_all(b"one\ntwo\r\n").unwrap();
        std::fs::write(&path, encoder.finish().unwrap()).unwrap();
        let mut seen = Vec::new();
        for_each_line(&path, |n, line| {
            seen.push((n, line.to_string()));
            Ok(())
        })
        .unwrap();
        assert_eq!(seen, vec![(1, "one".into()), (2, "two".into())]);

        let bad = dir.path().join("b.gz");
        std::fs::write(&bad, b"not gzip at all").unwrap();
        let error = for_each_line(&bad, |_, _| Ok(())).unwrap_err();
        assert_eq!(error.category(), "read");
        assert!(error.to_string().contains("b.gz:1"), "{error}");
        let missing = for_each_line(&dir.path().join("none"), |_, _| Ok(())).unwrap_err();
        assert_eq!(missing.category(), "open");
    }
}
