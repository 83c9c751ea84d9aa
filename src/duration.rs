//! The one duration grammar of the project, in resources and on the command line: Go's `time.ParseDuration`,
//! which Kubernetes uses for its own durations and the CRDs' CEL rules use in `duration(self)`. So `0`, `250ms`,
//! `10s`, `1m30s`, `1.5s`, `300us` and `2h45m` mean here what they mean to the API server that admitted them.
//!
//! Hand-written because no maintained crate parses exactly this grammar: `go-parse-duration` 0.1 checks
//! overflow against `1 << 62` (Rust's `1 << 63 - 1`) and panics on `1µs`, `go-duration` 0.2 refuses a bare `0`,
//! and humantime's grammar is another one (spaces, `sec`, `min`, days, weeks, months, years). This follows Go's
//! algorithm step by step, including how a fraction is scaled, and its tests carry Go's own cases.

use std::time::Duration;

/// What the CRD schemas accept: Go's grammar, spelled as a regular expression (`0`, or numbers with a unit, an
/// optional sign first). Parsing below accepts the same strings, less the negative ones and those too long for
/// Go's 64-bit nanoseconds, which the fields' CEL rules refuse too.
pub const PATTERN: &str = r"^[-+]?(0|(([0-9]+(\.[0-9]*)?|\.[0-9]+)(ns|us|µs|μs|ms|s|m|h))+)$";

/// The units Go knows, in nanoseconds.
const UNITS: [(&str, u64); 8] = [
    ("ns", 1),
    ("us", 1_000),
    ("µs", 1_000), // U+00B5, the micro sign
    ("μs", 1_000), // U+03BC, the Greek letter mu
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Go's durations are signed 64-bit nanoseconds: nothing longer (about 292 years) exists there.
const MAX_NANOS: u64 = i64::MAX as u64;

/// Why a text is not a duration here.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    /// Not in the grammar, or negative; the message says which and how.
    #[error("{0}")]
    Invalid(String),
    /// In the grammar, but longer than any duration Go (and so the API server) has.
    #[error("`{0}`: too long (at most 2562047h47m16.854775807s, about 292 years)")]
    TooLong(String),
}

/// Parses a duration the way Go's `time.ParseDuration` does. Negative durations are refused: every duration of
/// this project (a TTL, a timeout, a margin, a wait) is a length of time.
pub fn parse(text: &str) -> Result<Duration, ParseError> {
    let (negative, nanos) = parse_go(text)?;
    if negative && nanos > 0 {
        return Err(ParseError::Invalid(format!(
            "`{text}`: a duration here cannot be negative"
        )));
    }
    if nanos > MAX_NANOS {
        return Err(too_long(text));
    }
    Ok(Duration::from_nanos(nanos))
}

/// Go's `ParseDuration` up to the sign: whether the text is negative, and its size in nanoseconds (at most
/// 2^63, which only a negative duration may reach).
fn parse_go(text: &str) -> Result<(bool, u64), ParseError> {
    let not_a_duration = || {
        ParseError::Invalid(format!(
            "`{text}` is not a duration like 0, 250ms, 10s, 1m30s or 1.5h"
        ))
    };
    let (negative, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (true, &text[1..]),
        Some(b'+') => (false, &text[1..]),
        _ => (false, text),
    };
    // The one number without a unit.
    if rest == "0" {
        return Ok((negative, 0));
    }
    if rest.is_empty() {
        return Err(not_a_duration());
    }
    const LIMIT: u64 = 1 << 63;
    // Past 2^63: kept on with `LIMIT + 1` to the end of the text, so that one not in the grammar is called that
    // (as the schema's pattern calls it) rather than too long.
    let mut total: u64 = 0;
    while !rest.is_empty() {
        if !rest.starts_with(|c: char| c == '.' || c.is_ascii_digit()) {
            return Err(not_a_duration());
        }
        let (whole, after_whole) = leading_int(rest);
        let whole = whole.unwrap_or(LIMIT + 1);
        let has_whole = after_whole.len() != rest.len();
        rest = after_whole;
        let (mut fraction, mut scale, mut has_fraction) = (0, 1.0, false);
        if let Some(after_dot) = rest.strip_prefix('.') {
            let (digits, digits_scale, after_fraction) = leading_fraction(after_dot);
            has_fraction = after_fraction.len() != after_dot.len();
            (fraction, scale, rest) = (digits, digits_scale, after_fraction);
        }
        if !has_whole && !has_fraction {
            return Err(not_a_duration());
        }
        let unit_len = rest
            .find(|c: char| c == '.' || c.is_ascii_digit())
            .unwrap_or(rest.len());
        let (unit, after_unit) = rest.split_at(unit_len);
        rest = after_unit;
        if unit.is_empty() {
            return Err(ParseError::Invalid(format!(
                "`{text}`: a number needs a unit (ns, us, ms, s, m or h); only 0 goes without"
            )));
        }
        let Some(&(_, unit_nanos)) = UNITS.iter().find(|(name, _)| *name == unit) else {
            return Err(ParseError::Invalid(format!(
                "`{text}`: unknown unit `{unit}`; the units are ns, us (or µs), ms, s, m and h"
            )));
        };
        let mut part = whole
            .checked_mul(unit_nanos)
            .filter(|part| *part <= LIMIT)
            .unwrap_or(LIMIT + 1);
        if fraction > 0 {
            // As Go does it: a float64 is exact enough to the nanosecond for fractions of an hour, and truncating
            // its product is what makes `1.0000000001s` one second here and in the API server alike.
            let fraction_nanos = (fraction as f64 * (unit_nanos as f64 / scale)) as u64;
            part = part.saturating_add(fraction_nanos);
        }
        total = total.saturating_add(part).min(LIMIT + 1);
    }
    if total > LIMIT {
        return Err(too_long(text));
    }
    Ok((negative, total))
}

/// Go's `leadingInt`: the leading digits of `text` as a number (`None` past 2^63), and what follows them.
fn leading_int(text: &str) -> (Option<u64>, &str) {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let mut value = Some(0u64);
    for digit in text[..digits].bytes() {
        value = value
            .and_then(|value| value.checked_mul(10))
            .and_then(|value| value.checked_add(u64::from(digit - b'0')))
            .filter(|value| *value <= 1 << 63);
    }
    (value, &text[digits..])
}

/// Go's `leadingFraction`: the digits after the point as a number and the power of ten that scales it, and what
/// follows them. Digits past what 2^63 holds are consumed but add no precision.
fn leading_fraction(text: &str) -> (u64, f64, &str) {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (mut value, mut scale, mut overflow) = (0u64, 1.0f64, false);
    for digit in text[..digits].bytes() {
        if overflow {
            continue;
        }
        match value
            .checked_mul(10)
            .and_then(|value| value.checked_add(u64::from(digit - b'0')))
            .filter(|value| *value <= 1 << 63)
        {
            Some(next) => {
                value = next;
                scale *= 10.0;
            }
            None => overflow = true,
        }
    }
    (value, scale, &text[digits..])
}

fn too_long(text: &str) -> ParseError {
    ParseError::TooLong(text.to_owned())
}

/// Whether `duration` is a whole number of milliseconds, as a Redis TTL must be (`PX`): Go's grammar reaches down
/// to nanoseconds.
pub fn is_whole_millis(duration: Duration) -> bool {
    duration.subsec_nanos().is_multiple_of(1_000_000)
}

/// The canonical text for a duration, used in status and messages: whole seconds, or else whole milliseconds,
/// microseconds or nanoseconds, whichever is exact. It parses back to the same duration.
pub fn format(duration: Duration) -> String {
    let nanos = duration.as_nanos();
    if nanos.is_multiple_of(1_000_000_000) {
        format!("{}s", nanos / 1_000_000_000)
    } else if nanos.is_multiple_of(1_000_000) {
        format!("{}ms", nanos / 1_000_000)
    } else if nanos.is_multiple_of(1_000) {
        format!("{}us", nanos / 1_000)
    } else {
        format!("{nanos}ns")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NS: u64 = 1;
    const US: u64 = 1_000;
    const MS: u64 = 1_000_000;
    const S: u64 = 1_000_000_000;
    const M: u64 = 60 * S;
    const H: u64 = 60 * M;

    fn nanos(text: &str) -> Result<u64, ParseError> {
        parse(text).map(|duration| u64::try_from(duration.as_nanos()).unwrap())
    }

    #[test]
    fn every_spelling_the_help_texts_and_readme_show() {
        for (text, expected) in [
            ("0", 0),
            ("0s", 0),
            ("50ms", 50 * MS),
            ("250ms", 250 * MS),
            ("1s", S),
            ("3s", 3 * S),
            ("4s", 4 * S),
            ("5s", 5 * S),
            ("10s", 10 * S),
            ("60s", 60 * S),
            ("1m30s", 90 * S),
            ("1.5s", 1500 * MS),
            ("300us", 300 * US),
            ("2h45m", 2 * H + 45 * M),
            ("1h0m0s", H),
            ("1m", M),
            ("1h", H),
            ("24h", 24 * H),
        ] {
            assert_eq!(nanos(text), Ok(expected), "{text}");
        }
    }

    /// Go's own table (`time.TestParseDuration`), the negative cases refused here instead.
    #[test]
    fn go_grammar() {
        for (text, expected) in [
            // simple
            ("0", 0),
            ("5s", 5 * S),
            ("30s", 30 * S),
            ("1478s", 1478 * S),
            // sign
            ("+5s", 5 * S),
            ("-0", 0),
            ("+0", 0),
            // decimal
            ("5.0s", 5 * S),
            ("5.6s", 5 * S + 600 * MS),
            ("5.s", 5 * S),
            (".5s", 500 * MS),
            ("1.0s", S),
            ("1.00s", S),
            ("1.004s", S + 4 * MS),
            ("1.0040s", S + 4 * MS),
            ("100.00100s", 100 * S + MS),
            // different units
            ("10ns", 10 * NS),
            ("11us", 11 * US),
            ("12µs", 12 * US),
            ("12μs", 12 * US),
            ("13ms", 13 * MS),
            ("14s", 14 * S),
            ("15m", 15 * M),
            ("16h", 16 * H),
            // composite
            ("3h30m", 3 * H + 30 * M),
            ("10.5s4m", 4 * M + 10 * S + 500 * MS),
            ("1h2m3s4ms5us6ns", H + 2 * M + 3 * S + 4 * MS + 5 * US + 6 * NS),
            ("39h9m14.425s", 39 * H + 9 * M + 14 * S + 425 * MS),
            ("1s1s", 2 * S),
            // large value
            ("52763797000ns", 52763797000 * NS),
            // more than 9 digits after the point, as Go truncates them
            ("0.3333333333333333333h", 20 * M),
            ("1.0000000001s", S),
            // 9007199254740993 = 1<<53 + 1 cannot be stored precisely in a float64
            ("9007199254740993ns", (1 << 53) + 1),
            // the largest duration that can be represented by int64 in nanoseconds
            ("9223372036854775807ns", (1 << 63) - 1),
            ("9223372036854775.807us", (1 << 63) - 1),
            ("9223372036s854ms775us807ns", (1 << 63) - 1),
            // huge string; Go issue 15011
            ("0.100000000000000000000h", 6 * M),
            // this value tests the first overflow check in leadingFraction
            ("0.830103483285477580700h", 49 * M + 48 * S + 372539827 * NS),
        ] {
            assert_eq!(nanos(text), Ok(expected), "{text}");
        }
        for bad in [
            "",
            "3",
            "-",
            "s",
            ".",
            "-.",
            ".s",
            "+.s",
            "1d",
            "\u{85}\u{85}",
            "\u{ffff}",
            "hello \u{ffff} world",
            "10 s",
            " 10s",
            "10s ",
            "10sec",
            "1m-30s",
            "00",
            "9223372036854775808ns",
            "9223372036854775.808us",
            "9223372036s854ms775us808ns",
            "2562048h",
            "99999999999999999999s",
            // Go's sum wraps around to 0 here (2^63 + 2^63 in a uint64): too long for anything meant.
            "9223372036854775808ns9223372036854775808ns",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} parsed as {:?}", parse(bad));
        }
    }

    #[test]
    fn negative_durations_are_refused_with_a_reason() {
        for negative in ["-1s", "-1ns", "-1.5h", "-9223372036854775808ns"] {
            let err = parse(negative).unwrap_err().to_string();
            assert!(err.contains("cannot be negative"), "{negative}: {err}");
        }
    }

    #[test]
    fn errors_say_what_is_wrong() {
        let message = |text| parse(text).unwrap_err().to_string();
        assert!(message("10").contains("needs a unit"));
        assert!(message("10sec").contains("unknown unit `sec`"));
        assert!(message("2562048h").contains("too long"));
        assert_eq!(parse("2562048h"), Err(ParseError::TooLong("2562048h".into())));
        assert!(message("soon").contains("not a duration"));
    }

    /// Found by the fuzz tests: a number too large for Go was called too long before the rest of the text was
    /// read, so a text the schema's pattern refuses (no unit, an unknown one, a stray character after it) got the
    /// range message instead of what is wrong with it.
    #[test]
    fn a_text_outside_the_grammar_is_invalid_however_large_its_numbers() {
        for text in [
            "99999999999999999999",
            "99999999999999999999x",
            "99999999999999999999s1d",
            "9223372036854775808ns-",
            "2562048h ",
            "2562048h1",
            "1.5h99999999999999999999",
        ] {
            assert!(
                matches!(parse(text), Err(ParseError::Invalid(_))),
                "{text:?}: {:?}",
                parse(text)
            );
        }
        for text in [
            "99999999999999999999s",
            "2562048h",
            "9223372036854775807ns1ns",
            "1s99999999999999999999h",
        ] {
            assert_eq!(parse(text), Err(ParseError::TooLong(text.into())), "{text:?}");
        }
    }

    /// The schema's pattern and the parser take the same strings (less those too long for 64-bit nanoseconds,
    /// which the CEL rules' `duration()` refuses at admission): every string of up to five characters over an
    /// alphabet with each character the grammar gives a meaning to. Rust's regex crate has the syntax and
    /// semantics of Go's regexp, which the API server checks `pattern` with.
    #[test]
    fn the_schema_pattern_takes_what_the_parser_takes() {
        let pattern = regex::Regex::new(PATTERN).unwrap();
        let alphabet = [
            "0", "7", ".", "-", "+", "n", "u", "µ", "μ", "m", "s", "h", "d", " ",
        ];
        let mut texts = vec![String::new()];
        let mut checked = 0;
        for _ in 0..5 {
            let mut longer = Vec::new();
            for text in &texts {
                for c in alphabet {
                    let text = format!("{text}{c}");
                    let parsed = parse_go(&text);
                    assert_eq!(
                        pattern.is_match(&text),
                        parsed.is_ok(),
                        "{text:?}: pattern and parser disagree ({parsed:?})"
                    );
                    checked += 1;
                    longer.push(text);
                }
            }
            texts = longer;
        }
        assert!(checked > 500_000);
        assert!(pattern.is_match("9223372036854775808ns") && parse("9223372036854775808ns").is_err());
    }

    #[test]
    fn format_is_exact_and_parses_back() {
        for (duration, text) in [
            (Duration::ZERO, "0s"),
            (Duration::from_secs(10), "10s"),
            (Duration::from_millis(1500), "1500ms"),
            (Duration::from_micros(300), "300us"),
            (Duration::from_nanos(1_000_001), "1000001ns"),
        ] {
            assert_eq!(format(duration), text);
            assert_eq!(parse(text), Ok(duration));
        }
    }

    #[test]
    fn every_duration_field_of_the_crds_has_this_grammar() {
        use kube::CustomResourceExt;
        let crds = serde_json::to_value([crate::api::DistributedLock::crd(), crate::api::RedisQuorum::crd()])
            .unwrap();
        let mut patterns = Vec::new();
        let mut stack = vec![&crds];
        while let Some(value) = stack.pop() {
            match value {
                serde_json::Value::Object(map) => {
                    if let Some(pattern) = map.get("pattern").and_then(|pattern| pattern.as_str())
                        && pattern.contains("ms|s|m|h")
                    {
                        patterns.push(pattern);
                    }
                    stack.extend(map.values());
                }
                serde_json::Value::Array(items) => stack.extend(items),
                _ => {}
            }
        }
        assert_eq!(
            patterns.len(),
            7,
            "ttl, two fence margins, nodeTimeout, maxTtl, delayMin, delayMax"
        );
        for pattern in patterns {
            assert_eq!(pattern, PATTERN);
        }
    }

    /// The chart's values take the RedisQuorum's durations as the CRD does (its alert thresholds are Prometheus
    /// durations, a grammar of their own).
    #[test]
    fn the_charts_quorum_durations_have_this_grammar() {
        let path = concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/charts/redlock-operator/values.schema.json"
        );
        let schema: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(schema["definitions"]["goDuration"]["pattern"], PATTERN);
        for field in ["maxTtl", "nodeTimeout"] {
            assert_eq!(
                schema["properties"]["quorum"]["properties"][field]["$ref"],
                "#/definitions/goDuration"
            );
        }
    }
}
