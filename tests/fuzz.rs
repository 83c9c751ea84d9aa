//! Property-based tests (proptest) of the parsers that take input from outside (issue #39): the duration grammar,
//! label keys, a hand-over report's body and bearer-token claims, endpoint URLs, and `DistributedLock` and
//! `RedisQuorum` specs through the validation the operator runs. No input panics or hangs, and what is accepted
//! holds what the parser promises. The masters' replies are fuzzed beside the engine (`src/redlock/fuzz.rs`).
//!
//! `PROPTEST_CASES` sets the number of cases per property (defaults below).

use std::collections::BTreeMap;
use std::sync::LazyLock;
use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use proptest::prelude::*;
use redlock_operator::api::holder_contract::{REPORT_TOKEN_AUDIENCE, StoppedReport};
use redlock_operator::api::{DistributedLockSpec, RedisQuorumSpec, label_key, limits};
use redlock_operator::controller::lock::reports::endpoint::MAX_REPORT_BYTES;
use redlock_operator::controller::lock::reports::token_shape::{MAX_TOKEN_BYTES, claims_of};
use redlock_operator::controller::lock::settings::{HolderKind, QuorumRules, lock_settings};
use redlock_operator::controller::quorum::config::{QuorumSecrets, engine_config};
use redlock_operator::duration;
use redlock_operator::redlock::{Endpoint, MAX_PERMITS, shortest_ttl, with_credentials};
use regex::Regex;
use serde_json::{Value, json};

#[path = "../src/fuzz_support.rs"]
mod fuzz_support;
use fuzz_support::{config, timed};

fn concat(pieces: &'static [&'static str], len: std::ops::Range<usize>) -> impl Strategy<Value = String> {
    prop::collection::vec(prop::sample::select(pieces), len).prop_map(|pieces| pieces.concat())
}

// ---- durations ----

const DURATION_PIECES: &[&str] = &[
    "0",
    "1",
    "7",
    "9",
    "00",
    "9223372036854775807",
    "99999999999999999999",
    ".",
    "-",
    "+",
    "ns",
    "us",
    "µs",
    "μs",
    "ms",
    "s",
    "m",
    "h",
    "d",
    " ",
    "\u{b5}",
    "e",
    "_",
    "2562047",
    "h47m16.854775807s",
];

fn duration_text() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => concat(DURATION_PIECES, 0..10),
        3 => "[-+]?(0|([0-9]{1,20}(\\.[0-9]{0,22})?|\\.[0-9]{1,22})(ns|us|µs|μs|ms|s|m|h)){1,4}",
        1 => ".{0,24}",
        1 => (0..=i64::MAX as u64).prop_map(|nanos| duration::format(Duration::from_nanos(nanos))),
        1 => prop::sample::select(vec![
            "0", "-0", "+0s", "100ms", "99ms", "1h", "1h0m0.000000001s", "24h", "10s", "50ms", "1ms", "0.999999ms",
            "2562047h47m16.854775807s", "2562047h47m16.854775808s", "1.0000000001s",
        ])
        .prop_map(String::from),
    ]
}

/// A duration field's text, often within `min_ms..=max_ms` so that specs get past it to the checks after it.
fn duration_field(min_ms: u64, max_ms: u64) -> impl Strategy<Value = Value> {
    prop_oneof![
        1 => duration_text(),
        3 => (min_ms..=max_ms).prop_map(|ms| duration::format(Duration::from_millis(ms))),
    ]
    .prop_map(Value::from)
}

static PATTERN: LazyLock<Regex> = LazyLock::new(|| Regex::new(duration::PATTERN).unwrap());

// ---- label keys (the API server's IsQualifiedName, and the CRD's leaderLabel pattern) ----

static DNS_SUBDOMAIN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$").unwrap()
});
static QUALIFIED_NAME: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$").unwrap());
static LEADER_LABEL_PATTERN: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$").unwrap()
});

/// k8s.io/apimachinery's `validation.IsQualifiedName`, what the API server checks a label key with.
fn api_server_takes_key(key: &str) -> bool {
    let parts: Vec<&str> = key.split('/').collect();
    let (prefix, name) = match parts.as_slice() {
        [name] => (None, *name),
        [prefix, name] => (Some(*prefix), *name),
        _ => return false,
    };
    let prefix_ok = prefix
        .is_none_or(|prefix| !prefix.is_empty() && prefix.len() <= 253 && DNS_SUBDOMAIN.is_match(prefix));
    prefix_ok && !name.is_empty() && name.len() <= 63 && QUALIFIED_NAME.is_match(name)
}

const KEY_PIECES: &[&str] = &[
    "a",
    "z",
    "0",
    "9",
    "A",
    "-",
    "_",
    ".",
    "/",
    "io",
    "redlock",
    "kubernetes.io",
    "k8s.io",
    " ",
    "!",
    "é",
];

fn label_key_text() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => concat(KEY_PIECES, 0..12),
        2 => "([a-z0-9][-a-z0-9.]{0,70}/)?[A-Za-z0-9][-A-Za-z0-9_.]{0,70}",
        1 => "[a-z0-9.-]{0,300}/[a-z]{1,3}",
        1 => ".{0,20}",
        1 => prop::sample::select(vec![
            "redlock.io/leader", "app", "pod-template-hash", "controller-revision-hash", "node.k8s.io/x",
            "a.kubernetes.io/b", "mykubernetes.io/x",
        ])
        .prop_map(String::from),
    ]
}

// ---- JSON pieces for bodies, claims and specs ----

fn json_scalar() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,12}".prop_map(Value::from),
    ]
}

fn json_any() -> impl Strategy<Value = Value> {
    json_scalar().prop_recursive(3, 24, 4, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Array),
            prop::collection::btree_map(".{0,6}", inner, 0..4)
                .prop_map(|map| Value::Object(map.into_iter().collect())),
        ]
    })
}

/// `good`, mostly; now and then a value of any type, or absent (`None`).
fn field(good: impl Strategy<Value = Value>) -> impl Strategy<Value = Option<Value>> {
    prop_oneof![
        24 => good.prop_map(Some),
        1 => json_any().prop_map(Some),
        2 => Just(None),
    ]
}

fn object(fields: Vec<(&'static str, Option<Value>)>) -> Value {
    Value::Object(
        fields
            .into_iter()
            .filter_map(|(name, value)| Some((name.to_owned(), value?)))
            .collect(),
    )
}

/// Nesting as deep as a sender likes: the JSON parser's own depth limit is what stands against it.
fn deep_json() -> impl Strategy<Value = Vec<u8>> {
    (
        1usize..3000,
        prop::sample::select(vec!["[", "{\"a\":", "[{\"lock\":"]),
    )
        .prop_map(|(depth, open)| open.repeat(depth).into_bytes())
}

// ---- the report body ----

fn report_body() -> impl Strategy<Value = Vec<u8>> {
    let name = prop_oneof![
        ".{0,20}".prop_map(Value::from),
        "[a-z]{250,260}".prop_map(Value::from)
    ];
    let shaped = (
        field(name),
        field(prop_oneof![
            any::<u32>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from)
        ]),
        field(prop_oneof![
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            Just(json!(1e300)),
            Just(json!(-0.0)),
            Just(json!("7")),
        ]),
        prop::option::of(json_any()),
    )
        .prop_map(|(lock, permit, token, extra)| {
            object(vec![
                ("lock", lock),
                ("permit", permit),
                ("fencingToken", token),
                ("other", extra),
            ])
            .to_string()
            .into_bytes()
        });
    prop_oneof![
        4 => shaped,
        1 => prop::collection::vec(any::<u8>(), 0..256),
        1 => deep_json(),
        1 => json_any().prop_map(|value| value.to_string().into_bytes()),
    ]
    // The endpoint reads at most this much; the rest is refused before parsing.
    .prop_map(|mut body| {
        body.truncate(MAX_REPORT_BYTES);
        body
    })
}

// ---- the bearer token ----

const NOW: i64 = 1_800_000_000;

fn b64(bytes: &[u8]) -> String {
    URL_SAFE_NO_PAD.encode(bytes)
}

/// A claim's time, mostly within a day of `NOW`: `after` leans it ahead of `NOW` (an `exp`), or else behind it.
fn claim_time(after: bool) -> impl Strategy<Value = Value> {
    let near = if after {
        -1_000i64..100_000
    } else {
        -100_000i64..1_000
    };
    prop_oneof![
        6 => near.prop_map(|offset| Value::from(NOW + offset)),
        1 => any::<i64>().prop_map(Value::from),
        1 => any::<f64>().prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        1 => prop::sample::select(vec![json!(1e308), json!(-1e308), json!(u64::MAX), json!(NOW as f64 + 0.5)]),
    ]
}

fn bounded_text(max: usize) -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => "[a-z0-9-]{0,12}".prop_map(Value::from),
        1 => (0..max + 3).prop_map(|len| Value::from("n".repeat(len))),
        1 => ".{0,8}".prop_map(Value::from),
    ]
}

fn claims() -> impl Strategy<Value = Value> {
    let aud = prop_oneof![
        3 => Just(json!(REPORT_TOKEN_AUDIENCE)),
        3 => Just(json!([REPORT_TOKEN_AUDIENCE])),
        3 => Just(json!(["api", REPORT_TOKEN_AUDIENCE])),
        1 => ".{0,10}".prop_map(Value::from),
        1 => prop::collection::vec(json_scalar(), 0..3).prop_map(Value::Array),
    ];
    let pod = (field(bounded_text(253)), field(bounded_text(128)))
        .prop_map(|(name, uid)| object(vec![("name", name), ("uid", uid)]));
    let bound = (field(bounded_text(63)), field(pod))
        .prop_map(|(namespace, pod)| object(vec![("namespace", namespace), ("pod", pod)]));
    (
        field(aud),
        field(claim_time(true)),
        field(claim_time(false)),
        field(claim_time(false)),
        field(bound),
    )
        .prop_map(|(aud, exp, nbf, iat, bound)| {
            object(vec![
                ("aud", aud),
                ("exp", exp),
                ("nbf", nbf),
                ("iat", iat),
                ("kubernetes.io", bound),
            ])
        })
}

fn token() -> impl Strategy<Value = String> {
    let header = prop_oneof![
        4 => Just(json!({"alg": "RS256", "kid": "k1"})),
        1 => prop::sample::select(vec!["none", "NoNe", "", "HS256"]).prop_map(|alg| json!({ "alg": alg })),
        1 => json_any(),
    ];
    let signature = prop_oneof![
        3 => prop::collection::vec(any::<u8>(), 1..300).prop_map(|bytes| b64(&bytes)),
        1 => ".{0,8}",
    ];
    let shaped = (header, prop_oneof![4 => claims(), 1 => json_any()], signature).prop_map(
        |(header, claims, signature)| {
            format!(
                "{}.{}.{signature}",
                b64(header.to_string().as_bytes()),
                b64(claims.to_string().as_bytes())
            )
        },
    );
    prop_oneof![
        6 => shaped,
        1 => prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..5)
            .prop_map(|segments| segments.iter().map(|bytes| b64(bytes)).collect::<Vec<_>>().join(".")),
        1 => ".{0,64}",
        // About the limit in length.
        1 => (MAX_TOKEN_BYTES - 20..MAX_TOKEN_BYTES + 20, prop::sample::select(vec!["A", "a.", "A.A.A", "é"]))
            .prop_map(|(len, piece)| piece.repeat(len).chars().take(len).collect()),
        1 => deep_json().prop_map(|nested| format!("{}.{}.{}", b64(b"{\"alg\":\"RS256\"}"), b64(&nested), b64(b"s"))),
    ]
}

// ---- endpoints and specs ----

fn endpoint_text() -> impl Strategy<Value = String> {
    let scheme = prop::sample::select(vec![
        "redis",
        "rediss",
        "redis",
        "rediss",
        "http",
        "REDIS",
        "redis+unix",
        "",
    ]);
    let separator = prop::sample::select(vec!["://", "://", "://", ":/", ":", ""]);
    let userinfo = prop::option::weighted(0.2, "[a-zA-Z0-9:%@/]{0,10}@");
    let host = prop_oneof![
        3 => "[a-z0-9.-]{0,20}",
        1 => "\\[[0-9a-f:]{0,20}\\]",
        1 => ".{0,10}",
    ];
    let port = prop::option::weighted(
        0.8,
        prop_oneof![
            3 => any::<u16>().prop_map(|port| format!(":{port}")),
            1 => ":[0-9]{0,8}",
            1 => ":.{0,4}",
        ],
    );
    let tail = prop::option::weighted(0.3, prop_oneof!["/[0-9a-z]{0,4}", "\\?[a-z=&]{0,12}", "#.{0,8}"]);
    let space = prop::sample::select(vec!["", "", "", " ", "\t"]);
    prop_oneof![
        9 => (scheme, separator, userinfo, host, port, tail, space).prop_map(
            |(scheme, separator, userinfo, host, port, tail, space)| {
                format!(
                    "{space}{scheme}{separator}{}{host}{}{}{space}",
                    userinfo.unwrap_or_default(),
                    port.unwrap_or_default(),
                    tail.unwrap_or_default()
                )
            }
        ),
        1 => ".{0,30}",
    ]
}

/// The markers the generated credentials start with: no display of an endpoint may show them.
const USER_MARK: &str = "usrQx";
const PASSWORD_MARK: &str = "pwZq";

fn secrets() -> impl Strategy<Value = QuorumSecrets> {
    (
        prop::option::weighted(0.3, ".{0,8}".prop_map(|user| format!("{USER_MARK}{user}"))),
        prop::option::weighted(
            0.4,
            ".{0,12}".prop_map(|password| format!("{PASSWORD_MARK}{password}")),
        ),
    )
        .prop_map(|(username, password)| QuorumSecrets {
            username,
            password,
            ca_pem: None,
        })
}

fn drift_factor() -> impl Strategy<Value = Value> {
    prop_oneof![
        3 => (0.0f64..=0.25).prop_map(Value::from),
        1 => prop::sample::select(vec![json!(0), json!(0.2), json!(0.2000001), json!(-0.0), json!(1e308), json!(-1)]),
    ]
}

fn quorum_spec() -> impl Strategy<Value = Value> {
    let endpoints = prop_oneof![
        8 => prop::collection::vec(
            prop_oneof![
                3 => "rediss?://[a-z][a-z0-9-]{0,10}(:[0-9]{1,5})?(/[0-9]{1,2})?",
                1 => endpoint_text(),
            ],
            0..6,
        )
        .prop_map(Value::from),
        1 => prop::collection::vec(json_any(), 0..3).prop_map(Value::from),
    ];
    let retry = (
        field(prop_oneof![
            (0i64..=101).prop_map(Value::from),
            any::<i32>().prop_map(Value::from)
        ]),
        field(duration_field(0, 60_000)),
        field(duration_field(0, 60_000)),
    )
        .prop_map(|(attempts, min, max)| {
            object(vec![("attempts", attempts), ("delayMin", min), ("delayMax", max)])
        });
    let shared = (
        field(
            prop::collection::vec(prop_oneof!["[a-z0-9-]{1,8}", Just("*".to_owned())], 0..3)
                .prop_map(Value::from),
        ),
        field(prop_oneof!["[a-z0-9:/_-]{0,10}", ".{0,6}"].prop_map(Value::from)),
    )
        .prop_map(|(namespaces, prefix)| object(vec![("namespaces", namespaces), ("prefix", prefix)]));
    (
        field(endpoints),
        field(duration_field(1, 10_000)),
        field(duration_field(100, 86_400_000)),
        field(drift_factor()),
        prop::option::weighted(0.3, retry),
        field(any::<bool>().prop_map(Value::from)),
        prop::option::weighted(0.3, shared),
    )
        .prop_map(
            |(endpoints, node_timeout, max_ttl, drift, retry, durable, shared)| {
                object(vec![
                    ("endpoints", endpoints),
                    ("nodeTimeout", node_timeout),
                    ("maxTtl", max_ttl),
                    ("driftFactor", drift),
                    ("retry", retry),
                    ("assumeDurable", durable),
                    ("sharedKeys", shared),
                ])
            },
        )
}

fn selector() -> impl Strategy<Value = Value> {
    let labels = prop::collection::btree_map(label_key_text(), ".{0,10}", 0..4)
        .prop_map(|labels| serde_json::to_value(labels).unwrap());
    let expression = (
        label_key_text(),
        prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist", "Near"]),
        prop::option::of(prop::collection::vec(".{0,6}", 0..3)),
    )
        .prop_map(|(key, operator, values)| json!({ "key": key, "operator": operator, "values": values }));
    (
        prop::option::of(labels),
        prop::option::of(prop::collection::vec(expression, 0..3)),
    )
        .prop_map(|(labels, expressions)| {
            object(vec![
                ("matchLabels", labels),
                ("matchExpressions", expressions.map(Value::from)),
            ])
        })
}

fn lock_spec() -> impl Strategy<Value = Value> {
    let margin = || prop::option::weighted(0.5, duration_field(0, 120_000));
    let election = (
        field(selector()),
        field(label_key_text().prop_map(Value::from)),
        prop::option::weighted(
            0.2,
            prop::collection::vec("[a-z0-9-]{0,8}", 0..3).prop_map(Value::from),
        ),
        margin(),
    )
        .prop_map(|(selector, label, preference, margin)| {
            object(vec![
                ("selector", selector),
                ("leaderLabel", label),
                ("preference", preference),
                ("fenceMargin", margin),
            ])
        });
    let jobs = margin().prop_map(|margin| object(vec![("fenceMargin", margin)]));
    // Mostly exactly one policy; sometimes none or several.
    let holder = (0u8..8, prop_oneof![".{0,12}", "[a-z]{250,256}"], election, jobs).prop_map(
        |(which, identity, election, jobs)| {
            let pick = match which {
                0 | 1 => 1,
                2 | 3 => 2,
                4 | 5 => 4,
                6 => 0,
                _ => 7,
            };
            object(vec![
                ("identity", (pick & 1 != 0).then(|| Value::from(identity))),
                ("leaderElection", (pick & 2 != 0).then_some(election)),
                ("jobs", (pick & 4 != 0).then_some(jobs)),
            ])
        },
    );
    (
        field(".{0,12}".prop_map(Value::from)),
        prop::option::weighted(0.4, prop_oneof![".{1,16}", "[a-z]{500,520}"].prop_map(Value::from)),
        field(duration_field(50, 120_000)),
        field(holder),
        field(prop_oneof![
            3 => (0i64..=4).prop_map(Value::from),
            1 => prop::sample::select(vec![100i64, 101, -1, i64::from(i32::MAX), i64::from(i32::MIN), i64::MAX])
                .prop_map(Value::from),
        ]),
    )
        .prop_map(|(quorum, resource_key, ttl, holder, permits)| {
            object(vec![
                ("quorum", quorum),
                ("resourceKey", resource_key),
                ("ttl", ttl),
                ("holder", holder),
                ("permits", permits),
            ])
        })
}

/// A quorum spec the operator has an engine for, by default when the generated one is refused.
fn default_quorum() -> RedisQuorumSpec {
    serde_json::from_value(json!({ "endpoints": ["redis://a:6379", "redis://b:6379", "redis://c:6379"] }))
        .unwrap()
}

proptest! {
    #![proptest_config(config(5_000))]

    /// The duration grammar: the parser and the schema's pattern agree, and a duration parsed formats to a text
    /// that parses back to it.
    #[test]
    fn fuzz_durations(text in duration_text()) {
        let parsed = timed("duration::parse", || duration::parse(&text));
        let matches = PATTERN.is_match(&text);
        match &parsed {
            Ok(value) => {
                prop_assert!(matches, "{text:?} parsed as {value:?} but the schema refuses it");
                prop_assert!(value.as_nanos() <= i64::MAX as u128);
                let formatted = duration::format(*value);
                prop_assert_eq!(duration::parse(&formatted), Ok(*value), "{:?} -> {}", text, formatted);
            }
            Err(duration::ParseError::TooLong(_)) => prop_assert!(matches, "{text:?}: too long, but not in the grammar"),
            Err(duration::ParseError::Invalid(message)) => prop_assert!(
                !matches || (text.starts_with('-') && message.contains("cannot be negative")),
                "{text:?} is in the grammar but refused: {message}"
            ),
        }
        for range in limits::ALL {
            if let Ok(value) = timed("DurationRange::parse", || range.parse(&text)) {
                prop_assert_eq!(Ok(value), parsed.clone());
                prop_assert!(duration::parse(range.min).unwrap() <= value && value <= duration::parse(range.max).unwrap());
            }
        }
    }

    /// Every duration Go has formats to a text that parses back to it.
    #[test]
    fn fuzz_duration_format(nanos in prop_oneof![0..=i64::MAX as u64, 0..10_000_000_000u64]) {
        let value = Duration::from_nanos(nanos);
        let text = duration::format(value);
        prop_assert!(PATTERN.is_match(&text));
        prop_assert_eq!(duration::parse(&text), Ok(value));
    }

    /// Label keys: what the operator accepts the API server accepts, and the CRD's pattern too.
    #[test]
    fn fuzz_label_keys(key in label_key_text()) {
        let checked = timed("label_key::check", || label_key::check(&key));
        let _ = timed("label_key::is_reserved", || label_key::is_reserved(&key));
        if checked.is_ok() {
            prop_assert!(api_server_takes_key(&key), "{key:?} accepted, but the API server refuses it");
            prop_assert!(LEADER_LABEL_PATTERN.is_match(&key) && key.len() <= 317, "{key:?}: not the CRD's pattern");
            let name = key.rsplit('/').next().unwrap();
            prop_assert!(!name.is_empty() && name.len() <= 63);
        } else {
            // Stricter than the API server only where the CRD's pattern is (63 characters per prefix label).
            prop_assert!(
                !api_server_takes_key(&key) || !LEADER_LABEL_PATTERN.is_match(&key),
                "{key:?} is refused ({checked:?}) though the API server and the CRD take it"
            );
        }
    }

    /// A report's body as the endpoint reads it: what parses is a report that reads back the same.
    #[test]
    fn fuzz_report_body(body in report_body()) {
        if let Ok(report) = timed("report body", || serde_json::from_slice::<StoppedReport>(&body)) {
            let again = serde_json::to_vec(&report).unwrap();
            prop_assert_eq!(serde_json::from_slice::<StoppedReport>(&again).unwrap(), report);
        }
    }

}

proptest! {
    #![proptest_config(config(3000))]

    /// A report's bearer token: what is let through to a review claims a pod, bounded as the API server bounds
    /// names, for our audience, not expired.
    #[test]
    fn fuzz_token_claims(token in token(), now in prop_oneof![4 => Just(NOW), 1 => any::<i64>()]) {
        let claimed = timed("claims_of", || claims_of(&token, REPORT_TOKEN_AUDIENCE, now));
        if let Ok(claimed) = claimed {
            prop_assert!(token.len() <= MAX_TOKEN_BYTES && token.split('.').count() == 3);
            prop_assert!((1..=63).contains(&claimed.namespace.len()), "{claimed:?}");
            prop_assert!((1..=253).contains(&claimed.pod.len()), "{claimed:?}");
            prop_assert!((1..=128).contains(&claimed.uid.len()), "{claimed:?}");
            let payload: Value = serde_json::from_slice(&URL_SAFE_NO_PAD.decode(token.split('.').nth(1).unwrap()).unwrap()).unwrap();
            let aud = &payload["aud"];
            prop_assert!(aud == REPORT_TOKEN_AUDIENCE || aud.as_array().is_some_and(|all| all.iter().any(|one| one == REPORT_TOKEN_AUDIENCE)));
            prop_assert!(payload["exp"].as_f64().is_some_and(|exp| exp + 60.0 > now as f64));
            prop_assert_eq!(claims_of(&token, REPORT_TOKEN_AUDIENCE, now), Ok(claimed));
        }
    }

}

proptest! {
    #![proptest_config(config(5000))]

    /// Endpoint URLs, with and without credentials: what is accepted is a redis URL that never shows them.
    #[test]
    fn fuzz_endpoints(raw in endpoint_text(), secrets in secrets()) {
        if let Ok(endpoint) = timed("Endpoint::parse", || Endpoint::parse(&raw)) {
            let trimmed = raw.trim();
            prop_assert!(trimmed.starts_with("redis://") || trimmed.starts_with("rediss://"), "{raw:?}");
            prop_assert!(!raw.contains('#'), "{raw:?}");
            prop_assert_eq!(endpoint.is_tls(), trimmed.starts_with("rediss://"));
        }
        let Ok(url) = timed("with_credentials", || {
            with_credentials(&raw, secrets.username.as_deref(), secrets.password.as_deref())
        }) else {
            return Ok(());
        };
        if let Ok(endpoint) = timed("Endpoint::parse", || Endpoint::parse(&url)) {
            let shown = format!("{} {endpoint:?} {endpoint}", endpoint.display());
            prop_assert!(!shown.contains(PASSWORD_MARK) && !shown.contains(USER_MARK), "{url:?} shown as {shown:?}");
        }
    }

}

proptest! {
    #![proptest_config(config(3000))]

    /// RedisQuorum specs through `engine_config`, as the quorum reconciler runs it: what is accepted is within
    /// every bound, shows no credential, and is accepted again.
    #[test]
    fn fuzz_quorum_specs(raw in quorum_spec(), secrets in secrets()) {
        let Ok(spec) = serde_json::from_value::<RedisQuorumSpec>(raw) else {
            return Ok(());
        };
        let Ok(config) = timed("engine_config", || engine_config(&spec, &secrets)) else {
            return Ok(());
        };
        prop_assert!(!config.endpoints.is_empty() && config.endpoints.len() == spec.endpoints.len());
        prop_assert!(Duration::from_millis(1) <= config.node_timeout && config.node_timeout <= Duration::from_secs(10));
        prop_assert!(Duration::from_millis(100) <= config.max_ttl && config.max_ttl <= Duration::from_secs(86_400));
        prop_assert!(config.max_ttl >= shortest_ttl(config.node_timeout));
        prop_assert!((0.0..=0.2).contains(&config.drift_factor));
        prop_assert!((1..=100).contains(&config.retry.attempts));
        prop_assert!(config.retry.delay_min <= config.retry.delay_max);
        for endpoint in &config.endpoints {
            let shown = endpoint.display();
            prop_assert!(!shown.contains(PASSWORD_MARK) && !shown.contains(USER_MARK), "{shown}");
        }
        if let Some(shared) = &spec.shared_keys {
            prop_assert!(shared.check_prefix().is_ok());
        }
        let again = engine_config(&spec, &secrets).expect("accepted once, accepted again");
        prop_assert_eq!(format!("{:?}", again.endpoints), format!("{:?}", config.endpoints));
        let reread: RedisQuorumSpec = serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
        prop_assert!(engine_config(&reread, &secrets).is_ok());
    }

}

proptest! {
    #![proptest_config(config(2000))]

    /// DistributedLock specs through `lock_settings`, on the rules of a quorum `engine_config` accepted (as the
    /// lock reconciler runs them): what is accepted is within every bound and is accepted again, the same.
    #[test]
    fn fuzz_lock_specs(
        raw in lock_spec(),
        quorum in quorum_spec(),
        namespace in prop_oneof![4 => "[a-z0-9-]{1,20}", 1 => ".{0,10}"],
        name in prop_oneof![4 => "[a-z0-9.-]{1,30}", 1 => "[a-z]{250,253}", 1 => ".{0,10}"],
    ) {
        let quorum = serde_json::from_value::<RedisQuorumSpec>(quorum)
            .ok()
            .filter(|spec| engine_config(spec, &QuorumSecrets::default()).is_ok())
            .unwrap_or_else(default_quorum);
        let config = engine_config(&quorum, &QuorumSecrets::default()).unwrap();
        let rules = QuorumRules {
            max_ttl: config.max_ttl,
            node_timeout: config.node_timeout,
            shared_keys: quorum.shared_keys.as_ref(),
        };
        let Ok(spec) = serde_json::from_value::<DistributedLockSpec>(raw) else {
            return Ok(());
        };
        let Ok(settings) = timed("lock_settings", || lock_settings(&spec, &namespace, &name, &rules)) else {
            return Ok(());
        };
        let ttl = settings.ttl;
        prop_assert!(Duration::from_millis(100) <= ttl && ttl <= Duration::from_secs(3600), "{ttl:?}");
        prop_assert!(ttl <= rules.max_ttl && ttl >= shortest_ttl(rules.node_timeout) && duration::is_whole_millis(ttl));
        prop_assert!((1..=MAX_PERMITS).contains(&settings.permits) && i64::from(settings.permits) == i64::from(spec.permits));
        if let Some(margin) = settings.fence_margin {
            prop_assert!(!margin.is_zero() && margin < ttl);
        }
        match &settings.holder {
            HolderKind::Identity(identity) => prop_assert!(!identity.is_empty() && settings.permits == 1),
            HolderKind::LeaderElection(election) => {
                let key = election.leader_label.as_str();
                prop_assert!(label_key::check(key).is_ok() && !label_key::is_reserved(key));
                prop_assert!(api_server_takes_key(key));
                let selector = &election.selector;
                prop_assert!(!selector.match_labels.as_ref().is_some_and(|labels: &BTreeMap<String, String>| labels.contains_key(key)));
                prop_assert!(!selector.match_expressions.iter().flatten().any(|expression| expression.key == key));
            }
            HolderKind::Jobs => {}
        }
        let own_key = format!("{namespace}/{}", spec.resource_key.as_deref().unwrap_or(&name));
        let shared = rules.shared_keys.filter(|shared| shared.allows(&namespace) && spec.resource_key.is_some());
        match shared {
            Some(shared) => prop_assert_eq!(&settings.key, &format!("{}{}", shared.prefix, spec.resource_key.as_deref().unwrap())),
            None => prop_assert_eq!(&settings.key, &own_key),
        }
        prop_assert_eq!(&settings.quorum, &spec.quorum);
        prop_assert_eq!(lock_settings(&spec, &namespace, &name, &rules), Ok(settings.clone()));
        // As the API server stores it and the watch hands it back.
        let reread: DistributedLockSpec = serde_json::from_value(serde_json::to_value(&spec).unwrap()).unwrap();
        prop_assert_eq!(lock_settings(&reread, &namespace, &name, &rules), Ok(settings));
    }
}
