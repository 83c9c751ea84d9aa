//! The cluster's durable floor of fencing tokens per (quorum, key): one small ConfigMap in the operator's
//! namespace records the highest token granted for the key. A semaphore's permits are keys of their own
//! (`permit_key`), so each permit has its own record and token sequence; permit 0's is the plain lock's. The masters' counters can forget (a majority
//! restarted empty, `FLUSHALL`, counters expired); a token is shown nowhere before this record holds it, so
//! within a cluster a later grant never shows a lower token. Pure: naming, the record's data, and what to do
//! after the masters granted; `floor_record` makes the API calls.

use std::collections::BTreeMap;

use ring::digest;

/// Name prefix of the floor records.
pub const RECORD_PREFIX: &str = "redlock-token-floor-";
/// The label every floor record carries (and what `kubectl get cm -l` finds them by).
pub const MANAGED_BY: (&str, &str) = ("app.kubernetes.io/managed-by", "redlock-operator");

const DATA_QUORUM: &str = "quorum";
const DATA_KEY: &str = "key";
const DATA_TOKEN: &str = "token";

/// The record's name: a hash of quorum and key (keys may be long and hold any character), length-prefixed so
/// that no two (quorum, key) pairs share one.
pub fn record_name(quorum: &str, key: &str) -> String {
    let mut context = digest::Context::new(&digest::SHA256);
    for part in [quorum, key] {
        context.update(&(part.len() as u64).to_be_bytes());
        context.update(part.as_bytes());
    }
    let hash = context.finish();
    format!("{RECORD_PREFIX}{}", hex::encode(&hash.as_ref()[..20]))
}

/// The record's data for `token`.
pub fn record_data(quorum: &str, key: &str, token: i64) -> BTreeMap<String, String> {
    BTreeMap::from([
        (DATA_QUORUM.to_owned(), quorum.to_owned()),
        (DATA_KEY.to_owned(), key.to_owned()),
        (DATA_TOKEN.to_owned(), token.to_string()),
    ])
}

/// The floor a record holds (0 for none), or what is wrong with it: anyone allowed to edit ConfigMaps in the
/// namespace can write it, and a record that makes no sense is not guessed at.
pub fn floor_of(data: Option<&BTreeMap<String, String>>, quorum: &str, key: &str) -> Result<i64, String> {
    let field = |name: &str| data.and_then(|data| data.get(name)).map(String::as_str);
    if field(DATA_QUORUM) != Some(quorum) || field(DATA_KEY) != Some(key) {
        return Err(format!(
            "it does not name quorum `{quorum}` and key `{key}` in data.quorum and data.key"
        ));
    }
    let token = field(DATA_TOKEN).ok_or("it has no data.token")?;
    match token.parse::<i64>() {
        Ok(token) if token >= 0 => Ok(token),
        _ => Err(format!(
            "data.token `{token}` is not a token (an integer from 0 to {})",
            i64::MAX
        )),
    }
}

/// What an acquisition granted by the masters with `granted` does, given the floor the record holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AfterGrant {
    /// Record `granted` as the new floor, then show it.
    Record,
    /// The masters forgot: a token at least `floor` was granted before. Give the grant back and acquire with
    /// the masters asked for a token above `floor`.
    Reacquire { floor: i64 },
}

pub fn after_grant(floor: i64, granted: i64) -> AfterGrant {
    if floor >= granted {
        AfterGrant::Reacquire { floor }
    } else {
        AfterGrant::Record
    }
}

/// The message of a record that makes no sense: which one, what is wrong, how to repair it.
pub fn invalid_record_message(namespace: &str, name: &str, problem: &str) -> String {
    format!(
        "the fencing-token floor record ConfigMap `{namespace}/{name}` cannot be read: {problem}. Set data.token \
         to the highest fencing token ever granted for the key (at least status.fencingToken of every lock \
         naming it) or delete the ConfigMap; deleting it lets a token go back if the masters also forgot theirs"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_permit_has_its_own_record_and_permit_0_keeps_the_plain_locks() {
        use crate::redlock::permit_key;
        assert_eq!(
            record_name("default", &permit_key("ns/jobs", 0)),
            record_name("default", "ns/jobs"),
            "a lock that becomes a semaphore keeps its floor on permit 0"
        );
        let names: std::collections::HashSet<String> = (0..100)
            .map(|permit| record_name("default", &permit_key("ns/jobs", permit)))
            .collect();
        assert_eq!(names.len(), 100);
        assert_eq!(
            floor_of(
                Some(&record_data("default", "permit:2:ns/jobs", 7)),
                "default",
                &permit_key("ns/jobs", 2)
            ),
            Ok(7)
        );
    }

    #[test]
    fn names_are_stable_valid_and_distinct_per_quorum_and_key() {
        let name = record_name("default", "ns/orders");
        assert_eq!(name, record_name("default", "ns/orders"));
        assert!(name.starts_with(RECORD_PREFIX) && name.len() == RECORD_PREFIX.len() + 40);
        assert!(
            name.chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        );
        assert_ne!(name, record_name("other", "ns/orders"));
        assert_ne!(name, record_name("default", "ns/orders2"));
        // Without the length prefixes these two would hash the same bytes.
        assert_ne!(record_name("ab", "c"), record_name("a", "bc"));
    }

    #[test]
    fn a_record_reads_back_as_its_floor() {
        let data = record_data("default", "ns/orders", 42);
        assert_eq!(floor_of(Some(&data), "default", "ns/orders"), Ok(42));
        assert_eq!(
            floor_of(
                Some(&record_data("default", "ns/orders", i64::MAX)),
                "default",
                "ns/orders"
            ),
            Ok(i64::MAX)
        );
    }

    #[test]
    fn records_that_make_no_sense_are_refused_with_the_reason() {
        assert!(
            floor_of(None, "default", "k")
                .unwrap_err()
                .contains("data.quorum")
        );
        let other_key = record_data("default", "other", 3);
        assert!(floor_of(Some(&other_key), "default", "k").is_err());
        for token in ["-1", "x", "9223372036854775808", ""] {
            let mut data = record_data("default", "k", 0);
            data.insert("token".into(), token.into());
            let problem = floor_of(Some(&data), "default", "k").unwrap_err();
            assert!(problem.contains("is not a token"), "{token}: {problem}");
        }
        let mut data = record_data("default", "k", 0);
        data.remove("token");
        assert_eq!(
            floor_of(Some(&data), "default", "k"),
            Err("it has no data.token".into())
        );
    }

    #[test]
    fn a_grant_at_or_below_the_floor_is_given_back_and_one_above_recorded() {
        assert_eq!(after_grant(0, 1), AfterGrant::Record);
        assert_eq!(after_grant(6, 7), AfterGrant::Record);
        assert_eq!(after_grant(7, 7), AfterGrant::Reacquire { floor: 7 });
        assert_eq!(after_grant(9, 2), AfterGrant::Reacquire { floor: 9 });
        assert_eq!(
            after_grant(i64::MAX, 5),
            AfterGrant::Reacquire { floor: i64::MAX }
        );
    }
}
