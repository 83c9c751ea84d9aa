//! The semaphore mode of the check. A holder believes it holds one permit of a key: its belief (and its writes
//! to the protected resource) are recorded on that permit's own Redis key, `redlock::permit_key(key, i)` (the key
//! itself for permit 0, `permit:<i>:<key>` above), which has its own token sequence. So the per-resource checks
//! of a plain lock — one holder at a time, tokens rising, no older token accepted after a newer one — are made
//! per permit as they are, and this module adds the per-key one: never more beliefs of a key at once than its
//! permits.

use std::collections::{BTreeMap, BTreeSet};

use redlock_operator::redlock::{PERMIT_KEY_PREFIX, permit_key};

use crate::support::history::{Interval, Overlap, find_overlaps};

/// The resource a holder of permit `permit` of `key` acts on: that permit's Redis key.
pub fn permit_resource(key: &str, permit: u32) -> String {
    permit_key(key, permit)
}

/// The key a permit's resource belongs to: the resource without its `permit:<i>:` prefix.
pub fn key_of(resource: &str) -> &str {
    resource
        .strip_prefix(PERMIT_KEY_PREFIX)
        .and_then(|rest| {
            let (number, key) = rest.split_once(':')?;
            number.bytes().all(|byte| byte.is_ascii_digit()).then_some(key)
        })
        .unwrap_or(resource)
}

/// How many holders each key admits at once: its permits (1, a plain lock, for every key not named).
#[derive(Clone, Debug, Default)]
pub struct Bounds(BTreeMap<String, usize>);

impl Bounds {
    pub fn set(&mut self, key: &str, permits: usize) {
        self.0.insert(key.to_owned(), permits);
    }

    pub fn of(&self, key: &str) -> usize {
        self.0.get(key).copied().unwrap_or(1)
    }
}

/// Every belief seen as one of its key (whatever its permit): for the checks that ask how many hold a key, or
/// whether anyone does.
pub fn per_key(beliefs: &[Interval]) -> Vec<Interval> {
    beliefs
        .iter()
        .map(|belief| Interval {
            resource: key_of(&belief.resource).to_owned(),
            ..belief.clone()
        })
        .collect()
}

/// Every belief that starts while its key's permits are all believed held by others: an excess holder, whatever
/// permit numbers the holders think they have. A plain key (one permit, every belief of permit 0) is left to the
/// per-permit check, which finds the same overlaps.
pub fn excess_holders(beliefs: &[Interval], bounds: &Bounds) -> Vec<Overlap> {
    let with_permits: BTreeSet<&str> = beliefs
        .iter()
        .map(|belief| key_of(&belief.resource))
        .filter(|key| bounds.of(key) > 1)
        .chain(
            beliefs
                .iter()
                .filter(|belief| key_of(&belief.resource) != belief.resource)
                .map(|belief| key_of(&belief.resource)),
        )
        .collect();
    let mut by_bound: BTreeMap<usize, Vec<Interval>> = BTreeMap::new();
    for belief in per_key(beliefs) {
        if with_permits.contains(belief.resource.as_str()) {
            by_bound
                .entry(bounds.of(&belief.resource))
                .or_default()
                .push(belief);
        }
    }
    by_bound
        .into_iter()
        .flat_map(|(bound, beliefs)| find_overlaps(&beliefs, bound))
        .collect()
}

/// The most beliefs of `key` (whatever their permits) held at once among `beliefs`.
pub fn most_at_once<'a>(beliefs: impl IntoIterator<Item = &'a Interval>, key: &str) -> usize {
    let mut edges: Vec<(tokio::time::Instant, i32)> = Vec::new();
    for belief in beliefs
        .into_iter()
        .filter(|belief| key_of(&belief.resource) == key && belief.end > belief.start)
    {
        edges.push((belief.start, 1));
        edges.push((belief.end, -1));
    }
    // An end at the instant of a start is no overlap: ends sort first.
    edges.sort();
    let (mut now, mut most) = (0i32, 0i32);
    for (_, step) in edges {
        now += step;
        most = most.max(now);
    }
    usize::try_from(most).unwrap_or(0)
}
