//! The order check of the engine checker's fair mode (issue 31): a waiter that a majority of masters had queued
//! before another waiter first asked must get the key first, unless a fault was under way while it waited.

use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// One fair acquisition: when it first asked, when a majority of masters had queued it with one ticket (if
/// ever), and when it got the key (if it did before giving up).
#[derive(Clone, Debug)]
pub struct Arrival {
    pub resource: String,
    pub client: String,
    pub asked: Instant,
    pub queued: Option<Instant>,
    pub granted: Option<Instant>,
}

/// A waiter served after one that arrived after it, with no fault to excuse it.
#[derive(Clone, Debug)]
pub struct Inversion {
    pub first: Arrival,
    pub overtaken_by: Arrival,
}

impl fmt::Display for Inversion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (Some(queued), Some(granted), Some(other_granted)) =
            (self.first.queued, self.first.granted, self.overtaken_by.granted)
        else {
            return write!(f, "{self:?}");
        };
        write!(
            f,
            "{} on {}: queued at a majority {:?} before {} asked, yet granted {:?} after it",
            self.first.client,
            self.first.resource,
            self.overtaken_by.asked.saturating_duration_since(queued),
            self.overtaken_by.client,
            granted.saturating_duration_since(other_granted),
        )
    }
}

/// Every pair where a waiter queued at a majority before another asked was granted after it, leaving out the
/// pairs a fault excuses: one under way (or within `aftermath` of its end: the queue is learned back by then)
/// at any time between the first waiter's first attempt and its grant.
pub fn find_order_inversions(
    arrivals: &[Arrival],
    faults: &[(Instant, Instant)],
    aftermath: Duration,
) -> (Vec<Inversion>, usize) {
    let mut inversions = Vec::new();
    let mut excused = 0;
    for first in arrivals {
        let (Some(queued), Some(granted)) = (first.queued, first.granted) else {
            continue;
        };
        let faulted = faults
            .iter()
            .any(|(began, ended)| *began <= granted && *ended + aftermath >= first.asked);
        for later in arrivals {
            let overtook = later.resource == first.resource
                && later.asked > queued
                && later.granted.is_some_and(|other| other < granted);
            if !overtook {
                continue;
            }
            if faulted {
                excused += 1;
            } else {
                inversions.push(Inversion {
                    first: first.clone(),
                    overtaken_by: later.clone(),
                });
            }
        }
    }
    (inversions, excused)
}
