//! Messages of the data plane and their binary encoding.
//!
//! A frame body is a kind byte followed by fixed-width little-endian fields; collections carry a
//! `u32` count checked against the remaining bytes before anything is allocated; value payloads are
//! raw little-endian `f32` bytes borrowed from the frame (decoding never copies them).

use crate::app::TableId;
use crate::frame::{FrameError, begin_frame, end_frame, get_f32s, put_f32s};
use crate::partition::PartitionId;

/// A run of `f32` values: borrowed little-endian bytes (decoded) or floats (to encode).
#[derive(Debug, Clone, Copy)]
pub enum Values<'a> {
    /// Little-endian bytes, `4 * len` of them.
    Le(&'a [u8]),
    /// Native floats.
    F32(&'a [f32]),
}

impl Values<'_> {
    /// Number of values.
    pub fn len(&self) -> usize {
        match self {
            Values::Le(bytes) => bytes.len() / 4,
            Values::F32(values) => values.len(),
        }
    }

    /// True if there are no values.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies the values into `out` (`out.len() == self.len()`).
    pub fn copy_to(&self, out: &mut [f32]) {
        match self {
            Values::Le(bytes) => get_f32s(bytes, out),
            Values::F32(values) => out.copy_from_slice(values),
        }
    }

    /// The values as a vector (tests, rare paths).
    pub fn to_vec(&self) -> Vec<f32> {
        let mut out = vec![0.0; self.len()];
        self.copy_to(&mut out);
        out
    }

    pub(crate) fn put(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&(self.len() as u32).to_le_bytes());
        match self {
            Values::Le(bytes) => out.extend_from_slice(bytes),
            Values::F32(values) => put_f32s(out, values),
        }
    }
}

impl PartialEq for Values<'_> {
    fn eq(&self, other: &Self) -> bool {
        let (a, b) = (self.to_vec(), other.to_vec());
        a.len() == b.len() && a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits())
    }
}

/// One message of the data plane.
#[derive(Debug, Clone, PartialEq)]
pub enum Message<'a> {
    /// First frame of a client: who connects, and its nonce ([`crate::handshake`]). No
    /// secret: the key never crosses the wire.
    Hello {
        /// The connecting node.
        node: u32,
        /// The client's nonce ([`crate::handshake::NONCE_BYTES`]).
        nonce: &'a [u8],
    },
    /// The server's answer to a hello: its nonce and its proof that it holds the job key.
    Challenge {
        /// The server's nonce, fresh for this connection.
        nonce: &'a [u8],
        /// [`crate::handshake::server_proof`].
        proof: &'a [u8],
    },
    /// The client's proof that it holds the job key ([`crate::handshake::client_proof`]).
    Proof {
        /// The proof.
        proof: &'a [u8],
    },
    /// The server accepted the client's proof.
    Welcome,
    /// Declares a worker's batch for one partition: keys per table, in value order.
    Register {
        /// The worker.
        worker: u32,
        /// The partition.
        partition: PartitionId,
        /// Epoch the worker believes the partition is at.
        epoch: u64,
        /// Keys per table.
        tables: Vec<(TableId, Vec<u64>)>,
        /// The worker already holds the partition's rows as of this visible clock (read from
        /// the partition's previous owner; the move at a clock boundary changed no value), so
        /// it need not read them again before pushing. On the wire `u64::MAX` is none.
        read_through: Option<u64>,
    },
    /// Reply to `Register`: the number of values of the batch.
    Registered {
        /// The partition.
        partition: PartitionId,
        /// Values per push/pull of this batch.
        len: u64,
    },
    /// A worker's deltas of one clock for one partition, in registered order.
    Push {
        /// The worker.
        worker: u32,
        /// The clock the deltas belong to.
        clock: u64,
        /// The partition.
        partition: PartitionId,
        /// Epoch the worker believes the partition is at.
        epoch: u64,
        /// The deltas.
        values: Values<'a>,
    },
    /// Reply to `Push`.
    Pushed {
        /// The partition.
        partition: PartitionId,
        /// True if the push had been received before (ignored this time).
        duplicate: bool,
    },
    /// Asks for a worker's registered rows once the partition's visible clock reaches `min_clock`.
    Pull {
        /// The worker.
        worker: u32,
        /// The partition.
        partition: PartitionId,
        /// Epoch the worker believes the partition is at.
        epoch: u64,
        /// The visible clock required.
        min_clock: u64,
    },
    /// Reply to `Pull`.
    Rows {
        /// The partition.
        partition: PartitionId,
        /// Visible clock of the values.
        visible: u64,
        /// Row values in registered order.
        values: Values<'a>,
    },
    /// Asks for every materialised row of a partition.
    Dump {
        /// The partition.
        partition: PartitionId,
        /// Epoch the client believes the partition is at.
        epoch: u64,
    },
    /// Reply to `Dump`: per table, keys and row values.
    DumpRows {
        /// The partition.
        partition: PartitionId,
        /// Visible clock of the values.
        visible: u64,
        /// Per table: id, keys, values (`keys.len() * width`).
        tables: Vec<(TableId, Vec<u64>, Values<'a>)>,
    },
    /// A control request from the coordinator to a node (elastic runs): a JSON command and an
    /// optional binary payload (partition images).
    Control {
        /// The command (`control::ControlRequest` as JSON).
        json: &'a str,
        /// Binary payload.
        blob: &'a [u8],
    },
    /// Reply to `Control`.
    ControlReply {
        /// The answer (`control::ControlResponse` as JSON).
        json: &'a str,
        /// Binary payload.
        blob: &'a [u8],
    },
    /// Asks the server to size this connection's buffers for frames of `bytes` and page them in
    /// (capped at its frame limit), so later large frames land in memory already touched: a
    /// connection opened while a joining node is prepared pays for its buffers before the
    /// switch, not in the first clock after it.
    Warm {
        /// The largest frame body expected.
        bytes: u64,
    },
    /// Reply to `Warm`: the buffers are ready.
    Warmed,
    /// A request failed; the connection stays usable.
    Error {
        /// Static category of the failure (an error's `category()`).
        category: &'a str,
        /// Human-readable description.
        message: &'a str,
    },
}

const HELLO: u8 = 1;
const WELCOME: u8 = 2;
const REGISTER: u8 = 3;
const REGISTERED: u8 = 4;
const PUSH: u8 = 5;
const PUSHED: u8 = 6;
const PULL: u8 = 7;
/// Kind byte of [`Message::Rows`] (the server writes that frame without an intermediate copy).
pub(crate) const ROWS: u8 = 8;
const DUMP: u8 = 9;
const DUMP_ROWS: u8 = 10;
const ERROR: u8 = 11;
const CONTROL: u8 = 12;
const CONTROL_REPLY: u8 = 13;
const WARM: u8 = 14;
const WARMED: u8 = 15;
const CHALLENGE: u8 = 16;
const PROOF: u8 = 17;

/// Reads fields from a complete frame body; running out of bytes is `Invalid`.
pub(crate) struct Cursor<'a> {
    pub(crate) rest: &'a [u8],
}

impl<'a> Cursor<'a> {
    pub(crate) fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], FrameError> {
        if self.rest.len() < n {
            return Err(FrameError::Invalid(what));
        }
        let (head, tail) = self.rest.split_at(n);
        self.rest = tail;
        Ok(head)
    }

    pub(crate) fn u8(&mut self, what: &'static str) -> Result<u8, FrameError> {
        Ok(self.take(1, what)?[0])
    }

    pub(crate) fn u32(&mut self, what: &'static str) -> Result<u32, FrameError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    pub(crate) fn u64(&mut self, what: &'static str) -> Result<u64, FrameError> {
        let b = self.take(8, what)?;
        Ok(u64::from_le_bytes([
            b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7],
        ]))
    }

    /// A `u32` count of items of `item_bytes` each, checked against the remaining bytes.
    pub(crate) fn count(
        &mut self,
        item_bytes: usize,
        what: &'static str,
    ) -> Result<usize, FrameError> {
        let count = self.u32(what)? as usize;
        if count.saturating_mul(item_bytes) > self.rest.len() {
            return Err(FrameError::Invalid(what));
        }
        Ok(count)
    }

    pub(crate) fn bytes(&mut self, what: &'static str) -> Result<&'a [u8], FrameError> {
        let len = self.count(1, what)?;
        self.take(len, what)
    }

    pub(crate) fn str(&mut self, what: &'static str) -> Result<&'a str, FrameError> {
        std::str::from_utf8(self.bytes(what)?).map_err(|_| FrameError::Invalid(what))
    }

    pub(crate) fn values(&mut self, what: &'static str) -> Result<Values<'a>, FrameError> {
        let count = self.count(4, what)?;
        Ok(Values::Le(self.take(count * 4, what)?))
    }

    pub(crate) fn keys(&mut self, what: &'static str) -> Result<Vec<u64>, FrameError> {
        let count = self.count(8, what)?;
        let bytes = self.take(count * 8, what)?;
        Ok(bytes
            .chunks_exact(8)
            .map(|c| u64::from_le_bytes(<[u8; 8]>::try_from(c).unwrap_or_default()))
            .collect())
    }

    pub(crate) fn bool(&mut self, what: &'static str) -> Result<bool, FrameError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            _ => Err(FrameError::Invalid(what)),
        }
    }

    pub(crate) fn finish(self) -> Result<(), FrameError> {
        if self.rest.is_empty() {
            Ok(())
        } else {
            Err(FrameError::Invalid("trailing bytes after message"))
        }
    }
}

pub(crate) fn put_u32(out: &mut Vec<u8>, v: u32) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_u64(out: &mut Vec<u8>, v: u64) {
    out.extend_from_slice(&v.to_le_bytes());
}

pub(crate) fn put_bytes(out: &mut Vec<u8>, bytes: &[u8]) {
    put_u32(out, bytes.len() as u32);
    out.extend_from_slice(bytes);
}

pub(crate) fn put_keys(out: &mut Vec<u8>, keys: &[u64]) {
    put_u32(out, keys.len() as u32);
    for key in keys {
        put_u64(out, *key);
    }
}

impl<'a> Message<'a> {
    /// Decodes a frame body (without the length header).
    pub fn decode(body: &'a [u8]) -> Result<Self, FrameError> {
        let mut c = Cursor { rest: body };
        let message = match c.u8("missing message kind")? {
            HELLO => Message::Hello {
                node: c.u32("hello node")?,
                nonce: c.bytes("hello nonce")?,
            },
            CHALLENGE => Message::Challenge {
                nonce: c.bytes("challenge nonce")?,
                proof: c.bytes("challenge proof")?,
            },
            PROOF => Message::Proof {
                proof: c.bytes("proof")?,
            },
            WELCOME => Message::Welcome,
            REGISTER => {
                let (worker, partition, epoch) = (
                    c.u32("register worker")?,
                    c.u32("register partition")?,
                    c.u64("register epoch")?,
                );
                let count = c.count(8, "register table count")?;
                let mut tables = Vec::with_capacity(count);
                for _ in 0..count {
                    tables.push((c.u32("register table id")?, c.keys("register keys")?));
                }
                let read_through = Some(c.u64("register read through")?).filter(|&c| c != u64::MAX);
                Message::Register {
                    worker,
                    partition,
                    epoch,
                    tables,
                    read_through,
                }
            }
            REGISTERED => Message::Registered {
                partition: c.u32("registered partition")?,
                len: c.u64("registered length")?,
            },
            PUSH => Message::Push {
                worker: c.u32("push worker")?,
                clock: c.u64("push clock")?,
                partition: c.u32("push partition")?,
                epoch: c.u64("push epoch")?,
                values: c.values("push values")?,
            },
            PUSHED => Message::Pushed {
                partition: c.u32("pushed partition")?,
                duplicate: c.bool("pushed flag")?,
            },
            PULL => Message::Pull {
                worker: c.u32("pull worker")?,
                partition: c.u32("pull partition")?,
                epoch: c.u64("pull epoch")?,
                min_clock: c.u64("pull clock")?,
            },
            ROWS => Message::Rows {
                partition: c.u32("rows partition")?,
                visible: c.u64("rows clock")?,
                values: c.values("rows values")?,
            },
            DUMP => Message::Dump {
                partition: c.u32("dump partition")?,
                epoch: c.u64("dump epoch")?,
            },
            DUMP_ROWS => {
                let (partition, visible) =
                    (c.u32("dump rows partition")?, c.u64("dump rows clock")?);
                let count = c.count(12, "dump table count")?;
                let mut tables = Vec::with_capacity(count);
                for _ in 0..count {
                    tables.push((
                        c.u32("dump table id")?,
                        c.keys("dump keys")?,
                        c.values("dump values")?,
                    ));
                }
                Message::DumpRows {
                    partition,
                    visible,
                    tables,
                }
            }
            ERROR => Message::Error {
                category: c.str("error category")?,
                message: c.str("error message")?,
            },
            CONTROL => Message::Control {
                json: c.str("control command")?,
                blob: c.bytes("control payload")?,
            },
            CONTROL_REPLY => Message::ControlReply {
                json: c.str("control answer")?,
                blob: c.bytes("control answer payload")?,
            },
            WARM => Message::Warm {
                bytes: c.u64("warm bytes")?,
            },
            WARMED => Message::Warmed,
            _ => return Err(FrameError::Invalid("unknown message kind")),
        };
        c.finish()?;
        Ok(message)
    }

    /// Appends the whole frame (length header and body) to `out`.
    pub fn encode(&self, out: &mut Vec<u8>) {
        let start = begin_frame(out);
        match self {
            Message::Hello { node, nonce } => {
                out.push(HELLO);
                put_u32(out, *node);
                put_bytes(out, nonce);
            }
            Message::Challenge { nonce, proof } => {
                out.push(CHALLENGE);
                put_bytes(out, nonce);
                put_bytes(out, proof);
            }
            Message::Proof { proof } => {
                out.push(PROOF);
                put_bytes(out, proof);
            }
            Message::Welcome => out.push(WELCOME),
            Message::Register {
                worker,
                partition,
                epoch,
                tables,
                read_through,
            } => {
                out.push(REGISTER);
                put_u32(out, *worker);
                put_u32(out, *partition);
                put_u64(out, *epoch);
                put_u32(out, tables.len() as u32);
                for (table, keys) in tables {
                    put_u32(out, *table);
                    put_keys(out, keys);
                }
                put_u64(out, read_through.unwrap_or(u64::MAX));
            }
            Message::Registered { partition, len } => {
                out.push(REGISTERED);
                put_u32(out, *partition);
                put_u64(out, *len);
            }
            Message::Push {
                worker,
                clock,
                partition,
                epoch,
                values,
            } => {
                out.push(PUSH);
                put_u32(out, *worker);
                put_u64(out, *clock);
                put_u32(out, *partition);
                put_u64(out, *epoch);
                values.put(out);
            }
            Message::Pushed {
                partition,
                duplicate,
            } => {
                out.push(PUSHED);
                put_u32(out, *partition);
                out.push(u8::from(*duplicate));
            }
            Message::Pull {
                worker,
                partition,
                epoch,
                min_clock,
            } => {
                out.push(PULL);
                put_u32(out, *worker);
                put_u32(out, *partition);
                put_u64(out, *epoch);
                put_u64(out, *min_clock);
            }
            Message::Rows {
                partition,
                visible,
                values,
            } => {
                out.push(ROWS);
                put_u32(out, *partition);
                put_u64(out, *visible);
                values.put(out);
            }
            Message::Dump { partition, epoch } => {
                out.push(DUMP);
                put_u32(out, *partition);
                put_u64(out, *epoch);
            }
            Message::DumpRows {
                partition,
                visible,
                tables,
            } => {
                out.push(DUMP_ROWS);
                put_u32(out, *partition);
                put_u64(out, *visible);
                put_u32(out, tables.len() as u32);
                for (table, keys, values) in tables {
                    put_u32(out, *table);
                    put_keys(out, keys);
                    values.put(out);
                }
            }
            Message::Error { category, message } => {
                out.push(ERROR);
                put_bytes(out, category.as_bytes());
                put_bytes(out, message.as_bytes());
            }
            Message::Control { json, blob } => {
                out.push(CONTROL);
                put_bytes(out, json.as_bytes());
                put_bytes(out, blob);
            }
            Message::ControlReply { json, blob } => {
                out.push(CONTROL_REPLY);
                put_bytes(out, json.as_bytes());
                put_bytes(out, blob);
            }
            Message::Warm { bytes } => {
                out.push(WARM);
                put_u64(out, *bytes);
            }
            Message::Warmed => out.push(WARMED),
        }
        end_frame(out, start);
    }

    /// Static name of the message kind (logs, metrics).
    pub fn kind(&self) -> &'static str {
        match self {
            Message::Hello { .. } => "hello",
            Message::Challenge { .. } => "challenge",
            Message::Proof { .. } => "proof",
            Message::Welcome => "welcome",
            Message::Register { .. } => "register",
            Message::Registered { .. } => "registered",
            Message::Push { .. } => "push",
            Message::Pushed { .. } => "pushed",
            Message::Pull { .. } => "pull",
            Message::Rows { .. } => "rows",
            Message::Dump { .. } => "dump",
            Message::DumpRows { .. } => "dump_rows",
            Message::Error { .. } => "error",
            Message::Control { .. } => "control",
            Message::ControlReply { .. } => "control_reply",
            Message::Warm { .. } => "warm",
            Message::Warmed => "warmed",
        }
    }
}

/// Compares two secrets in time independent of where they differ.
pub fn secrets_match(expected: &[u8], presented: &[u8]) -> bool {
    if expected.len() != presented.len() {
        return false;
    }
    let difference = expected
        .iter()
        .zip(presented)
        .fold(0u8, |acc, (a, b)| acc | (a ^ b));
    std::hint::black_box(difference) == 0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::{DEFAULT_MAX_FRAME_BYTES, HEADER_BYTES, check};
    use proptest::prelude::*;

    fn round_trip(message: &Message<'_>) {
        let mut out = Vec::new();
        message.encode(&mut out);
        let total = check(&out, DEFAULT_MAX_FRAME_BYTES).unwrap();
        assert_eq!(total, out.len());
        assert_eq!(&Message::decode(&out[HEADER_BYTES..]).unwrap(), message);
    }

    #[test]
    fn every_message_round_trips() {
        let floats = [1.0f32, -2.5, 3.75];
        round_trip(&Message::Hello {
            node: 4,
            nonce: &[7; 32],
        });
        round_trip(&Message::Challenge {
            nonce: &[8; 32],
            proof: &[9; 32],
        });
        round_trip(&Message::Proof { proof: &[10; 32] });
        round_trip(&Message::Welcome);
        round_trip(&Message::Warm { bytes: 1 << 20 });
        round_trip(&Message::Warmed);
        round_trip(&Message::Register {
            worker: 1,
            partition: 2,
            epoch: 3,
            tables: vec![(0, vec![5, 9]), (7, vec![])],
            read_through: None,
        });
        round_trip(&Message::Register {
            worker: 1,
            partition: 2,
            epoch: 3,
            tables: vec![(0, vec![5])],
            read_through: Some(12),
        });
        round_trip(&Message::Registered {
            partition: 2,
            len: 99,
        });
        round_trip(&Message::Push {
            worker: 1,
            clock: 8,
            partition: 2,
            epoch: 3,
            values: Values::F32(&floats),
        });
        round_trip(&Message::Pushed {
            partition: 2,
            duplicate: true,
        });
        round_trip(&Message::Pull {
            worker: 1,
            partition: 2,
            epoch: 3,
            min_clock: 7,
        });
        round_trip(&Message::Rows {
            partition: 2,
            visible: 7,
            values: Values::F32(&floats),
        });
        round_trip(&Message::Dump {
            partition: 2,
            epoch: 3,
        });
        round_trip(&Message::DumpRows {
            partition: 2,
            visible: 7,
            tables: vec![(0, vec![1], Values::F32(&floats[..1]))],
        });
        round_trip(&Message::Error {
            category: "check_epoch",
            message: "partition 2 moved",
        });
        round_trip(&Message::Control {
            json: r#"{"take":{"partition":3}}"#,
            blob: &[],
        });
        round_trip(&Message::ControlReply {
            json: "\"ok\"",
            blob: &[1, 2, 3],
        });
    }

    #[test]
    fn malformed_bodies_are_invalid() {
        assert_eq!(
            Message::decode(&[]),
            Err(FrameError::Invalid("missing message kind"))
        );
        assert_eq!(
            Message::decode(&[200]),
            Err(FrameError::Invalid("unknown message kind"))
        );
        assert_eq!(
            Message::decode(&[WELCOME, 0]),
            Err(FrameError::Invalid("trailing bytes after message"))
        );
        // A count promising more keys than bytes follow is refused before allocating.
        let mut body = vec![REGISTER];
        body.extend_from_slice(&[0; 16]);
        body.extend_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(
            Message::decode(&body),
            Err(FrameError::Invalid("register table count"))
        );
        assert!(secrets_match(b"abc", b"abc"));
        assert!(!secrets_match(b"abc", b"abd"));
        assert!(!secrets_match(b"abc", b"abcd"));
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Arbitrary bytes never panic the decoder, and every claimed frame length is honoured.
        #[test]
        fn decoder_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..256), max in 1usize..512) {
            match check(&bytes, max) {
                Ok(total) => {
                    prop_assert!(total <= bytes.len() && total - HEADER_BYTES <= max);
                    let _ = Message::decode(&bytes[HEADER_BYTES..total]);
                }
                Err(FrameError::TooLarge { len, max: cap }) => prop_assert!(len > cap),
                Err(_) => {}
            }
            let _ = Message::decode(&bytes);
        }

        /// Truncated valid frames are incomplete; frames with any byte changed never panic.
        #[test]
        fn mutated_frames_never_panic(
            worker in any::<u32>(), clock in any::<u64>(), values in proptest::collection::vec(any::<f32>(), 0..32),
            position in any::<usize>(), byte in any::<u8>(), cut in any::<usize>(),
        ) {
            let mut out = Vec::new();
            Message::Push { worker, clock, partition: 1, epoch: 2, values: Values::F32(&values) }.encode(&mut out);
            let cut = cut % out.len();
            prop_assert_eq!(check(&out[..cut], 1 << 16), Err(FrameError::Incomplete));
            let decoded = Message::decode(&out[HEADER_BYTES..]).unwrap();
            prop_assert_eq!(decoded, Message::Push { worker, clock, partition: 1, epoch: 2, values: Values::F32(&values) });
            let position = position % out.len();
            out[position] = byte;
            if let Ok(total) = check(&out, 1 << 16) {
                let _ = Message::decode(&out[HEADER_BYTES..total]);
            }
        }
    }
}
