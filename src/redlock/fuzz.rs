//! Property-based tests of what the masters answer, as the engine reads it (issue #39): the replies of the
//! scripts (`rules::interpret`, `permits::interpret_any`), the counters and holder labels inside them, and
//! `INFO server`, fed arbitrary `redis::Value` trees (nested, of the wrong type, with huge integers and bulk
//! strings that are not UTF-8) and arbitrary bytes through the client's own RESP parser: a master that answers
//! garbage. No reply panics or hangs, and garbage never counts as a vote.
//!
//! `PROPTEST_CASES` sets the number of cases per property (default below).

use proptest::prelude::*;
use redis::{PushKind, Value, VerbatimFormat};

use super::info::parse_server_info;
use super::outcome::NodeOutcome;
use super::permits::{Answer, interpret_any};
use super::queue::Waiter;
use super::rules::{Op, holder_named, interpret, known_counter, reported_counter};
use super::value::LockValue;
use crate::fuzz_support::timed;

const CASES: u32 = 4_000;

fn config() -> proptest::test_runner::Config {
    crate::fuzz_support::config(CASES)
}

/// Decimal texts as the scripts send counters and tickets, and what a broken master might send instead.
fn counter_text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        any::<i64>().prop_map(|n| n.to_string().into_bytes()),
        any::<u64>().prop_map(|n| n.to_string().into_bytes()),
        "[-+]?[0-9]{0,40}(\\.[0-9]{0,5})?(e[0-9]{1,3})?".prop_map(String::into_bytes),
        Just(b"9223372036854775808".to_vec()),
        Just(b"-9223372036854775809".to_vec()),
        prop::collection::vec(any::<u8>(), 0..24),
    ]
}

/// Values as our clients write them (`<holder>|<hex>`), near misses, and bytes that are not UTF-8.
fn value_text() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        "[a-z0-9_|.-]{0,16}\\|[0-9a-fA-F]{0,44}".prop_map(String::into_bytes),
        ".{0,20}\\|.{0,20}".prop_map(String::into_bytes),
        prop::collection::vec(any::<u8>(), 0..48),
        prop::collection::vec(any::<u8>(), 0..8).prop_map(|mut raw| {
            // Not UTF-8 before a well-formed secret.
            raw.extend_from_slice(b"\xff\xfe|abc123");
            raw
        }),
    ]
}

fn leaf() -> impl Strategy<Value = Value> {
    prop_oneof![
        Just(Value::Nil),
        Just(Value::Okay),
        (-2i64..=5).prop_map(Value::Int),
        any::<i64>().prop_map(Value::Int),
        prop::sample::select(vec![i64::MIN, i64::MAX, -1, 0, 1, 2, 3]).prop_map(Value::Int),
        counter_text().prop_map(Value::BulkString),
        value_text().prop_map(Value::BulkString),
        ".{0,16}".prop_map(Value::SimpleString),
        any::<f64>().prop_map(Value::Double),
        any::<bool>().prop_map(Value::Boolean),
        ".{0,16}".prop_map(|text| Value::VerbatimString {
            format: VerbatimFormat::Text,
            text
        }),
    ]
}

/// Any reply tree: nested arrays, maps, sets, attributes and pushes of any leaves.
fn any_value() -> impl Strategy<Value = Value> {
    leaf().prop_recursive(4, 48, 6, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..7).prop_map(Value::Array),
            prop::collection::vec(inner.clone(), 0..4).prop_map(Value::Set),
            prop::collection::vec((inner.clone(), inner.clone()), 0..3).prop_map(Value::Map),
            (
                inner.clone(),
                prop::collection::vec((inner.clone(), inner.clone()), 0..2)
            )
                .prop_map(|(data, attributes)| Value::Attribute {
                    data: Box::new(data),
                    attributes
                }),
            prop::collection::vec(inner, 0..3).prop_map(|data| Value::Push {
                kind: PushKind::Message,
                data
            }),
        ]
    })
}

/// Replies shaped like the scripts' (a tag 0 to 3, then what that tag carries), with any items in the places.
fn script_shaped() -> impl Strategy<Value = Value> {
    (
        -1i64..=4,
        prop::collection::vec(prop_oneof![3 => leaf(), 1 => any_value()], 0..7),
    )
        .prop_map(|(tag, rest)| {
            let mut items = vec![Value::Int(tag)];
            items.extend(rest);
            Value::Array(items)
        })
}

fn reply() -> impl Strategy<Value = Value> {
    prop_oneof![2 => leaf(), 2 => any_value(), 3 => script_shaped()]
}

/// RESP pieces, for bytes a master might send: well-formed frames, declared lengths far beyond what follows,
/// and every RESP3 type.
fn resp_bytes() -> impl Strategy<Value = Vec<u8>> {
    const PIECES: &[&str] = &[
        "*2\r\n",
        "*5\r\n",
        "*-1\r\n",
        "*0\r\n",
        "*99999999999\r\n",
        "*4294967295\r\n",
        ":0\r\n",
        ":1\r\n",
        ":2\r\n",
        ":3\r\n",
        ":-9223372036854775808\r\n",
        ":99999999999999999999\r\n",
        "$2\r\n41\r\n",
        "$-1\r\n",
        "$99999999999\r\n",
        "$4\r\nab|f\r\n",
        "+OK\r\n",
        "-ERR garbage\r\n",
        "-NOSCRIPT No matching script\r\n",
        "%1\r\n",
        "~2\r\n",
        ">2\r\n",
        "|1\r\n",
        ",1.5\r\n",
        ",nan\r\n",
        "#t\r\n",
        "_\r\n",
        "(123456789012345678901234567890\r\n",
        "=8\r\ntxt:abcd\r\n",
        "!5\r\nERR x\r\n",
        "\r\n",
        "\n",
        "x",
    ];
    prop_oneof![
        prop::collection::vec(prop::sample::select(PIECES), 0..10)
            .prop_map(|pieces| pieces.concat().into_bytes()),
        // A bulk string that is not UTF-8, in a well-formed frame.
        prop::collection::vec(any::<u8>(), 0..8).prop_map(|raw| {
            let mut frame = format!("*2\r\n:2\r\n${}\r\n", raw.len()).into_bytes();
            frame.extend_from_slice(&raw);
            frame.extend_from_slice(b"\r\n");
            frame
        }),
        prop::collection::vec(any::<u8>(), 0..64),
    ]
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u64>(), any::<i64>(), any::<Option<(u64, i64)>>()).prop_map(|(ttl_ms, token, waiter)| {
            Op::Acquire {
                ttl_ms,
                token,
                waiter: waiter.map(|(id, ticket)| Waiter::new(id, ticket)),
            }
        }),
        (any::<u64>(), any::<i64>()).prop_map(|(ttl_ms, token)| Op::Extend { ttl_ms, token }),
        Just(Op::Release),
        (any::<u64>(), any::<i64>(), any::<u32>()).prop_map(|(id, ticket, wake)| Op::LeaveQueue {
            waiter: Waiter::new(id, ticket),
            wake
        }),
    ]
}

/// What `interpret` may make of `reply` for `op`: a vote (or a re-creation, or "not there") only from the exact
/// integer the script answers for it; anything else is a refusal it describes, or an error.
fn check_outcome(op: Op, reply: &Value, outcome: &NodeOutcome) {
    let int = match reply {
        Value::Int(n) => Some(*n),
        _ => None,
    };
    match (op, outcome) {
        (Op::LeaveQueue { .. }, outcome) => {
            assert_eq!(
                matches!(outcome, NodeOutcome::Granted),
                int.is_some(),
                "{reply:?} -> {outcome:?}"
            )
        }
        (_, NodeOutcome::Granted) => assert_eq!(int, Some(1), "{reply:?} counted as a vote"),
        (Op::Extend { .. }, NodeOutcome::Recreated) => assert_eq!(int, Some(2), "{reply:?}"),
        (_, NodeOutcome::Recreated) => panic!("{reply:?} -> Recreated outside an extension"),
        (Op::Release | Op::Extend { .. }, NodeOutcome::NotHeld) => assert_eq!(int, Some(0), "{reply:?}"),
        (Op::Acquire { .. }, NodeOutcome::TokenTooLow { .. } | NodeOutcome::Queued { .. }) => {
            assert!(matches!(reply, Value::Array(_)), "{reply:?} -> {outcome:?}")
        }
        (Op::Acquire { .. }, NodeOutcome::HeldByOther { .. }) => {
            assert!(matches!(reply, Value::Array(_)), "{reply:?}")
        }
        (Op::Extend { .. }, NodeOutcome::HeldByOther { counter, .. }) => {
            assert!(
                matches!(reply, Value::BulkString(_)) && counter.is_none(),
                "{reply:?}"
            )
        }
        (_, NodeOutcome::Error(_)) => {}
        (_, other) => panic!("{reply:?} -> {other:?}: not an outcome a reply can give"),
    }
    if let NodeOutcome::HeldByOther {
        holder: Some(holder), ..
    }
    | NodeOutcome::Queued {
        holder: Some(holder), ..
    } = outcome
    {
        assert!(holder.len() < 4096, "holder label of {} bytes", holder.len());
    }
}

proptest! {
    #![proptest_config(config())]

    /// Every script reply, for every operation: no panic, and no vote from anything but the answer that means one.
    #[test]
    fn fuzz_script_replies(op in op(), reply in reply()) {
        let outcome = timed("interpret", || interpret(op, reply.clone()));
        check_outcome(op, &reply, &outcome);
        // The outcome is shown in status, metrics and logs.
        let _ = timed("outcome display", || (outcome.to_string(), outcome.label(), outcome.is_vote()));
    }

    /// A master that answers garbage bytes: whatever the client's RESP parser makes of them, read as every
    /// operation's reply.
    #[test]
    fn fuzz_garbage_from_a_master(bytes in resp_bytes(), op in op(), count in 0usize..8) {
        let Ok(reply) = timed("parse_redis_value", || redis::parse_redis_value(&bytes)) else {
            return Ok(());
        };
        let outcome = timed("interpret", || interpret(op, reply.clone()));
        check_outcome(op, &reply, &outcome);
        let _ = timed("interpret_any", || interpret_any(reply, count));
    }

    /// The acquire-any script's replies: a candidate is only ever one of the attempt's.
    #[test]
    fn fuzz_permit_replies(reply in reply(), count in 0usize..120) {
        match timed("interpret_any", || interpret_any(reply.clone(), count)) {
            Answer::Granted(candidate) | Answer::Refused { candidate, .. } => {
                prop_assert!(candidate < count, "{reply:?} -> candidate {candidate} of {count}");
            }
            Answer::AllHeld { counters, .. } | Answer::Queued { counters, .. } => {
                prop_assert!(counters.iter().all(|(candidate, _)| *candidate < count), "{reply:?}");
            }
            Answer::Failed(outcome) => {
                prop_assert!(matches!(outcome, NodeOutcome::Error(_)), "{reply:?} -> {outcome:?}");
            }
        }
    }

    /// Counters and holder labels inside refusals.
    #[test]
    fn fuzz_counters_and_holders(raw in prop_oneof![counter_text(), value_text()], n in any::<i64>(), value in any_value()) {
        let counter = timed("reported_counter", || reported_counter(&raw));
        // A counter that is not a canonical decimal reads as the largest token, never as a small one.
        if let Ok(text) = std::str::from_utf8(&raw) && text.parse::<i64>().is_err() {
            prop_assert_eq!(counter, i64::MAX);
        }
        prop_assert_eq!(reported_counter(n.to_string().as_bytes()), n);
        if let Some(holder) = timed("holder_of", || LockValue::holder_of(&raw)) {
            let text = std::str::from_utf8(&raw).expect("a holder is read from UTF-8 only");
            let secret = &text[holder.len() + 1..];
            prop_assert!(text.starts_with(&holder) && text.as_bytes()[holder.len()] == b'|');
            prop_assert!(!secret.is_empty() && secret.bytes().all(|b| b.is_ascii_hexdigit()));
        }
        let _ = timed("known_counter", || (known_counter(&value), holder_named(&value)));
    }

    /// `INFO server` as a master (or something posing as one) answers it.
    #[test]
    fn fuzz_server_info(
        lines in prop::collection::vec(
            prop_oneof![
                ".{0,30}",
                "run_id:.{0,45}",
                "uptime_in_seconds:[ -+0-9a-z]{0,25}",
                "uptime_in_seconds:[0-9]{1,25}",
                "# Server",
            ],
            0..8,
        ),
        separator in prop::sample::select(vec!["\r\n", "\n", "\r", ""]),
    ) {
        let text = lines.join(separator);
        if let Ok(info) = timed("parse_server_info", || parse_server_info(&text)) {
            prop_assert!(text.contains("run_id:") && text.contains("uptime_in_seconds:"));
            prop_assert!(!info.run_id.starts_with(char::is_whitespace));
        }
    }
}
