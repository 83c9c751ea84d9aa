//! The one duration grammar of the project, in resources and on the command line: `10s`, `1m30s`, `250ms`, like
//! Kubernetes' own (whole numbers of ms, s, m and h). The CRD schemas check the same pattern.

use std::time::Duration;

/// What the schema accepts; parsing below accepts exactly the same.
pub const PATTERN: &str = r"^([0-9]+(ms|s|m|h))+$";

pub fn parse(text: &str) -> Result<Duration, String> {
    let mut total = Duration::ZERO;
    let mut rest = text.trim();
    if rest.is_empty() {
        return Err("empty duration".into());
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(format!("`{text}` is not a duration like 10s, 1m30s or 250ms"));
        }
        let value: u64 = rest[..digits]
            .parse()
            .map_err(|_| format!("`{text}`: number too large"))?;
        rest = &rest[digits..];
        let (unit, millis) = if let Some(tail) = rest.strip_prefix("ms") {
            (tail, 1)
        } else if let Some(tail) = rest.strip_prefix('s') {
            (tail, 1_000)
        } else if let Some(tail) = rest.strip_prefix('m') {
            (tail, 60_000)
        } else if let Some(tail) = rest.strip_prefix('h') {
            (tail, 3_600_000)
        } else {
            return Err(format!("`{text}`: unit must be ms, s, m or h"));
        };
        rest = unit;
        let part = value
            .checked_mul(millis)
            .ok_or_else(|| format!("`{text}`: too long"))?;
        total = total
            .checked_add(Duration::from_millis(part))
            .ok_or_else(|| format!("`{text}`: too long"))?;
    }
    Ok(total)
}

/// The canonical text for a duration (whole milliseconds), used in status.
pub fn format(duration: Duration) -> String {
    let millis = duration.as_millis();
    if millis.is_multiple_of(1_000) {
        format!("{}s", millis / 1_000)
    } else {
        format!("{millis}ms")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_kubernetes_style_durations() {
        assert_eq!(parse("10s"), Ok(Duration::from_secs(10)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse("1h"), Ok(Duration::from_secs(3600)));
        for bad in [
            "",
            "10",
            "s",
            "10 s",
            "1.5s",
            "-1s",
            "10sec",
            "99999999999999999999s",
        ] {
            assert!(parse(bad).is_err(), "{bad}");
        }
        assert_eq!(format(Duration::from_millis(1500)), "1500ms");
        assert_eq!(format(Duration::from_secs(10)), "10s");
    }

    #[test]
    fn every_duration_field_of_the_crds_has_this_grammar() {
        use kube::CustomResourceExt;
        let crds =
            serde_json::to_string(&[crate::api::DistributedLock::crd(), crate::api::RedisQuorum::crd()])
                .unwrap();
        let patterns: Vec<&str> = crds
            .split("\"pattern\":\"")
            .skip(1)
            .filter_map(|rest| rest.split("\",").next())
            .filter(|pattern| pattern.contains("ms|s|m|h"))
            .collect();
        assert_eq!(
            patterns.len(),
            7,
            "ttl, two fence margins, nodeTimeout, maxTtl, delayMin, delayMax"
        );
        for pattern in patterns {
            assert_eq!(pattern.replace("\\\\", "\\"), PATTERN);
        }
    }
}
