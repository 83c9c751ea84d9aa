//! Fencing tokens that cannot advance: where the largest token was found and what an operator can do about it.
//! Pure: the message is tested without a cluster.

use crate::redlock::counter_key;

/// The Ready condition's reason (and the Warning Event's) of a lock whose token cannot advance.
pub const EXHAUSTED_REASON: &str = "FencingTokenExhausted";

/// Where the largest token there is was found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Exhausted {
    /// The highest token known for the lock (status, or what this replica granted) is already the largest.
    Known { token: i64 },
    /// The masters' counter for the key is at the largest token (or beyond what a token can be).
    Masters { counter: i64 },
    /// The cluster's floor record for the key is at the largest token.
    Floor { token: i64 },
}

/// What is reset where, to let a lock whose token cannot advance be held again.
pub struct Places<'a> {
    pub quorum: &'a str,
    pub key: &'a str,
    /// `namespace/name` of the cluster's floor record for the key.
    pub floor_record: &'a str,
}

/// The message of the condition and the Event: what is at the limit, how to start again, and what that risks.
pub fn exhausted_message(exhausted: &Exhausted, places: &Places<'_>) -> String {
    let found = match exhausted {
        Exhausted::Known { token } => format!("the lock's status.fencingToken is {token}"),
        Exhausted::Masters { counter } => format!(
            "the fencing counter `{}` on the masters of RedisQuorum `{}` is at {counter}",
            counter_key(places.key),
            places.quorum
        ),
        Exhausted::Floor { token } => format!(
            "the floor record ConfigMap `{}` (data.token) is at {token}",
            places.floor_record
        ),
    };
    format!(
        "no fencing token can be granted above the largest one ({}): {found}. To start the key `{}` again, \
         stop every holder, then reset all three places to 0: status.fencingToken of every lock naming the key \
         (kubectl patch --subresource=status), the ConfigMap `{}`, and the key `{}` on every master of RedisQuorum \
         `{}`. Only do that once every resource fenced with these tokens forgets the highest it accepted: until \
         then it rejects every new holder, and if it forgot while an old holder still writes, that holder's late \
         writes are accepted again",
        i64::MAX,
        places.key,
        places.floor_record,
        counter_key(places.key),
        places.quorum
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    const PLACES: Places<'static> = Places {
        quorum: "default",
        key: "ns/orders",
        floor_record: "redlock/redlock-token-floor-00",
    };

    #[test]
    fn the_message_names_the_limit_every_place_to_reset_and_the_risk() {
        let message = exhausted_message(&Exhausted::Masters { counter: i64::MAX }, &PLACES);
        assert!(message.contains(
            "`{ns/orders}:token` on the masters of RedisQuorum `default` is at 9223372036854775807"
        ));
        assert!(message.contains("ConfigMap `redlock/redlock-token-floor-00`"));
        assert!(message.contains("status.fencingToken"));
        assert!(message.contains("late writes"), "{message}");
        let known = exhausted_message(&Exhausted::Known { token: i64::MAX }, &PLACES);
        assert!(known.contains("status.fencingToken is 9223372036854775807"));
        let floor = exhausted_message(&Exhausted::Floor { token: i64::MAX }, &PLACES);
        assert!(floor.contains("(data.token) is at 9223372036854775807"));
    }
}
