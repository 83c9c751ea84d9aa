//! Counting semaphores in the engine (issue 23): one of N permits, each its own Redlock key with its own fencing
//! counter, against real `redis-server` masters.

use std::time::Duration;

use crate::support::forgotten_tokens::{
    Refusal, assert_above_the_last_token, masters_that_forgot_the_last_token,
};
use crate::support::redis_server::{RedisCluster, raw_command, raw_get};
use redlock_operator::redlock::{
    AcquireError, AcquireOptions, FailureKind, LockValue, Redlock, RedlockConfig, counter_key, permit_key,
};
use tokio::time::Instant;

const TTL: Duration = Duration::from_secs(30);

/// Durable masters (no quarantine to wait out) with a TTL long enough that nothing expires while a test looks.
async fn engine(cluster: &RedisCluster) -> Redlock {
    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = TTL;
    config.node_timeout = Duration::from_millis(500);
    config.assume_durable = true;
    let engine = Redlock::connect(config).await.expect("engine");
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.eligible() < cluster.len() {
        assert!(Instant::now() < deadline, "masters never became eligible");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    engine
}

fn once() -> AcquireOptions {
    AcquireOptions {
        attempts: Some(1),
        deadline: None,
        token_floor: 0,
        fair: false,
    }
}

/// How many masters hold `key` with a value of `holder`'s.
async fn held_by(cluster: &RedisCluster, key: &str, holder: &str) -> usize {
    let mut count = 0;
    for url in cluster.urls() {
        if raw_get(&url, key)
            .await
            .is_some_and(|value| value.starts_with(&format!("{holder}|")))
        {
            count += 1;
        }
    }
    count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_holder_gets_a_permit_of_its_own_until_none_is_left() {
    let cluster = RedisCluster::start(3).expect("masters");
    let engine = engine(&cluster).await;
    let mut leases = Vec::new();
    for holder in ["a", "b", "c"] {
        let lease = engine
            .acquire_permit("sem", 3, TTL, holder, once())
            .await
            .expect("a free permit");
        assert_eq!(lease.resource(), permit_key("sem", lease.permit()));
        assert_eq!(lease.fencing_token(), 1, "each permit has its own token sequence");
        leases.push(lease);
    }
    let mut permits: Vec<u32> = leases.iter().map(|lease| lease.permit()).collect();
    permits.sort_unstable();
    assert_eq!(permits, vec![0, 1, 2]);

    let err = engine
        .acquire_permit("sem", 3, TTL, "d", once())
        .await
        .expect_err("every permit is held");
    let AcquireError::NotAcquired { kind, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(*kind, FailureKind::Contended, "{err}");
    engine.settle().await;
    for permit in 0..3 {
        assert_eq!(
            held_by(&cluster, &permit_key("sem", permit), "d").await,
            0,
            "a failed attempt leaves nothing behind"
        );
    }

    // A released permit is the one the next holder gets, with that permit's next token.
    let freed = leases.remove(1);
    engine.release(&freed).await;
    let next = engine
        .acquire_permit("sem", 3, TTL, "d", once())
        .await
        .expect("the freed permit");
    assert_eq!(next.permit(), freed.permit());
    assert_eq!(next.fencing_token(), 2);
    // A permit is a lock: it extends and releases as one.
    let extended = engine.extend(&next).await.expect("extend");
    assert_eq!((extended.permit(), extended.fencing_token()), (next.permit(), 2));
    engine.release(&extended).await;
    for lease in &leases {
        engine.release(lease).await;
    }
    engine.settle().await;
}

/// One permit is exactly one lock: `permits: 1` uses the key itself and its counter.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_permit_is_the_plain_lock() {
    let cluster = RedisCluster::start(3).expect("masters");
    let engine = engine(&cluster).await;
    let lease = engine.acquire("plain", TTL, "a", once()).await.expect("lock");
    let err = engine
        .acquire_permit("plain", 1, TTL, "b", once())
        .await
        .expect_err("the lock's own key");
    assert!(err.to_string().contains("held by a"), "{err}");
    engine.release(&lease).await;
    let permit = engine
        .acquire_permit("plain", 1, TTL, "b", once())
        .await
        .expect("free again");
    assert_eq!(
        (permit.resource(), permit.permit(), permit.fencing_token()),
        ("plain", 0, 2)
    );
    engine.release(&permit).await;
    engine.settle().await;
}

/// Masters that disagree on which permit is free: the permit a majority took wins, and the masters that took
/// another one give it back, so no permit is held anywhere it was not won.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_that_took_another_permit_give_it_back() {
    let cluster = RedisCluster::start(5).expect("masters");
    let engine = engine(&cluster).await;
    let urls = cluster.urls();
    // Permit 0 is taken on masters 2, 3 and 4, permit 1 on masters 0 and 1.
    for (index, url) in urls.iter().enumerate() {
        let permit = if index < 2 { 1 } else { 0 };
        raw_command(
            url,
            &["SET", &permit_key("split", permit), "other|x", "PX", "30000"],
        )
        .await;
    }
    let lease = engine
        .try_acquire_permit("split", 3, TTL, LockValue::random("me").expect("value"), &[], 0)
        .await
        .expect("permit 1 has a majority");
    // Started at permit 0: masters 0 and 1 take permit 0, 2–4 take permit 1 — permit 1 wins with three.
    assert_eq!(lease.permit(), 1, "{}", lease.report());
    engine.settle().await;
    assert_eq!(
        held_by(&cluster, &permit_key("split", 0), "me").await,
        0,
        "permit 0 given back"
    );
    assert_eq!(held_by(&cluster, &permit_key("split", 1), "me").await, 3);
    engine.release(&lease).await;
    engine.settle().await;
}

/// Each permit's counter is its own: a permit whose counter a majority knows higher is proposed above it in the
/// same attempt, and the other permits' tokens are untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokens_rise_per_permit_above_what_the_masters_know() {
    let cluster = RedisCluster::start(3).expect("masters");
    let engine = engine(&cluster).await;
    for url in cluster.urls() {
        raw_command(
            &url,
            &["SET", &counter_key(&permit_key("tok", 1)), "41", "PX", "60000"],
        )
        .await;
    }
    let value = || LockValue::random("me").expect("value");
    let first = engine
        .try_acquire_permit("tok", 2, TTL, value(), &[], 1)
        .await
        .expect("permit 1, above its counter");
    assert_eq!((first.permit(), first.fencing_token()), (1, 42));
    let second = engine
        .try_acquire_permit("tok", 2, TTL, value(), &[], 1)
        .await
        .expect("permit 0, its own sequence");
    assert_eq!((second.permit(), second.fencing_token()), (0, 1));
    engine.release(&first).await;
    let again = engine
        .try_acquire_permit("tok", 2, TTL, value(), &[7, 50], 1)
        .await
        .expect("permit 1 again, above the caller's floor");
    assert_eq!((again.permit(), again.fencing_token()), (1, 51));
    engine.release(&again).await;
    engine.release(&second).await;
    engine.settle().await;
}

/// As for one key (see the engine's `masters_refusing_for_a_holder_or_the_queue_still_keep_tokens_rising`): a
/// master whose permits are all held, or whose semaphore queue comes first, reports the counters that are not
/// below their proposals, so that a majority of masters that forgot them cannot send a permit's token back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_refusing_for_holders_or_the_queue_still_keep_permit_tokens_rising() {
    let cluster = RedisCluster::start(5).expect("masters");
    let engine = engine(&cluster).await;
    let urls = cluster.urls();
    for (key, refusal) in [("outbid-held", Refusal::Held), ("outbid-queued", Refusal::Queued)] {
        let permits = [permit_key(key, 0), permit_key(key, 1)];
        masters_that_forgot_the_last_token(&urls, &permits, key, refusal).await;
        let lease = engine
            .acquire_permit(key, 2, TTL, "a", once())
            .await
            .expect("a majority grants");
        assert_above_the_last_token(&lease, refusal);
        engine.release(&lease).await;
    }
    engine.settle().await;
}

/// A permit that an earlier round of the same attempt took (our value, the counter at our very proposal) is
/// granted again, not refused for a counter that is only ours: such a refusal cost a round, and the fourth
/// would fail the attempt.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_permit_an_earlier_round_took_is_granted_again_at_the_same_token() {
    let cluster = RedisCluster::start(3).expect("masters");
    let engine = engine(&cluster).await;
    // A value whose stored form the test knows (the secret never leaves the crate otherwise).
    let secret = [7u8; 20];
    let value = LockValue::with_secret("me", &secret).expect("value");
    let stored = format!("me|{}", "07".repeat(20));
    let permit = permit_key("again", 1);
    for url in cluster.urls() {
        raw_command(&url, &["SET", &permit, &stored, "PX", "60000"]).await;
        raw_command(&url, &["SET", &counter_key(&permit), "5"]).await;
    }
    let lease = engine
        .try_acquire_permit("again", 2, TTL, value, &[0, 4], 1)
        .await
        .expect("granted");
    assert_eq!(
        (lease.permit(), lease.fencing_token()),
        (1, 5),
        "{}",
        lease.report()
    );
    engine.release(&lease).await;
    engine.settle().await;
}

/// Many clients at once on few permits: never more holders than permits, and every permit gets used (the
/// random start keeps clients from all colliding on permit 0).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_clients_never_hold_more_than_the_permits() {
    let cluster = RedisCluster::start(3).expect("masters");
    let engine = engine(&cluster).await;
    let holding = std::sync::Arc::new(std::sync::Mutex::new(Vec::<u32>::new()));
    let used = std::sync::Arc::new(std::sync::Mutex::new(std::collections::BTreeSet::new()));
    let mut tasks = Vec::new();
    for client in 0..8 {
        let engine = engine.clone();
        let holding = holding.clone();
        let used = used.clone();
        tasks.push(tokio::spawn(async move {
            for _ in 0..10 {
                let Ok(lease) = engine
                    .acquire_permit("busy", 3, TTL, &format!("c{client}"), once())
                    .await
                else {
                    tokio::task::yield_now().await;
                    continue;
                };
                {
                    let mut holding = holding.lock().unwrap();
                    assert!(
                        !holding.contains(&lease.permit()),
                        "permit {} held twice: {holding:?}",
                        lease.permit()
                    );
                    holding.push(lease.permit());
                    assert!(holding.len() <= 3, "more holders than permits: {holding:?}");
                    used.lock().unwrap().insert(lease.permit());
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
                holding.lock().unwrap().retain(|permit| *permit != lease.permit());
                engine.release(&lease).await;
            }
        }));
    }
    for task in tasks {
        task.await.expect("client");
    }
    assert!(!used.lock().unwrap().is_empty());
    engine.settle().await;
}
