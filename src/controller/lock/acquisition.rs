//! An acquisition as decisions (pure): what it does next is a function of what its last step came to and of what
//! it has done so far, so that `actions::acquire` only carries steps out and every path (a grant above the
//! proposal, masters that forgot, a check that forbids the grant, this lock's own earlier values in the way) is
//! tested without masters or a cluster.

use crate::controller::lock::tokens::exhausted::Exhausted;
use crate::redlock::FailureKind;

/// Grants one reconcile asks the masters for before it hands the lock back to the reconciler. A grant is given
/// back when its token is not the one its value was derived from (the masters knew a higher token) or when the
/// cluster's floor record is at or above it (the masters forgot): two suffice unless contenders raise the
/// counters at the same time.
pub const GRANT_ROUNDS: u32 = 3;

/// What one acquisition has done so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Acquisition {
    /// The highest token known granted: the next proposal is the one above.
    floor: i64,
    /// `floor` is the cluster's floor record (where an exhausted token is then found), not a token known before.
    floor_is_record: bool,
    /// This lock's own earlier values were deleted once already: a refusal now is waited out.
    cleared_earlier: bool,
    /// A grant whose check is left until the key is won keeps the lock first in the key's queue until the check
    /// passed: given back, the key goes to nobody behind it.
    stays_queued: bool,
    asks_left: u32,
    /// The token of the last proposal, from which the value asked for was derived.
    proposed: i64,
}

/// What the last step came to. `E`: a failed API call's error, handed back as it is.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome<E> {
    /// The masters granted the key at `token`.
    Granted {
        token: i64,
    },
    /// The masters refused.
    Refused {
        kind: FailureKind,
    },
    /// The masters' counter for the key is at the largest token.
    CounterExhausted {
        counter: i64,
    },
    /// This lock's earlier values were looked for; `any`: a master deleted one.
    EarlierValuesDeleted {
        any: bool,
    },
    /// The cluster's floor record was read and, where lower, raised to the granted token.
    Recorded(Record),
    RecordFailed(E),
    /// The policy's check left until the grant: `Ok(true)`, the grant may stand.
    Rechecked(Result<bool, E>),
    /// A grant was given back (see [`Step::GiveBack`]) and the acquisition goes on.
    GivenBack,
}

/// What the floor record came to, as the decision needs it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Record {
    /// The record now holds the granted token.
    Written,
    /// The record holds `floor`, at least the granted token (the masters forgot): acquire above it.
    Above { floor: i64 },
    /// The record makes no sense; the message says how to repair it.
    Invalid(String),
}

/// What the acquisition does next.
#[derive(Debug, PartialEq, Eq)]
pub enum Step<E> {
    /// Ask the masters for the key with the value for `token`, proposing `token` (= `floor + 1`).
    Ask {
        token: i64,
        floor: i64,
    },
    /// No token can be granted above the largest one.
    Exhausted(Exhausted),
    /// Refused by values holding the key: delete those that are this lock's own earlier values.
    DeleteEarlierValues,
    /// Not acquired: show who or what blocks it, and try again later.
    Wait(FailureKind),
    /// Granted at the token proposed: the keeper keeps it from now on (`forget_ticket`: the lock leaves the
    /// key's queue now), and its token is recorded in the cluster's floor record.
    KeepAndRecord {
        forget_ticket: bool,
    },
    /// Recorded: the policy's check left until the grant is made now.
    Recheck,
    /// Granted, kept and recorded: show it held (`leave_queue`: the lock held its place in the key's queue until
    /// now, and leaves it).
    Hold {
        leave_queue: bool,
    },
    GiveBack(GiveBack<E>),
    /// The floor record makes no sense: nothing is acquired until it is repaired.
    InvalidFloor(String),
    /// Asked as often as one reconcile asks: handed back to the reconciler, to come again at once.
    AskLater,
}

/// A grant given back, and what follows.
#[derive(Debug, PartialEq, Eq)]
pub struct GiveBack<E> {
    /// The grant is kept by the keeper already (released through it), not only granted.
    pub kept: bool,
    /// The lock stays first in the key's queue: its next attempt makes its checks first, and wins again.
    pub stay_first: bool,
    pub then: Then<E>,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Then<E> {
    /// Ask again, above the new floor.
    AskAgain,
    /// Hand the lock back to the reconciler, to come again at once.
    Requeue,
    /// Hand the error back.
    Fail(E),
}

impl Acquisition {
    /// An acquisition above `floor` (what the reconciler knows, and what the masters showed while refusing).
    pub fn new(floor: i64, stays_queued: bool) -> Self {
        Self {
            floor,
            floor_is_record: false,
            cleared_earlier: false,
            stays_queued,
            asks_left: GRANT_ROUNDS,
            proposed: floor,
        }
    }

    /// Whether a grant keeps the lock first in the key's queue until it leaves.
    pub fn stays_queued(&self) -> bool {
        self.stays_queued
    }

    /// The first step.
    pub fn start<E>(&mut self) -> Step<E> {
        self.ask()
    }

    /// The step after `outcome`.
    pub fn next<E>(&mut self, outcome: Outcome<E>) -> Step<E> {
        match outcome {
            Outcome::Granted { token } if token != self.proposed => {
                // The masters' counters were above the floor, and the lock value (which a successor rebuilds
                // from the token in status) was derived from the token proposed: give the grant back, propose
                // above.
                self.raise(token, false);
                self.give_back(false, false, Then::AskAgain)
            }
            Outcome::Granted { .. } => Step::KeepAndRecord {
                forget_ticket: !self.stays_queued,
            },
            Outcome::Refused {
                kind: FailureKind::Contended,
            } if !self.cleared_earlier => Step::DeleteEarlierValues,
            Outcome::Refused { kind } => Step::Wait(kind),
            Outcome::EarlierValuesDeleted { any: true } => {
                // Held by this lock's own earlier value, put back by a late write after its holder stopped:
                // asked again at once, instead of waited out for a whole TTL.
                self.cleared_earlier = true;
                self.ask()
            }
            Outcome::EarlierValuesDeleted { any: false } => Step::Wait(FailureKind::Contended),
            Outcome::CounterExhausted { counter } => Step::Exhausted(Exhausted::Masters { counter }),
            Outcome::Recorded(Record::Written) => Step::Recheck,
            Outcome::Recorded(Record::Above { floor }) => {
                self.raise(floor, true);
                self.give_back(true, false, Then::AskAgain)
            }
            Outcome::Recorded(Record::Invalid(message)) => Step::InvalidFloor(message),
            // Nothing shows the token: giving the grant back is safe even if a write landed (the next token is
            // then above it).
            Outcome::RecordFailed(err) => self.give_back(true, self.stays_queued, Then::Fail(err)),
            Outcome::Rechecked(Ok(true)) => Step::Hold {
                leave_queue: self.stays_queued,
            },
            // Its recount is made before the next attempt, within the time the masters keep it first.
            Outcome::Rechecked(Ok(false)) => self.give_back(true, true, Then::Requeue),
            // A replica that lost its leadership meanwhile keeps the key (the keeper decides), and nothing
            // counted the pods for it: whatever comes next counts them first.
            Outcome::Rechecked(Err(err)) => self.give_back(true, true, Then::Fail(err)),
            Outcome::GivenBack => self.ask(),
        }
    }

    fn ask<E>(&mut self) -> Step<E> {
        if self.asks_left == 0 {
            return Step::AskLater;
        }
        self.asks_left -= 1;
        let Some(token) = self.floor.checked_add(1) else {
            return Step::Exhausted(if self.floor_is_record {
                Exhausted::Floor { token: self.floor }
            } else {
                Exhausted::Known { token: self.floor }
            });
        };
        self.proposed = token;
        Step::Ask {
            token,
            floor: self.floor,
        }
    }

    fn raise(&mut self, floor: i64, is_record: bool) {
        self.floor = floor;
        self.floor_is_record = is_record;
    }

    fn give_back<E>(&self, kept: bool, stay_first: bool, then: Then<E>) -> Step<E> {
        Step::GiveBack(GiveBack {
            kept,
            stay_first,
            then,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    type Out = Outcome<&'static str>;

    fn ask(token: i64) -> Step<&'static str> {
        Step::Ask {
            token,
            floor: token - 1,
        }
    }

    fn give_back<E>(kept: bool, stay_first: bool, then: Then<E>) -> Step<E> {
        Step::GiveBack(GiveBack {
            kept,
            stay_first,
            then,
        })
    }

    /// Plays `outcomes` from the start; the steps taken, the first one included.
    fn play(floor: i64, stays_queued: bool, outcomes: Vec<Out>) -> Vec<Step<&'static str>> {
        let mut acquisition = Acquisition::new(floor, stays_queued);
        let mut steps = vec![acquisition.start()];
        for outcome in outcomes {
            steps.push(acquisition.next(outcome));
        }
        steps
    }

    #[test]
    fn a_grant_at_the_proposal_is_kept_recorded_rechecked_and_held() {
        let steps = play(
            4,
            false,
            vec![
                Outcome::Granted { token: 5 },
                Outcome::Recorded(Record::Written),
                Outcome::Rechecked(Ok(true)),
            ],
        );
        assert_eq!(
            steps,
            vec![
                ask(5),
                Step::KeepAndRecord { forget_ticket: true },
                Step::Recheck,
                Step::Hold { leave_queue: false },
            ]
        );
    }

    #[test]
    fn a_lock_that_stays_queued_keeps_its_ticket_until_it_holds() {
        let steps = play(
            0,
            true,
            vec![
                Outcome::Granted { token: 1 },
                Outcome::Recorded(Record::Written),
                Outcome::Rechecked(Ok(true)),
            ],
        );
        assert_eq!(steps[1], Step::KeepAndRecord { forget_ticket: false });
        assert_eq!(steps[3], Step::Hold { leave_queue: true });
    }

    #[test]
    fn a_grant_above_the_proposal_is_given_back_unkept_and_asked_above() {
        let steps = play(4, false, vec![Outcome::Granted { token: 9 }, Outcome::GivenBack]);
        assert_eq!(
            steps,
            vec![ask(5), give_back(false, false, Then::AskAgain), ask(10)]
        );
    }

    #[test]
    fn masters_that_forgot_are_asked_above_the_floor_record() {
        let steps = play(
            4,
            true,
            vec![
                Outcome::Granted { token: 5 },
                Outcome::Recorded(Record::Above { floor: 20 }),
                Outcome::GivenBack,
            ],
        );
        assert_eq!(steps[2], give_back(true, false, Then::AskAgain));
        assert_eq!(steps[3], ask(21));
    }

    #[test]
    fn asking_stops_after_the_rounds_of_one_reconcile() {
        let mut acquisition = Acquisition::new(0, false);
        let mut step: Step<()> = acquisition.start();
        let mut asks = 0;
        while let Step::Ask { token, .. } = step {
            asks += 1;
            assert_eq!(
                acquisition.next::<()>(Outcome::Granted { token: token + 1 }),
                give_back(false, false, Then::AskAgain)
            );
            step = acquisition.next(Outcome::GivenBack);
        }
        assert_eq!(asks, GRANT_ROUNDS);
        assert_eq!(step, Step::AskLater);
    }

    #[test]
    fn the_largest_token_is_found_where_the_floor_came_from() {
        assert_eq!(
            play(i64::MAX, false, vec![])[0],
            Step::Exhausted(Exhausted::Known { token: i64::MAX })
        );
        let steps = play(
            4,
            false,
            vec![
                Outcome::Granted { token: 5 },
                Outcome::Recorded(Record::Above { floor: i64::MAX }),
                Outcome::GivenBack,
            ],
        );
        assert_eq!(steps[3], Step::Exhausted(Exhausted::Floor { token: i64::MAX }));
        let steps = play(4, false, vec![Outcome::CounterExhausted { counter: i64::MAX }]);
        assert_eq!(
            steps[1],
            Step::Exhausted(Exhausted::Masters { counter: i64::MAX })
        );
    }

    #[test]
    fn a_contended_key_is_cleared_of_earlier_values_once_then_waited_for() {
        let contended = || Outcome::Refused {
            kind: FailureKind::Contended,
        };
        let steps = play(
            4,
            false,
            vec![
                contended(),
                Outcome::EarlierValuesDeleted { any: true },
                contended(),
            ],
        );
        assert_eq!(
            steps,
            vec![
                ask(5),
                Step::DeleteEarlierValues,
                ask(5),
                Step::Wait(FailureKind::Contended),
            ]
        );
        let steps = play(
            4,
            false,
            vec![contended(), Outcome::EarlierValuesDeleted { any: false }],
        );
        assert_eq!(steps[2], Step::Wait(FailureKind::Contended));
    }

    #[test]
    fn other_refusals_are_waited_out_at_once() {
        for kind in [FailureKind::TooFewMasters, FailureKind::ValidityExhausted] {
            assert_eq!(
                play(0, false, vec![Outcome::Refused { kind }])[1],
                Step::Wait(kind)
            );
        }
    }

    #[test]
    fn a_failed_recheck_gives_the_kept_grant_back_and_stays_first() {
        for stays_queued in [false, true] {
            let granted = || vec![Outcome::Granted { token: 1 }, Outcome::Recorded(Record::Written)];
            let mut outcomes = granted();
            outcomes.push(Outcome::Rechecked(Ok(false)));
            assert_eq!(
                play(0, stays_queued, outcomes)[3],
                give_back(true, true, Then::Requeue)
            );
            let mut outcomes = granted();
            outcomes.push(Outcome::Rechecked(Err("gone")));
            assert_eq!(
                play(0, stays_queued, outcomes)[3],
                give_back(true, true, Then::Fail("gone"))
            );
        }
    }

    #[test]
    fn a_failed_floor_write_gives_the_grant_back_and_stays_first_only_if_queued() {
        for stays_queued in [false, true] {
            let steps = play(
                0,
                stays_queued,
                vec![Outcome::Granted { token: 1 }, Outcome::RecordFailed("down")],
            );
            assert_eq!(steps[2], give_back(true, stays_queued, Then::Fail("down")));
        }
        let steps = play(
            0,
            false,
            vec![
                Outcome::Granted { token: 1 },
                Outcome::Recorded(Record::Invalid("bad".into())),
            ],
        );
        assert_eq!(steps[2], Step::InvalidFloor("bad".into()));
    }
}
