//! Fair waiting (issue 31) in the engine, against real `redis-server` masters: waiters get a key in the order
//! they arrived, a dead or cut-off waiter leaves the queue by expiry, a master restarted empty or a partition
//! neither deadlocks the queue nor reorders it, and a caller that does not wait never jumps it.
//!
//! "Arrived" is made certain before the next waiter starts: every master shows the waiter queued. No test
//! asserts how long anything took.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::redis_server::RedisCluster;
use redlock_operator::redlock::{
    AcquireError, AcquireOptions, Lease, LockValue, NodeOutcome, Redlock, RedlockConfig, Waiter, queue_keys,
    released_channel,
};
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The waiters' TTL; the holder that makes them wait holds for [`HOLD`], which outlasts any test's queueing.
const TTL: Duration = Duration::from_secs(3);
const HOLD: Duration = Duration::from_secs(60);

/// An engine whose masters vote at once: these tests are about the queue, not the restart quarantine (a master
/// restarted empty votes at once, the worst case for the queue).
async fn engine_on(urls: &[String]) -> Redlock {
    engine_with(urls, |_| {}).await
}

/// [`engine_on`], its configuration changed by `adjust` first.
async fn engine_with(urls: &[String], adjust: impl FnOnce(&mut RedlockConfig)) -> Redlock {
    let mut config = RedlockConfig::from_urls(urls).expect("config");
    config.max_ttl = HOLD;
    config.node_timeout = Duration::from_millis(200);
    config.assume_durable = true;
    adjust(&mut config);
    let engine = Redlock::connect(config).await.expect("engine");
    let deadline = Instant::now() + Duration::from_secs(60);
    while engine.eligible() < urls.len() {
        assert!(Instant::now() < deadline, "masters never connected");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    engine
}

fn once() -> AcquireOptions {
    AcquireOptions {
        attempts: Some(1),
        ..AcquireOptions::default()
    }
}

fn fair_for(wait: Duration) -> AcquireOptions {
    AcquireOptions {
        deadline: Some(Instant::now() + wait),
        fair: true,
        ..AcquireOptions::default()
    }
}

async fn redis_conn(url: &str) -> redis::aio::MultiplexedConnection {
    let client = redis::Client::open(url).expect("url");
    client.get_multiplexed_async_connection().await.expect("connect")
}

/// How many waiters each master queues for `key` (expired ones included until a script drops them).
async fn queued(urls: &[String], key: &str) -> Vec<usize> {
    let (queue, _) = queue_keys(key);
    let mut counts = Vec::new();
    for url in urls {
        let mut conn = redis_conn(url).await;
        let count: usize = redis::cmd("ZCARD")
            .arg(&queue)
            .query_async(&mut conn)
            .await
            .expect("ZCARD");
        counts.push(count);
    }
    counts
}

async fn eventually_queued(urls: &[String], key: &str, expected: usize) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = queued(urls, key).await;
        if counts.iter().all(|count| *count == expected) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never {expected} queued on every master: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A fair waiter in a task of its own: once it has the key it notes its name in `served` and releases.
fn waiter(engine: &Redlock, key: &str, name: String, served: &Arc<Mutex<Vec<String>>>) -> JoinHandle<()> {
    let (engine, key, served) = (engine.clone(), key.to_owned(), served.clone());
    tokio::spawn(async move {
        let lease = engine
            .acquire(&key, TTL, &name, fair_for(Duration::from_secs(120)))
            .await
            .unwrap_or_else(|err| panic!("{name} never got the key: {err}"));
        served.lock().expect("served").push(name);
        engine.release(&lease).await;
    })
}

/// Starts a waiter per name, each once the one before has arrived (every master queues it).
async fn queue_up(
    engine: &Redlock,
    urls: &[String],
    key: &str,
    names: Vec<String>,
    served: &Arc<Mutex<Vec<String>>>,
) -> Vec<JoinHandle<()>> {
    let mut tasks = Vec::new();
    for (i, name) in names.into_iter().enumerate() {
        tasks.push(waiter(engine, key, name, served));
        eventually_queued(urls, key, i + 1).await;
    }
    tasks
}

async fn all_served(tasks: Vec<JoinHandle<()>>) {
    for task in tasks {
        task.await.expect("waiter");
    }
}

async fn hold(engine: &Redlock, key: &str) -> Lease {
    engine.acquire(key, HOLD, "holder", once()).await.expect("holder")
}

fn names(range: std::ops::Range<usize>) -> Vec<String> {
    range.map(|i| format!("w{i}")).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_key_in_the_order_they_arrived() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "fair-order";
    let holder = hold(&engine, key).await;
    let served = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_up(&engine, &urls, key, names(0..6), &served).await;
    engine.release(&holder).await;
    all_served(tasks).await;
    assert_eq!(*served.lock().expect("served"), names(0..6));
    // Every waiter left the queue on every master.
    eventually_queued(&urls, key, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_single_attempt_does_not_jump_a_queue_and_is_not_queued() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "fair-no-jump";
    // A waiter that stays queued for a minute without asking again, put on every master by hand: the key is free,
    // and only the queue stands in the way.
    let (queue, deadlines) = queue_keys(key);
    for url in &urls {
        let mut conn = redis_conn(url).await;
        let (seconds, micros): (i64, i64) = redis::cmd("TIME").query_async(&mut conn).await.expect("TIME");
        let deadline_ms = seconds * 1000 + micros / 1000 + 60_000;
        redis::pipe()
            .cmd("ZADD")
            .arg(&queue)
            .arg(1)
            .arg("0000000000000001")
            .cmd("ZADD")
            .arg(&deadlines)
            .arg(deadline_ms)
            .arg("0000000000000001")
            .query_async::<()>(&mut conn)
            .await
            .expect("queue a waiter");
    }
    let refused = engine.acquire(key, TTL, "impatient", once()).await;
    let Err(AcquireError::NotAcquired { report, .. }) = refused else {
        panic!("a single attempt got the key past a queue: {refused:?}");
    };
    // Decided at a majority: the rest may still be pending.
    for node in report
        .nodes
        .iter()
        .filter(|node| node.outcome != NodeOutcome::Pending)
    {
        assert!(
            matches!(
                node.outcome,
                NodeOutcome::Queued {
                    place: 2,
                    ticket: 0,
                    ..
                }
            ),
            "{report}"
        );
    }
    assert_eq!(
        queued(&urls, key).await,
        [1, 1, 1],
        "a single attempt is not queued"
    );

    // A fair waiter queues behind it, and leaves the queue when it gives up.
    let gave_up = engine
        .acquire(key, TTL, "patient", fair_for(Duration::from_millis(600)))
        .await;
    let Err(AcquireError::NotAcquired { report, .. }) = gave_up else {
        panic!("a waiter got the key past the queue: {gave_up:?}");
    };
    assert_eq!(report.queue_place().map(|place| place.place), Some(2), "{report}");
    eventually_queued(&urls, key, 1).await;

    // Once the queue is empty, a single attempt gets the key.
    for url in &urls {
        let mut conn = redis_conn(url).await;
        redis::cmd("DEL")
            .arg(&queue)
            .arg(&deadlines)
            .query_async::<()>(&mut conn)
            .await
            .expect("DEL");
    }
    let lease = engine.acquire(key, TTL, "impatient", once()).await.expect("free");
    engine.release(&lease).await;
}

/// A waiter whose attempt some masters granted but a majority did not keeps its place on those masters too:
/// before, a grant took it out of that master's queue at once, and a waiter behind it was head there until its
/// next attempt (found through the `lock` command, with one master restarted and another stopped, as an order
/// inversion). A newcomer is refused by every master meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_granted_by_a_minority_keeps_its_place_there() {
    let cluster = RedisCluster::start(5).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "keeps-place";
    for url in &urls[..3] {
        let mut conn = redis_conn(url).await;
        redis::cmd("SET")
            .arg(key)
            .arg("another holder")
            .arg("PX")
            .arg(60_000)
            .query_async::<()>(&mut conn)
            .await
            .expect("hold the key on three masters");
    }
    let value = || LockValue::random("waiter").expect("value");
    // Kept long enough that nothing in this test expires, however slow the machine.
    let waiter = |id, ticket| Some(Waiter::new(id, ticket).keeping(HOLD));
    let first = engine
        .try_acquire_waiting(key, TTL, value(), 0, waiter(1, 5))
        .await;
    let Err(AcquireError::NotAcquired { report, .. }) = first else {
        panic!("granted without a majority: {first:?}");
    };
    let granted = report.nodes.iter().filter(|node| node.outcome.is_vote()).count();
    assert!(granted <= 2, "{report}");
    // Masters still answering when the attempt was decided get the script all the same, a moment later.
    let deadline = Instant::now() + Duration::from_secs(60);
    while queued(&urls, key).await.iter().sum::<usize>() < 5 {
        assert!(Instant::now() < deadline, "{report}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }

    // The other holder lets go; a newcomer finds the waiter first everywhere.
    for url in &urls[..3] {
        let mut conn = redis_conn(url).await;
        redis::cmd("DEL")
            .arg(key)
            .query_async::<()>(&mut conn)
            .await
            .expect("let go");
    }
    let newcomer = engine
        .try_acquire_waiting(key, TTL, value(), 0, waiter(2, 0))
        .await;
    let Err(AcquireError::NotAcquired { report, .. }) = newcomer else {
        panic!("a newcomer got the key before the waiter: {newcomer:?}");
    };
    assert!(
        report
            .nodes
            .iter()
            .all(|node| matches!(node.outcome, NodeOutcome::Queued { .. } | NodeOutcome::Pending)),
        "{report}"
    );
    let lease = engine
        .try_acquire_waiting(key, TTL, value(), 0, waiter(1, 5))
        .await
        .expect("the waiter, first in every queue");
    engine.release(&lease).await;
}

/// A waiter that leaves a check until it has won the key (the operator's queued Job lock recounts its pods then)
/// may give the key back: granted as [`Waiter::staying_after_grant`], it stays first, so the waiter behind it is
/// still refused, and its next attempt wins again; once it leaves the queue the one behind is let through.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_stays_after_its_grant_can_give_the_key_back_without_losing_its_place() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "stays-after-grant";
    let holder = hold(&engine, key).await;
    let value = || LockValue::random("waiter").expect("value");
    // Kept long enough that nothing in this test expires, however slow the machine.
    let waiter = |id, ticket| Waiter::new(id, ticket).keeping(HOLD);
    let ticket_of = |attempt: Result<Lease, AcquireError>| match attempt {
        Err(AcquireError::NotAcquired { report, .. }) => report.queue_place().expect("queued").ticket,
        other => panic!("granted while the holder holds: {other:?}"),
    };
    let first = ticket_of(
        engine
            .try_acquire_waiting(key, TTL, value(), 0, Some(waiter(1, 0)))
            .await,
    );
    eventually_queued(&urls, key, 1).await;
    let behind = ticket_of(
        engine
            .try_acquire_waiting(key, TTL, value(), 0, Some(waiter(2, 0)))
            .await,
    );
    eventually_queued(&urls, key, 2).await;
    engine.release(&holder).await;
    eventually_free(&urls, key).await;

    let staying = waiter(1, first).staying_after_grant();
    let won = engine
        .try_acquire_waiting(key, TTL, value(), 0, Some(staying))
        .await
        .expect("the queue's head, the key free");
    // Its check failed: the key goes back, the place does not.
    engine.release(&won).await;
    eventually_free(&urls, key).await;
    assert_eq!(
        queued(&urls, key).await,
        [2, 2, 2],
        "both still queued everywhere"
    );
    let refused = engine
        .try_acquire_waiting(key, TTL, value(), 0, Some(waiter(2, behind)))
        .await;
    let Err(AcquireError::NotAcquired { report, .. }) = refused else {
        panic!("the waiter behind took the key given back: {refused:?}");
    };
    assert_eq!(report.queue_place().map(|place| place.place), Some(2), "{report}");
    let again = engine
        .try_acquire_waiting(key, TTL, value(), 0, Some(staying))
        .await
        .expect("still first: wins again");
    assert!(again.fencing_token() > won.fencing_token());

    // Its check passed: it leaves, and the one behind is next once the key is let go.
    engine.leave_won(key, staying);
    eventually_queued(&urls, key, 1).await;
    engine.release(&again).await;
    eventually_free(&urls, key).await;
    let next = engine
        .try_acquire_waiting(key, TTL, value(), 0, Some(waiter(2, behind)))
        .await
        .expect("the waiter behind, first now");
    engine.release(&next).await;
    eventually_queued(&urls, key, 0).await;
}

/// Waits until no master holds `key` (a release is decided at a majority, the rest follow in the background).
async fn eventually_free(urls: &[String], key: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    for url in urls {
        let mut conn = redis_conn(url).await;
        loop {
            let held: bool = redis::cmd("EXISTS")
                .arg(key)
                .query_async(&mut conn)
                .await
                .expect("EXISTS");
            if !held {
                break;
            }
            assert!(Instant::now() < deadline, "{url} still holds {key}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_waiter_leaves_the_queue_by_expiry_and_the_next_gets_the_key() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "fair-dead";
    let holder = hold(&engine, key).await;
    let served = Arc::new(Mutex::new(Vec::new()));
    let dead = waiter(&engine, key, "dead".to_owned(), &served);
    eventually_queued(&urls, key, 1).await;
    let alive = waiter(&engine, key, "alive".to_owned(), &served);
    eventually_queued(&urls, key, 2).await;
    // The first waiter dies without a word: it asks no more and never leaves the queue itself.
    dead.abort();
    assert!(dead.await.is_err_and(|err| err.is_cancelled()));
    let released = Instant::now();
    engine.release(&holder).await;
    alive.await.expect("the waiter behind the dead one");
    assert_eq!(*served.lock().expect("served"), ["alive"]);
    eprintln!(
        "the waiter behind a dead one got the key {:?} after the release (the masters keep a silent waiter {:?})",
        released.elapsed(),
        redlock_operator::redlock::QUEUE_KEEP
    );
    eventually_queued(&urls, key, 0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_restarted_empty_while_waiters_queue_neither_stalls_nor_reorders_them() {
    let mut cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "fair-restart";
    let holder = hold(&engine, key).await;
    let served = Arc::new(Mutex::new(Vec::new()));
    let tasks = queue_up(&engine, &urls, key, names(0..4), &served).await;
    // The first master forgets the key and the queue, and votes again at once.
    cluster[0].restart().expect("restart");
    // The waiters bring their tickets back to it as they ask again: it queues them in the same order.
    eventually_queued(&urls, key, 4).await;
    engine.release(&holder).await;
    all_served(tasks).await;
    assert_eq!(*served.lock().expect("served"), names(0..4));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_cut_off_from_a_majority_drops_out_and_does_not_stall_the_rest() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let mut proxies = Vec::new();
    for index in 0..3 {
        proxies.push(FaultProxy::start(cluster[index].addr()).await.expect("proxy"));
    }
    let proxied: Vec<String> = proxies.iter().map(FaultProxy::url).collect();
    let behind_proxies = engine_on(&proxied).await;
    let engine = engine_on(&urls).await;
    let key = "fair-partition";
    let holder = hold(&engine, key).await;
    let served = Arc::new(Mutex::new(Vec::new()));
    let first = waiter(&behind_proxies, key, "cut-off".to_owned(), &served);
    eventually_queued(&urls, key, 1).await;
    let second = waiter(&engine, key, "second".to_owned(), &served);
    eventually_queued(&urls, key, 2).await;
    // The first waiter is cut off from two masters: it cannot get the key, and they stop keeping it.
    for proxy in &proxies[1..] {
        proxy.hold(Direction::Both, true);
    }
    engine.release(&holder).await;
    second.await.expect("the second waiter");
    assert_eq!(*served.lock().expect("served"), ["second"]);
    // Healed, the first waiter joins again and gets the key.
    for proxy in &proxies[1..] {
        proxy.heal();
        proxy.cut_all();
    }
    first.await.expect("the cut-off waiter");
    assert_eq!(*served.lock().expect("served"), ["second", "cut-off"]);
}

/// A fair waiter for one of several permits, in a task of its own (as [`waiter`] for a key).
fn permit_waiter(
    engine: &Redlock,
    key: &str,
    permits: u32,
    name: String,
    served: &Arc<Mutex<Vec<String>>>,
) -> JoinHandle<()> {
    let (engine, key, served) = (engine.clone(), key.to_owned(), served.clone());
    tokio::spawn(async move {
        let lease = engine
            .acquire_permit(&key, permits, TTL, &name, fair_for(Duration::from_secs(120)))
            .await
            .unwrap_or_else(|err| panic!("{name} never got a permit: {err}"));
        served.lock().expect("served").push(name);
        engine.release(&lease).await;
    })
}

/// Both permits of a two-permit semaphore on `key` held, then `waiters` permit waiters, each started once the one
/// before is queued on every master: the leases, who was served, and the waiters' tasks.
async fn permits_held_and_waited_for(
    engine: &Redlock,
    urls: &[String],
    key: &str,
    waiters: usize,
) -> (Vec<Lease>, Arc<Mutex<Vec<String>>>, Vec<JoinHandle<()>>) {
    let mut held = Vec::new();
    for holder in ["kept", "holder"] {
        held.push(
            engine
                .acquire_permit(key, 2, HOLD, holder, once())
                .await
                .expect("a permit"),
        );
    }
    let served = Arc::new(Mutex::new(Vec::new()));
    let mut tasks = Vec::new();
    for (i, name) in names(0..waiters).into_iter().enumerate() {
        tasks.push(permit_waiter(engine, key, 2, name, &served));
        eventually_queued(urls, key, i + 1).await;
    }
    (held, served, tasks)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn semaphore_waiters_get_permits_in_the_order_they_arrived() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "fair-permits";
    // Both permits held; one stays held throughout, so that the waiters go through the other one at a time.
    let (mut held, served, tasks) = permits_held_and_waited_for(&engine, &urls, key, 4).await;
    // A single attempt does not take the permit that frees up ahead of them.
    let freed = held.pop().expect("the second permit");
    engine.release(&freed).await;
    let refused = engine.acquire_permit(key, 2, TTL, "impatient", once()).await;
    // A waiter not served yet after the attempt was queued during it.
    let unserved = 4 - served.lock().expect("served").len();
    assert!(
        refused.is_err() || unserved == 0,
        "a single attempt took a permit while {unserved} waited: {refused:?}"
    );
    if let Ok(lease) = refused {
        engine.release(&lease).await;
    }
    all_served(tasks).await;
    assert_eq!(*served.lock().expect("served"), names(0..4));
    for lease in held {
        engine.release(&lease).await;
    }
}

/// Longer than any test's patience: a waiter that asks again only at this pace gets a key in time only if a
/// release's announcement wakes it.
const NEVER: Duration = Duration::from_secs(600);
/// How long a test waits for a woken waiter: far below [`NEVER`], far above any hand-over on a slow machine.
const PATIENCE: Duration = Duration::from_secs(30);

/// How many connections of each master listen on `key`'s wake channel.
async fn listening(urls: &[String], key: &str) -> Vec<usize> {
    let channel = released_channel(key);
    let mut counts = Vec::new();
    for url in urls {
        let mut conn = redis_conn(url).await;
        let (_, count): (String, usize) = redis::cmd("PUBSUB")
            .arg("NUMSUB")
            .arg(&channel)
            .query_async(&mut conn)
            .await
            .expect("PUBSUB NUMSUB");
        counts.push(count);
    }
    counts
}

/// Until every master has a listener on `key`'s channel (one per process, whatever its waiters).
async fn eventually_listening(urls: &[String], key: &str) {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let counts = listening(urls, key).await;
        if counts.iter().all(|count| *count == 1) {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "never one listener on every master: {counts:?}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_release_wakes_the_waiters_long_before_their_fallback_poll() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_with(&urls, |config| config.queue_fallback = Some(NEVER)).await;
    let key = "fair-woken";
    let holder = hold(&engine, key).await;
    let served = Arc::new(Mutex::new(Vec::new()));
    // Three waiters of one process: one listening connection per master, and they still go in order.
    let tasks = queue_up(&engine, &urls, key, names(0..3), &served).await;
    eventually_listening(&urls, key).await;
    engine.release(&holder).await;
    // Each waiter's release wakes the next: without the announcements none would ask again within NEVER.
    tokio::time::timeout(PATIENCE, all_served(tasks))
        .await
        .expect("the waiters were not woken by the releases");
    assert_eq!(*served.lock().expect("served"), names(0..3));
    // The last waiter gone, nobody listens any more.
    let deadline = Instant::now() + Duration::from_secs(60);
    while listening(&urls, key).await.iter().any(|count| *count > 0) {
        assert!(Instant::now() < deadline, "still listening after the wait");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_released_permit_wakes_the_semaphores_waiters() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_with(&urls, |config| config.queue_fallback = Some(NEVER)).await;
    let key = "fair-woken-permits";
    let (mut held, served, tasks) = permits_held_and_waited_for(&engine, &urls, key, 2).await;
    eventually_listening(&urls, key).await;
    // The permit's key is `permit:<i>:<key>` (or the key itself): either announces on the semaphore's channel.
    let freed = held.pop().expect("the second permit");
    engine.release(&freed).await;
    tokio::time::timeout(PATIENCE, all_served(tasks))
        .await
        .expect("the semaphore's waiters were not woken by the release");
    assert_eq!(*served.lock().expect("served"), names(0..2));
    for lease in held {
        engine.release(&lease).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_whose_listeners_were_cut_still_gets_the_key_by_its_fallback_poll() {
    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "fair-unheard";
    let holder = hold(&engine, key).await;
    let served = Arc::new(Mutex::new(Vec::new()));
    let task = waiter(&engine, key, "unheard".to_owned(), &served);
    eventually_queued(&urls, key, 1).await;
    eventually_listening(&urls, key).await;
    // Every master drops the waiter's listening connection; the process opens new ones.
    for url in &urls {
        let mut conn = redis_conn(url).await;
        let killed: usize = redis::cmd("CLIENT")
            .arg("KILL")
            .arg("TYPE")
            .arg("pubsub")
            .query_async(&mut conn)
            .await
            .expect("CLIENT KILL");
        assert_eq!(killed, 1, "{url}: one listening connection");
    }
    eventually_listening(&urls, key).await;
    // The key goes without a word (as it does when it expires): only the waiter's fallback poll can notice.
    for url in &urls {
        let mut conn = redis_conn(url).await;
        redis::cmd("DEL")
            .arg(key)
            .query_async::<()>(&mut conn)
            .await
            .expect("let go");
    }
    tokio::time::timeout(PATIENCE, task)
        .await
        .expect("the waiter never polled")
        .expect("waiter");
    assert_eq!(*served.lock().expect("served"), ["unheard"]);
    drop(holder);
}

/// Issue 41: the operator's waiters. A lock's reconciles are its attempts, so the operator keeps a watch per
/// queued permit between them (`controller::lock::release_wakes`) and asks the reconciler, through the keeper's
/// wake channel, to look at the lock once the releases ahead of it were announced. Nothing here polls: the wake
/// channel receiving the lock within PATIENCE is the announcement's doing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_lock_queued_for_a_key_is_woken_at_its_release() {
    use kube::runtime::reflector::ObjectRef;
    use redlock_operator::api::DistributedLock;
    use redlock_operator::controller::keeper::{Keeper, PermitRef};
    use redlock_operator::controller::lock::fair_queue::wakes::ReleaseWakes;

    let cluster = RedisCluster::start(3).expect("masters");
    let urls = cluster.urls();
    let engine = engine_on(&urls).await;
    let key = "fair-operator-woken";
    let holder = hold(&engine, key).await;
    let (keeper, mut wakes) = Keeper::new(Arc::default(), false);
    let release_wakes = ReleaseWakes::default();
    let lock = ObjectRef::<DistributedLock>::new("report").within("team");
    let permit = PermitRef::new(lock.clone(), 0);
    let waiter = Waiter::new(7, 0);
    let attempt = || async {
        let heard = release_wakes.attempting(&permit, &engine, key);
        let value = LockValue::random("operator").expect("value");
        match engine.try_acquire_waiting(key, TTL, value, 0, Some(waiter)).await {
            Err(AcquireError::NotAcquired { report, .. }) => {
                let place = report.queue_place().expect("queued");
                release_wakes.queued(&permit, &engine, key, heard, &place, &keeper);
            }
            other => panic!("the key is held: {other:?}"),
        }
    };

    // The first refusal subscribes; a channel new to the process counts as announced (what happened before is
    // unknown), so the lock is asked about once more at once, and from then on waits for a real release.
    attempt().await;
    eventually_listening(&urls, key).await;
    let first = tokio::time::timeout(PATIENCE, wakes.recv())
        .await
        .expect("the subscription wakes the lock once");
    assert_eq!(first, Some(lock.clone()));
    attempt().await;
    assert_eq!(release_wakes.len(), 1, "one watch per queued permit, kept");
    assert_eq!(
        listening(&urls, key).await,
        [1, 1, 1],
        "still one listener per master"
    );
    assert!(wakes.try_recv().is_err(), "no wake before a release");

    engine.release(&holder).await;
    let woken = tokio::time::timeout(PATIENCE, wakes.recv())
        .await
        .expect("the release did not wake the queued lock");
    assert_eq!(woken, Some(lock.clone()));
    // Its next attempt is granted; the watch goes, and with it the listeners.
    let heard = release_wakes.attempting(&permit, &engine, key);
    assert!(heard.is_none(), "the permit's watch was kept for this attempt");
    let lease = engine
        .try_acquire_waiting(
            key,
            TTL,
            LockValue::random("operator").expect("value"),
            0,
            Some(waiter),
        )
        .await
        .expect("granted after the release");
    release_wakes.forget(&permit);
    assert!(release_wakes.is_empty());
    let deadline = Instant::now() + Duration::from_secs(60);
    while listening(&urls, key).await.iter().any(|count| *count > 0) {
        assert!(Instant::now() < deadline, "still listening after the grant");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    engine.release(&lease).await;
}
