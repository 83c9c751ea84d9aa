//! `status.releasing`: the keys given up and not released yet, each with when it may be released. Kept in status
//! so that a replica taking over in the middle of a hand-over releases the key at that time, as its predecessor
//! would have, instead of leaving it to expire (the key outlives the validity shown to its holder by up to a
//! TTL: status shows an older validity than the keeper's last extension). Pure edits of the status; one entry
//! per permit, as a permit has at most one key waiting.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;

use crate::api::DistributedLockStatus;
use crate::api::lock::ReleasingKey;

/// What is recorded of a key given up.
pub struct Recorded<'a> {
    pub permit: u32,
    pub holder: &'a str,
    pub token: i64,
    pub quorum: &'a str,
    pub key: &'a str,
    pub release_at: Timestamp,
}

/// The key of `permit` waiting to be released, as status records it.
pub fn recorded(status: &DistributedLockStatus, permit: u32) -> Option<&ReleasingKey> {
    status
        .releasing
        .iter()
        .find(|entry| u32::try_from(entry.permit).ok() == Some(permit))
}

/// `status` recording `key` as waiting (replacing what it recorded for that permit). `None`: a permit number the
/// status cannot show, or nothing to change.
pub fn with_entry(status: &DistributedLockStatus, key: &Recorded<'_>) -> Option<DistributedLockStatus> {
    let entry = ReleasingKey {
        permit: i32::try_from(key.permit).ok()?,
        holder: key.holder.to_owned(),
        fencing_token: key.token,
        quorum: key.quorum.to_owned(),
        key: key.key.to_owned(),
        release_at: MicroTime(key.release_at),
    };
    if recorded(status, key.permit) == Some(&entry) {
        return None;
    }
    let mut next = status.clone();
    next.releasing.retain(|other| other.permit != entry.permit);
    next.releasing.push(entry);
    next.releasing.sort_by_key(|entry| entry.permit);
    Some(next)
}

/// `status` without the entry of `permit` for `token` (released). `None`: not recorded.
pub fn without_entry(
    status: &DistributedLockStatus,
    permit: u32,
    token: i64,
) -> Option<DistributedLockStatus> {
    let recorded = recorded(status, permit)?;
    if recorded.fencing_token != token {
        return None;
    }
    let mut next = status.clone();
    next.releasing
        .retain(|entry| u32::try_from(entry.permit).ok() != Some(permit));
    Some(next)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key(permit: u32, token: i64, second: i64) -> Recorded<'static> {
        Recorded {
            permit,
            holder: "web-0",
            token,
            quorum: "default",
            key: "shop/web",
            release_at: Timestamp::from_second(second).unwrap(),
        }
    }

    #[test]
    fn one_entry_per_permit_the_latest_give_up_wins() {
        let status = DistributedLockStatus::default();
        let first = with_entry(&status, &key(0, 3, 100)).unwrap();
        assert_eq!(recorded(&first, 0).map(|entry| entry.fencing_token), Some(3));
        assert!(with_entry(&first, &key(0, 3, 100)).is_none(), "nothing to change");
        let second = with_entry(&first, &key(0, 4, 200)).unwrap();
        assert_eq!(second.releasing.len(), 1);
        assert_eq!(recorded(&second, 0).map(|entry| entry.fencing_token), Some(4));
        let both = with_entry(&second, &key(2, 9, 150)).unwrap();
        let permits: Vec<i32> = both.releasing.iter().map(|entry| entry.permit).collect();
        assert_eq!(permits, [0, 2]);
        assert!(
            with_entry(&both, &key(u32::MAX, 1, 1)).is_none(),
            "not a permit status can show"
        );
    }

    #[test]
    fn a_release_removes_only_its_own_entry() {
        let status = with_entry(&DistributedLockStatus::default(), &key(1, 5, 100)).unwrap();
        assert!(without_entry(&status, 1, 4).is_none(), "another token's release");
        assert!(without_entry(&status, 0, 5).is_none(), "another permit");
        let released = without_entry(&status, 1, 5).unwrap();
        assert!(released.releasing.is_empty());
    }
}
