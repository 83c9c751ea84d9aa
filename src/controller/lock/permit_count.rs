//! How many permits a lock has, which of them may be held and which are left from a higher count: what the
//! policies, the status edits and the actions all read, kept apart so that none of them imports another for it.
//! Pure.

use kube::runtime::reflector::ObjectRef;

use crate::api::{DistributedLock, DistributedLockStatus};
use crate::controller::keeper::PermitRef;
use crate::redlock::MAX_PERMITS;

/// Whether `lock`'s status lists its permits in `holders` (a semaphore) rather than showing its one holder at
/// the top: by the spec, or while permits above it, left from a higher count, are still held.
pub fn is_semaphore(lock: &DistributedLock) -> bool {
    permit_span(lock) > 1
}

/// The permits of `lock` that may be held now: spec.permits, at least 1.
pub fn open_permits(lock: &DistributedLock) -> u32 {
    u32::try_from(lock.spec.permits).unwrap_or(1).max(1)
}

/// How many permits of `lock` are looked after: the spec's, or more while status still lists a holder of a
/// permit above them (spec.permits was lowered under it). What is kept, released, given up and shown goes over
/// these; the permits above the spec's are given up after their holders are fenced, never handed out again.
pub fn permit_span(lock: &DistributedLock) -> u32 {
    let status = lock.status.as_ref().unwrap_or(DistributedLockStatus::none());
    span_of(status, open_permits(lock))
}

/// Every permit of `lock` that may be held ([`permit_span`]), as the keeper names them.
pub fn permits_of(lock: &DistributedLock) -> impl Iterator<Item = PermitRef> + use<> {
    let lref = ObjectRef::from_obj(lock);
    (0..permit_span(lock)).map(move |permit| PermitRef::new(lref.clone(), permit))
}

/// Whether `permit` is at or above `open` (spec.permits): left from a higher count, handed to nobody.
pub fn is_closing(permit: u32, open: usize) -> bool {
    usize::try_from(permit).map_or(true, |permit| permit >= open)
}

/// [`permit_span`] for `status` and `open` permits. Pure.
pub fn span_of(status: &DistributedLockStatus, open: u32) -> u32 {
    status
        .holders
        .iter()
        .filter_map(|held| u32::try_from(held.permit).ok())
        // The schema's bound on spec.permits: no permit at or above it is looked after, whatever status lists.
        .filter(|permit| *permit < MAX_PERMITS)
        .map(|permit| permit.saturating_add(1))
        .fold(open, u32::max)
}

#[cfg(test)]
mod tests {
    use crate::api::lock::PermitHolder;

    use super::*;

    #[test]
    fn permits_above_the_count_are_looked_after_while_status_lists_them() {
        let mut status = DistributedLockStatus::default();
        assert_eq!(span_of(&status, 3), 3);
        status.holders = vec![PermitHolder {
            permit: 4,
            holder: "job-e".into(),
            fencing_token: 2,
            acquired_at: None,
            valid_until: None,
        }];
        assert_eq!(
            span_of(&status, 3),
            5,
            "permit 4, left from a count of five, is still held"
        );
        assert_eq!(span_of(&status, 6), 6);
        status.holders[0].permit = -1;
        assert_eq!(span_of(&status, 2), 2, "a permit that cannot be is ignored");
        status.holders[0].permit = 1_000;
        assert_eq!(span_of(&status, 2), 2, "nor one above the schema's bound");
    }

    #[test]
    fn permits_at_or_above_the_count_are_closing() {
        assert!(!is_closing(0, 1));
        assert!(is_closing(1, 1));
        assert!(is_closing(u32::MAX, 3));
    }
}
