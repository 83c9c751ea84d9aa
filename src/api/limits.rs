//! The ranges of the duration fields. The schema checks them with CEL at admission; the controllers check them
//! again, because an object admitted before a bound existed (or written where CEL does not run) reaches them
//! too, and must become a condition rather than an overflow.

use std::time::Duration;

use crate::duration;

/// A duration field's inclusive range, and the CEL rule text the schema carries for it.
#[derive(Clone, Copy, Debug)]
pub struct DurationRange {
    /// The field's path in the spec, for messages.
    pub field: &'static str,
    pub min: &'static str,
    pub max: &'static str,
}

pub const LOCK_TTL: DurationRange = DurationRange::new("spec.ttl", "100ms", "1h");
pub const NODE_TIMEOUT: DurationRange = DurationRange::new("spec.nodeTimeout", "1ms", "10s");
pub const MAX_TTL: DurationRange = DurationRange::new("spec.maxTtl", "100ms", "24h");
pub const RETRY_DELAY_MIN: DurationRange = DurationRange::new("spec.retry.delayMin", "0ms", "1m");
pub const RETRY_DELAY_MAX: DurationRange = DurationRange::new("spec.retry.delayMax", "0ms", "1m");

/// Every range, for the test that compares them with the CRDs.
pub const ALL: [DurationRange; 5] = [LOCK_TTL, NODE_TIMEOUT, MAX_TTL, RETRY_DELAY_MIN, RETRY_DELAY_MAX];

impl DurationRange {
    const fn new(field: &'static str, min: &'static str, max: &'static str) -> Self {
        Self { field, min, max }
    }

    /// Parses `text` and checks it is in range; the error names the field and the range.
    pub fn parse(&self, text: &str) -> Result<Duration, String> {
        let field = self.field;
        let out_of_range = || {
            format!(
                "{field} must be between {} and {}, got {text}",
                self.min, self.max
            )
        };
        let value = match duration::parse(text) {
            Ok(value) => value,
            // Longer than any duration is out of range too: the API server answers the same with the CEL rule's
            // message, its `duration()` failing on it.
            Err(duration::ParseError::TooLong(_)) => return Err(out_of_range()),
            Err(err) => return Err(format!("{field}: {err}")),
        };
        let bound = |limit: &str| duration::parse(limit).unwrap_or(Duration::ZERO);
        if value < bound(self.min) || value > bound(self.max) {
            return Err(out_of_range());
        }
        Ok(value)
    }

    /// The message of the CEL rule the schema carries for this field.
    pub fn message(&self) -> String {
        let name = self.field.rsplit('.').next().unwrap_or(self.field);
        format!("{name} must be between {} and {}", self.min, self.max)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_crds_carry_the_same_ranges_as_the_code() {
        use kube::CustomResourceExt;
        let crds =
            serde_json::to_string(&[crate::api::DistributedLock::crd(), crate::api::RedisQuorum::crd()])
                .unwrap();
        for range in ALL {
            let rule = format!(
                "duration(self) >= duration('{}') && duration(self) <= duration('{}')",
                range.min, range.max
            );
            assert!(crds.contains(&rule), "{}: no rule {rule}", range.field);
            assert!(
                crds.contains(&range.message()),
                "{}: no message {}",
                range.field,
                range.message()
            );
            assert!(duration::parse(range.min).is_ok() && duration::parse(range.max).is_ok());
        }
    }

    #[test]
    fn out_of_range_values_name_the_field_and_the_range() {
        assert_eq!(MAX_TTL.parse("60s"), Ok(Duration::from_secs(60)));
        for bad in ["100000000h", "0s", "25h", "99999999999999999999999h", "forever"] {
            let err = MAX_TTL.parse(bad).unwrap_err();
            assert!(err.starts_with("spec.maxTtl"), "{bad}: {err}");
        }
        // Longer than any duration, as the API server's rule message says of it too.
        for too_long in ["25h", "100000000h", "99999999999999999999999h"] {
            assert!(
                MAX_TTL
                    .parse(too_long)
                    .unwrap_err()
                    .contains("between 100ms and 24h"),
                "{too_long}"
            );
        }
    }
}
