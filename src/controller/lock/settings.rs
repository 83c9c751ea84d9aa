//! `DistributedLock` spec → what the controller needs to hold it, or a message for the `Ready` condition.

use std::time::Duration;

use crate::api::lock::LeaderElectionPolicy;
use crate::api::{DistributedLockSpec, HolderPolicy};
use crate::duration;

/// Who the lock is for, once validated.
#[derive(Clone, Debug, PartialEq)]
pub enum HolderKind {
    Identity(String),
    LeaderElection(LeaderElectionPolicy),
    Jobs,
}

#[derive(Clone, Debug, PartialEq)]
pub struct LockSettings {
    /// The Redis key.
    pub key: String,
    pub ttl: Duration,
    pub quorum: String,
    pub holder: HolderKind,
    /// The holder is fenced (told the lock is lost) this long before the validity ends; `None`: the default,
    /// a fifth of the TTL.
    pub fence_margin: Option<Duration>,
}

/// Why a spec cannot be acted on, and whether waiting can help.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// A `Ready` condition reason (CamelCase).
    pub reason: &'static str,
    pub message: String,
}

pub fn lock_settings(
    spec: &DistributedLockSpec,
    namespace: &str,
    name: &str,
    quorum_max_ttl: Duration,
) -> Result<LockSettings, Invalid> {
    let invalid = |reason, message: String| Invalid { reason, message };
    let ttl = duration::parse(&spec.ttl).map_err(|err| invalid("InvalidTtl", format!("spec.ttl: {err}")))?;
    if ttl.is_zero() {
        return Err(invalid("InvalidTtl", "spec.ttl must be greater than 0".into()));
    }
    if ttl > quorum_max_ttl {
        return Err(invalid(
            "TtlAboveMaxTtl",
            format!(
                "spec.ttl {} exceeds the maxTtl {} of RedisQuorum {}: restarted masters are only kept out for maxTtl, so a longer lock could be granted twice; lower the ttl or raise the quorum's maxTtl",
                spec.ttl,
                duration::format(quorum_max_ttl),
                spec.quorum
            ),
        ));
    }
    let policies = &spec.holder;
    let holder = match (&policies.identity, &policies.leader_election, &policies.jobs) {
        (Some(identity), None, None) if !identity.is_empty() => HolderKind::Identity(identity.clone()),
        (None, Some(election), None) => HolderKind::LeaderElection(election.clone()),
        (None, None, Some(_)) => HolderKind::Jobs,
        _ => {
            return Err(invalid(
                "InvalidHolder",
                "set exactly one of spec.holder.identity, spec.holder.leaderElection and spec.holder.jobs"
                    .into(),
            ));
        }
    };
    let margin_text = match policies {
        HolderPolicy {
            leader_election: Some(election),
            ..
        } => election
            .fence_margin
            .as_deref()
            .map(|text| ("spec.holder.leaderElection.fenceMargin", text)),
        HolderPolicy { jobs: Some(jobs), .. } => jobs
            .fence_margin
            .as_deref()
            .map(|text| ("spec.holder.jobs.fenceMargin", text)),
        _ => None,
    };
    let fence_margin = match margin_text {
        None => None,
        Some((field, text)) => {
            let margin = duration::parse(text)
                .map_err(|err| invalid("InvalidFenceMargin", format!("{field}: {err}")))?;
            if margin.is_zero() || margin >= ttl {
                return Err(invalid(
                    "InvalidFenceMargin",
                    format!(
                        "{field} must be greater than 0 and shorter than spec.ttl ({})",
                        spec.ttl
                    ),
                ));
            }
            Some(margin)
        }
    };
    let key = spec
        .resource_key
        .clone()
        .unwrap_or_else(|| format!("{namespace}/{name}"));
    Ok(LockSettings {
        key,
        ttl,
        quorum: spec.quorum.clone(),
        holder,
        fence_margin,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(value: serde_json::Value) -> DistributedLockSpec {
        serde_json::from_value(value).unwrap()
    }

    #[test]
    fn defaults_give_a_ten_second_lock_on_namespace_slash_name() {
        let settings = lock_settings(
            &spec(serde_json::json!({"holder": {"identity": "batch"}})),
            "payments",
            "nightly",
            Duration::from_secs(60),
        )
        .unwrap();
        assert_eq!(settings.key, "payments/nightly");
        assert_eq!(settings.ttl, Duration::from_secs(10));
        assert_eq!(settings.quorum, "default");
        assert_eq!(settings.holder, HolderKind::Identity("batch".into()));
    }

    #[test]
    fn ttl_above_the_quorum_max_is_explained() {
        let err = lock_settings(
            &spec(serde_json::json!({"ttl": "2m", "holder": {"identity": "x"}})),
            "ns",
            "n",
            Duration::from_secs(60),
        )
        .unwrap_err();
        assert_eq!(err.reason, "TtlAboveMaxTtl");
        assert!(err.message.contains("exceeds the maxTtl 60s"), "{}", err.message);
    }

    #[test]
    fn holder_policies_are_exclusive() {
        let err = lock_settings(
            &spec(serde_json::json!({"holder": {"identity": "x", "jobs": {}}})),
            "ns",
            "n",
            Duration::from_secs(60),
        )
        .unwrap_err();
        assert_eq!(err.reason, "InvalidHolder");
        let jobs = lock_settings(
            &spec(serde_json::json!({"holder": {"jobs": {}}})),
            "ns",
            "n",
            Duration::from_secs(60),
        );
        assert_eq!(jobs.unwrap().holder, HolderKind::Jobs);
    }

    #[test]
    fn a_fence_margin_must_fit_inside_the_ttl() {
        let with_margin = |margin: &str| {
            lock_settings(
                &spec(serde_json::json!({"ttl": "10s", "holder": {"leaderElection": {
                    "selector": {"matchLabels": {"app": "web"}}, "fenceMargin": margin}}})),
                "ns",
                "n",
                Duration::from_secs(60),
            )
        };
        assert_eq!(
            with_margin("3s").unwrap().fence_margin,
            Some(Duration::from_secs(3))
        );
        assert_eq!(with_margin("10s").unwrap_err().reason, "InvalidFenceMargin");
        assert_eq!(with_margin("soon").unwrap_err().reason, "InvalidFenceMargin");
    }
}
