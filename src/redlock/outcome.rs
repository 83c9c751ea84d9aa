use std::fmt;
use std::time::Duration;

/// What one master answered to one operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum NodeOutcome {
    /// The master voted for us: key set (acquire), TTL extended (extend) or key deleted (release).
    Granted,
    /// Extend only: the key had vanished and was re-created with NX. Not counted as a vote, so that keys lost
    /// without a restart (FLUSHALL, eviction) on a majority are noticed as a lost lock.
    Recreated,
    /// Another value holds the key; `holder` is its label when it was written by a Redlock client of ours.
    HeldByOther {
        holder: Option<String>,
        /// Acquire: the master's fencing counter for the key, where it is not below the proposed token. A
        /// refusal of any kind says so, so that the acquisition proposes above it even with a majority granted.
        counter: Option<i64>,
    },
    /// Acquire: the master's fencing counter for the key is already at `counter`, not below the proposed token;
    /// nothing was written. The acquisition proposes `counter + 1` next.
    TokenTooLow {
        counter: i64,
    },
    /// Acquire: the key's fair queue comes first on this master. `place` counts from 1 (1: first in the queue,
    /// waiting for `holder` to let go); `ticket` is the waiter's ticket on this master (0 for a caller that does
    /// not wait and was not queued); `holder` is the key's holder, when there is one and it is a client of ours.
    Queued {
        place: u64,
        ticket: i64,
        holder: Option<String>,
        /// The master's fencing counter for the key, where it is not below the proposed token (as for
        /// [`NodeOutcome::HeldByOther`]).
        counter: Option<i64>,
    },
    /// Release/extend: the key was not there (already expired or never set on this master).
    NotHeld,
    Timeout,
    Error(String),
    /// Restarted less than max-TTL ago: no writes, no vote.
    Quarantined {
        remaining: Duration,
    },
    /// No verified connection at the moment (reconnecting in the background).
    Unavailable(String),
    /// The operation was decided before this master answered.
    Pending,
}

impl NodeOutcome {
    pub fn is_vote(&self) -> bool {
        matches!(self, Self::Granted)
    }

    /// Failures that say nothing about the lock, only about reaching the master.
    pub fn is_unreachable(&self) -> bool {
        matches!(
            self,
            Self::Timeout | Self::Error(_) | Self::Quarantined { .. } | Self::Unavailable(_)
        )
    }

    pub fn label(&self) -> &'static str {
        match self {
            Self::Granted => "granted",
            Self::Recreated => "recreated",
            Self::HeldByOther { .. } => "held-by-other",
            Self::TokenTooLow { .. } => "token-too-low",
            Self::Queued { .. } => "queued",
            Self::NotHeld => "not-held",
            Self::Timeout => "timeout",
            Self::Error(_) => "error",
            Self::Quarantined { .. } => "quarantined",
            Self::Unavailable(_) => "unavailable",
            Self::Pending => "pending",
        }
    }
}

impl fmt::Display for NodeOutcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::HeldByOther {
                holder: Some(holder), ..
            } => write!(f, "held by {holder}"),
            Self::TokenTooLow { counter } => write!(f, "token too low (fencing counter at {counter})"),
            Self::Queued { place, .. } => write!(f, "queued, place {place}"),
            Self::Error(message) | Self::Unavailable(message) => write!(f, "{}: {message}", self.label()),
            Self::Quarantined { remaining } => write!(
                f,
                "quarantined for {} more (restarted recently)",
                crate::duration::format(round_ms(*remaining))
            ),
            other => f.write_str(other.label()),
        }
    }
}

fn round_ms(duration: Duration) -> Duration {
    Duration::from_millis(duration.as_millis() as u64)
}

/// Where a waiter stands in a key's fair queue, from one attempt's report (see [`OperationReport::queue_place`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QueuePlace {
    /// 1: next once the holder lets go.
    pub place: u64,
    /// The highest ticket a master gave the waiter (0 for a caller that does not wait).
    pub ticket: i64,
    /// Every master that queued the waiter gave it that ticket; if not, the next attempt brings it to them.
    pub settled: bool,
}

/// Masters kept out by their restart quarantine, from one operation's report (see
/// [`OperationReport::quarantine_outlook`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct QuarantineOutlook {
    /// How many masters were quarantined.
    pub quarantined: usize,
    /// How long until enough of them have left the quarantine to make a majority with the masters that
    /// answered, if those keep answering; `None` if even all of them would not make one.
    pub majority_in: Option<Duration>,
    /// How many masters could vote once every quarantine is over (the others staying as they are).
    pub can_vote_after: usize,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NodeReport {
    /// The master's URL without its password.
    pub endpoint: String,
    pub outcome: NodeOutcome,
    /// Round trip of this operation on this master, when it answered.
    pub latency: Option<Duration>,
}

/// Per-master outcomes of one acquire, extend or release.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct OperationReport {
    pub nodes: Vec<NodeReport>,
    pub elapsed: Duration,
    pub quorum: usize,
}

impl OperationReport {
    pub fn votes(&self) -> usize {
        self.nodes.iter().filter(|node| node.outcome.is_vote()).count()
    }

    pub fn unreachable(&self) -> usize {
        self.nodes
            .iter()
            .filter(|node| node.outcome.is_unreachable())
            .count()
    }

    /// Whether the masters that voted, with those whose answer is unknown (unreachable, or not waited for once the
    /// operation was decided), could still make a majority: then the key may still hold the value on a majority,
    /// and nobody else can take it either.
    pub fn could_still_be_held(&self) -> bool {
        let unknown = self
            .nodes
            .iter()
            .filter(|node| node.outcome.is_unreachable() || node.outcome == NodeOutcome::Pending)
            .count();
        self.votes().saturating_add(unknown) >= self.quorum
    }

    /// "2 timed out, 1 quarantined": why masters did not vote, for error messages.
    pub fn unreachable_summary(&self) -> String {
        self.unreachable_counts(true)
    }

    /// Like [`Self::unreachable_summary`], leaving the quarantined masters out (told separately).
    pub(crate) fn unreachable_summary_but_quarantined(&self) -> String {
        self.unreachable_counts(false)
    }

    fn unreachable_counts(&self, with_quarantined: bool) -> String {
        let mut counts: Vec<(&'static str, usize)> = Vec::new();
        for node in &self.nodes {
            let label = match node.outcome {
                NodeOutcome::Timeout => "timed out",
                NodeOutcome::Error(_) => "failed",
                NodeOutcome::Quarantined { .. } if with_quarantined => "quarantined (restarted recently)",
                NodeOutcome::Unavailable(_) => "not connected",
                _ => continue,
            };
            match counts.iter_mut().find(|(known, _)| *known == label) {
                Some((_, count)) => *count += 1,
                None => counts.push((label, 1)),
            }
        }
        counts
            .iter()
            .map(|(label, count)| format!("{count} {label}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Whether the restart quarantine is what keeps a majority from voting, and for how long: `None` when no
    /// master was quarantined, or when enough masters answered anyway.
    pub fn quarantine_outlook(&self) -> Option<QuarantineOutlook> {
        let mut remaining: Vec<Duration> = self
            .nodes
            .iter()
            .filter_map(|node| match node.outcome {
                NodeOutcome::Quarantined { remaining } => Some(remaining),
                _ => None,
            })
            .collect();
        let answered = self.nodes.len().saturating_sub(self.unreachable());
        let missing = self.quorum.saturating_sub(answered);
        if remaining.is_empty() || missing == 0 {
            return None;
        }
        remaining.sort_unstable();
        Some(QuarantineOutlook {
            quarantined: remaining.len(),
            // The `missing`-th quarantine to end completes the majority; none does when too few are left.
            majority_in: missing.checked_sub(1).and_then(|i| remaining.get(i)).copied(),
            can_vote_after: answered.saturating_add(remaining.len()),
        })
    }

    /// The highest fencing counter that masters refusing a proposal reported: each is at or above the token
    /// proposed, whether the master refused for its counter, for another holder or for its fair queue.
    pub fn highest_counter(&self) -> Option<i64> {
        self.nodes
            .iter()
            .filter_map(|node| match node.outcome {
                NodeOutcome::TokenTooLow { counter }
                | NodeOutcome::HeldByOther {
                    counter: Some(counter),
                    ..
                }
                | NodeOutcome::Queued {
                    counter: Some(counter),
                    ..
                } => Some(counter),
                _ => None,
            })
            .max()
    }

    /// The place in the key's fair queue that a majority of masters gives the caller or a better one (the
    /// quorum-th smallest of the places reported; the largest when fewer masters answered before the attempt
    /// was decided), and the highest ticket any master gave it: `None` when no master answered with the queue.
    pub fn queue_place(&self) -> Option<QueuePlace> {
        let mut places: Vec<u64> = Vec::new();
        let mut ticket = 0;
        for node in &self.nodes {
            if let NodeOutcome::Queued {
                place, ticket: given, ..
            } = node.outcome
            {
                places.push(place);
                ticket = ticket.max(given);
            }
        }
        places.sort_unstable();
        let place = *places.get(self.quorum.saturating_sub(1)).or(places.last())?;
        let settled = self.nodes.iter().all(|node| match node.outcome {
            NodeOutcome::Queued { ticket: given, .. } => given == ticket,
            _ => true,
        });
        Some(QueuePlace {
            place,
            ticket,
            settled,
        })
    }

    /// The holder most masters that refused us named, to tell a contender who blocks it.
    pub fn blocking_holder(&self) -> Option<String> {
        let mut counts: Vec<(String, usize)> = Vec::new();
        for node in &self.nodes {
            let (NodeOutcome::HeldByOther {
                holder: Some(holder), ..
            }
            | NodeOutcome::Queued {
                holder: Some(holder), ..
            }) = &node.outcome
            else {
                continue;
            };
            match counts.iter_mut().find(|(known, _)| known == holder) {
                Some((_, count)) => *count += 1,
                None => counts.push((holder.clone(), 1)),
            }
        }
        counts
            .into_iter()
            .max_by_key(|(_, count)| *count)
            .map(|(holder, _)| holder)
    }
}

impl fmt::Display for OperationReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{} votes (quorum {}) in {:.1}ms",
            self.votes(),
            self.nodes.len(),
            self.quorum,
            self.elapsed.as_secs_f64() * 1e3
        )?;
        for node in &self.nodes {
            write!(f, "\n  {}: {}", node.endpoint, node.outcome)?;
            if let Some(latency) = node.latency {
                write!(f, " ({:.2}ms)", latency.as_secs_f64() * 1e3)?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(outcomes: &[NodeOutcome]) -> OperationReport {
        OperationReport {
            nodes: outcomes
                .iter()
                .enumerate()
                .map(|(index, outcome)| NodeReport {
                    endpoint: format!("redis://m{index}"),
                    outcome: outcome.clone(),
                    latency: None,
                })
                .collect(),
            elapsed: Duration::ZERO,
            quorum: outcomes.len() / 2 + 1,
        }
    }

    #[test]
    fn masters_not_waited_for_count_as_unknown_like_unreachable_ones() {
        use NodeOutcome::*;
        // Decided once a majority could no longer extend: the one not waited for may hold the value too.
        assert!(report(&[Granted, Timeout, NotHeld, NotHeld, Pending]).could_still_be_held());
        assert!(report(&[Granted, Pending, Pending, NotHeld, NotHeld]).could_still_be_held());
        assert!(report(&[Granted, Timeout, Timeout, NotHeld, NotHeld]).could_still_be_held());
        // A majority answered that the key is not there: it is gone.
        assert!(!report(&[Granted, NotHeld, NotHeld, NotHeld, Pending]).could_still_be_held());
        assert!(!report(&[NotHeld, NotHeld, Timeout]).could_still_be_held());
    }
}
