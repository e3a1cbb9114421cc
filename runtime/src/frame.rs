//! Length-prefixed framing of the data plane.
//!
//! A frame is a 4-byte little-endian body length followed by the body (a message kind byte and its
//! payload, see [`crate::message`]). The length is checked against a configured cap before anything
//! is allocated, so a peer can never make a reader allocate more than the cap.

use thiserror::Error;

/// Bytes of the length header.
pub const HEADER_BYTES: usize = 4;

/// Default cap on a frame body (256 MiB: a 64 Mi-value batch).
pub const DEFAULT_MAX_FRAME_BYTES: usize = 256 << 20;

/// Why bytes could not be parsed as a frame or message.
#[derive(Debug, Error, Clone, PartialEq, Eq)]
pub enum FrameError {
    /// More bytes are needed (not an error on a stream, only at its end).
    #[error("incomplete frame")]
    Incomplete,
    /// The bytes are not a valid frame or message.
    #[error("invalid frame: {0}")]
    Invalid(&'static str),
    /// The announced body is larger than the configured cap.
    #[error("frame of {len} bytes exceeds the cap of {max} bytes")]
    TooLarge {
        /// Announced body length.
        len: usize,
        /// Configured cap.
        max: usize,
    },
}

impl FrameError {
    /// Static label for metrics.
    pub fn category(&self) -> &'static str {
        match self {
            FrameError::Incomplete => "incomplete",
            FrameError::Invalid(_) => "invalid",
            FrameError::TooLarge { .. } => "too_large",
        }
    }
}

/// Parses the header at the start of `buf`: the body length, if the header is present and the
/// length within `max`. Does not require the body to be present.
pub fn body_len(buf: &[u8], max: usize) -> Result<usize, FrameError> {
    let Some(header) = buf.get(..HEADER_BYTES) else {
        return Err(FrameError::Incomplete);
    };
    let len = u32::from_le_bytes([header[0], header[1], header[2], header[3]]) as usize;
    if len == 0 {
        return Err(FrameError::Invalid("empty frame body"));
    }
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    Ok(len)
}

/// If `buf` starts with a complete frame, its total length (header + body).
pub fn check(buf: &[u8], max: usize) -> Result<usize, FrameError> {
    let len = body_len(buf, max)?;
    if buf.len() < HEADER_BYTES + len {
        return Err(FrameError::Incomplete);
    }
    Ok(HEADER_BYTES + len)
}

/// Starts a frame in `out` (reserving the header); finish it with [`end_frame`].
pub fn begin_frame(out: &mut Vec<u8>) -> usize {
    let start = out.len();
    out.extend_from_slice(&[0; HEADER_BYTES]);
    start
}

/// Writes the body length of the frame begun at `start`.
pub fn end_frame(out: &mut [u8], start: usize) {
    let len = (out.len() - start - HEADER_BYTES) as u32;
    out[start..start + HEADER_BYTES].copy_from_slice(&len.to_le_bytes());
}

/// Appends `values` as little-endian bytes (a straight copy on little-endian machines).
pub fn put_f32s(out: &mut Vec<u8>, values: &[f32]) {
    let start = out.len();
    out.resize(start + values.len() * 4, 0);
    for (chunk, value) in out[start..].chunks_exact_mut(4).zip(values) {
        chunk.copy_from_slice(&value.to_le_bytes());
    }
}

/// Decodes little-endian `f32`s from `bytes` into `out` (`bytes.len() == out.len() * 4`).
pub fn get_f32s(bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * 4);
    for (value, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *value = f32::from_le_bytes(<[u8; 4]>::try_from(chunk).unwrap_or_default());
    }
}

/// Adds little-endian `f32`s from `bytes` onto `out` element-wise.
pub fn add_f32s(bytes: &[u8], out: &mut [f32]) {
    debug_assert_eq!(bytes.len(), out.len() * 4);
    for (value, chunk) in out.iter_mut().zip(bytes.chunks_exact(4)) {
        *value += f32::from_le_bytes(<[u8; 4]>::try_from(chunk).unwrap_or_default());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_checks() {
        assert_eq!(check(&[1, 0], 10), Err(FrameError::Incomplete));
        assert_eq!(
            check(&[0, 0, 0, 0], 10),
            Err(FrameError::Invalid("empty frame body"))
        );
        assert_eq!(
            check(&[11, 0, 0, 0], 10),
            Err(FrameError::TooLarge { len: 11, max: 10 })
        );
        assert_eq!(check(&[2, 0, 0, 0, 9], 10), Err(FrameError::Incomplete));
        assert_eq!(check(&[2, 0, 0, 0, 9, 9, 7], 10), Ok(6));
    }

    #[test]
    fn floats_round_trip() {
        let values = [1.5f32, -0.0, f32::MAX, 3.25e-7];
        let mut out = Vec::new();
        let start = begin_frame(&mut out);
        put_f32s(&mut out, &values);
        end_frame(&mut out, start);
        assert_eq!(check(&out, 100), Ok(20));
        let mut back = [0f32; 4];
        get_f32s(&out[4..], &mut back);
        assert_eq!(back.map(f32::to_bits), values.map(f32::to_bits));
        add_f32s(&out[4..8], &mut back[..1]);
        assert_eq!(back[0], 3.0);
    }
}
