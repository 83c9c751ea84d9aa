//! A history of holdings and the checks made on it, shared by the engine's safety checker (`safety.rs`: a
//! holding is a grant's window) and the product's (`product_safety/`: a holding is a holder's belief). One
//! monotonic clock of this machine orders every event.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use tokio::time::Instant;

/// One holder's holding of one resource (key): from `start` to `end`, with `token`.
#[derive(Clone, Debug)]
pub struct Interval {
    pub resource: String,
    pub client: String,
    pub start: Instant,
    pub end: Instant,
    pub token: i64,
    /// What explains the interval (what the masters answered, what the holder saw), to explain a finding.
    pub evidence: String,
}

#[derive(Clone, Debug)]
pub struct Overlap {
    pub resource: String,
    pub first: Interval,
    pub second: Interval,
}

impl fmt::Display for Overlap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} held until {:?} after {} got it at {:?} ({:.1}ms of overlap)",
            self.resource,
            self.first.client,
            self.first.end,
            self.second.client,
            self.second.start,
            (self.first.end - self.second.start).as_secs_f64() * 1e3
        )?;
        if !self.first.evidence.is_empty() || !self.second.evidence.is_empty() {
            write!(
                f,
                "\n    first (from {:?}): {}\n    second: {}",
                self.first.start, self.first.evidence, self.second.evidence
            )?;
        }
        Ok(())
    }
}

/// Intervals per resource, sorted by start (the grant order wherever they do not overlap).
fn in_start_order(intervals: &[Interval]) -> BTreeMap<&str, Vec<&Interval>> {
    let mut by_resource: BTreeMap<&str, Vec<&Interval>> = BTreeMap::new();
    for interval in intervals {
        by_resource.entry(&interval.resource).or_default().push(interval);
    }
    for windows in by_resource.values_mut() {
        windows.sort_by_key(|interval| (interval.start, interval.end));
    }
    by_resource
}

/// Every interval that starts while `bound` others of its resource are still open (a lock has one holder at a
/// time: `bound` 1; a semaphore of N permits: N), paired with the open one that lasts longest. A sweep over
/// intervals sorted by start.
pub fn find_overlaps(intervals: &[Interval], bound: usize) -> Vec<Overlap> {
    let mut overlaps = Vec::new();
    for (resource, windows) in in_start_order(intervals) {
        let mut open: Vec<&Interval> = Vec::new();
        for interval in windows {
            open.retain(|earlier| earlier.end > interval.start);
            if open.len() >= bound
                && let Some(longest) = open.iter().max_by_key(|earlier| earlier.end)
            {
                overlaps.push(Overlap {
                    resource: resource.to_owned(),
                    first: (*longest).clone(),
                    second: interval.clone(),
                });
            }
            open.push(interval);
        }
    }
    overlaps
}

/// An interval whose token is not above every token held before it on the same resource.
#[derive(Clone, Debug)]
pub struct TokenRegression {
    pub resource: String,
    pub earlier: Interval,
    pub later: Interval,
}

impl fmt::Display for TokenRegression {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}: {} got token {} at {:?}, after {} had token {} from {:?}\n    later: {}",
            self.resource,
            self.later.client,
            self.later.token,
            self.later.start,
            self.earlier.client,
            self.earlier.token,
            self.earlier.start,
            self.later.evidence
        )
    }
}

/// Whether one holding may show up as several intervals.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Repeats {
    /// Every interval is a grant of its own (the engine's history).
    Forbidden,
    /// A holder may believe again with the token it had (an outage of its view, a resumed Job): intervals of
    /// one holder with the highest token so far are that holding again, not a new grant.
    SameHolder,
}

/// Every interval, per resource in start order, whose token does not exceed the highest held before it.
pub fn find_token_regressions(intervals: &[Interval], repeats: Repeats) -> Vec<TokenRegression> {
    let mut regressions = Vec::new();
    for (resource, windows) in in_start_order(intervals) {
        let mut highest: Option<&Interval> = None;
        for interval in windows {
            match highest {
                Some(top)
                    if repeats == Repeats::SameHolder
                        && interval.token == top.token
                        && interval.client == top.client => {}
                Some(top) if interval.token <= top.token => regressions.push(TokenRegression {
                    resource: resource.to_owned(),
                    earlier: top.clone(),
                    later: interval.clone(),
                }),
                _ => highest = Some(interval),
            }
        }
    }
    regressions
}

/// Holdings per resource: each change of token or holder counts once, repeated beliefs of one holding do not.
pub fn transitions(intervals: &[Interval]) -> BTreeMap<String, usize> {
    let mut counts = BTreeMap::new();
    for (resource, windows) in in_start_order(intervals) {
        let mut last: Option<(&str, i64)> = None;
        let mut count = 0;
        for interval in windows {
            let holding = (interval.client.as_str(), interval.token);
            if last != Some(holding) {
                count += 1;
                last = Some(holding);
            }
        }
        counts.insert(resource.to_owned(), count);
    }
    counts
}

/// The longest stretch, on any resource, during which nobody held it.
pub fn longest_unavailable(
    intervals: &[Interval],
    resources: &[String],
    from: Instant,
    to: Instant,
) -> Duration {
    longest_unavailable_outside(intervals, resources, from, to, &[])
}

/// The longest stretch of time outside `excused` (periods when faults, and recovery from them, may leave a
/// resource without a holder) during which nobody held one of `resources`.
pub fn longest_unavailable_outside(
    intervals: &[Interval],
    resources: &[String],
    from: Instant,
    to: Instant,
    excused: &[(Instant, Instant)],
) -> Duration {
    let mut longest = Duration::ZERO;
    for resource in resources {
        let mut covered: Vec<(Instant, Instant)> = intervals
            .iter()
            .filter(|interval| &interval.resource == resource)
            .map(|interval| (interval.start, interval.end))
            .chain(excused.iter().copied())
            .collect();
        covered.sort();
        let mut covered_until = from;
        for (start, end) in covered {
            if start > covered_until {
                longest = longest.max(start - covered_until);
            }
            covered_until = covered_until.max(end);
        }
        if to > covered_until {
            longest = longest.max(to - covered_until);
        }
    }
    longest
}
