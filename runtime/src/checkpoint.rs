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
use prometheus::{IntCounter, IntGauge};
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

/// The bytes of job `job`'s checkpoint at `clock` holding `images`.
fn encode_parts(job: &str, clock: u64, images: &[PartitionImage]) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(MAGIC);
    out.extend_from_slice(&(job.len() as u32).to_le_bytes());
    out.extend_from_slice(job.as_bytes());
    out.extend_from_slice(&clock.to_le_bytes());
    encode_images(images, &mut out);
    let sum = fnv1a(&out);
    out.extend_from_slice(&sum.to_le_bytes());
    out
}

/// Writes `bytes` to `path` atomically: a temporary file beside it, synced, renamed over it,
/// and the directory synced. On an error the temporary file is removed and `path` is as before.
fn write_bytes_atomic(path: &Path, bytes: &[u8]) -> Result<(), CheckpointError> {
    let io = |source| CheckpointError::Io {
        path: path.to_owned(),
        source,
    };
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = PathBuf::from(temporary);
    let written = (|| {
        let mut file = std::fs::File::create(&temporary)?;
        file.write_all(bytes)?;
        file.sync_all()?;
        drop(file);
        std::fs::rename(&temporary, path)
    })();
    if let Err(source) = written {
        let _ = std::fs::remove_file(&temporary);
        return Err(io(source));
    }
    // The rename is durable once the directory is synced (a bare file name is in `.`).
    let dir = match path.parent() {
        Some(dir) if !dir.as_os_str().is_empty() => dir,
        _ => Path::new("."),
    };
    std::fs::File::open(dir)
        .and_then(|dir| dir.sync_all())
        .map_err(io)
}

impl Checkpoint {
    /// The file's bytes.
    pub fn encode(&self) -> Vec<u8> {
        encode_parts(&self.job, self.clock, &self.images)
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

    /// Writes the checkpoint to `path` atomically (temporary file, sync, rename, directory
    /// sync); on an error nothing is left behind and the old checkpoint stays.
    pub fn write_atomic(&self, path: &Path) -> Result<(), CheckpointError> {
        write_bytes_atomic(path, &self.encode())
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

/// A consistent copy: its clock and every partition's image, shared with the controller.
type Copy = (u64, Arc<Vec<PartitionImage>>);

/// What the writer last did.
#[derive(Debug, Default)]
struct Offered {
    /// When a checkpoint was last handed to the writing thread.
    at: Option<Instant>,
    /// Its clock (while it is written, or once it is on disk).
    clock: u64,
    /// The clock on disk.
    on_disk: u64,
    /// The process is going (SIGTERM): every newer copy is written at once.
    urgent: bool,
    /// The newest copy the interval held back: written at once when the process is told to
    /// stop, so a replacement resumes from it even if no copy follows.
    held: Option<Copy>,
}

/// Writes a job's checkpoints on a thread of its own (see the module docs).
pub struct CheckpointWriter {
    job: String,
    interval: Duration,
    offered: Arc<Mutex<Offered>>,
    /// Notified by the writing thread after each write, done or failed.
    settled: Arc<parking_lot::Condvar>,
    sender: Mutex<mpsc::Sender<Copy>>,
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
    /// `written` shows the clock of the last one on disk (`ebbflow_runtime_checkpoint_clock`),
    /// `failures` counts writes that failed (`ebbflow_runtime_checkpoint_failures_total`). A
    /// failed write is tried again with the next copy offered, whatever the interval.
    pub fn start(
        path: PathBuf,
        job: &str,
        interval: Duration,
        on_disk: u64,
        (written, failures): (IntGauge, IntCounter),
    ) -> Arc<Self> {
        written.set(on_disk as i64);
        let offered = Arc::new(Mutex::new(Offered {
            clock: on_disk,
            on_disk,
            ..Offered::default()
        }));
        let (sender, receiver) = mpsc::channel::<Copy>();
        let settled = Arc::new(parking_lot::Condvar::new());
        let (state, name, notify) = (offered.clone(), job.to_owned(), settled.clone());
        std::thread::Builder::new()
            .name("checkpoint".into())
            .spawn(move || {
                while let Ok(mut copy) = receiver.recv() {
                    // Only the newest one queued matters.
                    while let Ok(newer) = receiver.try_recv() {
                        copy = newer;
                    }
                    let (clock, images) = &copy;
                    match write_bytes_atomic(&path, &encode_parts(&name, *clock, images)) {
                        Ok(()) => {
                            written.set(*clock as i64);
                            let mut state = state.lock();
                            state.on_disk = state.on_disk.max(*clock);
                            tracing::debug!(clock, path = %path.display(), "checkpoint written");
                        }
                        Err(error) => {
                            failures.inc();
                            tracing::warn!(%error, clock, "checkpoint not written; the next copy tries again");
                            // The next offer is due at once, and a stop writes this copy again
                            // if nothing newer comes.
                            let mut state = state.lock();
                            if state.clock == *clock {
                                state.clock = state.on_disk;
                                state.at = None;
                            }
                            if state.held.as_ref().is_none_or(|(held, _)| held < clock) {
                                state.held = Some(copy);
                            }
                        }
                    }
                    notify.notify_all();
                }
            })
            .expect("spawning the checkpoint thread");
        Arc::new(Self {
            job: job.to_owned(),
            interval,
            offered,
            settled,
            sender: Mutex::new(sender),
        })
    }

    /// The process was told to stop (SIGTERM): the newest copy the interval held back is written
    /// now, and every newer one at once, so a replacement loses only the clocks since the last.
    pub fn write_next_now(&self) {
        let mut offered = self.offered.lock();
        offered.urgent = true;
        if let Some((clock, images)) = offered.held.take() {
            if clock > offered.clock {
                self.hand_over(&mut offered, clock, images);
            }
        }
    }

    /// Waits up to `timeout` for the copy handed to the writing thread to be written (or to
    /// fail); returns the clock on disk. A process that exits right after its job (a stop, a
    /// SIGTERM) calls it last, or the final copy could be cut off mid-write.
    pub fn flush(&self, timeout: Duration) -> u64 {
        let deadline = Instant::now() + timeout;
        let mut offered = self.offered.lock();
        while offered.on_disk < offered.clock {
            if self.settled.wait_until(&mut offered, deadline).timed_out() {
                tracing::warn!(
                    clock = offered.clock,
                    on_disk = offered.on_disk,
                    "the last checkpoint was not written in time"
                );
                break;
            }
        }
        offered.on_disk
    }

    /// Offers the consistent copy at `clock`: written if the clock moved past the last one
    /// written and the interval has passed since (or the process is going); otherwise kept
    /// as the newest copy held back.
    pub fn offer(&self, clock: u64, images: &Arc<Vec<PartitionImage>>) {
        let mut offered = self.offered.lock();
        if clock <= offered.clock {
            return;
        }
        let due = offered.urgent || offered.at.is_none_or(|at| at.elapsed() >= self.interval);
        if due {
            self.hand_over(&mut offered, clock, images.clone());
        } else {
            offered.held = Some((clock, images.clone()));
        }
    }

    /// Hands the copy at `clock` to the writing thread.
    fn hand_over(&self, offered: &mut Offered, clock: u64, images: Arc<Vec<PartitionImage>>) {
        offered.held = None;
        offered.at = Some(Instant::now());
        offered.clock = clock;
        let _ = self.sender.lock().send((clock, images));
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

    /// A writer of job `exact/400` to `path`, one checkpoint per `interval` at most: the
    /// written-clock gauge, the failure counter, the writer.
    fn writer_to(
        path: &Path,
        interval: Duration,
        on_disk: u64,
    ) -> (IntGauge, IntCounter, Arc<CheckpointWriter>) {
        let gauge = IntGauge::new("t", "t").unwrap();
        let failures = IntCounter::new("f", "f").unwrap();
        let writer = CheckpointWriter::start(
            path.to_owned(),
            "exact/400",
            interval,
            on_disk,
            (gauge.clone(), failures.clone()),
        );
        (gauge, failures, writer)
    }

    /// A writer to `job.ckpt` in `dir`, one checkpoint an hour at most.
    fn hourly_writer(dir: &tempfile::TempDir) -> (PathBuf, IntGauge, Arc<CheckpointWriter>) {
        let path = dir.path().join("job.ckpt");
        let (gauge, _, writer) = writer_to(&path, Duration::from_secs(3600), 0);
        (path, gauge, writer)
    }

    /// Waits until `gauge` (the clock on disk) reads `clock`.
    fn wait_on_disk(gauge: &IntGauge, clock: i64) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while gauge.get() != clock {
            assert!(
                Instant::now() < deadline,
                "clock {clock} never reached the disk ({})",
                gauge.get()
            );
            std::thread::yield_now();
        }
    }

    fn images() -> Arc<Vec<PartitionImage>> {
        Arc::new(checkpoint().images)
    }

    #[test]
    fn the_writer_keeps_to_its_interval_and_only_moves_forward() {
        let dir = tempfile::tempdir().unwrap();
        let (path, gauge, writer) = hourly_writer(&dir);
        let images = images();
        writer.offer(5, &images);
        // within the interval: not written
        writer.offer(9, &images);
        wait_on_disk(&gauge, 5);
        assert_eq!(
            Checkpoint::read(&path, "exact/400").unwrap().unwrap().clock,
            5
        );
        let (_, _, writer) = writer_to(&path, Duration::ZERO, 5);
        writer.offer(5, &images); // the clock already on disk: not written again
        assert_eq!(writer.offered.lock().at, None);
        writer.offer(6, &images);
        writer.offer(6, &images); // not past the last offer: ignored
        assert_eq!(writer.offered.lock().clock, 6);
    }

    /// Told to stop, the writer writes the newest copy the interval held back at once (a
    /// segment stalled on a lost node may offer none before the process exits), then every
    /// newer copy at once.
    #[test]
    fn told_to_stop_the_newest_copy_held_back_is_written_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let (path, gauge, writer) = hourly_writer(&dir);
        let images = images();
        writer.offer(5, &images);
        writer.offer(9, &images); // within the interval: held back
        assert_eq!(writer.offered.lock().clock, 5);
        writer.write_next_now();
        assert_eq!(
            writer.offered.lock().clock,
            9,
            "the held copy, with no new offer"
        );
        // a process about to exit waits for it
        assert_eq!(writer.flush(Duration::from_secs(10)), 9);
        assert_eq!(gauge.get(), 9);
        writer.offer(12, &images);
        writer.offer(15, &images);
        assert_eq!(
            writer.offered.lock().clock,
            15,
            "every newer copy once told to stop"
        );
        wait_on_disk(&gauge, 15);
        assert_eq!(
            Checkpoint::read(&path, "exact/400").unwrap().unwrap().clock,
            15
        );
    }

    /// A write that fails (here the path is a directory) is counted, leaves nothing behind, and
    /// is tried again with the next copy offered, whatever the interval.
    #[test]
    fn a_failed_write_is_counted_and_tried_again() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("job.ckpt");
        std::fs::create_dir(&path).unwrap();
        let (gauge, failures, writer) = writer_to(&path, Duration::from_secs(3600), 0);
        let images = images();
        writer.offer(5, &images);
        // a flush returns once the write failed, with nothing on disk
        assert_eq!(writer.flush(Duration::from_secs(10)), 0);
        assert_eq!(failures.get(), 1);
        assert_eq!(writer.offered.lock().clock, 0);
        assert_eq!(gauge.get(), 0);
        assert!(
            !dir.path().join("job.ckpt.tmp").exists(),
            "no temporary file left"
        );
        // the path is writable again: the next copy is written, though within the interval
        std::fs::remove_dir(&path).unwrap();
        writer.offer(7, &images);
        wait_on_disk(&gauge, 7);
        assert_eq!(
            Checkpoint::read(&path, "exact/400").unwrap().unwrap().clock,
            7
        );
        assert_eq!(failures.get(), 1);
    }
}
