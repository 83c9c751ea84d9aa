//! Every reason the operator gives in Events and in status conditions, with what it means for the user: the
//! reference (docs/reference/events-and-conditions.md) is generated from these tables (one per kind, in
//! `reasons/`), and a test fails when the code gives a reason that is not here (or this lists one the code no
//! longer gives).

/// Where a reason shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// An Event (`kubectl describe`, `kubectl get events`) of this type on this kind.
    Event { kind: &'static str, warning: bool },
    /// The `reason` of a status condition of this type on this kind.
    Condition {
        kind: &'static str,
        condition: &'static str,
        status: &'static str,
    },
}

#[derive(Clone, Copy)]
pub struct Reason {
    pub name: &'static str,
    pub shown: Shown,
    /// What happened and what the user does about it, in one or two sentences.
    pub meaning: &'static str,
}

// One table per kind the reasons show on, so that no file holds them all.
mod job;
mod lock;
mod quorum;

/// Every reason, in the order the reference lists them: the lock's, the Jobs', the quorum's.
pub const REASONS: &[Reason] = &ALL;

const COUNT: usize = lock::REASONS.len() + job::REASONS.len() + quorum::REASONS.len();
const ALL: [Reason; COUNT] = joined([lock::REASONS, job::REASONS, quorum::REASONS]);

/// The tables one after the other, at compile time (a const slice cannot be concatenated otherwise).
const fn joined<const N: usize>(tables: [&[Reason]; 3]) -> [Reason; N] {
    const UNSET: Reason = Reason {
        name: "",
        shown: Shown::Event {
            kind: "",
            warning: false,
        },
        meaning: "",
    };
    let mut all = [UNSET; N];
    let mut filled = 0;
    let mut table = 0;
    while table < tables.len() {
        let mut row = 0;
        while row < tables[table].len() {
            all[filled] = tables[table][row];
            filled += 1;
            row += 1;
        }
        table += 1;
    }
    assert!(filled == N, "COUNT is the sum of the tables' lengths");
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_joined_table_is_every_kinds_table_in_order() {
        let chained: Vec<(&str, Shown)> = [lock::REASONS, job::REASONS, quorum::REASONS]
            .into_iter()
            .flatten()
            .map(|reason| (reason.name, reason.shown))
            .collect();
        let joined: Vec<(&str, Shown)> = REASONS.iter().map(|reason| (reason.name, reason.shown)).collect();
        assert_eq!(joined, chained);
        assert!(
            REASONS.iter().all(|reason| !reason.name.is_empty()),
            "no row left unset"
        );
    }
}
