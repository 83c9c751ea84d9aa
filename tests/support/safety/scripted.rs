//! The engine checker's scripted runs: one fault each, at a chosen moment, with the outcome known in advance
//! (and their negative controls), beside the random runs of the parent module.

use super::*;

/// `workload` on five masters without faults for `duration`: the fair mode's order check with nothing to
/// excuse an inversion (and, with `workload.queue_skipper`, its negative control).
pub async fn run_without_faults(workload: Workload, node_timeout: Duration, duration: Duration) -> Report {
    let cluster = RedisCluster::start(5).expect("masters");
    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = workload.ttl;
    config.node_timeout = node_timeout;
    // Fresh masters are in quarantine for max-ttl (uptime is reported in whole seconds).
    tokio::time::sleep(workload.ttl + Duration::from_secs(1)).await;
    let recorder = Arc::new(Recorder::default());
    let started = Instant::now();
    run_clients(&config, &workload, recorder.clone(), move |_| {
        started.elapsed() >= duration
    })
    .await;
    recorder.report(&workload.resources, workload.permits, started, Instant::now())
}

/// Records a grant that starts now and claims the lease's whole validity.
fn record_whole(recorder: &Recorder, client: &str, lease: &Lease) {
    recorder.grant(Grant {
        resource: lease.resource().to_owned(),
        client: client.to_owned(),
        start: Instant::now(),
        end: lease.valid_until(),
        token: lease.fencing_token(),
        evidence: format!("token {}: {}", lease.fencing_token(), lease.report()),
    });
}

fn once_above(token_floor: i64) -> AcquireOptions {
    AcquireOptions {
        attempts: Some(1),
        deadline: None,
        token_floor,
        fair: false,
    }
}

/// The holder's grant of `resource` (no floor), tried again for up to 10 s: on a loaded machine one attempt can
/// time out on a majority of masters, which says nothing of the control the grant sets up (a clean twin's setup
/// once failed so, beside two CPU-bound processes).
async fn holder_acquires(engine: &Redlock, resource: &str, ttl: Duration) -> Lease {
    let give_up = Instant::now() + Duration::from_secs(10);
    loop {
        match engine.acquire(resource, ttl, "holder", once_above(0)).await {
            Ok(lease) => return lease,
            Err(err) if Instant::now() >= give_up => {
                panic!("the holder never acquired {resource}: {err}")
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(20)).await,
        }
    }
}

/// Tries until `give_up`; records the grant, if any.
async fn contend(
    recorder: &Recorder,
    engine: &Redlock,
    resource: &str,
    ttl: Duration,
    floor: i64,
    give_up: Instant,
) {
    while Instant::now() < give_up {
        match engine
            .acquire(resource, ttl, "contender", once_above(floor))
            .await
        {
            Ok(lease) => {
                record_whole(recorder, "contender", &lease);
                return;
            }
            Err(_) => {
                recorder.failed_attempts.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(2)).await;
            }
        }
    }
}

/// Negative control (or its clean twin): a majority of masters restarts empty while a lock is held, and a
/// fresh client tries to take it. With `quarantine` off, the fresh client gets it inside the holder's window.
/// The contender proposes above the holder's token, as the operator does from its durable floor.
pub async fn restart_majority_while_held(quarantine: bool) -> Report {
    let ttl = Duration::from_secs(3);
    let mut cluster = RedisCluster::start(5).expect("masters");
    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = ttl;
    config.assume_durable = !quarantine;
    let holder = Redlock::connect(config.clone()).await.expect("engine");
    wait_eligible(&holder, 5).await;
    let recorder = Recorder::default();
    let started = Instant::now();
    let lease = holder_acquires(&holder, "payments", ttl).await;
    record_whole(&recorder, "holder", &lease);
    for index in 0..3 {
        cluster[index].restart().expect("restart");
    }
    recorder.nemesis_events.fetch_add(1, Ordering::Relaxed);
    let contender = Redlock::connect(config).await.expect("engine");
    let give_up = lease.valid_until() + ttl + Duration::from_secs(2);
    contend(
        &recorder,
        &contender,
        "payments",
        ttl,
        lease.fencing_token(),
        give_up,
    )
    .await;
    recorder.report(&["payments".to_owned()], 1, started, Instant::now())
}

/// Negative control (or its clean twin) for tokens: a key is used five times (tokens 1 to 5, learnt from the
/// masters' counters: the holder keeps no floor), then a majority of masters restarts empty, and, once their
/// quarantine is over, a contender acquires while the two masters that remember token 5 hang. Without a
/// durable floor it gets token 1 again; with the floor (the highest token granted) it gets 6.
pub async fn majority_restart_tokens(durable_floor: bool) -> Report {
    let ttl = Duration::from_secs(1);
    let mut cluster = RedisCluster::start(5).expect("masters");
    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = ttl;
    let holder = Redlock::connect(config.clone()).await.expect("engine");
    wait_eligible(&holder, 5).await;
    let recorder = Recorder::default();
    let started = Instant::now();
    let floor = grant_five_times(&holder, &recorder, ttl).await;
    for index in 0..3 {
        cluster[index].restart().expect("restart");
    }
    cluster[3].stop();
    cluster[4].stop();
    recorder.nemesis_events.fetch_add(2, Ordering::Relaxed);
    let contender = Redlock::connect_majority(config).await.expect("engine");
    let floor = if durable_floor { floor } else { 0 };
    let give_up = Instant::now() + ttl * 4 + Duration::from_secs(5);
    contend(&recorder, &contender, "ledger", ttl, floor, give_up).await;
    cluster[3].cont();
    cluster[4].cont();
    recorder.report(&["ledger".to_owned()], 1, started, Instant::now())
}

/// Key `ledger` granted to the holder five times (tokens 1 to 5, learnt from the masters' counters: it proposes
/// token 1 each time); returns the highest token.
async fn grant_five_times(holder: &Redlock, recorder: &Recorder, ttl: Duration) -> i64 {
    let mut highest = 0;
    for _ in 0..5 {
        let lease = holder_acquires(holder, "ledger", ttl).await;
        record_whole(recorder, "holder", &lease);
        highest = highest.max(lease.fencing_token());
        // Released only once its window is over, so that windows never overlap in this history.
        tokio::time::sleep_until(lease.valid_until()).await;
        holder.release(&lease).await;
        holder.settle().await;
    }
    highest
}

/// Issue 39, item 4 (or, with `wait_for_counters` off, its negative control): a key is used five times (tokens 1
/// to 5, no floor), then a majority of masters restarts empty. Once their quarantine is over, a contender
/// acquires while the two masters that remember token 5 are slow (100 ms each way, well inside the engine's wait
/// for counters: the 1 s node timeout, and a sixteenth of the contender's 8 s TTL), not hung. The restarted masters answer first: decided at once, the contender gets token 1 again.
/// Since a restarted master is in the deciding majority, the engine waits for the others' counters, proposes
/// above 5, and gets 6.
pub async fn slow_rememberers_tokens(wait_for_counters: bool) -> Report {
    // The contender's TTL (and the quorum's): its rounds wait up to a sixteenth of it for counters, 500 ms.
    let ttl = Duration::from_secs(8);
    let grant_ttl = Duration::from_secs(1);
    let mut cluster = RedisCluster::start(5).expect("masters");
    let upstreams: Vec<_> = cluster.servers().iter().map(|server| server.addr()).collect();
    let proxies = FaultProxy::start_group(&upstreams).await.expect("proxies");
    let urls: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let mut config = RedlockConfig::from_urls(&urls).expect("config");
    config.max_ttl = ttl;
    config.node_timeout = Duration::from_secs(1);
    config.decide_before_counters = !wait_for_counters;
    let holder = Redlock::connect(config.clone()).await.expect("engine");
    wait_eligible(&holder, 5).await;
    let recorder = Recorder::default();
    let started = Instant::now();
    grant_five_times(&holder, &recorder, grant_ttl).await;
    for index in 0..3 {
        cluster[index].restart().expect("restart");
    }
    recorder.nemesis_events.fetch_add(1, Ordering::Relaxed);
    let contender = Redlock::connect(config).await.expect("engine");
    wait_eligible(&contender, 5).await;
    // Slow only now: connecting through them would take longer than the connect timeout.
    for proxy in &proxies[3..] {
        proxy.set_latency(Direction::Both, Duration::from_millis(100));
    }
    recorder.nemesis_events.fetch_add(2, Ordering::Relaxed);
    let give_up = Instant::now() + Duration::from_secs(20);
    contend(&recorder, &contender, "ledger", ttl, 0, give_up).await;
    recorder.report(&["ledger".to_owned()], 1, started, Instant::now())
}

/// Negative control (or its clean twin): every master's clock runs `rate` times too fast. The holder keeps
/// its lock for its whole validity without extending; a contender tries to take it all the time.
pub async fn fast_clocks(rate: f64) -> Report {
    let ttl = Duration::from_secs(2);
    let cluster = RedisCluster::start_with(5, |_| Options {
        clock_rate: Some(rate),
        ..Options::default()
    })
    .expect("masters");
    let mut config = RedlockConfig::from_urls(&cluster.urls()).expect("config");
    config.max_ttl = ttl;
    let holder = Redlock::connect(config.clone()).await.expect("engine");
    let contender = Redlock::connect(config).await.expect("engine");
    wait_eligible(&holder, 5).await;
    wait_eligible(&contender, 5).await;
    let recorder = Recorder::default();
    let started = Instant::now();
    let lease = holder_acquires(&holder, "clock", ttl).await;
    record_whole(&recorder, "holder", &lease);
    let give_up = lease.valid_until() + Duration::from_millis(500);
    contend(&recorder, &contender, "clock", ttl, 0, give_up).await;
    recorder.report(&["clock".to_owned()], 1, started, Instant::now())
}

async fn wait_eligible(engine: &Redlock, count: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.eligible() < count {
        assert!(
            Instant::now() < deadline,
            "masters never left quarantine: {:?}",
            engine.masters()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
