//! The coordinator's checkpoint: its newest consistent BackupPS copy, on disk, so that a job
//! whose coordinator is lost (its reliable pod drained, evicted for memory, its node replaced)
//! resumes from that clock instead of from the start.
//!
//! A checkpoint is the job's id, the copy's clock and every partition's image (values,
//! optimizer state, the workers' clock counts; the payload format of
//! [`crate::control::encode_images`]) behind a magic header and followed by a checksum. It is
//! written to a temporary file, synced and renamed over the old one, so a reader sees the old
//! checkpoint or the new one, never a torn one. [`CheckpointWriter`] writes on a thread of its
//! own, at most once per interval and only when the clock moved, keeping the newest offer.
//!
//! A coordinator started with a checkpoint path resumes from the checkpoint there if it is its
//! job's ([`Checkpoint::read`]); a missing file is a fresh start; another job's checkpoint, or a
//! torn or altered one, is an error that names the file, not a silent fresh start.

use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use prometheus::IntGauge;
use thiserror::Error;

use crate::control::{decode_images, encode_images};
use crate::store::PartitionImage;

const MAGIC: &[u8; 8] = b"EBBCKPT1";

/// Errors reading or writing a checkpoint; each names the file.
#[derive(Debug, Error)]
pub enum CheckpointError {
    /// The file could not be read or written.
    #[error("checkpoint {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The file is not a whole checkpoint.
    #[error("checkpoint {path} is corrupt: {reason}")]
    Corrupt {
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// The file is another job's checkpoint.
    #[error(
        "checkpoint {path} belongs to job {found:?}, not {expected:?}: the training state it holds \
         has another shape (app, dataset, consistency, worker or partition count); restore those \
         settings, or remove the file to start again from clock 0"
    )]
    OtherJob {
        /// The file.
        path: PathBuf,
        /// The job it holds.
        found: String,
        /// This job.
        expected: String,
    },
}

/// A consistent copy of a job's parameters at a clock.
#[derive(Clone, Debug, PartialEq)]
pub struct Checkpoint {
    /// The job's id (what its nodes must present).
    pub job: String,
    /// Clocks every partition holds.
    pub clock: u64,
    /// Every partition's image at `clock`.
    pub images: Vec<PartitionImage>,
}

/// FNV-1a over `bytes` (a checksum against torn or altered files, not against an adversary).
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |hash, byte| {
        (hash ^ u64::from(*byte)).wrapping_mul(0x0100_0000_01b3)
    })
}

impl Checkpoint {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(MAGIC);
        out.extend_from_slice(&(self.job.len() as u32).to_le_bytes());
        out.extend_from_slice(self.job.as_bytes());
        out.extend_from_slice(&self.clock.to_le_bytes());
        encode_images(&self.images, &mut out);
        let sum = fnv1a(&out);
        out.extend_from_slice(&sum.to_le_bytes());
        out
    }

    /// Decodes the bytes of the file at `path` (named in errors).
    pub fn decode(bytes: &[u8], path: &Path) -> Result<Self, CheckpointError> {
        let corrupt = |reason: &str| CheckpointError::Corrupt {
            path: path.to_owned(),
            reason: reason.to_owned(),
        };
        if bytes.len() < MAGIC.len() + 4 + 8 + 8 || &bytes[..MAGIC.len()] != MAGIC {
            return Err(corrupt("not an ebbflow checkpoint (bad header)"));
        }
        let (body, sum) = bytes.split_at(bytes.len() - 8);
        let sum = u64::from_le_bytes(sum.try_into().expect("8 bytes"));
        if fnv1a(body) != sum {
            return Err(corrupt("checksum mismatch (torn or altered)"));
        }
        let rest = &body[MAGIC.len()..];
        let job_len = u32::from_le_bytes(rest[..4].try_into().expect("4 bytes")) as usize;
        let rest = &rest[4..];
        if rest.len() < job_len + 8 {
            return Err(corrupt("truncated job id"));
        }
        let job = std::str::from_utf8(&rest[..job_len])
            .map_err(|_| corrupt("job id is not UTF-8"))?
            .to_owned();
        let rest = &rest[job_len..];
        let clock = u64::from_le_bytes(rest[..8].try_into().expect("8 bytes"));
        let images =
            decode_images(&rest[8..]).map_err(|e| corrupt(&format!("partition images: {e}")))?;
        Ok(Self { job, clock, images })
    }

    /// Writes the checkpoint to `path` atomically (temporary file, sync, rename).
    pub fn write_atomic(&self, path: &Path) -> Result<(), CheckpointError> {
        let io = |source| CheckpointError::Io {
            path: path.to_owned(),
            source,
        };
        let mut temporary = path.as_os_str().to_owned();
        temporary.push(".tmp");
        let temporary = PathBuf::from(temporary);
        let mut file = std::fs::File::create(&temporary).map_err(io)?;
        file.write_all(&self.encode()).map_err(io)?;
        file.sync_all().map_err(io)?;
        drop(file);
        std::fs::rename(&temporary, path).map_err(io)?;
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            // The rename is durable once the directory is synced.
            if let Ok(dir) = std::fs::File::open(dir) {
                let _ = dir.sync_all();
            }
        }
        Ok(())
    }

    /// The checkpoint of job `job` at `path`: `None` if there is no file.
    pub fn read(path: &Path, job: &str) -> Result<Option<Self>, CheckpointError> {
        let bytes = match std::fs::read(path) {
            Ok(bytes) => bytes,
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => {
                return Err(CheckpointError::Io {
                    path: path.to_owned(),
                    source,
                });
            }
        };
        let checkpoint = Self::decode(&bytes, path)?;
        if checkpoint.job != job {
            return Err(CheckpointError::OtherJob {
                path: path.to_owned(),
                found: checkpoint.job,
                expected: job.to_owned(),
            });
        }
        Ok(Some(checkpoint))
    }
}

/// What the writer last did.
#[derive(Debug, Default)]
struct Offered {
    /// When a checkpoint was last handed to the writing thread.
    at: Option<Instant>,
    /// Its clock.
    clock: u64,
    /// The next copy offered is written whatever the interval says (the process is going).
    urgent: bool,
}

/// Writes a job's checkpoints on a thread of its own (see the module docs).
pub struct CheckpointWriter {
    job: String,
    interval: Duration,
    offered: Mutex<Offered>,
    sender: Mutex<mpsc::Sender<Checkpoint>>,
}

impl std::fmt::Debug for CheckpointWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CheckpointWriter")
            .field("job", &self.job)
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl CheckpointWriter {
    /// A writer of job `job`'s checkpoints to `path`, at most one per `interval`, over a
    /// checkpoint of clock `on_disk` already there (0: none; only later clocks are written);
    /// `written` shows the clock of the last one on disk (`ebbflow_runtime_checkpoint_clock`).
    pub fn start(
        path: PathBuf,
        job: &str,
        interval: Duration,
        on_disk: u64,
        written: IntGauge,
    ) -> Arc<Self> {
        written.set(on_disk as i64);
        let (sender, receiver) = mpsc::channel::<Checkpoint>();
        std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || {
                while let Ok(mut checkpoint) = receiver.recv() {
                    // Only the newest one queued matters.
                    while let Ok(newer) = receiver.try_recv() {
                        checkpoint = newer;
                    }
                    match checkpoint.write_atomic(&path) {
                        Ok(()) => {
                            written.set(checkpoint.clock as i64);
                            tracing::debug!(clock = checkpoint.clock, path = %path.display(), "checkpoint written");
                        }
                        Err(error) => tracing::warn!(%error, "checkpoint not written"),
                    }
                }
            })
            .expect("spawning the checkpoint thread");
        Arc::new(Self {
            job: job.to_owned(),
            interval,
            offered: Mutex::new(Offered {
                at: None,
                clock: on_disk,
                urgent: false,
            }),
            sender: Mutex::new(sender),
        })
    }

    /// The process was told to stop (SIGTERM): the next consistent copy is written at once, not
    /// up to an interval later, so a replacement loses only the clocks since that copy.
    pub fn write_next_now(&self) {
        self.offered.lock().urgent = true;
    }

    /// Offers the consistent copy at `clock`: written if the clock moved past the last one
    /// written and the interval has passed since.
    pub fn offer(&self, clock: u64, images: &[PartitionImage]) {
        let mut offered = self.offered.lock();
        let due = offered.urgent || offered.at.is_none_or(|at| at.elapsed() >= self.interval);
        if clock <= offered.clock || !due {
            return;
        }
        offered.urgent = false;
        offered.at = Some(Instant::now());
        offered.clock = clock;
        let _ = self.sender.lock().send(Checkpoint {
            job: self.job.clone(),
            clock,
            images: images.to_vec(),
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::TableImage;

    fn checkpoint() -> Checkpoint {
        Checkpoint {
            job: "exact/400".into(),
            clock: 42,
            images: vec![PartitionImage {
                partition: 0,
                tables: vec![TableImage {
                    table: 1,
                    keys: vec![3, 7],
                    data: vec![1.0, 2.0, 3.0, 4.0],
                    state: Vec::new(),
                }],
                completed: vec![42, 42],
            }],
        }
    }

    #[test]
    fn a_checkpoint_round_trips_and_bad_files_are_errors_naming_them() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        assert_eq!(Checkpoint::read(&path, "exact/400").unwrap(), None);
        checkpoint().write_atomic(&path).unwrap();
        assert_eq!(
            Checkpoint::read(&path, "exact/400").unwrap(),
            Some(checkpoint())
        );
        let other = Checkpoint::read(&path, "exact/500")
            .unwrap_err()
            .to_string();
        assert!(
            other.contains("job.ckpt") && other.contains("exact/500"),
            "{other}"
        );
        // a flipped byte, a truncation, another format
        let mut bytes = std::fs::read(&path).unwrap();
        bytes[20] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let flipped = Checkpoint::read(&path, "exact/400")
            .unwrap_err()
            .to_string();
        assert!(flipped.contains("checksum"), "{flipped}");
        std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
        assert!(Checkpoint::read(&path, "exact/400").is_err());
        std::fs::write(&path, b"{\"not\": \"a checkpoint\"}").unwrap();
        let foreign = Checkpoint::read(&path, "exact/400")
            .unwrap_err()
            .to_string();
        assert!(
            foreign.contains("bad header") && foreign.contains("job.ckpt"),
            "{foreign}"
        );
    }

    /// A writer of job `exact/400` to `job.ckpt` in `dir`, one checkpoint an hour at most: the
    /// file, the written-clock gauge, the writer.
    fn hourly_writer(dir: &tempfile::TempDir) -> (PathBuf, IntGauge, Arc<CheckpointWriter>) {
        let path = dir.path().join("job.ckpt");
        let gauge = IntGauge::new("t", "t").unwrap();
        let writer = CheckpointWriter::start(
            path.clone(),
            "exact/400",
            Duration::from_secs(3600),
            0,
            gauge.clone(),
        );
        (path, gauge, writer)
    }

    #[test]
    fn the_writer_keeps_to_its_interval_and_only_moves_forward() {
        let dir = tempfile::tempdir().unwrap();
        let (path, _, writer) = hourly_writer(&dir);
        let images = checkpoint().images;
        writer.offer(5, &images);
        // within the interval: not written
        writer.offer(9, &images);
        let deadline = Instant::now() + Duration::from_secs(10);
        let written = loop {
            if let Ok(Some(written)) = Checkpoint::read(&path, "exact/400") {
                break written;
            }
            assert!(Instant::now() < deadline, "no checkpoint written");
            std::thread::yield_now();
        };
        assert_eq!(written.clock, 5);
        let writer = CheckpointWriter::start(
            path.clone(),
            "exact/400",
            Duration::ZERO,
            5,
            IntGauge::new("u", "u").unwrap(),
        );
        writer.offer(5, &images); // the clock already on disk: not written again
        assert_eq!(writer.offered.lock().at, None);
        writer.offer(6, &images);
        writer.offer(6, &images); // not past the last offer: ignored
        assert_eq!(writer.offered.lock().clock, 6);
    }

    #[test]
    fn told_to_stop_the_next_copy_is_written_within_the_interval() {
        let dir = tempfile::tempdir().unwrap();
        let (path, gauge, writer) = hourly_writer(&dir);
        let images = checkpoint().images;
        writer.offer(5, &images);
        writer.offer(9, &images); // within the interval: not written
        assert_eq!(writer.offered.lock().clock, 5);
        writer.write_next_now();
        writer.offer(12, &images);
        assert_eq!(writer.offered.lock().clock, 12, "written at once");
        writer.offer(15, &images); // once: the interval holds again
        assert_eq!(writer.offered.lock().clock, 12);
        let deadline = Instant::now() + Duration::from_secs(10);
        while gauge.get() != 12 {
            assert!(Instant::now() < deadline, "clock 12 never reached the disk");
            std::thread::yield_now();
        }
        assert_eq!(
            Checkpoint::read(&path, "exact/400").unwrap().unwrap().clock,
            12
        );
    }
}
