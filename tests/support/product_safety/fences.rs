//! The operator's fences of lost locks, as its replicas logged them: for each, how long after the fence time the
//! lock was looked at, how long the fence's writes took (the Job's suspension, the leader label's removal) and
//! how much of the validity was left once they were written. Pure: it reads log text, so the checker's report
//! can say where a late fence's time went.

use std::fmt;

/// What one "lock lost" line says of its fence, in milliseconds (signed: negative is before the fence time, or
/// after the validity ended).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Fence {
    pub looked_at_after_fence_time_ms: i64,
    pub fence_write_ms: i64,
    pub validity_left_ms: i64,
}

/// Every fence the replicas logged in one run.
#[derive(Clone, Debug, Default)]
pub struct Fences(pub Vec<Fence>);

/// The fences logged in `log` (a replica's stderr, text format); lines of other messages, or a loss without
/// a held lease to measure (nothing to fence), are skipped.
pub fn parse(log: &str) -> Vec<Fence> {
    log.lines()
        .filter(|line| line.contains(" lock lost "))
        .filter_map(|line| {
            let field = |name: &str| {
                line.split_whitespace()
                    .find_map(|token| token.strip_prefix(name)?.strip_prefix('=')?.parse::<i64>().ok())
            };
            Some(Fence {
                looked_at_after_fence_time_ms: field("looked_at_after_fence_time_ms")?,
                fence_write_ms: field("fence_write_ms")?,
                validity_left_ms: field("validity_left_ms")?,
            })
        })
        .collect()
}

impl Fences {
    /// The fences written once the validity they were meant to precede had ended.
    pub fn late(&self) -> Vec<Fence> {
        self.0
            .iter()
            .copied()
            .filter(|fence| fence.validity_left_ms < 0)
            .collect()
    }

    /// The fence that left the least validity, if any.
    pub fn closest(&self) -> Option<Fence> {
        self.0.iter().copied().min_by_key(|fence| fence.validity_left_ms)
    }
}

/// `p`-th percentile (0–100) of `values` by nearest rank.
fn percentile(values: &[i64], p: usize) -> i64 {
    let mut sorted = values.to_vec();
    sorted.sort_unstable();
    let rank = (sorted.len() * p).div_ceil(100).clamp(1, sorted.len().max(1));
    sorted.get(rank - 1).copied().unwrap_or(0)
}

impl fmt::Display for Fences {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let Some(closest) = self.closest() else {
            return write!(f, "operator fences: none logged");
        };
        let of = |pick: fn(&Fence) -> i64| self.0.iter().map(pick).collect::<Vec<_>>();
        let left = of(|fence| fence.validity_left_ms);
        let looked = of(|fence| fence.looked_at_after_fence_time_ms);
        let writes = of(|fence| fence.fence_write_ms);
        write!(
            f,
            "operator fences: {} (validity left when written: min {} p50 {} ms; looked at after the fence time: p50 {} max {} ms; the fence's writes: p50 {} max {} ms); closest: looked at {} ms after the fence time, written in {} ms, {} ms of validity left",
            self.0.len(),
            closest.validity_left_ms,
            percentile(&left, 50),
            percentile(&looked, 50),
            percentile(&looked, 100),
            percentile(&writes, 50),
            percentile(&writes, 100),
            closest.looked_at_after_fence_time_ms,
            closest.fence_write_ms,
            closest.validity_left_ms,
        )
    }
}
