//! The Redlock engine against real `redis-server` masters started by the tests, with real faults
//! (SIGKILL + empty restart, SIGSTOP).
//!
//! The tests are in `tests/engine/`, one module a concern; this file holds what they share.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::support::fault_proxy::{Direction, FaultProxy};
use crate::support::forgotten_tokens::{
    Refusal, assert_above_the_last_token, masters_that_forgot_the_last_token,
};
use crate::support::redis_server::{RedisCluster, raw_get};
use redlock_operator::redlock::{
    AcquireError, AcquireOptions, ExtendError, FailureKind, KeepPolicy, LockValue, LossReason, NodeHealth,
    NodeOutcome, Redlock, RedlockConfig, counter_key,
};
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

#[path = "engine/locking.rs"]
mod locking;
#[path = "engine/masters.rs"]
mod masters;
#[path = "engine/tokens.rs"]
mod tokens;
