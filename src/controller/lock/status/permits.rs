//! A semaphore's status seen one permit at a time, so the one-permit rules (`decide`, `handover`) and status
//! edits (`status`) run unchanged per permit: [`permit_view`] shows one permit as a plain lock's status, and
//! [`fold_permit`] puts what an edit made of that view back into the semaphore's status. Pure.
//!
//! A semaphore's status lists each held permit in `holders`; permit 0 is also shown in the top-level `holder`,
//! `fencingToken`, `acquiredAt` and `validUntil`, as a plain lock's (and the top-level token stays as permit 0's
//! floor once it is released, as a plain lock's does). The phase is `Held` while any permit is held. A plain
//! lock's status is its permit 0's, as it is.

use std::borrow::Cow;

use crate::api::conditions::{self, Stamp, Update};

use crate::api::lock::PermitHolder;
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};
use crate::controller::lock::permit_count::is_semaphore;

/// What `lock`'s status shows of `permit`, as a plain lock's status (see [`permit_view`]).
pub fn status_of(lock: &DistributedLock, permit: u32) -> Cow<'_, DistributedLockStatus> {
    let status = lock.status.as_ref().unwrap_or(DistributedLockStatus::none());
    if is_semaphore(lock) {
        Cow::Owned(permit_view(status, permit))
    } else {
        Cow::Borrowed(status)
    }
}

/// Permit `permit` of `status` as a plain lock's status: `Held` by its holder with its token and validity when
/// `holders` lists it, otherwise not held (permit 0 keeps the top-level token, its floor; a `Lost` phase is kept,
/// for the permit that lost). Everything else (conditions, queue, transitions) is the semaphore's.
pub fn permit_view(status: &DistributedLockStatus, permit: u32) -> DistributedLockStatus {
    let mut view = status.clone();
    view.holders = Vec::new();
    match listed(status, permit)
        .cloned()
        .or_else(|| held_as_plain(status, permit))
    {
        Some(held) => {
            view.phase = Some(LockPhase::Held);
            view.holder = Some(held.holder.clone());
            view.fencing_token = Some(held.fencing_token);
            view.acquired_at = held.acquired_at.clone();
            view.valid_until = held.valid_until.clone();
        }
        None => {
            if view.phase == Some(LockPhase::Held) {
                view.phase = Some(LockPhase::Pending);
            }
            view.holder = None;
            if permit != 0 {
                view.fencing_token = None;
                view.acquired_at = None;
                view.renewed_at = None;
                view.valid_until = None;
            }
        }
    }
    view
}

/// `status` with permit `permit` as `edited` (an edit of [`permit_view`]) shows it: listed in `holders` while
/// `Held`, gone from it otherwise; permit 0 also in the top-level fields. What the edit changed of the
/// semaphore's own fields (queue, masters, transitions, the `Ready` condition) is kept; the `Held` condition
/// tells of every permit (one permit's reason would overwrite another's at each look, and write every time).
pub fn fold_permit(
    status: &DistributedLockStatus,
    permit: u32,
    edited: &DistributedLockStatus,
    stamp: Stamp,
) -> DistributedLockStatus {
    let mut next = edited.clone();
    next.holders = status.holders.clone();
    next.holders
        .retain(|held| u32::try_from(held.permit).ok() != Some(permit));
    if edited.phase == Some(LockPhase::Held)
        && let (Some(holder), Some(token), Ok(number)) =
            (&edited.holder, edited.fencing_token, i32::try_from(permit))
    {
        next.holders.push(PermitHolder {
            permit: number,
            holder: holder.clone(),
            fencing_token: token,
            acquired_at: edited.acquired_at.clone(),
            valid_until: edited.valid_until.clone(),
        });
        next.holders.sort_by_key(|held| held.permit);
    }
    if permit != 0 {
        next.holder = status.holder.clone();
        next.fencing_token = status.fencing_token;
        next.acquired_at = status.acquired_at.clone();
        next.renewed_at = status.renewed_at.clone();
        next.valid_until = status.valid_until.clone();
    }
    if !next.holders.is_empty() {
        next.phase = Some(LockPhase::Held);
    } else if edited.phase == Some(LockPhase::Held) {
        // Held, but the permit number does not fit the status: shown as not held rather than wrongly.
        next.phase = Some(LockPhase::Pending);
    }
    conditions::set(&mut next.conditions, held_condition(&next.holders), stamp);
    next
}

/// `status` with each of `permits` as `edit(permit, view)` makes it, folded in one after another (see
/// [`fold_permit`]); a permit whose edit returns `None` (it no longer applies) is left as it is. Returns the new
/// status and the permits edited, in order.
pub fn fold_permits(
    status: &DistributedLockStatus,
    permits: &[u32],
    stamp: Stamp,
    mut edit: impl FnMut(u32, &DistributedLockStatus) -> Option<DistributedLockStatus>,
) -> (DistributedLockStatus, Vec<u32>) {
    let mut next = status.clone();
    let mut edited = Vec::with_capacity(permits.len());
    for &permit in permits {
        if let Some(view) = edit(permit, &permit_view(&next, permit)) {
            next = fold_permit(&next, permit, &view, stamp);
            edited.push(permit);
        }
    }
    (next, edited)
}

/// A semaphore's `Held` condition: which permits are held, by whom and with which token.
fn held_condition(holders: &[PermitHolder]) -> Update {
    if holders.is_empty() {
        return Update::new("Held", false, "NoPermitHeld", "no permit is held");
    }
    let held: Vec<String> = holders
        .iter()
        .map(|held| {
            format!(
                "permit {} by {} with fencing token {}",
                held.permit, held.holder, held.fencing_token
            )
        })
        .collect();
    Update::new("Held", true, "Held", format!("held: {}", held.join(", ")))
}

/// Permit 0 as a plain lock's status shows it (holder at the top, no `holders`): how a lock whose spec.permits
/// was just raised from 1 shows the holder it already has.
fn held_as_plain(status: &DistributedLockStatus, permit: u32) -> Option<PermitHolder> {
    if permit != 0 || !status.holders.is_empty() || status.phase != Some(LockPhase::Held) {
        return None;
    }
    Some(PermitHolder {
        permit: 0,
        holder: status.holder.clone()?,
        fencing_token: status.fencing_token?,
        acquired_at: status.acquired_at.clone(),
        valid_until: status.valid_until.clone(),
    })
}

fn listed(status: &DistributedLockStatus, permit: u32) -> Option<&PermitHolder> {
    status
        .holders
        .iter()
        .find(|held| u32::try_from(held.permit).ok() == Some(permit))
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    use super::*;

    const STAMP: Stamp = Stamp {
        generation: Some(1),
        now: Timestamp::UNIX_EPOCH,
    };

    fn until(second: i64) -> Option<MicroTime> {
        Some(MicroTime(Timestamp::from_second(second).unwrap()))
    }

    /// A permit's view as a held plain lock's status.
    fn held(holder: &str, token: i64, valid_until: i64) -> DistributedLockStatus {
        DistributedLockStatus {
            phase: Some(LockPhase::Held),
            holder: Some(holder.into()),
            fencing_token: Some(token),
            valid_until: until(valid_until),
            ..DistributedLockStatus::default()
        }
    }

    fn released(view: &DistributedLockStatus) -> DistributedLockStatus {
        DistributedLockStatus {
            phase: Some(LockPhase::Pending),
            holder: None,
            ..view.clone()
        }
    }

    #[test]
    fn permits_refreshed_together_each_show_their_own_validity_and_a_refused_one_is_left_alone() {
        let mut status = DistributedLockStatus::default();
        for (permit, holder, token) in [(0, "web-0", 4), (1, "web-1", 7), (2, "web-2", 9)] {
            status = fold_permit(&status, permit, &held(holder, token, 10), STAMP);
        }
        let (next, edited) = fold_permits(&status, &[0, 1, 2], STAMP, |permit, view| {
            // Permit 1's status shows a newer token than the one refreshing: refused.
            (permit != 1).then(|| DistributedLockStatus {
                valid_until: until(20 + i64::from(permit)),
                ..view.clone()
            })
        });
        assert_eq!(edited, [0, 2]);
        let shown: Vec<_> = next
            .holders
            .iter()
            .map(|held| {
                (
                    held.permit,
                    held.holder.as_str(),
                    held.fencing_token,
                    held.valid_until.clone(),
                )
            })
            .collect();
        assert_eq!(
            shown,
            [
                (0, "web-0", 4, until(20)),
                (1, "web-1", 7, until(10)),
                (2, "web-2", 9, until(22)),
            ]
        );
        assert_eq!(next.valid_until, until(20), "permit 0 also at the top");
        let (unchanged, none) = fold_permits(&status, &[0, 1, 2], STAMP, |_, _| None);
        assert!(none.is_empty());
        assert_eq!(unchanged, status);
    }

    #[test]
    fn a_permit_not_listed_is_not_held_and_only_permit_0_keeps_a_token_floor() {
        let mut status = held("a", 4, 100);
        status.holders = vec![PermitHolder {
            permit: 0,
            holder: "a".into(),
            fencing_token: 4,
            acquired_at: None,
            valid_until: until(100),
        }];
        let second = permit_view(&status, 1);
        assert_eq!(second.phase, Some(LockPhase::Pending));
        assert_eq!(
            (second.holder, second.fencing_token, second.valid_until),
            (None, None, None)
        );
        let first = permit_view(&status, 0);
        assert_eq!(first.holder.as_deref(), Some("a"));
        assert_eq!(first.fencing_token, Some(4));
        assert!(
            first.holders.is_empty(),
            "a permit's view is a plain lock's status"
        );
    }

    #[test]
    fn each_permit_is_folded_in_on_its_own_and_read_back_as_written() {
        let mut status = DistributedLockStatus::default();
        for (permit, holder, token) in [(2, "c", 9), (0, "a", 3), (1, "b", 1)] {
            let edited = held(holder, token, 100 + i64::from(permit));
            status = fold_permit(&status, permit, &edited, STAMP);
            let view = permit_view(&status, permit);
            assert_eq!(
                (
                    view.phase,
                    view.holder.as_deref(),
                    view.fencing_token,
                    view.valid_until
                ),
                (edited.phase, Some(holder), Some(token), edited.valid_until)
            );
        }
        let listed: Vec<(i32, &str, i64)> = status
            .holders
            .iter()
            .map(|held| (held.permit, held.holder.as_str(), held.fencing_token))
            .collect();
        assert_eq!(listed, [(0, "a", 3), (1, "b", 1), (2, "c", 9)]);
        assert_eq!(status.phase, Some(LockPhase::Held));
        assert_eq!(
            (status.holder.as_deref(), status.fencing_token),
            (Some("a"), Some(3)),
            "permit 0 is also shown at the top"
        );
        assert_eq!(super::super::write::held_count(&status, 3), "3/3");
    }

    #[test]
    fn releasing_one_permit_touches_no_other() {
        let mut status = DistributedLockStatus::default();
        status = fold_permit(&status, 0, &held("a", 3, 100), STAMP);
        status = fold_permit(&status, 1, &held("b", 7, 101), STAMP);
        let after = fold_permit(&status, 1, &released(&permit_view(&status, 1)), STAMP);
        assert_eq!(after.holders.len(), 1);
        assert_eq!(after.holders[0].holder, "a");
        assert_eq!(after.phase, Some(LockPhase::Held), "permit 0 is still held");
        let holder_of = |status: &DistributedLockStatus| {
            let view = permit_view(status, 0);
            (view.phase, view.holder, view.fencing_token, view.valid_until)
        };
        assert_eq!(holder_of(&after), holder_of(&status));
        let none = fold_permit(&after, 0, &released(&permit_view(&after, 0)), STAMP);
        assert!(none.holders.is_empty());
        assert_eq!(none.phase, Some(LockPhase::Pending));
        assert_eq!(
            none.fencing_token,
            Some(3),
            "permit 0's token stays as its floor, as a plain lock's"
        );
    }

    #[test]
    fn a_lost_permit_is_no_longer_listed_and_its_view_says_lost() {
        let mut status = fold_permit(&DistributedLockStatus::default(), 1, &held("b", 7, 101), STAMP);
        let lost = DistributedLockStatus {
            phase: Some(LockPhase::Lost),
            ..permit_view(&status, 1)
        };
        status = fold_permit(&status, 1, &lost, STAMP);
        assert!(status.holders.is_empty());
        assert_eq!(status.phase, Some(LockPhase::Lost));
        assert_eq!(permit_view(&status, 1).phase, Some(LockPhase::Lost));
    }
}
