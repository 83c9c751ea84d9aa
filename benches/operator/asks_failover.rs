//! Failover of the operator with every holder asking (issue 55, item 4): two replicas of the real binary elect
//! the active one through a Lease (4 s, the default), the active one holds N identity locks (ttl 10s) and a
//! holder per lock asks it on a kept connection (`operator/asks.rs`'s holders); then the active replica is
//! SIGKILLed. The standby takes the Lease, resumes every lock and shows its own address and pin in status; the
//! holders' asks to the dead replica fail meanwhile (their stop times stand), and once status names the new
//! replica they ask it (answered `unknown` until it has resumed their lock). For each size in
//! `OPERATOR_BENCH_FAILOVER_ASK_LOCKS` (comma-separated, default `10000`; `0` leaves it out) it prints the time
//! from the kill until every holder had a validity from the new replica (asked after the kill), the p99 of those
//! times, the locks the new replica lost (its `redlock_locks_lost_total` until a TTL after the last answer), and
//! the holders that stopped their work while status still showed their term (a resume that came after their
//! stop time): `SUMMARY_ASK_FAILOVER locks=N all_answered_s=X answered_p99_s=X lost=N stopped_while_resumed=N`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::Api;
use redlock_operator::api::DistributedLock;
use tokio::time::Instant;

use super::asks::{
    Connection, Kind, START_SPREAD, TTL, Tally, lost, quantile, settled_holders, spawn_holders,
};
use super::{BoxError, Cluster, Operator, hold_identity_locks, patience};

/// The sizes to run: `OPERATOR_BENCH_FAILOVER_ASK_LOCKS`, comma-separated (`0` or empty: none).
pub fn sizes() -> Vec<usize> {
    std::env::var("OPERATOR_BENCH_FAILOVER_ASK_LOCKS")
        .unwrap_or_else(|_| "10000".to_owned())
        .split(',')
        .filter_map(|size| size.trim().parse().ok())
        .filter(|&size| size > 0)
        .collect()
}

pub async fn run(sizes: &[usize]) -> Result<(), BoxError> {
    println!(
        "a failover with every holder asking: held locks {sizes:?}, ttl {}s, two replicas (Lease 4 s), the active one SIGKILLed",
        TTL.as_secs()
    );
    for &locks in sizes {
        one_size(locks).await?;
    }
    Ok(())
}

async fn one_size(locks: usize) -> Result<(), BoxError> {
    let cluster = Cluster::start().await?;
    cluster.install().await?;
    let first = Operator::start_replica(&cluster, "replica-a").await?;
    let standby = Operator::start_replica(&cluster, "replica-b").await?;
    let api: Api<DistributedLock> = Api::default_namespaced(cluster.client.clone());
    hold_identity_locks(&api, locks).await?;

    let tally = Arc::new(Tally::default());
    let (mut holders, fanning) = spawn_holders(&api, locks, Connection::Kept, &tally, START_SPREAD);
    settled_holders(&tally, locks).await?;

    let lost_before = lost(standby.port).await?;
    let stopped_before = tally.stopped_early.load(Ordering::Relaxed);
    let killed = Instant::now();
    // SIGKILL: nothing handed over, as when a node goes.
    drop(first);
    let answered_after_kill = |tally: &Tally| -> Vec<Option<Instant>> {
        let mut firsts = vec![None::<Instant>; locks];
        for sample in tally.samples.lock().unwrap_or_else(|p| p.into_inner()).iter() {
            if sample.kind == Kind::Valid
                && sample.sent_at > killed
                && let Some(first) = firsts.get_mut(sample.holder)
                && first.is_none_or(|at| sample.answered_at < at)
            {
                *first = Some(sample.answered_at);
            }
        }
        firsts
    };
    let deadline = killed + patience();
    let firsts = loop {
        let firsts = answered_after_kill(&tally);
        if firsts.iter().all(Option::is_some) {
            break firsts;
        }
        if Instant::now() > deadline {
            let answered = firsts.iter().filter(|first| first.is_some()).count();
            return Err(
                format!("after the failover only {answered} of {locks} holders were answered").into(),
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let mut times: Vec<f64> = firsts
        .iter()
        .flatten()
        .map(|at| (*at - killed).as_secs_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    let all_answered = times.last().copied().unwrap_or(0.0);
    // A lock the failover cost shows lost within a TTL.
    tokio::time::sleep(TTL).await;
    let lost_failover = lost(standby.port).await? - lost_before;
    let stopped = tally.stopped_early.load(Ordering::Relaxed) - stopped_before;
    holders.abort_all();
    fanning.abort();
    while holders.join_next().await.is_some() {}
    standby.stop().await?;
    println!(
        "  {locks} held locks: every holder answered by the new active replica {all_answered:.1} s after the kill (p50 {:.1} s, p99 {:.1} s); {lost_failover:.0} locks lost; {stopped} holders stopped their work while status still showed their term",
        quantile(&times, 0.5),
        quantile(&times, 0.99)
    );
    println!(
        "SUMMARY_ASK_FAILOVER locks={locks} all_answered_s={all_answered:.2} answered_p99_s={:.2} lost={lost_failover:.0} stopped_while_resumed={stopped}",
        quantile(&times, 0.99)
    );
    Ok(())
}
