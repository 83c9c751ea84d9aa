//! Extreme values of every user-written field go through validation and the pure status and settings functions:
//! each gives a clear error (or a clamped value), never a panic. The schema rejects most of them at admission;
//! these are the objects admitted before a bound existed, or written where CEL does not run.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use redlock_operator::api::conditions::Stamp;
use redlock_operator::api::{DistributedLockSpec, RedisQuorumSpec, RedisQuorumStatus};
use redlock_operator::controller::lock::settings::{QuorumRules, lock_settings};
use redlock_operator::controller::quorum::config::{QuorumSecrets, engine_config};
use redlock_operator::controller::quorum::status::healthy_status;
use redlock_operator::redlock::{NodeHealth, NodeStatus};
use serde_json::{Value, json};
use tokio::time::Instant;

const EXTREME_DURATIONS: [&str; 15] = [
    "0s",
    "0ms",
    "100000000h",
    "18446744073709551615ms",
    "99999999999999999999999999h",
    "9223372036854775807s",
    "1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h1h",
    "2562047h47m16.854775807s",
    "-1s",
    "-0.5ms",
    "1.0000000001s",
    "0.5ns",
    "1000.5ms",
    "",
    "soon",
];

fn long_text() -> String {
    "x".repeat(100_000)
}

fn quorum_spec(overrides: Value) -> Option<RedisQuorumSpec> {
    let mut spec =
        json!({ "endpoints": ["redis://127.0.0.1:1", "redis://127.0.0.1:2", "redis://127.0.0.1:3"] });
    if let (Some(spec), Some(overrides)) = (spec.as_object_mut(), overrides.as_object()) {
        spec.extend(overrides.clone());
    }
    // Values the Rust types cannot hold (a negative u32) are rejected by deserialization, before any check.
    serde_json::from_value(spec).ok()
}

#[test]
fn every_quorum_field_at_its_extremes_gives_a_message_naming_it() {
    let secrets = QuorumSecrets::default();
    let mut cases: Vec<(&str, Value)> = Vec::new();
    for text in EXTREME_DURATIONS {
        cases.push(("spec.maxTtl", json!({ "maxTtl": text })));
        cases.push(("spec.nodeTimeout", json!({ "nodeTimeout": text })));
        cases.push(("spec.retry.delayMin", json!({ "retry": { "delayMin": text } })));
        cases.push((
            "spec.retry.delayMax",
            json!({ "retry": { "delayMin": "0ms", "delayMax": text } }),
        ));
    }
    for attempts in [json!(0), json!(101), json!(-1), json!(i32::MAX), json!(u32::MAX)] {
        cases.push((
            "spec.retry.attempts",
            json!({ "retry": { "attempts": attempts } }),
        ));
    }
    for factor in [json!(-1.0), json!(0.21), json!(1e308), json!(-1e308)] {
        cases.push(("spec.driftFactor", json!({ "driftFactor": factor })));
    }
    for (field, overrides) in cases {
        let Some(spec) = quorum_spec(overrides.clone()) else {
            continue;
        };
        match engine_config(&spec, &secrets) {
            Ok(config) => {
                // Accepted only inside the documented ranges.
                assert!(config.max_ttl <= Duration::from_secs(24 * 3600), "{overrides}");
                assert!(config.node_timeout <= Duration::from_secs(10), "{overrides}");
                assert!(config.retry.delay_max <= Duration::from_secs(60), "{overrides}");
            }
            Err(message) => assert!(
                message.starts_with(field) || message.contains("delay"),
                "{overrides}: {message}"
            ),
        }
    }
    let err = engine_config(
        &quorum_spec(json!({ "maxTtl": "100000000h" })).expect("spec"),
        &secrets,
    )
    .expect_err("out of range");
    assert_eq!(err, "spec.maxTtl must be between 100ms and 24h, got 100000000h");
}

#[test]
fn endpoint_lists_and_strings_at_their_extremes_are_refused_or_accepted_without_panic() {
    let secrets = QuorumSecrets {
        username: Some(long_text()),
        password: Some(long_text()),
        ca_pem: Some(long_text().into_bytes()),
    };
    let many: Vec<String> = (0..10_000)
        .map(|port| format!("redis://127.0.0.1:{port}"))
        .collect();
    for endpoints in [
        json!([]),
        json!(many),
        json!([format!("redis://{}:1", long_text())]),
        json!(["redis://127.0.0.1:99999999999"]),
        json!(["rediss://127.0.0.1:1#insecure"]),
        json!(["redis://127.0.0.1:1", "redis://127.0.0.1:1"]),
    ] {
        let spec = quorum_spec(json!({ "endpoints": endpoints })).expect("spec");
        if spec.endpoints.len() <= 15 {
            let _ = engine_config(&spec, &secrets);
        }
        let _ = engine_config(&spec, &QuorumSecrets::default());
    }
}

fn lock_spec(value: Value) -> Option<DistributedLockSpec> {
    serde_json::from_value(value).ok()
}

#[test]
fn every_lock_field_at_its_extremes_gives_a_ready_reason() {
    let max_ttl = Duration::from_secs(24 * 3600);
    for text in EXTREME_DURATIONS {
        for spec in [
            json!({ "ttl": text, "holder": { "identity": "x" } }),
            json!({ "holder": { "jobs": { "fenceMargin": text } } }),
            json!({ "holder": { "leaderElection": { "selector": {}, "fenceMargin": text } } }),
        ] {
            let spec = lock_spec(spec).expect("spec");
            if let Err(invalid) = lock_settings(&spec, "ns", "n", &QuorumRules::unshared(max_ttl)) {
                assert!(invalid.reason.starts_with("Invalid"), "{text}: {invalid:?}");
                assert!(invalid.message.contains("spec."), "{text}: {invalid:?}");
            }
        }
    }
    let err = lock_settings(
        &lock_spec(json!({ "ttl": "100000000h", "holder": { "identity": "x" } })).expect("spec"),
        "ns",
        "n",
        &QuorumRules::unshared(max_ttl),
    )
    .expect_err("out of range");
    assert_eq!(
        err.message,
        "spec.ttl must be between 100ms and 1h, got 100000000h"
    );

    let long = long_text();
    let many: Vec<String> = (0..10_000).map(|i| format!("pod-{i}")).collect();
    for spec in [
        json!({ "resourceKey": long, "holder": { "identity": long } }),
        json!({ "quorum": long, "holder": { "identity": "" } }),
        json!({ "holder": {} }),
        json!({ "holder": { "leaderElection": { "selector": {}, "leaderLabel": long, "preference": many } } }),
        json!({ "holder": { "leaderElection": { "selector": { "matchLabels": { long.clone(): long } } } } }),
    ] {
        let spec = lock_spec(spec).expect("spec");
        let _ = lock_settings(&spec, &long, &long, &QuorumRules::unshared(max_ttl));
        let _ = lock_settings(&spec, "ns", "n", &QuorumRules::unshared(Duration::ZERO));
        let _ = lock_settings(&spec, "ns", "n", &QuorumRules::unshared(Duration::MAX));
    }
}

#[test]
fn quorum_status_survives_quarantines_beyond_the_calendar() {
    let now = Instant::now();
    let node = |until: Option<Instant>| NodeStatus {
        endpoint: "redis://127.0.0.1:1".into(),
        health: NodeHealth::Quarantined,
        run_id: Some(long_text()),
        quarantined_until: until,
        last_error: Some(long_text()),
        latency: Some(Duration::from_secs(u64::from(u32::MAX))),
        restarts_seen: u64::MAX,
    };
    let far = now.checked_add(Duration::from_secs(100_000_000 * 3600));
    let nodes = vec![node(far), node(Some(now)), node(None)];
    for wall in [Timestamp::MIN, Timestamp::UNIX_EPOCH, Timestamp::MAX] {
        for required in [0, 1, usize::MAX] {
            let stamp = Stamp {
                generation: Some(i64::MAX),
                now: wall,
            };
            let (status, _) = healthy_status(&RedisQuorumStatus::default(), &nodes, required, now, stamp);
            assert_eq!(status.masters.len(), 3);
            assert!(status.masters[0].quarantined_until.is_some());
        }
    }
}
