//! When a key given up by its holder may be released: a pure function of the validity that holder was shown and
//! the clock, so every branch is tested with a fake one.
//!
//! A holder learns that it holds from what the operator shows it (a leader's label and `valid-until`, an
//! identity's status) and believes it until it sees that go — through a watch, milliseconds later, or never when
//! it is cut off from the API server — or until that validity (minus its fence margin) comes. Released at once,
//! the key went to another cluster or a `lock` process in those milliseconds (found by the product safety
//! checker). So a key shown to a holder is released only once the validity last shown to it has ended, unless
//! the holder is known to have stopped.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

/// When a given-up key may be released.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Release {
    /// Nobody can still be acting on it.
    Now,
    /// Not before this: the end of the validity its holder may still believe in.
    At(Timestamp),
}

/// The latest validity that can have been shown to the holder: what status showed and the validity of the lease
/// this replica kept (every validity shown came from one of its extensions, so it is the bound when status lags).
pub fn shown_until(in_status: Option<Timestamp>, kept: Option<Timestamp>) -> Option<Timestamp> {
    in_status.max(kept)
}

/// Whether the key may go now. `holder_stopped`: confirmed with a direct read that the holder cannot act any more
/// (a leader pod deleted once its kubelet reported it finished). No validity known means none was shown.
pub fn when_to_release(shown_until: Option<Timestamp>, holder_stopped: bool, now: Timestamp) -> Release {
    match shown_until {
        Some(until) if !holder_stopped && now < until => Release::At(until),
        _ => Release::Now,
    }
}

/// How long a reconciler waits for `at`: a millisecond past it (a look that still comes early waits again).
pub fn wait_until(at: Timestamp, now: Timestamp) -> Duration {
    Duration::try_from(at.duration_since(now))
        .unwrap_or_default()
        .saturating_add(Duration::from_millis(1))
}

/// What status and Events say while the key waits, so that a user sees why a hand-over waits.
pub fn release_note(holder: &str, release: Release) -> String {
    match release {
        Release::Now => format!("the key is released now: {holder} cannot be acting on it any more"),
        Release::At(at) => {
            format!("the key is released at {at}, when the validity shown to {holder} ends")
        }
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::SignedDuration;

    use super::*;

    fn at(second: i64) -> Timestamp {
        Timestamp::from_second(second).unwrap()
    }

    #[test]
    fn a_key_shown_to_a_holder_waits_for_the_validity_shown() {
        let until = Some(at(1_010));
        assert_eq!(when_to_release(until, false, at(1_000)), Release::At(at(1_010)));
        assert_eq!(
            when_to_release(until, false, at(1_010) - SignedDuration::from_nanos(1)),
            Release::At(at(1_010)),
            "not a nanosecond early"
        );
        assert_eq!(when_to_release(until, false, at(1_010)), Release::Now);
        assert_eq!(when_to_release(until, false, at(2_000)), Release::Now);
    }

    #[test]
    fn a_holder_known_stopped_or_never_shown_a_validity_lets_the_key_go_at_once() {
        assert_eq!(when_to_release(Some(at(1_010)), true, at(1_000)), Release::Now);
        assert_eq!(when_to_release(None, false, at(1_000)), Release::Now);
    }

    #[test]
    fn the_bound_is_the_later_of_status_and_the_kept_lease() {
        assert_eq!(shown_until(Some(at(5)), Some(at(7))), Some(at(7)));
        assert_eq!(
            shown_until(Some(at(9)), Some(at(7))),
            Some(at(9)),
            "a status written by a predecessor can show more than this replica's lease"
        );
        assert_eq!(shown_until(None, Some(at(7))), Some(at(7)));
        assert_eq!(shown_until(Some(at(5)), None), Some(at(5)));
        assert_eq!(shown_until(None, None), None);
    }

    #[test]
    fn a_wait_ends_just_after_the_release_time_and_never_before_now() {
        assert_eq!(wait_until(at(1_010), at(1_000)), Duration::from_millis(10_001));
        assert_eq!(wait_until(at(1_000), at(1_010)), Duration::from_millis(1));
    }

    #[test]
    fn the_note_says_when_and_why() {
        let note = release_note("web-0", Release::At(at(1_010)));
        assert!(
            note.contains("web-0") && note.contains("1970-01-01T00:16:50Z"),
            "{note}"
        );
        assert!(release_note("web-0", Release::Now).contains("now"));
    }
}
