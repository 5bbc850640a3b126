// SPDX-License-Identifier: Apache-2.0
//! Durations in Go's `time.Duration` text form, which `metav1.Duration` uses on the wire
//! ("30s", "250ms", "1m30s", "2h22m", "0s").
//!
//! The parser accepts exactly what Go's `time.ParseDuration` accepts (signs, fractions, the
//! units ns/us/µs/μs/ms/s/m/h, and a bare "0"), and rejects the rest with Go's messages, so a
//! file that kube-proxy refuses is refused here too. The printer reproduces
//! `time.Duration.String`, so a written file reads back identically in either program.

use std::fmt;
use std::str::FromStr;

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

const NANOSECOND: u64 = 1;
const MICROSECOND: u64 = 1_000 * NANOSECOND;
const MILLISECOND: u64 = 1_000 * MICROSECOND;
const SECOND: u64 = 1_000 * MILLISECOND;
const MINUTE: u64 = 60 * SECOND;
const HOUR: u64 = 60 * MINUTE;

/// Magnitude limit of an `i64` nanosecond count, as Go's parser checks it (`1<<63`).
const LIMIT: u64 = 1 << 63;

/// A signed nanosecond count, like Go's `time.Duration`. Negative values exist because the
/// file format allows them; validation rejects them where upstream does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Duration(i64);

impl Duration {
    pub const ZERO: Duration = Duration(0);

    pub const fn from_nanos(nanos: i64) -> Self {
        Duration(nanos)
    }

    pub const fn from_millis(millis: i64) -> Self {
        Duration(millis * MILLISECOND as i64)
    }

    pub const fn from_secs(secs: i64) -> Self {
        Duration(secs * SECOND as i64)
    }

    pub const fn from_mins(mins: i64) -> Self {
        Duration(mins * MINUTE as i64)
    }

    pub const fn from_hours(hours: i64) -> Self {
        Duration(hours * HOUR as i64)
    }

    pub const fn as_nanos(self) -> i64 {
        self.0
    }

    pub const fn is_zero(self) -> bool {
        self.0 == 0
    }

    pub const fn is_negative(self) -> bool {
        self.0 < 0
    }

    /// The value as a `std::time::Duration`; negative values (which a validated
    /// configuration never holds where a period is expected) become zero.
    pub fn to_std(self) -> std::time::Duration {
        std::time::Duration::from_nanos(u64::try_from(self.0).unwrap_or(0))
    }

    /// `None` when the value does not fit in Go's signed 64-bit nanosecond range.
    pub fn from_std(value: std::time::Duration) -> Option<Self> {
        i64::try_from(value.as_nanos()).ok().map(Duration)
    }
}

impl From<Duration> for std::time::Duration {
    fn from(value: Duration) -> Self {
        value.to_std()
    }
}

/// Why a duration string was refused; the messages are Go's, word for word.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationParseError {
    #[error("time: invalid duration {}", go_quote(.0))]
    Invalid(String),
    #[error("time: missing unit in duration {}", go_quote(.0))]
    MissingUnit(String),
    #[error("time: unknown unit {} in duration {}", go_quote(.unit), go_quote(.input))]
    UnknownUnit { unit: String, input: String },
}

impl FromStr for Duration {
    type Err = DurationParseError;

    fn from_str(input: &str) -> Result<Self, Self::Err> {
        parse(input)
    }
}

fn unit_nanos(unit: &str) -> Option<u64> {
    Some(match unit {
        "ns" => NANOSECOND,
        // Go accepts the ASCII spelling and both Unicode micro signs (U+00B5, U+03BC).
        "us" | "\u{b5}s" | "\u{3bc}s" => MICROSECOND,
        "ms" => MILLISECOND,
        "s" => SECOND,
        "m" => MINUTE,
        "h" => HOUR,
        _ => return None,
    })
}

fn parse(input: &str) -> Result<Duration, DurationParseError> {
    let invalid = || DurationParseError::Invalid(input.to_owned());
    let mut rest = input.as_bytes();
    let mut negative = false;
    if let Some((&sign @ (b'-' | b'+'), tail)) = rest.split_first() {
        negative = sign == b'-';
        rest = tail;
    }
    // A bare zero is the one unit-less form Go allows.
    if rest == b"0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(invalid());
    }

    let mut total: u64 = 0;
    while !rest.is_empty() {
        if !(rest[0] == b'.' || rest[0].is_ascii_digit()) {
            return Err(invalid());
        }
        let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
        let whole = leading_int(&rest[..digits]).ok_or_else(invalid)?;
        let had_whole = digits > 0;
        rest = &rest[digits..];

        let mut fraction: u64 = 0;
        let mut scale: f64 = 1.0;
        let mut had_fraction = false;
        if rest.first() == Some(&b'.') {
            rest = &rest[1..];
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            (fraction, scale) = leading_fraction(&rest[..digits]);
            had_fraction = digits > 0;
            rest = &rest[digits..];
        }
        if !had_whole && !had_fraction {
            return Err(invalid());
        }

        let unit_len = rest
            .iter()
            .take_while(|b| !(**b == b'.' || b.is_ascii_digit()))
            .count();
        if unit_len == 0 {
            return Err(DurationParseError::MissingUnit(input.to_owned()));
        }
        // The unit ends at an ASCII byte or at the end, so it is a whole UTF-8 slice.
        let unit = std::str::from_utf8(&rest[..unit_len]).map_err(|_| invalid())?;
        rest = &rest[unit_len..];
        let Some(unit_ns) = unit_nanos(unit) else {
            return Err(DurationParseError::UnknownUnit {
                unit: unit.to_owned(),
                input: input.to_owned(),
            });
        };

        if whole > LIMIT / unit_ns {
            return Err(invalid());
        }
        let mut value = whole * unit_ns;
        if fraction > 0 {
            // Same float arithmetic as Go, so rounding of long fractions matches.
            value += (fraction as f64 * (unit_ns as f64 / scale)) as u64;
            if value > LIMIT {
                return Err(invalid());
            }
        }
        total += value;
        if total > LIMIT {
            return Err(invalid());
        }
    }

    if negative {
        // `total` may be exactly 2^63, which is i64::MIN.
        return Ok(Duration((total as i64).wrapping_neg()));
    }
    if total > LIMIT - 1 {
        return Err(invalid());
    }
    Ok(Duration(total as i64))
}

/// Whole-number part; `None` on overflow past 2^63.
fn leading_int(digits: &[u8]) -> Option<u64> {
    let mut value: u64 = 0;
    for &digit in digits {
        if value > LIMIT / 10 {
            return None;
        }
        value = value * 10 + u64::from(digit - b'0');
        if value > LIMIT {
            return None;
        }
    }
    Some(value)
}

/// Fractional digits as (numerator, 10^count); digits beyond 63-bit precision are dropped,
/// as Go does.
fn leading_fraction(digits: &[u8]) -> (u64, f64) {
    let mut value: u64 = 0;
    let mut scale = 1.0;
    let mut overflow = false;
    for &digit in digits {
        if overflow {
            continue;
        }
        if value > (LIMIT - 1) / 10 {
            overflow = true;
            continue;
        }
        let next = value * 10 + u64::from(digit - b'0');
        if next > LIMIT {
            overflow = true;
            continue;
        }
        value = next;
        scale *= 10.0;
    }
    (value, scale)
}

impl fmt::Display for Duration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut magnitude = self.0.unsigned_abs();
        let sign = if self.0 < 0 { "-" } else { "" };
        if magnitude == 0 {
            return f.write_str("0s");
        }
        if magnitude < SECOND {
            let (unit, precision) = match magnitude {
                m if m < MICROSECOND => ("ns", 0),
                m if m < MILLISECOND => ("\u{b5}s", 3),
                _ => ("ms", 6),
            };
            let (whole, fraction) = split_fraction(magnitude, precision);
            return write!(f, "{sign}{whole}{fraction}{unit}");
        }
        let (whole_secs, fraction) = split_fraction(magnitude, 9);
        magnitude = whole_secs;
        let secs = magnitude % 60;
        let mins_total = magnitude / 60;
        if mins_total == 0 {
            return write!(f, "{sign}{secs}{fraction}s");
        }
        let mins = mins_total % 60;
        let hours = mins_total / 60;
        if hours == 0 {
            return write!(f, "{sign}{mins}m{secs}{fraction}s");
        }
        write!(f, "{sign}{hours}h{mins}m{secs}{fraction}s")
    }
}

/// Splits `value` into `value / 10^precision` and the fractional digits as ".ddd" with
/// trailing zeros removed (empty when the fraction is zero), like Go's `fmtFrac`.
fn split_fraction(value: u64, precision: u32) -> (u64, String) {
    let divisor = 10u64.pow(precision);
    let fraction = value % divisor;
    if fraction == 0 {
        return (value / divisor, String::new());
    }
    let digits = format!("{fraction:0width$}", width = precision as usize);
    (
        value / divisor,
        format!(".{}", digits.trim_end_matches('0')),
    )
}

impl Serialize for Duration {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Duration {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_str(DurationVisitor)
    }
}

struct DurationVisitor;

impl Visitor<'_> for DurationVisitor {
    type Value = Duration;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a duration string such as \"30s\" or \"1m30s\"")
    }

    fn visit_str<E: de::Error>(self, value: &str) -> Result<Duration, E> {
        value.parse().map_err(E::custom)
    }
}

/// Deserializes `logging.flushFrequency`, which upstream accepts either as a duration
/// string or as an integer count of nanoseconds.
pub(crate) fn deserialize_string_or_nanos<'de, D: Deserializer<'de>>(
    deserializer: D,
) -> Result<Duration, D::Error> {
    struct StringOrNanos;

    impl Visitor<'_> for StringOrNanos {
        type Value = Duration;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a duration string such as \"5s\" or an integer number of nanoseconds")
        }

        fn visit_str<E: de::Error>(self, value: &str) -> Result<Duration, E> {
            value.parse().map_err(E::custom)
        }

        fn visit_i64<E: de::Error>(self, value: i64) -> Result<Duration, E> {
            Ok(Duration(value))
        }

        fn visit_u64<E: de::Error>(self, value: u64) -> Result<Duration, E> {
            i64::try_from(value)
                .map(Duration)
                .map_err(|_| E::custom("duration out of range"))
        }
    }

    deserializer.deserialize_any(StringOrNanos)
}

/// Go's `strconv.Quote` for the characters that show up in configuration values.
pub(crate) fn go_quote(value: &str) -> String {
    let mut quoted = String::with_capacity(value.len() + 2);
    quoted.push('"');
    for c in value.chars() {
        match c {
            '"' => quoted.push_str("\\\""),
            '\\' => quoted.push_str("\\\\"),
            '\u{7}' => quoted.push_str("\\a"),
            '\u{8}' => quoted.push_str("\\b"),
            '\u{c}' => quoted.push_str("\\f"),
            '\n' => quoted.push_str("\\n"),
            '\r' => quoted.push_str("\\r"),
            '\t' => quoted.push_str("\\t"),
            '\u{b}' => quoted.push_str("\\v"),
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                quoted.push_str(&format!("\\x{:02x}", c as u32));
            }
            c if c.is_control() => quoted.push_str(&format!("\\u{:04x}", c as u32)),
            c => quoted.push(c),
        }
    }
    quoted.push('"');
    quoted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ns(s: &str) -> i64 {
        s.parse::<Duration>().unwrap().as_nanos()
    }

    #[test]
    fn parses_go_forms() {
        assert_eq!(ns("0"), 0);
        assert_eq!(ns("0s"), 0);
        assert_eq!(ns("-0"), 0);
        assert_eq!(ns("+0"), 0);
        assert_eq!(ns("1s"), 1_000_000_000);
        assert_eq!(ns("250ms"), 250_000_000);
        assert_eq!(ns("1m30s"), 90_000_000_000);
        assert_eq!(ns("2h22m"), (2 * 3600 + 22 * 60) * 1_000_000_000);
        assert_eq!(ns("1h0m0s"), 3_600_000_000_000);
        assert_eq!(ns("24h0m0s"), 86_400_000_000_000);
        assert_eq!(ns("1.5h"), 5_400_000_000_000);
        assert_eq!(ns(".5s"), 500_000_000);
        assert_eq!(ns("1.s"), 1_000_000_000);
        assert_eq!(ns("-1.5m"), -90_000_000_000);
        assert_eq!(ns("+3s"), 3_000_000_000);
        assert_eq!(ns("10ns"), 10);
        assert_eq!(ns("7us"), 7_000);
        assert_eq!(ns("7\u{b5}s"), 7_000);
        assert_eq!(ns("7\u{3bc}s"), 7_000);
        assert_eq!(ns("1h1m1s1ms1us1ns"), 3_661_001_001_001);
        assert_eq!(ns("300s"), 300_000_000_000);
        // Units may repeat and need not be ordered, as in Go.
        assert_eq!(ns("1s1s"), 2_000_000_000);
        assert_eq!(ns("1s1h"), 3_601_000_000_000);
        // The extremes of the range.
        assert_eq!(ns("9223372036854775807ns"), i64::MAX);
        assert_eq!(ns("-9223372036854775808ns"), i64::MIN);
        // Digits past 63-bit precision are dropped rather than rejected.
        assert_eq!(ns("1.0000000000000000000000000s"), 1_000_000_000);
    }

    #[test]
    fn rejects_what_go_rejects_with_go_messages() {
        let err = |s: &str| s.parse::<Duration>().unwrap_err().to_string();
        assert_eq!(err(""), r#"time: invalid duration """#);
        assert_eq!(err("-"), r#"time: invalid duration "-""#);
        assert_eq!(err("s"), r#"time: invalid duration "s""#);
        assert_eq!(err("."), r#"time: invalid duration ".""#);
        assert_eq!(err(".s"), r#"time: invalid duration ".s""#);
        assert_eq!(err("1"), r#"time: missing unit in duration "1""#);
        assert_eq!(err("30"), r#"time: missing unit in duration "30""#);
        assert_eq!(err("1.5"), r#"time: missing unit in duration "1.5""#);
        assert_eq!(err("1d"), r#"time: unknown unit "d" in duration "1d""#);
        assert_eq!(
            err("1sec"),
            r#"time: unknown unit "sec" in duration "1sec""#
        );
        assert_eq!(err("1 s"), r#"time: unknown unit " s" in duration "1 s""#);
        assert_eq!(err(" 1s"), r#"time: invalid duration " 1s""#);
        assert_eq!(err("1S"), r#"time: unknown unit "S" in duration "1S""#);
        assert_eq!(err("--1s"), r#"time: invalid duration "--1s""#);
        assert_eq!(
            err("9223372036854775808ns"),
            r#"time: invalid duration "9223372036854775808ns""#
        );
        assert_eq!(err("3000000h"), r#"time: invalid duration "3000000h""#);
        assert_eq!(
            err("1s-1s"),
            r#"time: unknown unit "s-" in duration "1s-1s""#
        );
    }

    #[test]
    fn formats_like_go_duration_string() {
        let fmt = |nanos: i64| Duration::from_nanos(nanos).to_string();
        assert_eq!(fmt(0), "0s");
        assert_eq!(fmt(1), "1ns");
        assert_eq!(fmt(1_100), "1.1\u{b5}s");
        assert_eq!(fmt(2_200_000), "2.2ms");
        assert_eq!(fmt(250_000_000), "250ms");
        assert_eq!(fmt(1_000_000_000), "1s");
        assert_eq!(fmt(1_500_000_000), "1.5s");
        assert_eq!(fmt(30_000_000_000), "30s");
        assert_eq!(fmt(90_000_000_000), "1m30s");
        assert_eq!(fmt(61_500_000_000), "1m1.5s");
        assert_eq!(fmt(900_000_000_000), "15m0s");
        assert_eq!(fmt(3_600_000_000_000), "1h0m0s");
        assert_eq!(fmt(86_400_000_000_000), "24h0m0s");
        assert_eq!(fmt((2 * 3600 + 22 * 60) * 1_000_000_000), "2h22m0s");
        assert_eq!(fmt(-1_000_000_000), "-1s");
        assert_eq!(fmt(-90_000_000_000), "-1m30s");
        assert_eq!(fmt(i64::MAX), "2562047h47m16.854775807s");
        assert_eq!(fmt(i64::MIN), "-2562047h47m16.854775808s");
    }

    #[test]
    fn printed_form_parses_back_to_the_same_value() {
        for nanos in [
            0,
            1,
            999,
            1_000,
            1_234_567,
            999_999_999,
            1_000_000_001,
            59_999_999_999,
            i64::MAX,
            -42_000,
            i64::MIN,
        ] {
            let printed = Duration::from_nanos(nanos).to_string();
            assert_eq!(
                printed.parse::<Duration>().unwrap().as_nanos(),
                nanos,
                "{printed}"
            );
        }
    }

    #[test]
    fn serde_uses_the_string_form_only() {
        let value: Duration = serde_json::from_str(r#""1m30s""#).unwrap();
        assert_eq!(value, Duration::from_secs(90));
        assert_eq!(
            serde_json::to_string(&Duration::from_hours(24)).unwrap(),
            r#""24h0m0s""#
        );
        // metav1.Duration refuses numbers; so do we.
        assert!(serde_json::from_str::<Duration>("30").is_err());
        let err = serde_json::from_str::<Duration>(r#""30""#)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(r#"time: missing unit in duration "30""#),
            "{err}"
        );
    }

    #[test]
    fn converts_to_std() {
        assert_eq!(
            Duration::from_millis(250).to_std(),
            std::time::Duration::from_millis(250)
        );
        assert_eq!(Duration::from_secs(-3).to_std(), std::time::Duration::ZERO);
        assert_eq!(
            Duration::from_std(std::time::Duration::from_secs(15)),
            Some(Duration::from_secs(15))
        );
        assert_eq!(Duration::from_std(std::time::Duration::MAX), None);
    }

    #[test]
    fn quotes_like_go() {
        assert_eq!(go_quote("a\"b\\c\n\u{1}"), r#""a\"b\\c\n\x01""#);
        assert_eq!(go_quote("µs"), "\"µs\"");
    }
}
