//! The keeper table's rules on a paused clock: due batches, applied extensions, losses and removals.

use kube::runtime::reflector::ObjectRef;

use super::*;
use crate::redlock::{LockValue, NodeOutcome, NodeReport};

const TTL: Duration = Duration::from_secs(10);

fn policy() -> KeepPolicy {
    // Extension a third into the validity, retries every 500 ms, fence 2 s before the validity ends.
    KeepPolicy::for_ttl(TTL, Duration::from_millis(50))
}

fn lease(granted_at: Instant) -> Lease {
    Lease::for_tests("ns/a", LockValue::random("holder").unwrap(), TTL, granted_at)
}

fn lock() -> PermitRef {
    PermitRef::from(ObjectRef::new("a").within("ns"))
}

fn holding(quorum: &str, key: &str, token: i64) -> Holding {
    Holding {
        quorum: quorum.into(),
        key: key.into(),
        token,
        policy: policy(),
    }
}

fn table_holding(now: Instant) -> Table {
    let mut table = Table::default();
    assert!(table.insert(lock(), lease(now), holding("default", "ns/a", 3), now));
    table
}

fn no_quorum() -> ExtendError {
    ExtendError::NoQuorum {
        report: OperationReport {
            nodes: Vec::new(),
            elapsed: Duration::ZERO,
            quorum: 2,
        },
    }
}

/// Takes the one due lease, failing the test if none or several are due.
fn take_one(table: &mut Table, now: Instant) -> Option<Vec<PermitRef>> {
    let (mut due, lags) = table.take_due(now);
    assert_eq!(due.len(), lags.len().min(1));
    due.pop().map(|batch| {
        assert_eq!(batch.quorum, "default");
        batch.locks
    })
}

#[tokio::test(start_paused = true)]
async fn a_lease_is_extended_a_third_into_its_validity_and_once_at_a_time() {
    let start = Instant::now();
    let mut table = table_holding(start);
    assert!(take_one(&mut table, start + Duration::from_secs(3)).is_none());
    let third = start + TTL / 3;
    let locks = take_one(&mut table, third).expect("due a third in");
    assert_eq!(locks, [lock()]);
    assert!(
        take_one(&mut table, third + Duration::from_secs(1)).is_none(),
        "in flight: not sent twice"
    );
    assert!(
        matches!(table.remove(&lock()), Removal::InFlight),
        "not removed under a running extension"
    );

    let applied = table.apply("default", locks, vec![Ok(lease(third))], third);
    assert_eq!(applied.extended, 1);
    assert_eq!(
        applied.wake,
        [lock()],
        "status was never written: the reconciler is woken once"
    );
    let view = table.view(&lock(), third).expect("held");
    assert_eq!(
        view.lease.valid_until(),
        third + TTL,
        "the new lease replaced the old one"
    );
    assert!(
        take_one(&mut table, third + TTL / 3 - Duration::from_millis(1)).is_none(),
        "the next extension is planned from the new lease"
    );
    assert!(take_one(&mut table, third + TTL / 3).is_some());
}

#[tokio::test(start_paused = true)]
async fn keys_a_failed_extension_re_created_do_not_vote_until_one_succeeds() {
    let start = Instant::now();
    let mut table = table_holding(start);
    let third = start + TTL / 3;
    let locks = take_one(&mut table, third).expect("due");
    let node = |outcome| NodeReport {
        endpoint: "redis://127.0.0.1:1".into(),
        outcome,
        latency: None,
    };
    let failed = ExtendError::NoQuorum {
        report: OperationReport {
            nodes: vec![
                node(NodeOutcome::Granted),
                node(NodeOutcome::Recreated),
                node(NodeOutcome::Timeout),
            ],
            elapsed: Duration::ZERO,
            quorum: 2,
        },
    };
    table.apply("default", locks, vec![Err(failed)], third);
    let view = table.view(&lock(), third).expect("held");
    assert_eq!(view.lease.unconfirmed(), [1]);
    assert_eq!(view.lease.valid_until(), start + TTL, "the validity is unchanged");

    let retry = third + Duration::from_millis(500);
    let locks = take_one(&mut table, retry).expect("retried");
    table.apply("default", locks, vec![Ok(lease(retry))], retry);
    let view = table.view(&lock(), retry).expect("held");
    assert!(view.lease.unconfirmed().is_empty());
}

#[tokio::test(start_paused = true)]
async fn a_quorum_with_a_batch_in_flight_holds_up_no_other_quorum() {
    let start = Instant::now();
    let mut table = table_holding(start);
    let slow = PermitRef::from(ObjectRef::new("b").within("ns"));
    assert!(table.insert(slow.clone(), lease(start), holding("slow", "ns/b", 1), start));
    let third = start + TTL / 3;
    let (due, _) = table.take_due(third);
    assert_eq!(due.len(), 2, "one batch per quorum");
    let fast = due
        .into_iter()
        .find(|batch| batch.quorum == "default")
        .expect("default's batch");
    // The slow quorum's batch never comes back; the default quorum's goes on extending on schedule.
    let mut now = third;
    let mut locks = fast.locks;
    for _ in 0..5 {
        let applied = table.apply("default", locks, vec![Ok(lease(now))], now);
        assert_eq!(applied.extended, 1);
        now += TTL / 3;
        locks = take_one(&mut table, now).expect("default's next extension, on time");
    }
    let (due, _) = table.take_due(now + TTL);
    assert!(
        due.iter().all(|batch| batch.quorum != "slow"),
        "at most one batch in flight per quorum"
    );
    let applied = table.apply("slow", vec![slow], vec![Err(no_quorum())], now);
    assert_eq!(applied.extended, 0);
}

/// Extensions come a third of the TTL apart, each when two thirds are left; status shows what the last write
/// gave. Whatever the TTL, what it shows never runs below the floor (or, where the TTL is too short for that,
/// below what one extension leaves) before the extension that refreshes it.
#[test]
fn what_status_shows_stays_above_the_holders_margin_at_every_ttl() {
    for millis in (300..=60_000).step_by(100) {
        let ttl = Duration::from_millis(millis);
        // Just written: status shows a whole TTL.
        let mut shown_left = ttl;
        let mut lowest = shown_left;
        for _ in 0..10 {
            // The next extension, a third of the TTL later.
            shown_left = shown_left.saturating_sub(ttl / 3);
            lowest = lowest.min(shown_left);
            if shown_left < status_refresh_below(ttl) {
                shown_left = ttl;
            }
        }
        let floor = SHOWN_VALIDITY_FLOOR.min(ttl * 2 / 3);
        assert!(lowest + Duration::from_millis(1) >= floor, "{ttl:?}: {lowest:?}");
    }
    assert_eq!(
        status_refresh_below(Duration::from_secs(10)),
        Duration::from_secs(2) + Duration::from_secs(10) / 3,
        "at the default TTL, one write every two extensions, as before"
    );
    assert_eq!(
        status_refresh_below(Duration::from_secs(3)),
        Duration::from_secs(3)
    );
}

#[tokio::test(start_paused = true)]
async fn the_reconciler_is_woken_when_status_is_due_and_not_again_until_it_writes() {
    let start = Instant::now();
    let mut table = table_holding(start);
    table.status_written(&lock(), start + TTL);
    let third = start + TTL / 3;
    let locks = take_one(&mut table, third).expect("due");
    let applied = table.apply("default", locks, vec![Ok(lease(third))], third);
    assert!(applied.wake.is_empty(), "status still shows two thirds of a TTL");

    let later = start + TTL * 2 / 3;
    let locks = take_one(&mut table, later).expect("due");
    let applied = table.apply("default", locks, vec![Ok(lease(later))], later);
    assert_eq!(
        applied.wake,
        [lock()],
        "less than half a TTL left of what status shows"
    );
    assert!(table.view(&lock(), later).expect("held").status_due);
}

#[tokio::test(start_paused = true)]
async fn failed_extensions_are_retried_and_the_loss_is_signalled_at_the_fence_time_before_the_validity_ends()
{
    let start = Instant::now();
    let mut table = table_holding(start);
    let fence_time = start + TTL - policy().fence_margin;
    let step = Duration::from_millis(100);
    let mut now = start + TTL / 3;
    let mut attempts = 0;
    let lost_at = loop {
        let mut lost = table.signal_fenced(now).len();
        if let Some(locks) = take_one(&mut table, now) {
            attempts += 1;
            let applied = table.apply("default", locks, vec![Err(no_quorum())], now);
            assert_eq!(applied.extended, 0);
            lost += usize::try_from(applied.lost).unwrap_or(usize::MAX);
        }
        if lost > 0 {
            break now;
        }
        assert!(
            now < fence_time,
            "the loss is signalled at the first look after the fence time"
        );
        now += step;
    };
    assert!(attempts > 1, "retried every retry interval");
    assert!(lost_at >= fence_time, "never before the fence time");
    assert!(
        fence_time < start + TTL,
        "the fence time is before the validity ends"
    );
    let view = table
        .view(&lock(), now)
        .expect("still in the table until released");
    assert!(matches!(view.lost, Some(LossReason::NotExtended { .. })));
    assert!(
        take_one(&mut table, now + TTL).is_none(),
        "a lost lock is not extended"
    );
}

#[tokio::test(start_paused = true)]
async fn a_keeper_that_ran_late_signals_the_loss_at_its_first_look_after_the_fence_time() {
    let start = Instant::now();
    let mut table = table_holding(start);
    let fence_time = start + TTL - policy().fence_margin;
    assert!(
        table
            .signal_fenced(fence_time - Duration::from_millis(1))
            .is_empty()
    );
    assert_eq!(table.signal_fenced(fence_time), [lock()]);
    assert!(table.signal_fenced(fence_time).is_empty(), "signalled once");
}

#[tokio::test(start_paused = true)]
async fn a_takeover_is_a_loss_at_once_and_a_removed_lock_ignores_late_results() {
    let start = Instant::now();
    let mut table = table_holding(start);
    let third = start + TTL / 3;
    let locks = take_one(&mut table, third).expect("due");
    let taken = ExtendError::Lost {
        holder: Some("other".into()),
        report: OperationReport {
            nodes: Vec::new(),
            elapsed: Duration::ZERO,
            quorum: 2,
        },
    };
    let applied = table.apply("default", locks.clone(), vec![Err(taken)], third);
    assert_eq!((applied.lost, applied.wake.len()), (1, 1));
    let view = table.view(&lock(), third).expect("held");
    assert!(matches!(view.lost, Some(LossReason::TakenOver { holder: Some(ref h) }) if h == "other"));

    assert!(matches!(table.remove(&lock()), Removal::Removed(_)));
    let applied = table.apply("default", locks, vec![Ok(lease(third))], third);
    assert_eq!(
        applied,
        Applied::default(),
        "released meanwhile: nothing to apply"
    );
    assert!(table.is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_permits_of_one_lock_are_kept_extended_and_lost_each_on_its_own() {
    let start = Instant::now();
    let mut table = table_holding(start);
    let second = PermitRef::new(lock().lock, 1);
    let permit_1 = holding("default", "permit:1:ns/a", 1);
    assert!(table.insert(second.clone(), lease(start), permit_1, start));
    assert_eq!(table.len(), 2, "permit 1 does not replace permit 0");
    // Status shows permit 0's validity, so only a loss wakes the lock for it.
    table.status_written(&lock(), start + TTL);
    let third = start + TTL / 3;
    let locks = take_one(&mut table, third).expect("both due");
    assert_eq!(locks, [lock(), second.clone()]);
    let taken = ExtendError::Lost {
        holder: None,
        report: OperationReport {
            nodes: Vec::new(),
            elapsed: Duration::ZERO,
            quorum: 2,
        },
    };
    let applied = table.apply("default", locks, vec![Ok(lease(third)), Err(taken)], third);
    assert_eq!((applied.extended, applied.lost), (1, 1));
    assert_eq!(
        applied.wake,
        std::slice::from_ref(&second),
        "only the lost permit wakes its lock"
    );
    let first = table.view(&lock(), third).expect("permit 0 held");
    assert!(first.lost.is_none(), "permit 1's loss is not permit 0's");
    assert_eq!(first.token, 3);
    let lost = table.view(&second, third).expect("permit 1 kept until removed");
    assert!(lost.lost.is_some());
    assert!(matches!(table.remove(&second), Removal::Removed(_)));
    assert!(
        table.view(&lock(), third).is_some(),
        "removing permit 1 leaves permit 0"
    );
}

#[tokio::test(start_paused = true)]
async fn a_semaphores_permits_are_extended_together_from_the_first_one_due() {
    let start = Instant::now();
    let mut table = table_holding(start);
    let permit = |number| PermitRef::new(lock().lock, number);
    let later = start + Duration::from_secs(2);
    assert!(table.insert(
        permit(1),
        lease(later),
        holding("default", "permit:1:ns/a", 1),
        later
    ));
    assert!(table.insert(
        permit(2),
        lease(later),
        holding("moved", "permit:2:ns/a", 1),
        later
    ));
    let third = start + TTL / 3;
    let (mut due, lags) = table.take_due(third);
    assert_eq!(lags.len(), 1, "only permit 0 was due");
    let batch = take_batch(&mut due, "default");
    assert_eq!(
        batch.locks,
        [lock(), permit(1)],
        "permit 1 goes early with permit 0; permit 2, on another quorum, does not"
    );
    let (again, _) = table.take_due(third);
    assert!(again.is_empty(), "nothing is taken twice");
    let results = succeeded(&batch, third);
    let applied = table.apply("default", batch.locks, results, third);
    assert_eq!(applied.extended, 2);
    let (mut moved, _) = table.take_due(later + TTL / 3);
    assert_eq!(moved.len(), 1);
    assert_eq!(take_batch(&mut moved, "moved").locks, [permit(2)]);
    // From now on they are due at the same moment.
    let (mut due, lags) = table.take_due(third + TTL / 3);
    assert_eq!(lags.len(), 2, "permits 0 and 1 both due");
    assert_eq!(take_batch(&mut due, "default").locks, [lock(), permit(1)]);
    assert!(matches!(table.remove(&permit(1)), Removal::InFlight));
    assert_eq!(table.siblings(&permit(2)), [lock(), permit(1)]);
}

/// Takes the batch of `quorum` out of `batches`.
fn take_batch(batches: &mut Vec<DueBatch>, quorum: &str) -> DueBatch {
    let index = batches
        .iter()
        .position(|batch| batch.quorum == quorum)
        .unwrap_or_else(|| panic!("no batch for {quorum}"));
    batches.swap_remove(index)
}

fn succeeded(batch: &DueBatch, now: Instant) -> Vec<Result<Lease, ExtendError>> {
    batch.locks.iter().map(|_| Ok(lease(now))).collect()
}

fn failed(batch: &DueBatch) -> Vec<Result<Lease, ExtendError>> {
    batch.locks.iter().map(|_| Err(no_quorum())).collect()
}

mod indexes;
