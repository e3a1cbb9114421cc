//! Duration fields (`30m`, `1h30m`, `90s`, `500ms`) as they appear in a `TrainingJob`.
//!
//! The wire form is a Go/CEL duration string restricted to non-negative values and the units
//! `ms`, `s`, `m`, `h`, so that the API server's CEL `duration()` and [`parse_duration`] agree on
//! every value the schema admits.

use std::{borrow::Cow, fmt, time::Duration};

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

/// The schema pattern every duration string must match.
pub const DURATION_PATTERN: &str = r"^([0-9]+(\.[0-9]+)?(ms|s|m|h))+$";

/// Longest duration string the schema admits (keeps CEL cost estimates small).
pub const DURATION_MAX_LENGTH: u32 = 32;

/// A duration as written in a manifest, e.g. `30m` or `1h30m`; see [`parse_duration`].
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct DurationString(String);

/// Why a duration string was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid duration {input:?}: expected a sequence like 90s, 30m or 1h30m (units ms, s, m, h)"
)]
pub struct DurationError {
    /// The rejected text.
    pub input: String,
}

impl DurationString {
    /// Wraps `text` after checking that it parses.
    pub fn new(text: impl Into<String>) -> Result<Self, DurationError> {
        let text = text.into();
        parse_duration(&text)?;
        Ok(Self(text))
    }

    /// The text as written in the manifest.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The parsed duration; a value that does not parse (only possible if it bypassed the schema)
    /// yields `None`.
    pub fn to_duration(&self) -> Option<Duration> {
        parse_duration(&self.0).ok()
    }
}

impl fmt::Display for DurationString {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<Duration> for DurationString {
    /// Formats whole seconds as `Ns` and anything finer as `Nms`.
    fn from(duration: Duration) -> Self {
        let millis = duration.as_millis();
        if millis.is_multiple_of(1000) {
            Self(format!("{}s", millis / 1000))
        } else {
            Self(format!("{millis}ms"))
        }
    }
}

impl JsonSchema for DurationString {
    fn schema_name() -> Cow<'static, str> {
        "DurationString".into()
    }

    fn inline_schema() -> bool {
        true
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": "string",
            "pattern": DURATION_PATTERN,
            "maxLength": DURATION_MAX_LENGTH,
        })
    }
}

/// Parses `text` with Go's `time.ParseDuration` rules restricted to [`DURATION_PATTERN`]:
/// one or more `<decimal><unit>` terms, units `ms`, `s`, `m`, `h`, no sign, no spaces.
pub fn parse_duration(text: &str) -> Result<Duration, DurationError> {
    let error = || DurationError {
        input: text.to_owned(),
    };
    if text.is_empty() || text.len() > DURATION_MAX_LENGTH as usize {
        return Err(error());
    }
    let mut rest = text;
    let mut total_nanos: f64 = 0.0;
    while !rest.is_empty() {
        let number_len = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .ok_or_else(error)?;
        let number = &rest[..number_len];
        if !is_decimal(number) {
            return Err(error());
        }
        let value: f64 = number.parse().map_err(|_| error())?;
        rest = &rest[number_len..];
        let (unit_nanos, unit_len) = if rest.starts_with("ms") {
            (1e6, 2)
        } else if rest.starts_with('s') {
            (1e9, 1)
        } else if rest.starts_with('m') {
            (60e9, 1)
        } else if rest.starts_with('h') {
            (3600e9, 1)
        } else {
            return Err(error());
        };
        rest = &rest[unit_len..];
        total_nanos += value * unit_nanos;
    }
    // Go rejects durations past ~292 years; so do we, rather than saturating silently.
    if total_nanos > i64::MAX as f64 {
        return Err(error());
    }
    Ok(Duration::from_nanos(total_nanos.round() as u64))
}

/// `digits` or `digits.digits`, as in [`DURATION_PATTERN`].
fn is_decimal(number: &str) -> bool {
    let mut parts = number.split('.');
    let whole = parts.next().unwrap_or_default();
    let fraction = parts.next();
    let all_digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    parts.next().is_none() && all_digits(whole) && fraction.is_none_or(all_digits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_go_style_durations() {
        let cases = [
            ("90s", Duration::from_secs(90)),
            ("30m", Duration::from_secs(1800)),
            ("1h30m", Duration::from_secs(5400)),
            ("1.5h", Duration::from_secs(5400)),
            ("500ms", Duration::from_millis(500)),
            ("2m30s", Duration::from_secs(150)),
            ("0s", Duration::ZERO),
        ];
        for (text, expected) in cases {
            assert_eq!(parse_duration(text), Ok(expected), "{text}");
        }
    }

    #[test]
    fn rejects_what_the_schema_pattern_rejects() {
        let pattern = regex_lite_match;
        for text in [
            "", "10", "h", "1d", "-1h", "1.h", ".5h", "1h 30m", "1hh", "1.2.3s", "5us",
        ] {
            assert!(parse_duration(text).is_err(), "{text:?} should not parse");
            assert!(!pattern(text), "{text:?} should not match the pattern");
        }
        for text in ["1h", "1h30m", "2.5s", "100ms", "1m1ms"] {
            assert!(parse_duration(text).is_ok(), "{text:?} should parse");
            assert!(pattern(text), "{text:?} should match the pattern");
        }
    }

    /// Checks `text` against [`DURATION_PATTERN`] through the same JSON-schema engine the
    /// manifest validation uses.
    fn regex_lite_match(text: &str) -> bool {
        let schema = serde_json::json!({ "type": "string", "pattern": DURATION_PATTERN });
        jsonschema::is_valid(&schema, &serde_json::json!(text))
    }

    #[test]
    fn formats_from_std_duration() {
        assert_eq!(
            DurationString::from(Duration::from_secs(120)).as_str(),
            "120s"
        );
        assert_eq!(
            DurationString::from(Duration::from_millis(1500)).as_str(),
            "1500ms"
        );
    }
}
