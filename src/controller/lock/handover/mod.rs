//! Hand-over and release: a key given up by its holder waits for the validity shown to that holder, unless it is
//! known to have stopped. The rule is pure (`rule`), and so is the record of the keys waiting in
//! `status.releasing` (`releasing`); `give_up` carries a giving-up out (released now, or kept waiting and settled
//! later), and `release` the releases a reconcile asks for (a holder's turn ended, the lock deleted).

pub mod give_up;
pub mod release;
pub mod releasing;
pub mod rule;
