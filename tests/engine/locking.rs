//! Acquiring, extending and releasing: contention, minority and majority failures, validity, many tasks on one
//! key, a kept lock's loss signal, and the masters' credentials (passwords, TLS, URL metacharacters).

use super::*;

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
    // Fresh masters count as restarted within the hour: a restarted master granted, so the attempt waits for the
    // paused masters' counters, but at most a sixteenth of the TTL (125 ms), not their 5 s node timeout.
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "decided without waiting the node timeout for the paused masters"
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
    use crate::support::redis_server::{Options, TlsFiles};
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
    // A loaded machine may not have finished the TLS handshakes within the connect wait: asked again until the
    // masters have answered (each attempt fails; what it says changes once the servers have refused the password).
    let mut err = engine.acquire("tls", ttl, "a", once()).await.unwrap_err();
    for _ in 0..50 {
        if err.report().is_some_and(|report| {
            report
                .to_string()
                .to_lowercase()
                .contains("authentication failed")
        }) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
        err = engine.acquire("tls", ttl, "a", once()).await.unwrap_err();
    }
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

/// Passwords from a RedisQuorum's Secret go into the URL percent-encoded; the master must see them decoded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quorum_secrets_with_url_metacharacters_authenticate() {
    use crate::support::redis_server::Options;
    use redlock_operator::controller::quorum::config::{QuorumSecrets, engine_config};
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
