//! The Redlock engine against real `redis-server` masters started by the tests, with real faults
//! (SIGKILL + empty restart, SIGSTOP).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use redlock_operator::redlock::{
    AcquireError, AcquireOptions, ExtendError, FailureKind, KeepPolicy, LockValue, LossReason, NodeHealth,
    NodeOutcome, Redlock, RedlockConfig, counter_key,
};
use support::fault_proxy::{Direction, FaultProxy};
use support::forgotten_tokens::{Refusal, assert_above_the_last_token, masters_that_forgot_the_last_token};
use support::redis_server::{RedisCluster, raw_get};
use tokio::time::Instant;

/// Masters started by the tests have uptime 0, so with the default max TTL they would sit in quarantine for a
/// minute; tests that are not about quarantine use a max TTL just above their lock TTL and wait it out once.
async fn engine(cluster: &RedisCluster, max_ttl: Duration, node_timeout: Duration) -> Redlock {
    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("valid config");
    config.max_ttl = max_ttl;
    config.node_timeout = node_timeout;
    Redlock::connect(config).await.expect("engine")
}

async fn wait_until_eligible(engine: &Redlock, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(120);
    while engine.eligible() < count {
        assert!(
            Instant::now() < deadline,
            "masters never left quarantine: {:?}",
            engine.masters()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn raw_pttl(url: &str, key: &str) -> i64 {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    redis::cmd("PTTL")
        .arg(key)
        .query_async::<i64>(&mut conn)
        .await
        .expect("pttl")
}

async fn keys_left(cluster: &RedisCluster, key: &str) -> usize {
    let mut left = 0;
    for url in cluster.urls() {
        if raw_get(&url, key).await.is_some() {
            left += 1;
        }
    }
    left
}

fn once() -> AcquireOptions {
    AcquireOptions {
        attempts: Some(1),
        deadline: None,
        token_floor: 0,
        fair: false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acquire_extend_release_and_contention() {
    let cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(10);
    // A node timeout a loaded machine does not run into: every master's answer is awaited where it counts.
    let engine = engine(&cluster, ttl, Duration::from_secs(1)).await;
    wait_until_eligible(&engine, 5).await;

    let lease = engine
        .acquire("orders", ttl, "alice", once())
        .await
        .expect("acquire");
    assert_eq!(lease.holder(), "alice");
    assert!(lease.validity() < ttl && !lease.validity().is_zero());
    assert!(lease.report().votes() >= 3, "{}", lease.report());
    // Acquisition returns once a majority granted; a write to another master may still be on its way (or,
    // not sent yet, dropped: the keeper's next extension repairs it). A ping on the same connections lets
    // every write sent before it land.
    engine.check_masters().await;
    let holding = holders(&cluster, "orders", "alice|").await;
    assert!(
        holding.len() >= lease.report().votes(),
        "{holding:?}: {}",
        lease.report()
    );
    for url in &holding {
        let stored = raw_get(url, "orders").await.expect("held");
        assert!(stored.len() >= "alice|".len() + 40, "at least 20 bytes of secret");
    }

    // A contender is refused and told who blocks it.
    let err = engine.acquire("orders", ttl, "bob", once()).await.unwrap_err();
    match &err {
        AcquireError::NotAcquired { kind, report, .. } => {
            assert_eq!(*kind, FailureKind::Contended);
            assert_eq!(report.blocking_holder().as_deref(), Some("alice"));
        }
        other => panic!("unexpected {other}"),
    }
    assert!(err.to_string().contains("held by alice"), "{err}");
    assert_eq!(
        holders(&cluster, "orders", "").await,
        holding,
        "a refused contender removes nothing of ours and leaves nothing of its own"
    );

    // Extension restores the full TTL: every master that answered it has a PTTL above what any had left
    // before (no threshold that a loaded machine could miss); the masters without the key get it back.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let mut left_before = 0;
    for url in cluster.urls() {
        left_before = left_before.max(raw_pttl(&url, "orders").await);
    }
    let extended = engine.extend(&lease).await.expect("extend");
    assert!(extended.valid_until() > lease.valid_until());
    let answered: Vec<&str> = extended
        .report()
        .nodes
        .iter()
        .filter(|node| matches!(node.outcome, NodeOutcome::Granted | NodeOutcome::Recreated))
        .map(|node| node.endpoint.as_str())
        .collect();
    assert!(answered.len() >= 3, "{}", extended.report());
    for url in answered {
        let left = raw_pttl(url, "orders").await;
        assert!(
            left > left_before,
            "PTTL on {url} was not reset to the TTL: {left} ms left, {left_before} ms before"
        );
    }

    let report = engine.release(&extended).await;
    assert!(report.votes() >= 3, "decided at a majority: {report}");
    engine.settle().await;
    assert_eq!(keys_left(&cluster, "orders").await, 0);
    // Releasing again is harmless and reports that nothing was held.
    let report = engine.release(&extended).await;
    assert!(
        report
            .nodes
            .iter()
            .all(|node| matches!(node.outcome, NodeOutcome::NotHeld | NodeOutcome::Pending)),
        "{report}"
    );
    assert_eq!(report.votes(), 0, "{report}");

    // The shortest TTL the node timeout allows, to wait out.
    let short = Duration::from_secs(2);
    let lease = engine
        .acquire("orders", short, "bob", once())
        .await
        .expect("free again");
    // An expired lease can be neither extended nor used to delete someone else's lock.
    tokio::time::sleep_until(lease.valid_until() + Duration::from_millis(400)).await;
    assert!(engine.extend(&lease).await.is_err());
    // A master's key expires a TTL after its write arrived, which on a loaded machine can be well after bob's
    // validity was counted from: carol retries until a majority let the key expire.
    let carol = engine
        .acquire(
            "orders",
            ttl,
            "carol",
            AcquireOptions {
                attempts: None,
                deadline: Some(Instant::now() + Duration::from_secs(30)),
                token_floor: 0,
                fair: false,
            },
        )
        .await
        .expect("carol after expiry");
    engine.check_masters().await;
    let carols = holders(&cluster, "orders", "carol|").await;
    assert!(carols.len() >= 3, "{carols:?}");
    engine.release(&lease).await;
    engine.settle().await;
    assert_eq!(
        holders(&cluster, "orders", "carol|").await,
        carols,
        "bob's stale release left carol's lock alone"
    );
    engine.release(&carol).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn minority_failures_do_not_block_or_slow_acquisition() {
    let mut cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(2);
    // A long per-node timeout makes "did not wait for the stopped masters" visible without timing tricks.
    let engine = engine(&cluster, ttl, Duration::from_secs(5)).await;
    wait_until_eligible(&engine, 5).await;

    cluster[0].kill();
    let lease = engine
        .acquire("one-down", ttl, "a", once())
        .await
        .expect("1 of 5 killed");
    engine.release(&lease).await;
    cluster[1].kill();
    let lease = engine
        .acquire("two-down", ttl, "a", once())
        .await
        .expect("2 of 5 killed");
    assert_eq!(lease.report().votes(), 3);
    engine.release(&lease).await;

    let mut cluster = RedisCluster::start(5).expect("masters");
    let engine = self::engine(&cluster, ttl, Duration::from_secs(5)).await;
    wait_until_eligible(&engine, 5).await;
    cluster[3].stop();
    cluster[4].stop();
    let started = Instant::now();
    let lease = engine
        .acquire("two-paused", ttl, "a", once())
        .await
        .expect("2 of 5 paused");
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "decided without waiting for the paused masters"
    );
    let pending = lease
        .report()
        .nodes
        .iter()
        .filter(|node| node.outcome == NodeOutcome::Pending)
        .count();
    assert_eq!(pending, 2, "{}", lease.report());
    engine.release(&lease).await;
    cluster[3].cont();
    cluster[4].cont();
    let _ = &mut cluster;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_down_fails_and_leaves_no_key_behind() {
    let cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(3);
    let engine = engine(&cluster, ttl, Duration::from_millis(100)).await;
    wait_until_eligible(&engine, 5).await;

    for index in 0..3 {
        cluster[index].stop();
    }
    let err = engine
        .acquire("majority-down", ttl, "a", once())
        .await
        .unwrap_err();
    match &err {
        AcquireError::NotAcquired { kind, report, .. } => {
            assert_eq!(*kind, FailureKind::TooFewMasters, "{report}");
            assert_eq!(report.votes(), 2);
        }
        other => panic!("unexpected {other}"),
    }
    assert!(err.to_string().contains("3 timed out"), "{err}");
    for index in 0..3 {
        cluster[index].cont();
    }
    // The paused masters now run the late SET and, queued behind it on the same connection, the unlock.
    let deadline = Instant::now() + Duration::from_secs(10);
    while keys_left(&cluster, "majority-down").await > 0 {
        assert!(Instant::now() < deadline, "a key survived a failed acquisition");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }

    // Killed (not paused) masters: refused at once, and the survivors are cleaned up too.
    let mut cluster = cluster;
    for index in 0..3 {
        cluster[index].kill();
    }
    let err = engine
        .acquire("majority-killed", ttl, "a", once())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            AcquireError::NotAcquired {
                kind: FailureKind::TooFewMasters,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(keys_left(&cluster, "majority-killed").await, 0);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_lock_is_granted_without_validity_left() {
    let cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_millis(40);
    let engine = engine(&cluster, Duration::from_secs(1), Duration::from_millis(500)).await;
    wait_until_eligible(&engine, 5).await;

    for round in 0..3 {
        for index in 0..5 {
            cluster[index].stop();
        }
        let resume = {
            let pids: Vec<u32> = (0..5).map(|index| cluster[index].pid()).collect();
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(80));
                for pid in pids {
                    let _ = nix::sys::signal::kill(
                        nix::unistd::Pid::from_raw(pid as i32),
                        nix::sys::signal::Signal::SIGCONT,
                    );
                }
            })
        };
        let key = format!("slow-{round}");
        let result = engine.acquire(&key, ttl, "a", once()).await;
        resume.join().expect("resume thread");
        match result {
            Ok(lease) => panic!("granted with {:?} validity after a >ttl stall", lease.validity()),
            Err(AcquireError::NotAcquired { kind, .. }) => assert_eq!(kind, FailureKind::ValidityExhausted),
            Err(other) => panic!("unexpected {other}"),
        }
    }
    for index in 0..5 {
        cluster[index].cont();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sixteen_tasks_on_one_key_never_overlap() {
    let cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_millis(500);
    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = ttl;
    config.node_timeout = Duration::from_millis(200);
    config.retry.delay_min = Duration::from_millis(1);
    config.retry.delay_max = Duration::from_millis(10);
    let first = Redlock::connect(config.clone()).await.expect("engine");
    wait_until_eligible(&first, 5).await;

    let windows: Arc<Mutex<Vec<(Instant, Instant, usize)>>> = Arc::default();
    let stop_at = Instant::now() + Duration::from_secs(4);
    let mut tasks = Vec::new();
    for task in 0..16 {
        // Separate engines: separate connections, like separate processes.
        let engine = Redlock::connect(config.clone()).await.expect("engine");
        let windows = windows.clone();
        tasks.push(tokio::spawn(async move {
            let mut grants = 0;
            while Instant::now() < stop_at {
                let options = AcquireOptions {
                    attempts: None,
                    deadline: Some(stop_at),
                    token_floor: 0,
                    fair: false,
                };
                let Ok(lease) = engine
                    .acquire("shared", ttl, &format!("task-{task}"), options)
                    .await
                else {
                    continue;
                };
                let start = Instant::now();
                grants += 1;
                tokio::time::sleep(Duration::from_millis(rand::random_range(0..5))).await;
                let end = Instant::now().min(lease.valid_until());
                windows.lock().expect("windows").push((start, end, task));
                engine.release(&lease).await;
            }
            grants
        }));
    }
    let mut total = 0;
    for task in tasks {
        total += task.await.expect("task");
    }
    let mut windows = windows.lock().expect("windows").clone();
    windows.sort();
    assert!(
        total >= 16,
        "too little progress to mean anything: {total} grants"
    );
    assert_eq!(windows.len(), total);
    for pair in windows.windows(2) {
        assert!(
            pair[0].1 <= pair[1].0,
            "task {} held until {:?} but task {} got the lock at {:?}",
            pair[0].2,
            pair[0].1,
            pair[1].2,
            pair[1].0
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_masters_are_quarantined_even_for_a_fresh_client() {
    let mut cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(30);
    let holder = engine(&cluster, ttl, Duration::from_millis(200)).await;
    // Fresh masters are themselves inside the quarantine window: the first grant waits it out.
    wait_until_eligible(&holder, 5).await;
    let kept = holder.keep(
        holder
            .acquire("payments", ttl, "holder", once())
            .await
            .expect("acquire"),
        KeepPolicy::for_ttl(ttl, Duration::from_millis(200)),
    );
    let holder_valid_until = kept.state().lease.valid_until();

    for index in 0..3 {
        cluster[index].restart().expect("restart empty");
    }
    let restarted_at = Instant::now();

    // A second process that never saw these masters before.
    let fresh = engine(&cluster, ttl, Duration::from_millis(200)).await;
    let statuses = fresh.masters();
    // The untouched masters may still look quarantined for a moment: uptime is reported in whole seconds and
    // rounded down, which only ever lengthens the quarantine.
    assert!(
        statuses[..3]
            .iter()
            .all(|node| node.health == NodeHealth::Quarantined),
        "{statuses:?}"
    );
    let err = fresh.acquire("payments", ttl, "fresh", once()).await.unwrap_err();
    match &err {
        AcquireError::NotAcquired { kind, report, .. } => {
            assert_eq!(*kind, FailureKind::TooFewMasters, "{report}");
            let quarantined = report.nodes[..3]
                .iter()
                .filter(|node| matches!(node.outcome, NodeOutcome::Quarantined { .. }))
                .count();
            assert_eq!(quarantined, 3, "{report}");
        }
        other => panic!("unexpected {other}"),
    }

    // The holder cannot extend on 2 of 5: it is told before its validity ends.
    let reason = kept.lost().await;
    let told_at = Instant::now();
    assert!(told_at < holder_valid_until.max(kept.state().lease.valid_until()));
    assert!(matches!(reason, LossReason::NotExtended { .. }), "{reason}");

    // The fresh client keeps trying; it gets the lock only once the quarantine is over.
    let options = AcquireOptions {
        attempts: None,
        deadline: Some(Instant::now() + Duration::from_secs(60)),
        token_floor: 0,
        fair: false,
    };
    let lease = fresh
        .acquire("payments", ttl, "fresh", options)
        .await
        .expect("after quarantine");
    let granted_at = lease.granted_at();
    assert!(
        granted_at >= restarted_at + fresh.config().quarantine_period() - Duration::from_secs(1),
        "granted {:?} after the restart, before the quarantine could end",
        granted_at - restarted_at
    );
    assert!(
        granted_at >= kept.state().lease.valid_until(),
        "the two holders' windows overlap"
    );
    fresh.release(&lease).await;
    drop(kept);
    let _ = &mut cluster;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kept_lock_signals_loss_before_validity_ends() {
    let cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(2);
    let engine = engine(&cluster, ttl, Duration::from_millis(100)).await;
    wait_until_eligible(&engine, 5).await;

    // Extended while healthy.
    let kept = engine.keep(
        engine.acquire("kept", ttl, "k", once()).await.expect("acquire"),
        KeepPolicy::for_ttl(ttl, Duration::from_millis(100)),
    );
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let state = kept.state();
    assert!(state.extensions >= 2, "{state:?}");
    assert!(state.lost.is_none());

    // A majority paused: the signal comes before the last validity ends.
    for index in 0..3 {
        cluster[index].stop();
    }
    let reason = kept.lost().await;
    let told_at = Instant::now();
    let valid_until = kept.state().lease.valid_until();
    assert!(
        told_at < valid_until,
        "told {:?} after the validity ended",
        told_at - valid_until
    );
    assert!(matches!(reason, LossReason::NotExtended { .. }), "{reason}");
    for index in 0..3 {
        cluster[index].cont();
    }
    kept.release().await;

    // Taken over: a majority holds someone else's value.
    let kept = engine.keep(
        engine.acquire("taken", ttl, "k", once()).await.expect("acquire"),
        KeepPolicy::for_ttl(ttl, Duration::from_millis(100)),
    );
    // What another client's value looks like: holder label, then a hex secret.
    let intruder_value = format!("intruder|{}", "ab".repeat(24));
    for url in cluster.urls().iter().take(3) {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        redis::cmd("SET")
            .arg("taken")
            .arg(&intruder_value)
            .arg("PX")
            .arg(5_000)
            .query_async::<()>(&mut conn)
            .await
            .expect("set");
    }
    let reason = tokio::time::timeout(Duration::from_secs(3), kept.lost())
        .await
        .expect("signal");
    assert_eq!(
        reason,
        LossReason::TakenOver {
            holder: Some("intruder".into())
        }
    );
    kept.release().await;
    engine.settle().await;
    assert_eq!(
        keys_left(&cluster, "taken").await,
        3,
        "release never deletes another holder's key"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn passwords_and_tls_are_honoured_and_failures_are_explained() {
    use support::redis_server::{Options, TlsFiles};
    let certs_dir = tempfile::tempdir().expect("tempdir");
    let tls = TlsFiles::generate(certs_dir.path()).expect("certificates");
    let cluster = RedisCluster::start_with(3, |_| Options {
        password: Some("s3cret-pw".into()),
        tls: Some(tls.clone()),
        ..Options::default()
    })
    .expect("masters");
    let ttl = Duration::from_secs(1);
    let urls = cluster.urls();
    assert!(urls.iter().all(|url| url.starts_with("rediss://")));

    // Trusted CA and the right password: locks work over TLS.
    let mut config = RedlockConfig::from_urls(&urls).expect("config");
    config.max_ttl = ttl;
    config.tls.ca_pem = Some(std::fs::read(&tls.ca_cert).expect("ca"));
    let engine = Redlock::connect(config.clone()).await.expect("engine");
    wait_until_eligible(&engine, 3).await;
    let lease = engine
        .acquire("tls", ttl, "a", once())
        .await
        .expect("acquire over TLS");
    assert!(engine.release(&lease).await.votes() >= 2);

    // Wrong password: not connected, with the server's reason, and no password in any message.
    let wrong: Vec<String> = urls
        .iter()
        .map(|url| url.replace("s3cret-pw", "wrong-pw"))
        .collect();
    let mut bad = RedlockConfig::from_urls(&wrong).expect("config");
    bad.max_ttl = ttl;
    bad.tls = config.tls.clone();
    let engine = Redlock::connect(bad).await.expect("engine");
    let err = engine.acquire("tls", ttl, "a", once()).await.unwrap_err();
    let report = err.report().expect("report").to_string();
    assert!(
        matches!(
            err,
            AcquireError::NotAcquired {
                kind: FailureKind::TooFewMasters,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        report.to_lowercase().contains("authentication failed"),
        "{report}"
    );
    assert!(
        !report.contains("wrong-pw") && !err.to_string().contains("wrong-pw"),
        "{report}"
    );

    // Untrusted server certificate (system roots only): refused, and said so.
    let mut untrusted = RedlockConfig::from_urls(&urls).expect("config");
    untrusted.max_ttl = ttl;
    let engine = Redlock::connect(untrusted).await.expect("engine");
    let statuses = engine.masters();
    assert!(
        statuses.iter().all(|node| node.health == NodeHealth::Down),
        "{statuses:?}"
    );
    let reason = statuses[0].last_error.clone().unwrap_or_default().to_lowercase();
    assert!(
        reason.contains("certificate") || reason.contains("tls"),
        "{reason}"
    );
}

/// Regression test for a bug the safety checker found: Redis reports uptime as the difference of two
/// whole-second readings, so a master started just before a second boundary claims a full second of uptime
/// milliseconds later. Trusting that number shortened the quarantine to almost nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_started_just_before_a_second_boundary_is_still_quarantined() {
    use std::time::{SystemTime, UNIX_EPOCH};
    let max_ttl = Duration::from_secs(1);
    let mut cluster = RedisCluster::start(1).expect("master");
    // Restart it at about x.95 s of wall-clock time, then ask right after the boundary. On a busy machine the
    // restart may miss the window every time: the quarantine below must hold for any restart, so the test then
    // checks it on the last one (the boundary case is the worst, not the only one).
    let mut restarted = Instant::now();
    let mut boundary_hit = false;
    for _ in 0..20 {
        let fraction = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .subsec_millis();
        tokio::time::sleep(Duration::from_millis(u64::from((1_950 - fraction) % 1_000))).await;
        cluster[0].restart().expect("restart");
        restarted = Instant::now();
        let fraction = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .expect("clock")
            .subsec_millis();
        if !(900..=990).contains(&fraction) {
            continue; // the restart itself took too long; try again
        }
        tokio::time::sleep(Duration::from_millis(u64::from(1_020 - fraction))).await;
        let client = redis::Client::open(cluster[0].url().as_str()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        let info: String = redis::cmd("INFO")
            .arg("server")
            .query_async(&mut conn)
            .await
            .expect("info");
        let uptime = info
            .lines()
            .find_map(|line| line.strip_prefix("uptime_in_seconds:"))
            .and_then(|value| value.trim().parse::<u64>().ok())
            .expect("uptime");
        if uptime == 1 && restarted.elapsed() < Duration::from_millis(500) {
            eprintln!(
                "the master claims a full second of uptime {:?} after its restart",
                restarted.elapsed()
            );
            boundary_hit = true;
            break;
        }
    }
    if !boundary_hit {
        eprintln!("the restart could not be timed around a second boundary: checking a plain restart");
        cluster[0].restart().expect("restart");
        restarted = Instant::now();
    }

    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = max_ttl;
    let engine = Redlock::connect(config.clone()).await.expect("engine");
    let status = &engine.masters()[0];
    assert_eq!(status.health, NodeHealth::Quarantined, "{status:?}");
    let until = status.quarantined_until.expect("quarantined");
    assert!(
        until >= restarted + config.quarantine_period(),
        "quarantine ends {:?} after the restart, before max-ttl + drift",
        until - restarted
    );
}

/// Passwords from a RedisQuorum's Secret go into the URL percent-encoded; the master must see them decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_secrets_with_url_metacharacters_authenticate() {
    use redlock_operator::controller::quorum::config::{QuorumSecrets, engine_config};
    use support::redis_server::Options;
    let password = "p@ss:w/rd%?#";
    let cluster = RedisCluster::start_with(1, |_| Options {
        password: Some(password.into()),
        ..Options::default()
    })
    .expect("master");
    let endpoint = format!("redis://127.0.0.1:{}", cluster[0].port());
    let spec =
        serde_json::from_value(serde_json::json!({"endpoints": [endpoint], "maxTtl": "1s"})).expect("spec");
    let secrets = QuorumSecrets {
        password: Some(password.into()),
        ..QuorumSecrets::default()
    };
    let config = engine_config(&spec, &secrets).expect("config");
    let engine = Redlock::connect(config).await.expect("engine");
    let statuses = engine.masters();
    assert_ne!(statuses[0].health, NodeHealth::Down, "{statuses:?}");
    assert!(statuses[0].last_error.is_none(), "{statuses:?}");
}

/// Issue 16, item 1: with a minority of masters hung, work starts once a majority is verified; the hung ones
/// keep connecting in the background, and the restart check still applies to them when they answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_majority_connection_starts_work_without_the_hung_masters() {
    let mut cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(3);
    let warm = engine(&cluster, ttl, Duration::from_millis(100)).await;
    wait_until_eligible(&warm, 5).await;
    drop(warm);
    // Master 4 restarts empty (it must be quarantined whenever it is verified), then 3 and 4 hang.
    cluster[4].restart().expect("restart");
    cluster[3].stop();
    cluster[4].stop();

    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = ttl;
    config.node_timeout = Duration::from_millis(100);
    // The longest the configuration allows, far longer than the test: had the engine waited for the hung
    // masters, they would show this timeout.
    config.connect_timeout = Duration::from_secs(60);
    let engine = Redlock::connect_majority(config).await.expect("engine");
    // A fresh client may see the three up masters quarantined a moment longer (whole-second uptimes).
    let patiently = AcquireOptions {
        attempts: None,
        deadline: Some(Instant::now() + Duration::from_secs(30)),
        token_floor: 0,
        fair: false,
    };
    let lease = engine
        .acquire("hung-minority", ttl, "a", patiently)
        .await
        .expect("a majority is up");
    let report = lease.report();
    assert_eq!(report.votes(), 3, "{report}");
    for node in &report.nodes[3..] {
        assert!(
            matches!(node.outcome, NodeOutcome::Unavailable(_)),
            "the hung masters are reported, not waited for: {report}"
        );
    }
    engine.release(&lease).await;

    cluster[3].cont();
    cluster[4].cont();
    let deadline = Instant::now() + Duration::from_secs(30);
    while engine.masters()[3..]
        .iter()
        .any(|node| node.health == NodeHealth::Down)
    {
        assert!(Instant::now() < deadline, "{:?}", engine.masters());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Master 3 may also look quarantined for a moment (whole-second uptimes); master 4 must be.
    let statuses = engine.masters();
    assert_eq!(
        statuses[4].health,
        NodeHealth::Quarantined,
        "a late connection passes the restart check too: {statuses:?}"
    );
}

/// Issue 16, item 2: a release is decided at a majority; the deletes for the paused masters go on in the
/// background and reach them once they resume, even when the engine is dropped right after the release.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_is_decided_at_a_majority_and_the_rest_follows() {
    let cluster = RedisCluster::start(5).expect("masters");
    // Long enough that no key expires by itself while the test looks for it; fresh masters, so no quarantine.
    let ttl = Duration::from_secs(30);
    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = ttl;
    config.node_timeout = Duration::from_millis(100);
    config.assume_durable = true;

    for (round, drop_engine) in [(0, false), (1, true)] {
        let engine = Redlock::connect(config.clone()).await.expect("engine");
        wait_until_eligible(&engine, 5).await;
        let key = format!("late-release-{round}");
        let lease = engine.acquire(&key, ttl, "a", once()).await.expect("acquire");
        // Every master holds the key before two of them hang.
        put_on_every_master(&engine, &cluster, &key).await;
        cluster[3].stop();
        cluster[4].stop();
        let report = engine.release(&lease).await;
        assert_eq!(report.votes(), 3, "{report}");
        assert!(
            report.nodes[3..]
                .iter()
                .all(|node| node.outcome == NodeOutcome::Pending),
            "decided without the paused masters: {report}"
        );
        if drop_engine {
            drop(engine);
        } else {
            engine.settle().await;
        }
        cluster[3].cont();
        cluster[4].cont();
        let deadline = Instant::now() + Duration::from_secs(10);
        while keys_left(&cluster, &key).await > 0 {
            assert!(
                Instant::now() < deadline,
                "the background deletes never reached the resumed masters (engine dropped: {drop_engine})"
            );
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

/// Issue 22: an operation decided at a majority still writes to the masters that had not answered. A master
/// whose script cache was flushed needs a second request after its first answer (NOSCRIPT, then the script);
/// the slow link makes that answer come after the decision, so only a request finished in the background ever
/// sends the second one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn writes_decided_at_a_majority_still_reach_the_other_masters() {
    let cluster = RedisCluster::start(5).expect("masters");
    let slow = FaultProxy::start(cluster[4].addr()).await.expect("proxy");
    let mut urls = cluster.urls();
    urls[4] = slow.url();
    let ttl = Duration::from_secs(30);
    let mut config = RedlockConfig::from_urls(&urls).expect("config");
    config.max_ttl = ttl;
    config.node_timeout = Duration::from_secs(3);
    config.assume_durable = true;
    let engine = Redlock::connect(config).await.expect("engine");
    wait_until_eligible(&engine, 5).await;
    slow.set_latency(Direction::ServerToClient, Duration::from_millis(300));
    let flush_scripts = || async {
        let client = redis::Client::open(cluster[4].url()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async::<()>(&mut conn)
            .await
            .expect("SCRIPT FLUSH");
    };

    flush_scripts().await;
    let lease = engine
        .acquire("late-writes", ttl, "a", once())
        .await
        .expect("acquire");
    engine.settle().await;
    let value = raw_get(&cluster.urls()[0], "late-writes").await;
    assert!(value.is_some(), "{}", lease.report());
    assert_eq!(
        raw_get(&cluster.urls()[4], "late-writes").await,
        value,
        "the slow master never got the acquisition's key: {}",
        lease.report()
    );

    // An extension re-creates the key where it was lost, also on a master that answers after the decision.
    raw_del(&cluster.urls()[4], "late-writes").await;
    flush_scripts().await;
    let extended = engine.extend(&lease).await.expect("extend");
    engine.settle().await;
    assert_eq!(
        raw_get(&cluster.urls()[4], "late-writes").await,
        value,
        "the slow master never got the key back: {}",
        extended.report()
    );
    engine.release(&extended).await;
    engine.settle().await;
}

async fn raw_set(url: &str, key: &str, value: &str) {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    redis::cmd("SET")
        .arg(key)
        .arg(value)
        .query_async::<()>(&mut conn)
        .await
        .expect("set");
}

/// Waits until `key` reads `expected` on the master at `url` (writes may still be on their way to it).
async fn eventually_reads(url: &str, key: &str, expected: Option<&str>) {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let value = raw_get(url, key).await;
        if value.as_deref() == expected {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{key} on {url} is {value:?}, expected {expected:?}"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

fn above(token_floor: i64) -> AcquireOptions {
    AcquireOptions {
        token_floor,
        ..once()
    }
}

/// Issue 14: tokens come from the masters' counters; a proposal at or below a counter is refused with the
/// counter, and the engine proposes above it at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fencing_tokens_are_proposed_above_the_counters() {
    let cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(2);
    let engine = engine(&cluster, ttl, Duration::from_millis(200)).await;
    wait_until_eligible(&engine, 5).await;
    let counter = counter_key("tokens");
    assert_eq!(counter, "{tokens}:token");

    // No memory in the caller: 1, then refused at 1 and granted at 2, and so on.
    let mut tokens = Vec::new();
    let mut voters = Vec::new();
    for _ in 0..3 {
        let lease = engine.acquire("tokens", ttl, "a", once()).await.expect("acquire");
        tokens.push(lease.fencing_token());
        voters = lease
            .report()
            .nodes
            .iter()
            .map(|node| node.outcome.is_vote())
            .collect();
        engine.release(&lease).await;
    }
    assert_eq!(tokens, [1, 2, 3]);
    engine.settle().await;
    // Every master that voted for the last grant holds its token (one that answered too late on a loaded
    // machine may not).
    for (url, voted) in cluster.urls().iter().zip(voters) {
        if voted {
            eventually_reads(url, &counter, Some("3")).await;
        }
    }

    // The caller's floor is above the counters: proposed as is.
    let lease = engine
        .acquire("tokens", ttl, "a", above(40))
        .await
        .expect("acquire");
    assert_eq!(lease.fencing_token(), 41);
    engine.release(&lease).await;

    // A majority knows a higher counter than the caller's floor: refused, then granted above it.
    for url in &cluster.urls()[..3] {
        raw_set(url, &counter, "0050").await;
    }
    let lease = engine
        .acquire("tokens", ttl, "a", above(41))
        .await
        .expect("acquire");
    assert_eq!(lease.fencing_token(), 51);
    engine.release(&lease).await;

    // A failed attempt's refusal is remembered by the next attempt of the same acquisition.
    let blocker = engine.acquire("tokens", ttl, "b", once()).await.expect("acquire");
    assert_eq!(blocker.fencing_token(), 52);
    let err = engine.acquire("tokens", ttl, "c", once()).await.unwrap_err();
    assert!(
        matches!(
            err,
            AcquireError::NotAcquired {
                kind: FailureKind::Contended,
                ..
            }
        ),
        "{err}"
    );
    engine.release(&blocker).await;
}

/// Found by the engine checker's fair mode: a master restarted empty (its quarantine over) and two that had
/// missed the last grants made a majority for a token below one the other two had given, because those two
/// refused for their fair queue and said nothing of their counters. A master that refuses for another holder or
/// for the key's queue now reports its counter where it is not below the proposal, and the acquisition proposes
/// above it even with a majority granted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn masters_refusing_for_a_holder_or_the_queue_still_keep_tokens_rising() {
    let cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(2);
    let engine = engine(&cluster, ttl, Duration::from_millis(200)).await;
    wait_until_eligible(&engine, 5).await;
    let urls = cluster.urls();
    for (key, refusal) in [("outbid-held", Refusal::Held), ("outbid-queued", Refusal::Queued)] {
        masters_that_forgot_the_last_token(&urls, &[key.to_owned()], key, refusal).await;
        let lease = engine
            .acquire(key, ttl, "a", once())
            .await
            .expect("a majority grants");
        assert_above_the_last_token(&lease, refusal);
        engine.release(&lease).await;
    }
    engine.settle().await;
}

/// Issue 14: a restarted master forgot its counters. Quarantined, it gets no writes; afterwards the masters
/// that remember refuse low proposals, and a grant teaches the restarted ones the token again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counters_survive_a_minority_restart_with_quarantine() {
    let mut cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(2);
    let engine = engine(&cluster, ttl, Duration::from_millis(200)).await;
    wait_until_eligible(&engine, 5).await;
    let counter = counter_key("restarts");
    let lease = engine
        .acquire("restarts", ttl, "a", once())
        .await
        .expect("acquire");
    assert_eq!(lease.fencing_token(), 1);
    engine.release(&lease).await;

    cluster[0].restart().expect("restart");
    cluster[1].restart().expect("restart");
    // Until verified again and out of quarantine, the restarted masters get nothing (and do not vote).
    let lease = engine
        .acquire("restarts", ttl, "a", once())
        .await
        .expect("3 of 5 vote");
    assert_eq!(lease.fencing_token(), 2, "{}", lease.report());
    assert!(
        lease.report().nodes[..2]
            .iter()
            .all(|node| !node.outcome.is_vote()),
        "{}",
        lease.report()
    );
    engine.release(&lease).await;
    engine.settle().await;
    for url in &cluster.urls()[..2] {
        assert_eq!(
            raw_get(url, &counter).await,
            None,
            "a quarantined master got a write"
        );
    }

    wait_until_eligible(&engine, 5).await;
    // Only the two forgetful masters could grant token 1: no majority, so it proposes above the others.
    let lease = engine
        .acquire("restarts", ttl, "a", once())
        .await
        .expect("acquire");
    assert_eq!(lease.fencing_token(), 3, "{}", lease.report());
    engine.release(&lease).await;
    // Every master that voted holds the new token (one that answered too late on a loaded machine may not).
    for (url, node) in cluster.urls().iter().zip(&lease.report().nodes) {
        if node.outcome.is_vote() {
            eventually_reads(url, &counter, Some("3")).await;
        }
    }
}

/// Issue 14: an extension that re-creates the key on a master that lost it raises that master's counter too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn repair_raises_the_counter_of_a_master_that_lost_it() {
    let mut cluster = RedisCluster::start(5).expect("masters");
    let ttl = Duration::from_secs(2);
    let engine = engine(&cluster, ttl, Duration::from_millis(200)).await;
    wait_until_eligible(&engine, 5).await;
    let counter = counter_key("repaired");
    let lease = engine
        .acquire("repaired", ttl, "a", above(6))
        .await
        .expect("acquire");
    assert_eq!(lease.fencing_token(), 7);

    // Master 0 forgets everything (whether or not the acquisition's write reached it before the decision) and
    // waits out its quarantine while the lock is kept.
    cluster[0].restart().expect("restart");
    let kept = engine.keep(lease, KeepPolicy::for_ttl(ttl, Duration::from_millis(200)));
    assert_eq!(raw_get(&cluster[0].url(), &counter).await, None);
    wait_until_eligible(&engine, 5).await;
    // Nothing but the extension's repair writes the counter there (the acquisition came before the restart).
    eventually_reads(&cluster[0].url(), &counter, Some("7")).await;
    assert!(kept.state().lost.is_none(), "{:?}", kept.state());
    kept.release().await;
}

/// Issue 14: a counter at the largest 64-bit integer is an error the caller can show, never a wrap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_counter_at_the_largest_token_is_an_error() {
    let cluster = RedisCluster::start(3).expect("masters");
    let ttl = Duration::from_secs(2);
    let engine = engine(&cluster, ttl, Duration::from_millis(200)).await;
    wait_until_eligible(&engine, 3).await;
    let max = i64::MAX.to_string();
    // At the largest token, or beyond any 64-bit token (someone wrote it). On every master: the decision is
    // made at a majority, so a minority's counter is heard only when it answers before that.
    let beyond = "99999999999999999999";
    for (key, counter) in [("exhausted", max.as_str()), ("beyond", beyond)] {
        for url in &cluster.urls() {
            raw_set(url, &counter_key(key), counter).await;
        }
        let err = engine.acquire(key, ttl, "a", once()).await.unwrap_err();
        assert!(
            matches!(
                err,
                AcquireError::TokenExhausted {
                    counter: i64::MAX,
                    ..
                }
            ),
            "{err}"
        );
        assert!(err.to_string().contains(&max), "{err}");
        engine.settle().await;
        assert_eq!(
            keys_left(&cluster, key).await,
            0,
            "nothing of the attempt is left"
        );
    }

    // A caller's floor at the maximum is refused before anything is sent.
    let err = engine
        .acquire("elsewhere", ttl, "a", above(i64::MAX))
        .await
        .unwrap_err();
    assert!(matches!(err, AcquireError::TokenExhausted { .. }), "{err}");
}

/// Issue 14: a takeover with a token nobody proved (status is writable by others) raises no counter: only a
/// majority still holding the value derived from the token makes it the lease's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reclaim_raises_counters_only_once_it_is_proven() {
    let cluster = RedisCluster::start(3).expect("masters");
    let ttl = Duration::from_secs(2);
    let engine = engine(&cluster, ttl, Duration::from_millis(200)).await;
    wait_until_eligible(&engine, 3).await;
    let forged = LockValue::random("someone").expect("value");
    let attempt = engine.reclaim("unheld", ttl, forged, i64::MAX).await;
    assert!(attempt.is_err(), "nobody held it");
    engine.settle().await;
    for url in cluster.urls() {
        assert_eq!(raw_get(&url, &counter_key("unheld")).await, None, "{url}");
    }

    let value = LockValue::random("a").expect("value");
    let lease = engine
        .try_acquire("held", ttl, value.clone(), 4)
        .await
        .expect("acquire");
    let reclaimed = engine
        .reclaim("held", ttl, value, lease.fencing_token())
        .await
        .expect("reclaim the live acquisition");
    assert_eq!(reclaimed.fencing_token(), 5);
    engine.release(&reclaimed).await;
}

/// One master's state of a key and its counter after a script ran, with what the script answered.
async fn script_step(
    conn: &mut redis::aio::MultiplexedConnection,
    script: &redis::Script,
    key: &str,
    value: &str,
    token: &str,
) -> (String, Option<String>, Option<String>) {
    let reply = script
        .key(key)
        .key(counter_key(key))
        .arg(value)
        .arg(10_000)
        .arg(token)
        .arg(60_000)
        .invoke_async::<redis::Value>(conn)
        .await;
    let reply = match reply {
        Ok(redis::Value::Int(n)) => n.to_string(),
        Ok(redis::Value::Array(items)) => items
            .iter()
            .map(|item| match item {
                redis::Value::Int(n) => n.to_string(),
                redis::Value::BulkString(raw) => String::from_utf8_lossy(raw).into_owned(),
                other => format!("{other:?}"),
            })
            .collect::<Vec<_>>()
            .join(","),
        Ok(redis::Value::BulkString(raw)) => String::from_utf8_lossy(&raw).into_owned(),
        Ok(other) => format!("{other:?}"),
        Err(err) => format!("error: {}", err.detail().unwrap_or_default()),
    };
    let stored = |key: String| {
        let mut conn = conn.clone();
        async move {
            redis::cmd("GET")
                .arg(key)
                .query_async::<Option<String>>(&mut conn)
                .await
                .expect("GET")
        }
    };
    (
        reply,
        stored(key.to_owned()).await,
        stored(counter_key(key)).await,
    )
}

/// Issue 14: the acquire and extend scripts decide alike on Redis 7 (`SET NX GET`, `SET GET`) and on older
/// masters (a read before each write), and compare counters as integers however long or zero-padded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_token_scripts_decide_alike_on_every_redis_and_compare_counters_as_integers() {
    let cluster = RedisCluster::start(1).expect("master");
    let client = redis::Client::open(cluster.urls()[0].as_str()).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    let s = |text: &str| Some(text.to_owned());
    for modern in [true, false] {
        let (acquire, extend) = redlock_operator::redlock::token_scripts(modern);
        let k = |name: &str| format!("{name}-{modern}");
        let setter = conn.clone();
        let set_counter = |key: String, counter: &'static str| {
            let mut conn = setter.clone();
            async move {
                redis::cmd("SET")
                    .arg(counter_key(&key))
                    .arg(counter)
                    .query_async::<()>(&mut conn)
                    .await
                    .expect("SET");
            }
        };
        // (script, key, value, token, counter set before (if any), expected reply, key after, counter after)
        type Step = (
            bool,
            &'static str,
            &'static str,
            &'static str,
            Option<&'static str>,
            &'static str,
            Option<String>,
            Option<String>,
        );
        let long = "100000000000000000";
        let steps: Vec<Step> = vec![
            (true, "fresh", "v", "1", None, "1", s("v"), s("1")),
            (true, "fresh", "v", "2", None, "1", s("v"), s("2")),
            (true, "fresh", "w", "3", None, "2,v", s("v"), s("2")),
            (true, "low", "v", "2", Some("2"), "0,2", None, s("2")),
            (
                true,
                "padded",
                "v",
                "5",
                Some("00000000000000000000000007"),
                "0,00000000000000000000000007",
                None,
                s("00000000000000000000000007"),
            ),
            (true, "padded", "v", "8", None, "1", s("v"), s("8")),
            (
                true,
                "long",
                "v",
                "99999999999999999",
                Some(long),
                "0,100000000000000000",
                None,
                s(long),
            ),
            (
                true,
                "long",
                "v",
                "100000000000000001",
                None,
                "1",
                s("v"),
                s("100000000000000001"),
            ),
            (
                true,
                "junk",
                "v",
                "1",
                Some("1e3"),
                "error: fencing counter",
                None,
                s("1e3"),
            ),
            (false, "kept", "v", "5", None, "2", s("v"), s("5")),
            (false, "kept", "v", "3", None, "1", s("v"), s("5")),
            (false, "kept", "v", "0", None, "1", s("v"), s("5")),
            (false, "kept", "v", "9", Some(long), "1", s("v"), s(long)),
            (false, "kept", "v", "9", Some("abc"), "1", s("v"), s("abc")),
            (false, "kept", "w", "9", Some("1"), "v", s("v"), s("1")),
            // A plain extension leaves the counter to the grant; only a repair raises it.
            (false, "kept", "v", "9", Some("2"), "1", s("v"), s("2")),
            (false, "repaired", "v", "9", Some("2"), "2", s("v"), s("9")),
            // Never over a counter above our token: this master granted a newer holder since (an extension
            // held up in the network must not bring an old holder's value back).
            (false, "repaired-high", "v", "9", Some(long), "0", None, s(long)),
            (false, "repaired-newer", "v", "9", Some("10"), "0", None, s("10")),
            (
                false,
                "repaired-junk",
                "v",
                "9",
                Some("abc"),
                "2",
                s("v"),
                s("abc"),
            ),
        ];
        for (is_acquire, name, value, token, counter, reply, key_after, counter_after) in steps {
            if let Some(counter) = counter {
                set_counter(k(name), counter).await;
            }
            let script = if is_acquire { &acquire } else { &extend };
            let (got, key_now, counter_now) = script_step(&mut conn, script, &k(name), value, token).await;
            let context = format!("modern={modern} {name} value={value} token={token}");
            assert!(
                got.starts_with(reply),
                "{context}: answered {got}, expected {reply}"
            );
            assert_eq!((key_now, counter_now), (key_after, counter_after), "{context}");
        }
    }
}

/// Scripts go out as EVALSHA (no text on the wire); a master that lost its script cache gets the text once and
/// the operation still counts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flushed_script_cache_costs_no_vote() {
    let cluster = RedisCluster::start(3).expect("masters");
    let ttl = Duration::from_secs(2);
    let engine = engine(&cluster, ttl, Duration::from_millis(200)).await;
    wait_until_eligible(&engine, 3).await;
    for url in cluster.urls() {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async::<()>(&mut conn)
            .await
            .expect("SCRIPT FLUSH");
    }
    let lease = engine
        .acquire("flushed", ttl, "a", once())
        .await
        .expect("acquire");
    // Decided at a majority: the last master may still be on its way.
    assert!(lease.report().votes() >= 2, "{}", lease.report());
    let extended = engine.extend(&lease).await.expect("extend");
    assert_eq!(extended.fencing_token(), lease.fencing_token());
    engine.release(&extended).await;
}

/// A takeover that failed while a master did not answer in time: its request still runs when that master
/// wakes up. It must leave no key there that a later attempt counts as proof that the predecessor's lock lived
/// on (it would then take back a lock that lost its majority, and with it a token a newer grant may have
/// passed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_reclaim_leaves_no_key_that_a_later_one_counts() {
    let cluster = RedisCluster::start(3).expect("masters");
    let ttl = Duration::from_secs(10);
    let engine = engine(&cluster, ttl, Duration::from_millis(200)).await;
    wait_until_eligible(&engine, 3).await;
    let value = LockValue::random("predecessor").expect("value");
    let lease = engine
        .try_acquire("taken", ttl, value.clone(), 1)
        .await
        .expect("acquire");
    // The key is lost on two masters; only the first still holds it.
    for url in &cluster.urls()[1..] {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        redis::cmd("DEL")
            .arg("taken")
            .query_async::<()>(&mut conn)
            .await
            .expect("del");
    }
    cluster.servers()[2].stop();
    let first = engine
        .reclaim("taken", ttl, value.clone(), lease.fencing_token())
        .await;
    assert!(first.is_err(), "one master held the value");
    cluster.servers()[2].cont();
    wait_until_eligible(&engine, 3).await;
    let second = engine.reclaim("taken", ttl, value, lease.fencing_token()).await;
    assert!(
        second.is_err(),
        "still only one master held the value throughout: {:?}",
        second.map(|lease| lease.report().clone())
    );
    engine.settle().await;
    for url in &cluster.urls()[1..] {
        assert_eq!(raw_get(url, "taken").await, None, "{url}");
    }
}

async fn raw_del(url: &str, key: &str) {
    let client = redis::Client::open(url).expect("url");
    let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
    redis::cmd("DEL")
        .arg(key)
        .query_async::<()>(&mut conn)
        .await
        .expect("del");
}

/// The masters whose `key` holds a value starting with `prefix`, in the cluster's order.
async fn holders(cluster: &RedisCluster, key: &str, prefix: &str) -> Vec<String> {
    let mut holding = Vec::new();
    for url in cluster.urls() {
        if raw_get(&url, key)
            .await
            .is_some_and(|value| value.starts_with(prefix))
        {
            holding.push(url);
        }
    }
    holding
}

/// Puts `key`, with the value and remaining time it has where the acquisition wrote it, on every master that
/// lacks it: an acquisition decided at a majority drops the writes to the other masters that were not sent yet
/// (the keeper's next extension would repair them), and a test that needs the key everywhere must not wait for
/// them. First a ping on the engine's connections, so that no write of the acquisition lands afterwards.
async fn put_on_every_master(engine: &Redlock, cluster: &RedisCluster, key: &str) {
    engine.check_masters().await;
    let holding = holders(cluster, key, "").await;
    let source = holding.first().expect("a majority holds the key");
    let value = raw_get(source, key).await.expect("held");
    let left = raw_pttl(source, key).await;
    assert!(left > 0, "{key} expired on {source}");
    for url in cluster.urls().iter().filter(|url| !holding.contains(url)) {
        let client = redis::Client::open(url.as_str()).expect("url");
        let mut conn = client.get_multiplexed_async_connection().await.expect("connect");
        redis::cmd("SET")
            .arg(key)
            .arg(&value)
            .arg("PX")
            .arg(left)
            .query_async::<()>(&mut conn)
            .await
            .expect("SET");
    }
}

/// Leaves `key` on one master that has it and deletes it everywhere else: lost on a majority without a restart.
/// First a ping on the engine's connections, so that no write of the acquisition lands after the deletes.
async fn keep_on_one_master_only(engine: &Redlock, cluster: &RedisCluster, key: &str) {
    engine.check_masters().await;
    let holding = holders(cluster, key, "").await;
    let kept = holding.first().expect("a majority holds the key");
    for url in cluster.urls().iter().filter(|url| *url != kept) {
        raw_del(url, key).await;
    }
}

fn recreated(report: &redlock_operator::redlock::OperationReport) -> usize {
    report
        .nodes
        .iter()
        .filter(|node| node.outcome == NodeOutcome::Recreated)
        .count()
}

/// Keys lost on a majority without a restart (FLUSHALL, eviction, a careless DEL) are a lost lock: the first
/// extension re-creates them as repair, not as votes, and fails. Its retry must not count those keys either —
/// they prove nothing about who could have held those masters meanwhile — on every extension path.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_lost_on_a_majority_stay_lost_when_the_extension_is_retried() {
    let cluster = RedisCluster::start(3).expect("masters");
    let ttl = Duration::from_secs(10);
    // A node timeout a loaded machine does not run into: every master's answer is awaited where it counts.
    let engine = engine(&cluster, ttl, Duration::from_secs(1)).await;
    wait_until_eligible(&engine, 3).await;
    let lease = engine
        .acquire("flushed", ttl, "holder", once())
        .await
        .expect("acquire");
    keep_on_one_master_only(&engine, &cluster, "flushed").await;
    let report = match engine.extend(&lease).await {
        Err(ExtendError::NoQuorum { report }) => report,
        other => panic!("the first round must fail: {other:?}"),
    };
    assert_eq!(recreated(&report), 2, "{report}");
    let retry = lease.after_failed_extension(&report);
    for round in 0..2 {
        match engine.extend(&retry).await {
            // The first master's vote counts if it answered before the decision (the re-created keys made a
            // majority impossible); the re-created keys never do.
            Err(ExtendError::NoQuorum { report }) => {
                assert!(report.votes() <= 1, "round {round}: {report}");
                assert_eq!(recreated(&report), 2, "round {round}: {report}");
            }
            other => panic!("round {round} counted the re-created keys: {other:?}"),
        }
        match engine.extend_many(std::slice::from_ref(&retry)).await.pop() {
            Some(Err(ExtendError::NoQuorum { report })) => assert!(report.votes() <= 1, "{report}"),
            other => panic!("a batch counted the re-created keys: {other:?}"),
        }
    }
    engine.release(&lease).await;

    // The same through a kept lock: the loss is signalled (before the validity ends), not healed over.
    let short = Duration::from_secs(2);
    let kept = engine.keep(
        engine
            .acquire("flushed-kept", short, "holder", once())
            .await
            .expect("acquire"),
        KeepPolicy::for_ttl(short, Duration::from_millis(200)),
    );
    keep_on_one_master_only(&engine, &cluster, "flushed-kept").await;
    let reason = tokio::time::timeout(Duration::from_secs(60), kept.lost())
        .await
        .expect("the loss of the majority's keys was healed over instead of signalled");
    assert!(matches!(reason, LossReason::NotExtended { .. }), "{reason}");
    kept.release().await;
}
