//! Fencing tokens from the masters' counters: proposals above the counters, counters surviving restarts and
//! repaired, the largest token, reclaims, and the token scripts on every Redis.

use super::*;

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
