//! `DistributedLock` spec → what the controller needs to hold it, or a message for the `Ready` condition.

use std::time::Duration;

use crate::api::lock::LeaderElectionPolicy;
use crate::api::{DistributedLockSpec, HolderPolicy, SharedKeys};
use crate::api::{label_key, limits};
use crate::duration;
use crate::redlock::{MAX_PERMITS, shortest_ttl};

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
    /// How many holders at once (1 to [`MAX_PERMITS`]): permit i is `permit_key(key, i)`.
    pub permits: u32,
}

/// Why a spec cannot be acted on, and whether waiting can help.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Invalid {
    /// A `Ready` condition reason (CamelCase).
    pub reason: &'static str,
    pub message: String,
}

/// What the lock's `RedisQuorum` decides for every lock on it.
#[derive(Clone, Copy, Debug)]
pub struct QuorumRules<'a> {
    pub max_ttl: Duration,
    /// How long one master may take per command: the TTL must leave room for the fence margin it implies.
    pub node_timeout: Duration,
    pub shared_keys: Option<&'a SharedKeys>,
}

impl QuorumRules<'static> {
    /// A quorum that shares no keys, with the default node timeout.
    pub fn unshared(max_ttl: Duration) -> Self {
        Self {
            max_ttl,
            node_timeout: Duration::from_millis(50),
            shared_keys: None,
        }
    }
}

pub fn lock_settings(
    spec: &DistributedLockSpec,
    namespace: &str,
    name: &str,
    quorum: &QuorumRules<'_>,
) -> Result<LockSettings, Invalid> {
    let quorum_max_ttl = quorum.max_ttl;
    let invalid = |reason, message: String| Invalid { reason, message };
    let ttl = limits::LOCK_TTL
        .parse(&spec.ttl)
        .map_err(|message| invalid("InvalidTtl", message))?;
    if !duration::is_whole_millis(ttl) {
        return Err(invalid(
            "InvalidTtl",
            format!(
                "spec.ttl {} is not a whole number of milliseconds, which Redis keeps a key's time to live in",
                spec.ttl
            ),
        ));
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
    let shortest = shortest_ttl(quorum.node_timeout);
    if ttl < shortest {
        return Err(invalid(
            "TtlBelowNodeTimeouts",
            format!(
                "spec.ttl {} is too short for the nodeTimeout {} of RedisQuorum {}: a lock must live at least ten node timeouts ({}), or it is reported lost before it can be extended; raise the ttl or lower the quorum's nodeTimeout",
                spec.ttl,
                duration::format(quorum.node_timeout),
                spec.quorum,
                duration::format(shortest)
            ),
        ));
    }
    let policies = &spec.holder;
    let holder = match (&policies.identity, &policies.leader_election, &policies.jobs) {
        (Some(identity), None, None) if !identity.is_empty() => HolderKind::Identity(identity.clone()),
        (None, Some(election), None) => {
            check_leader_label(election).map_err(|message| invalid("InvalidLeaderLabel", message))?;
            HolderKind::LeaderElection(election.clone())
        }
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
    let permits =
        check_permits(spec.permits, &holder).map_err(|(reason, message)| invalid(reason, message))?;
    let key = redis_key(spec, namespace, name, quorum.shared_keys)?;
    Ok(LockSettings {
        key,
        ttl,
        quorum: spec.quorum.clone(),
        holder,
        fence_margin,
        permits,
    })
}

/// `spec.permits` as a count, where the holder policy can hand that many out: Job fencing and leader election
/// any, an identity one. The schema refuses the same; this is the operator's own check of what
/// it is given.
fn check_permits(permits: i32, holder: &HolderKind) -> Result<u32, (&'static str, String)> {
    let count = u32::try_from(permits)
        .ok()
        .filter(|count| (1..=MAX_PERMITS).contains(count))
        .ok_or_else(|| {
            (
                "InvalidPermits",
                format!("spec.permits must be between 1 and {MAX_PERMITS}, not {permits}"),
            )
        })?;
    if count == 1 {
        return Ok(count);
    }
    match holder {
        HolderKind::Identity(_) => Err((
            "InvalidPermits",
            format!("spec.permits is {count}, but one holder.identity holds one permit: set permits to 1"),
        )),
        HolderKind::LeaderElection(_) | HolderKind::Jobs => Ok(count),
    }
}

/// The one place a lock's Redis key is made. Scoped by the namespace (`<namespace>/<resourceKey or name>`),
/// so that a lock cannot take, or learn the holders of, another namespace's key; shared (`<prefix><resourceKey>`)
/// only where the quorum lets the namespace share, and then in a key space scoped keys cannot reach (see
/// `SharedKeys::check_prefix`).
pub fn redis_key(
    spec: &DistributedLockSpec,
    namespace: &str,
    name: &str,
    shared_keys: Option<&SharedKeys>,
) -> Result<String, Invalid> {
    let shared = shared_keys.filter(|shared| shared.allows(namespace));
    match (&spec.resource_key, shared) {
        (Some(key), Some(shared)) => {
            shared.check_prefix().map_err(|message| Invalid {
                reason: "InvalidSharedKeys",
                message,
            })?;
            Ok(format!("{}{key}", shared.prefix))
        }
        (Some(key), None) => Ok(format!("{namespace}/{key}")),
        (None, _) => Ok(format!("{namespace}/{name}")),
    }
}

/// The leader label is written to and removed from every candidate: it must be a valid key, and no key the
/// candidates are selected by or Kubernetes manages, or removing it would take pods out of the selection (and
/// out of their ReplicaSet).
fn check_leader_label(election: &LeaderElectionPolicy) -> Result<(), String> {
    let key = election.leader_label.as_str();
    let field = "spec.holder.leaderElection.leaderLabel";
    label_key::check(key).map_err(|err| format!("{field}: {err}"))?;
    let selector = &election.selector;
    let in_labels = selector
        .match_labels
        .as_ref()
        .is_some_and(|labels| labels.contains_key(key));
    let in_expressions = selector
        .match_expressions
        .iter()
        .flatten()
        .any(|expression| expression.key == key);
    if in_labels || in_expressions {
        return Err(format!(
            "{field} `{key}` is a key of the selector: the operator removes it from every candidate but the leader, which would take them out of the selection; use another key, such as redlock.io/leader"
        ));
    }
    if label_key::is_reserved(key) {
        return Err(format!(
            "{field} `{key}` is a key Kubernetes sets or reserves; use another key, such as redlock.io/leader"
        ));
    }
    Ok(())
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
            &QuorumRules::unshared(Duration::from_secs(60)),
        )
        .unwrap();
        assert_eq!(settings.key, "payments/nightly");
        assert_eq!(settings.ttl, Duration::from_secs(10));
        assert_eq!(settings.quorum, "default");
        assert_eq!(settings.holder, HolderKind::Identity("batch".into()));
    }

    #[test]
    fn permits_default_to_one_and_are_bounded_by_what_the_policy_hands_out() {
        let rules = QuorumRules::unshared(Duration::from_secs(60));
        let settings = |value| lock_settings(&spec(value), "ns", "n", &rules);
        let plain = settings(serde_json::json!({"holder": {"jobs": {}}})).unwrap();
        assert_eq!(plain.permits, 1, "a lock without permits is a plain lock");
        for permits in [0, -1, 101, i32::MIN] {
            let invalid =
                settings(serde_json::json!({"permits": permits, "holder": {"jobs": {}}})).unwrap_err();
            assert_eq!(invalid.reason, "InvalidPermits", "{permits}");
        }
        let identity = settings(serde_json::json!({"permits": 2, "holder": {"identity": "x"}})).unwrap_err();
        assert_eq!(identity.reason, "InvalidPermits");
        assert!(identity.message.contains("one permit"), "{}", identity.message);
        let leader = settings(serde_json::json!({
            "permits": 3,
            "holder": {"leaderElection": {"selector": {"matchLabels": {"app": "w"}}}},
        }))
        .unwrap();
        assert_eq!(leader.permits, 3, "leader election elects a pod per permit");
        let jobs = settings(serde_json::json!({"permits": 3, "holder": {"jobs": {}}})).unwrap();
        assert_eq!(jobs.permits, 3, "Job fencing hands out every permit");
    }

    #[test]
    fn keys_are_scoped_by_namespace_unless_the_quorum_shares_them() {
        let lock = spec(serde_json::json!({"resourceKey": "payments/db", "holder": {"identity": "x"}}));
        let key = |rules: &QuorumRules<'_>| lock_settings(&lock, "team-a", "n", rules).map(|s| s.key);
        let max_ttl = Duration::from_secs(60);
        assert_eq!(
            key(&QuorumRules::unshared(max_ttl)).unwrap(),
            "team-a/payments/db"
        );
        let shared: SharedKeys =
            serde_json::from_value(serde_json::json!({"namespaces": ["team-a"]})).unwrap();
        let rules = QuorumRules {
            max_ttl,
            node_timeout: Duration::from_millis(50),
            shared_keys: Some(&shared),
        };
        assert_eq!(key(&rules).unwrap(), "shared:payments/db");
        assert_eq!(
            lock_settings(&lock, "team-b", "n", &rules).unwrap().key,
            "team-b/payments/db",
            "a namespace not listed stays scoped"
        );
        let named = spec(serde_json::json!({"holder": {"identity": "x"}}));
        assert_eq!(
            lock_settings(&named, "team-a", "n", &rules).unwrap().key,
            "team-a/n"
        );
        let everyone: SharedKeys =
            serde_json::from_value(serde_json::json!({"namespaces": ["*"], "prefix": "global/"})).unwrap();
        let rules = QuorumRules {
            max_ttl,
            node_timeout: Duration::from_millis(50),
            shared_keys: Some(&everyone),
        };
        assert_eq!(key(&rules).unwrap_err().reason, "InvalidSharedKeys");
        // A shared key could otherwise be a semaphore's permit key.
        let permits: SharedKeys =
            serde_json::from_value(serde_json::json!({"namespaces": ["*"], "prefix": "permit:"})).unwrap();
        let rules = QuorumRules {
            max_ttl,
            node_timeout: Duration::from_millis(50),
            shared_keys: Some(&permits),
        };
        assert_eq!(key(&rules).unwrap_err().reason, "InvalidSharedKeys");
    }

    #[test]
    fn durations_mean_what_the_api_server_admitted() {
        let rules = QuorumRules::unshared(Duration::from_secs(600));
        let settings = |ttl: &str, margin: &str| {
            let lock = spec(serde_json::json!({
                "ttl": ttl,
                "holder": {"jobs": {"fenceMargin": margin}},
            }));
            lock_settings(&lock, "ns", "n", &rules)
        };
        for (ttl, margin, expected_ttl, expected_margin) in [
            (
                "1m30s",
                "1.5s",
                Duration::from_secs(90),
                Duration::from_millis(1500),
            ),
            (
                "0.5m",
                "300us",
                Duration::from_secs(30),
                Duration::from_micros(300),
            ),
            (
                "2m0.25s",
                "+1s",
                Duration::from_millis(120_250),
                Duration::from_secs(1),
            ),
        ] {
            let held = settings(ttl, margin).unwrap();
            assert_eq!(
                (held.ttl, held.fence_margin),
                (expected_ttl, Some(expected_margin))
            );
        }
        let finer = settings("1500.5ms", "1s").unwrap_err();
        assert_eq!(finer.reason, "InvalidTtl");
        assert!(
            finer.message.contains("whole number of milliseconds"),
            "{}",
            finer.message
        );
        for margin in ["0", "-1s"] {
            assert_eq!(
                settings("10s", margin).unwrap_err().reason,
                "InvalidFenceMargin",
                "{margin}"
            );
        }
        assert_eq!(settings("-10s", "1s").unwrap_err().reason, "InvalidTtl");
    }

    #[test]
    fn ttl_above_the_quorum_max_is_explained() {
        let err = lock_settings(
            &spec(serde_json::json!({"ttl": "2m", "holder": {"identity": "x"}})),
            "ns",
            "n",
            &QuorumRules::unshared(Duration::from_secs(60)),
        )
        .unwrap_err();
        assert_eq!(err.reason, "TtlAboveMaxTtl");
        assert!(err.message.contains("exceeds the maxTtl 60s"), "{}", err.message);
    }

    #[test]
    fn a_ttl_shorter_than_ten_node_timeouts_is_refused() {
        let rules = |node_timeout| QuorumRules {
            node_timeout,
            ..QuorumRules::unshared(Duration::from_secs(300))
        };
        let lock = spec(serde_json::json!({"ttl": "10s", "holder": {"identity": "x"}}));
        let err = lock_settings(&lock, "ns", "n", &rules(Duration::from_secs(2))).unwrap_err();
        assert_eq!(err.reason, "TtlBelowNodeTimeouts");
        assert!(
            err.message.contains("at least ten node timeouts (20s)"),
            "{}",
            err.message
        );
        assert!(lock_settings(&lock, "ns", "n", &rules(Duration::from_secs(1))).is_ok());
    }

    #[test]
    fn holder_policies_are_exclusive() {
        let err = lock_settings(
            &spec(serde_json::json!({"holder": {"identity": "x", "jobs": {}}})),
            "ns",
            "n",
            &QuorumRules::unshared(Duration::from_secs(60)),
        )
        .unwrap_err();
        assert_eq!(err.reason, "InvalidHolder");
        let jobs = lock_settings(
            &spec(serde_json::json!({"holder": {"jobs": {}}})),
            "ns",
            "n",
            &QuorumRules::unshared(Duration::from_secs(60)),
        );
        assert_eq!(jobs.unwrap().holder, HolderKind::Jobs);
    }

    #[test]
    fn a_leader_label_must_be_a_free_valid_key() {
        let with = |label: &str, selector: serde_json::Value| {
            lock_settings(
                &spec(serde_json::json!({"holder": {"leaderElection": {
                    "selector": selector, "leaderLabel": label}}})),
                "ns",
                "n",
                &QuorumRules::unshared(Duration::from_secs(60)),
            )
        };
        let web = serde_json::json!({"matchLabels": {"app": "web"}});
        assert!(with("redlock.io/leader", web.clone()).is_ok());
        let err = with("app", web.clone()).unwrap_err();
        assert_eq!(err.reason, "InvalidLeaderLabel");
        assert!(
            err.message.contains("is a key of the selector"),
            "{}",
            err.message
        );
        let expressions = serde_json::json!({"matchExpressions": [
            {"key": "tier", "operator": "In", "values": ["a"]}]});
        assert_eq!(
            with("tier", expressions).unwrap_err().reason,
            "InvalidLeaderLabel"
        );
        for bad in ["pod-template-hash", "not a label", "", "x/y/z"] {
            assert_eq!(
                with(bad, web.clone()).unwrap_err().reason,
                "InvalidLeaderLabel",
                "{bad}"
            );
        }
    }

    #[test]
    fn a_fence_margin_must_fit_inside_the_ttl() {
        let with_margin = |margin: &str| {
            lock_settings(
                &spec(serde_json::json!({"ttl": "10s", "holder": {"leaderElection": {
                    "selector": {"matchLabels": {"app": "web"}}, "fenceMargin": margin}}})),
                "ns",
                "n",
                &QuorumRules::unshared(Duration::from_secs(60)),
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
