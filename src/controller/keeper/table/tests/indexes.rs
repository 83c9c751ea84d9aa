//! The indexes of waiting entries: what they give must be what a look at every entry would give.

use super::*;

fn ms(millis: u64) -> Duration {
    Duration::from_millis(millis)
}

fn named(name: &str) -> PermitRef {
    PermitRef::from(ObjectRef::new(name).within("ns"))
}

fn names(locks: &[PermitRef]) -> Vec<&str> {
    locks.iter().map(|lock| lock.lock.name.as_str()).collect()
}

/// Holds `name` on `quorum` with a lease granted at `granted_at`, inserted at that moment.
fn hold(table: &mut Table, quorum: &str, name: &str, granted_at: Instant) -> bool {
    let holding = Holding {
        quorum: quorum.into(),
        key: format!("ns/{name}"),
        token: 1,
        policy: policy(),
    };
    table.insert(named(name), lease(granted_at), holding, granted_at)
}

/// When a lease granted at `granted_at` is first due for extension, by the schedule's own rule.
fn due_at(granted_at: Instant) -> Instant {
    match next_keep_action(granted_at, granted_at + TTL, TTL, false, &policy()) {
        KeepAction::ExtendAt(at) => at,
        KeepAction::SignalLost => panic!("a fresh lease is not fenced"),
    }
}

fn fence_of(granted_at: Instant) -> Instant {
    granted_at + TTL - policy().fence_margin
}

fn lock_names(prefix: &str, range: std::ops::Range<u64>) -> Vec<String> {
    range.map(|i| format!("{prefix}{i:02}")).collect()
}

/// The indexes agree with the entries: every waiting entry is indexed once, under its quorum and slot, and
/// nothing else is; the fence floor is at or before every waiting entry's fence time.
fn assert_indexed(table: &Table) {
    let mut expected: Vec<(String, Slot, PermitRef)> = table
        .held
        .iter()
        .filter(|(_, held)| held.is_waiting())
        .map(|(lock, held)| (held.quorum.clone(), held.slot(), lock.clone()))
        .collect();
    let mut indexed: Vec<(String, Slot, PermitRef)> = table
        .waiting
        .entries()
        .map(|(quorum, slot, lock)| (quorum.to_owned(), slot, lock.clone()))
        .collect();
    expected.sort_by_key(|(_, slot, _)| *slot);
    indexed.sort_by_key(|(_, slot, _)| *slot);
    assert_eq!(indexed, expected);
    let first_fence = table
        .held
        .values()
        .filter(|held| held.is_waiting())
        .map(HeldLock::fence_at)
        .min();
    if let Some(first_fence) = first_fence {
        let floor = table.waiting.fence_floor();
        assert!(
            floor.is_some_and(|floor| floor <= first_fence),
            "floor {floor:?} after the first fence {first_fence:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn many_locks_on_two_quorums_go_in_due_order_and_a_busy_quorums_due_locks_wait_for_it() {
    let start = Instant::now();
    let mut table = Table::default();
    let granted = |i: u64| start + ms(10 * i);
    for i in 0..100 {
        assert!(hold(&mut table, "fast", &format!("f{i:02}"), granted(i)));
        assert!(hold(&mut table, "slow", &format!("s{i:02}"), granted(i)));
    }
    assert_indexed(&table);

    let now = due_at(granted(49));
    let (mut batches, mut lags) = table.take_due(now);
    assert_eq!(batches.len(), 2);
    let fast = take_batch(&mut batches, "fast");
    let slow = take_batch(&mut batches, "slow");
    assert_eq!(names(&fast.locks), lock_names("f", 0..50));
    assert_eq!(names(&slow.locks), lock_names("s", 0..50));
    let granted_at: Vec<Instant> = fast.leases.iter().map(Lease::granted_at).collect();
    assert_eq!(
        granted_at,
        (0..50).map(granted).collect::<Vec<_>>(),
        "leases in the order of the locks"
    );
    lags.sort_unstable();
    let mut expected: Vec<Duration> = (0..50).flat_map(|i| [now - due_at(granted(i)); 2]).collect();
    expected.sort_unstable();
    assert_eq!(lags, expected, "how late each one is");
    assert_indexed(&table);

    let applied = table.apply("fast", fast.locks.clone(), succeeded(&fast, now), now);
    assert_eq!(applied.extended, 50);
    assert_indexed(&table);

    // Every lock left is due now; the slow quorum's batch is still in flight.
    let later = due_at(granted(99));
    let (batches, _) = table.take_due(later);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].quorum, "fast");
    assert_eq!(names(&batches[0].locks), lock_names("f", 50..100));
    let mut still_waiting: Vec<&str> = table
        .waiting
        .entries()
        .filter(|(quorum, _, _)| *quorum == "slow")
        .map(|(_, _, lock)| lock.lock.name.as_str())
        .collect();
    still_waiting.sort_unstable();
    assert_eq!(
        still_waiting,
        lock_names("s", 50..100),
        "left in the index, not taken"
    );
    assert_indexed(&table);

    // The slow batch fails: its quorum is free, and its due locks go at once, earliest first.
    let applied = table.apply("slow", slow.locks.clone(), failed(&slow), later);
    assert_eq!((applied.extended, applied.lost), (0, 0));
    let (batches, lags) = table.take_due(later);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].quorum, "slow");
    assert_eq!(names(&batches[0].locks), lock_names("s", 50..100));
    let expected: Vec<Duration> = (50..100).map(|i| later - due_at(granted(i))).collect();
    assert_eq!(lags, expected);
    let applied = table.apply(
        "slow",
        batches[0].locks.clone(),
        succeeded(&batches[0], later),
        later,
    );
    assert_eq!(applied.extended, 50);

    // The failed ones are retried a retry interval later; the fast quorum still waits for its batch.
    let retry = later + policy().retry_interval;
    assert!(table.take_due(retry - ms(1)).0.is_empty());
    let (batches, _) = table.take_due(retry);
    assert_eq!(batches.len(), 1);
    assert_eq!(batches[0].quorum, "slow");
    assert_eq!(names(&batches[0].locks), lock_names("s", 0..50));
    assert_indexed(&table);
}

#[tokio::test(start_paused = true)]
async fn within_a_batch_the_earliest_due_goes_first_and_ties_in_insertion_order() {
    let start = Instant::now();
    let mut table = Table::default();
    for (name, offset) in [("c", 30), ("a", 10), ("b", 20), ("d", 10), ("e", 40)] {
        assert!(hold(&mut table, "default", name, start + ms(offset)));
    }
    let now = due_at(start + ms(30));
    let (batches, lags) = table.take_due(now);
    assert_eq!(batches.len(), 1);
    assert_eq!(names(&batches[0].locks), ["a", "d", "b", "c"]);
    let expected: Vec<Duration> = [10, 10, 20, 30]
        .into_iter()
        .map(|offset| now - due_at(start + ms(offset)))
        .collect();
    assert_eq!(lags, expected);
    assert_indexed(&table);
}

#[tokio::test(start_paused = true)]
async fn a_lock_removed_or_replaced_while_waiting_leaves_the_index() {
    let start = Instant::now();
    let mut table = Table::default();
    for name in ["a", "b", "c"] {
        assert!(hold(&mut table, "default", name, start));
    }
    assert!(matches!(table.remove(&named("b")), Removal::Removed(_)));
    assert!(matches!(table.remove(&named("b")), Removal::Absent));
    let renewed = start + ms(1_000);
    assert!(
        !hold(&mut table, "default", "c", renewed),
        "held before: replaced"
    );
    assert_indexed(&table);

    let (batches, _) = table.take_due(due_at(start));
    assert_eq!(batches.len(), 1);
    assert_eq!(names(&batches[0].locks), ["a"], "b is gone, c is due later");
    let applied = table.apply(
        "default",
        batches[0].locks.clone(),
        succeeded(&batches[0], due_at(start)),
        due_at(start),
    );
    assert_eq!(applied.extended, 1);
    assert!(matches!(table.remove(&named("a")), Removal::Removed(_)));
    assert_indexed(&table);

    assert!(table.take_due(due_at(renewed) - ms(1)).0.is_empty());
    let (batches, _) = table.take_due(due_at(renewed));
    assert_eq!(names(&batches[0].locks), ["c"]);
    assert!(
        table.take_due(start + TTL * 10).0.is_empty(),
        "a removed lock never comes back"
    );
    assert_indexed(&table);
}

#[tokio::test(start_paused = true)]
async fn a_lost_lock_is_never_scheduled_again() {
    let start = Instant::now();
    let mut table = Table::default();
    for (quorum, name) in [("default", "taken"), ("default", "expired"), ("other", "fenced")] {
        assert!(hold(&mut table, quorum, name, start));
    }
    let now = due_at(start);
    let (mut batches, _) = table.take_due(now);
    let default = take_batch(&mut batches, "default");
    let other = take_batch(&mut batches, "other");
    assert_eq!(names(&default.locks), ["taken", "expired"]);
    let results = vec![
        Err(ExtendError::Lost {
            holder: Some("someone".into()),
            report: OperationReport {
                nodes: Vec::new(),
                elapsed: Duration::ZERO,
                quorum: 2,
            },
        }),
        Err(ExtendError::Expired { report: None }),
    ];
    let applied = table.apply("default", default.locks, results, now);
    assert_eq!((applied.lost, applied.wake.len()), (2, 2));
    let applied = table.apply("other", other.locks.clone(), failed(&other), now);
    assert_eq!(applied.lost, 0, "retrying");
    assert_indexed(&table);

    assert_eq!(table.signal_fenced(fence_of(start)), [named("fenced")]);
    assert_indexed(&table);
    assert_eq!(table.waiting.entries().count(), 0, "nothing left to extend");
    let far = start + TTL * 10;
    assert!(table.take_due(far).0.is_empty());
    assert!(table.signal_fenced(far).is_empty(), "each loss signalled once");
    assert_eq!(table.len(), 3, "lost locks stay until released");
}

#[tokio::test(start_paused = true)]
async fn a_lock_back_from_a_failed_batch_is_signalled_at_its_fence_time_though_a_look_passed_it_in_flight() {
    // Late enough that leases granted seconds before it exist.
    let start = Instant::now() + TTL;
    let mut table = Table::default();
    let flying_granted = start - ms(3_400);
    assert!(hold(&mut table, "default", "flying", flying_granted));
    let (batches, _) = table.take_due(start);
    assert_eq!(names(&batches[0].locks), ["flying"]);

    // While it is in flight, another lock's fence time comes: the look at every lock does not see it.
    let early_granted = start - ms(7_000);
    assert!(hold(&mut table, "default", "early", early_granted));
    assert!(hold(&mut table, "default", "late", start));
    assert_eq!(table.signal_fenced(fence_of(early_granted)), [named("early")]);
    assert_indexed(&table);

    // Its extension fails: waiting again, its fence time comes before the late lock's.
    let applied = table.apply(
        "default",
        batches[0].locks.clone(),
        failed(&batches[0]),
        start + ms(1_500),
    );
    assert_eq!((applied.extended, applied.lost), (0, 0));
    assert_indexed(&table);
    let flying_fence = fence_of(flying_granted);
    assert!(flying_fence < fence_of(start));
    assert!(table.signal_fenced(flying_fence - ms(1)).is_empty());
    assert_eq!(table.signal_fenced(flying_fence), [named("flying")]);
    assert!(table.signal_fenced(fence_of(start) - ms(1)).is_empty());
    assert_eq!(table.signal_fenced(fence_of(start)), [named("late")]);
    assert_indexed(&table);
}

#[tokio::test(start_paused = true)]
async fn under_failing_extensions_every_lock_is_signalled_at_the_first_tick_after_its_fence_time() {
    let start = Instant::now();
    let tick = ms(50);
    let mut table = Table::default();
    let granted = |i: u64| start + ms(37 * i);
    for i in 0..20 {
        assert!(hold(
            &mut table,
            if i % 2 == 0 { "even" } else { "odd" },
            &format!("l{i:02}"),
            granted(i)
        ));
    }
    let mut lost_at: HashMap<String, Instant> = HashMap::new();
    let mut now = start;
    while lost_at.len() < 20 {
        assert!(
            now < start + TTL * 2,
            "every lock is signalled before its validity ends"
        );
        for lock in table.signal_fenced(now) {
            assert!(
                lost_at.insert(lock.lock.name.clone(), now).is_none(),
                "signalled once"
            );
        }
        let (batches, _) = table.take_due(now);
        for batch in batches {
            let applied = table.apply(&batch.quorum, batch.locks.clone(), failed(&batch), now);
            assert_eq!(applied.lost, 0, "signalled by the fence look first");
        }
        assert_indexed(&table);
        now += tick;
    }
    for i in 0..20 {
        let fence = fence_of(granted(i));
        let ticks = (fence - start).as_nanos().div_ceil(tick.as_nanos());
        let first_tick_after = start + tick * u32::try_from(ticks).expect("few ticks");
        assert_eq!(lost_at[&format!("l{i:02}")], first_tick_after, "l{i:02}");
    }
}

#[tokio::test(start_paused = true)]
async fn clear_empties_the_index() {
    let start = Instant::now();
    let mut table = Table::default();
    for i in 0..10 {
        assert!(hold(
            &mut table,
            if i < 5 { "a" } else { "b" },
            &format!("l{i}"),
            start + ms(i)
        ));
    }
    let (batches, _) = table.take_due(due_at(start + ms(9)));
    assert_eq!(batches.len(), 2);
    assert_eq!(table.clear(), 10);
    assert_eq!(table.waiting.entries().count(), 0);
    assert_eq!(table.waiting.fence_floor(), None);
    assert!(table.signal_fenced(start + TTL * 2).is_empty());
    assert!(table.take_due(start + TTL * 2).0.is_empty());
    for batch in batches {
        let now = start + TTL;
        let applied = table.apply(&batch.quorum, batch.locks.clone(), succeeded(&batch, now), now);
        assert_eq!(applied, Applied::default(), "forgotten meanwhile");
    }
    assert!(hold(&mut table, "a", "again", start + TTL));
    let (batches, _) = table.take_due(due_at(start + TTL));
    assert_eq!(names(&batches[0].locks), ["again"], "the quorum is free again");
    assert_indexed(&table);
}

/// Random operations in random order; after each, the indexes agree with the entries, and every take and
/// fence look gives exactly what a look at every entry gives.
#[tokio::test(start_paused = true)]
async fn the_indexes_take_and_signal_exactly_what_a_look_at_every_lock_would() {
    use rand::{Rng, SeedableRng, rngs::StdRng};

    let mut rng = StdRng::seed_from_u64(16);
    let start = Instant::now() + TTL;
    let mut now = start;
    let mut table = Table::default();
    let mut in_flight: Vec<DueBatch> = Vec::new();
    let (mut taken, mut fenced) = (0, 0);
    for _ in 0..4_000 {
        match rng.random_range(0..100) {
            0..30 => now += ms(rng.random_range(0..300)),
            30..42 => {
                let name = format!("l{}", rng.random_range(0..40));
                let quorum = ["q0", "q1", "q2"][rng.random_range(0..3)];
                let granted_at = now - ms(rng.random_range(0..9_000));
                let holding = Holding {
                    quorum: quorum.into(),
                    key: name.clone(),
                    token: 1,
                    policy: policy(),
                };
                table.insert(named(&name), lease(granted_at), holding, now);
            }
            42..47 => {
                table.remove(&named(&format!("l{}", rng.random_range(0..40))));
            }
            47..67 => {
                let mut expected: Vec<(Slot, PermitRef, String, Duration)> = table
                    .held
                    .iter()
                    .filter(|(_, held)| {
                        held.is_waiting() && held.next_at <= now && !table.busy.contains(&held.quorum)
                    })
                    .map(|(lock, held)| (held.slot(), lock.clone(), held.quorum.clone(), now - held.next_at))
                    .collect();
                expected.sort_by_key(|(slot, ..)| *slot);
                let (batches, mut lags) = table.take_due(now);
                let mut got: Vec<(String, Vec<PermitRef>)> = batches
                    .iter()
                    .map(|batch| (batch.quorum.clone(), batch.locks.clone()))
                    .collect();
                got.sort_by(|a, b| a.0.cmp(&b.0));
                let mut want: Vec<(String, Vec<PermitRef>)> = Vec::new();
                for quorum in ["q0", "q1", "q2"] {
                    let locks: Vec<PermitRef> = expected
                        .iter()
                        .filter(|(_, _, q, _)| q == quorum)
                        .map(|(_, lock, ..)| lock.clone())
                        .collect();
                    if !locks.is_empty() {
                        want.push((quorum.to_owned(), locks));
                    }
                }
                assert_eq!(got, want);
                let mut want_lags: Vec<Duration> = expected.iter().map(|(.., lag)| *lag).collect();
                want_lags.sort_unstable();
                lags.sort_unstable();
                assert_eq!(lags, want_lags);
                assert!(batches.iter().all(|batch| table.busy.contains(&batch.quorum)));
                taken += expected.len();
                in_flight.extend(batches);
            }
            67..80 if !in_flight.is_empty() => {
                let batch = in_flight.swap_remove(rng.random_range(0..in_flight.len()));
                let results = batch
                    .locks
                    .iter()
                    .map(|_| match rng.random_range(0..10) {
                        0..5 => Ok(lease(now)),
                        5..8 => Err(no_quorum()),
                        8 => Err(ExtendError::Expired { report: None }),
                        _ => Err(ExtendError::Lost {
                            holder: None,
                            report: OperationReport {
                                nodes: Vec::new(),
                                elapsed: Duration::ZERO,
                                quorum: 2,
                            },
                        }),
                    })
                    .collect();
                table.apply(&batch.quorum, batch.locks, results, now);
            }
            80..99 => {
                let mut want: Vec<PermitRef> = table
                    .held
                    .iter()
                    .filter(|(_, held)| held.is_waiting() && held.fence_at() <= now)
                    .map(|(lock, _)| lock.clone())
                    .collect();
                let mut got = table.signal_fenced(now);
                want.sort_by(|a, b| a.lock.name.cmp(&b.lock.name));
                got.sort_by(|a, b| a.lock.name.cmp(&b.lock.name));
                assert_eq!(got, want);
                fenced += got.len();
            }
            _ => {
                table.clear();
            }
        }
        assert_indexed(&table);
    }
    assert!(
        taken > 200 && fenced > 20,
        "the run exercised both: {taken} taken, {fenced} fenced"
    );
}
