//! `RedisQuorum` spec (and the Secret contents it points to) → engine configuration, or a message for the
//! `Available` condition saying what to fix.

use crate::api::RedisQuorumSpec;
use crate::api::limits;
use crate::negative_controls::{self, Control};
use crate::redlock::{Endpoint, RedlockConfig, shortest_ttl, with_credentials};

/// What the quorum's Secrets hold, already read.
#[derive(Clone, Default)]
pub struct QuorumSecrets {
    pub username: Option<String>,
    pub password: Option<String>,
    pub ca_pem: Option<Vec<u8>>,
}

impl std::fmt::Debug for QuorumSecrets {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QuorumSecrets")
            .field("username", &self.username.as_ref().map(|_| "<redacted>"))
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("ca", &self.ca_pem.is_some())
            .finish()
    }
}

pub fn engine_config(spec: &RedisQuorumSpec, secrets: &QuorumSecrets) -> Result<RedlockConfig, String> {
    let mut endpoints = Vec::with_capacity(spec.endpoints.len());
    for raw in &spec.endpoints {
        refuse_insecure(raw)?;
        let with_credentials = add_credentials(raw, secrets)?;
        endpoints.push(Endpoint::parse(&with_credentials).map_err(|err| err.to_string())?);
    }
    let mut config = RedlockConfig::new(endpoints);
    config.node_timeout = limits::NODE_TIMEOUT.parse(&spec.node_timeout)?;
    config.max_ttl = limits::MAX_TTL.parse(&spec.max_ttl)?;
    if config.max_ttl < shortest_ttl(config.node_timeout) {
        return Err(format!(
            "maxTtl {} is shorter than ten node timeouts ({}): no lock on this quorum could be kept; raise maxTtl or lower nodeTimeout",
            spec.max_ttl,
            crate::duration::format(shortest_ttl(config.node_timeout))
        ));
    }
    // The schema's range; `contains` is also false for NaN.
    if !(0.0..=0.2).contains(&spec.drift_factor) {
        return Err(format!(
            "spec.driftFactor must be between 0 and 0.2, got {}",
            spec.drift_factor
        ));
    }
    config.drift_factor = spec.drift_factor;
    config.assume_durable = spec.assume_durable || negative_controls::active(Control::NoQuarantine);
    if let Some(retry) = &spec.retry {
        if let Some(attempts) = retry.attempts {
            config.retry.attempts = u32::try_from(attempts)
                .ok()
                .filter(|attempts| (1..=100).contains(attempts))
                .ok_or_else(|| format!("spec.retry.attempts must be between 1 and 100, got {attempts}"))?;
        }
        if let Some(min) = &retry.delay_min {
            config.retry.delay_min = limits::RETRY_DELAY_MIN.parse(min)?;
        }
        if let Some(max) = &retry.delay_max {
            config.retry.delay_max = limits::RETRY_DELAY_MAX.parse(max)?;
        }
    }
    if let Some(shared) = &spec.shared_keys {
        shared.check_prefix()?;
    }
    config.tls.ca_pem = secrets.ca_pem.clone();
    config.validate().map_err(|err| err.to_string())?;
    Ok(config)
}

/// `rediss://host#insecure` makes the Redis client skip the certificate check: anyone on the path could then
/// pose as a master, collect the AUTH password and vote. Refused rather than offered as an option, because a
/// private CA (spec.tls.caSecretName) covers self-signed masters safely.
fn refuse_insecure(raw: &str) -> Result<(), String> {
    match raw.split_once('#') {
        Some((url, "insecure")) => Err(format!(
            "endpoint {url}: #insecure would turn off the certificate check of the masters; it is refused: put the CA that signed them in the Secret named by spec.tls.caSecretName"
        )),
        Some((url, _)) => Err(format!("endpoint {url}: URLs take no #fragment")),
        None => Ok(()),
    }
}

/// Puts the Secret's credentials into an endpoint URL. The spec's own URLs never carry credentials (the schema
/// forbids it).
fn add_credentials(raw: &str, secrets: &QuorumSecrets) -> Result<String, String> {
    with_credentials(raw, secrets.username.as_deref(), secrets.password.as_deref())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(endpoints: &[&str]) -> RedisQuorumSpec {
        serde_json::from_value(serde_json::json!({ "endpoints": endpoints })).unwrap()
    }

    #[test]
    fn defaults_match_the_engine_defaults() {
        let config = engine_config(
            &spec(&["redis://a:6379", "redis://b:6379", "redis://c:6379"]),
            &QuorumSecrets::default(),
        )
        .unwrap();
        let engine_defaults = RedlockConfig::new(Vec::new());
        assert_eq!(config.node_timeout, engine_defaults.node_timeout);
        assert_eq!(config.max_ttl, engine_defaults.max_ttl);
        assert_eq!(config.drift_factor, engine_defaults.drift_factor);
        assert_eq!(config.quorum(), 2);
    }

    #[test]
    fn credentials_are_encoded_and_never_displayed() {
        let secrets = QuorumSecrets {
            username: Some("locker".into()),
            password: Some("p@ss:w/rd".into()),
            ca_pem: None,
        };
        let config = engine_config(&spec(&["rediss://a:6380"]), &secrets).unwrap();
        let endpoint = &config.endpoints[0];
        assert_eq!(endpoint.display(), "rediss://***:***@a:6380");
        assert!(endpoint.is_tls());
        let shown = format!("{secrets:?}{config:?}");
        assert!(!shown.contains("p@ss") && !shown.contains("locker"), "{shown}");
    }

    #[test]
    fn certificate_checks_cannot_be_turned_off() {
        let err = engine_config(&spec(&["rediss://a:6380#insecure"]), &QuorumSecrets::default()).unwrap_err();
        assert!(
            err.contains("#insecure would turn off the certificate check"),
            "{err}"
        );
        assert!(engine_config(&spec(&["redis://a:1#x"]), &QuorumSecrets::default()).is_err());
    }

    #[test]
    fn bad_values_say_which_field_to_fix() {
        let mut bad = spec(&["redis://a:1"]);
        bad.max_ttl = "forever".into();
        let err = engine_config(&bad, &QuorumSecrets::default()).unwrap_err();
        assert!(err.starts_with("spec.maxTtl:"), "{err}");
        let mut bad = spec(&["redis://a:1"]);
        bad.max_ttl = "10s".into();
        bad.node_timeout = "2s".into();
        let err = engine_config(&bad, &QuorumSecrets::default()).unwrap_err();
        assert!(err.contains("shorter than ten node timeouts (20s)"), "{err}");
        let mut bad = spec(&["redis://a:1"]);
        bad.retry =
            Some(serde_json::from_value(serde_json::json!({"delayMin": "2s", "delayMax": "1s"})).unwrap());
        let err = engine_config(&bad, &QuorumSecrets::default()).unwrap_err();
        assert!(err.contains("retry delay range"), "{err}");
    }
}
