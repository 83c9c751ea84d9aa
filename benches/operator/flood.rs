//! A flood of forged reports beside held locks (issue 39): the real binary holds `locks` identity locks (ttl
//! 10s); one window is measured idle, then the same window while 8 clients flood `POST /v1/stopped` on the
//! operator's reports port (TLS, a handshake per request) with made-up bearer tokens and forged, unsigned JWTs for our audience
//! (`tests/support/forged_reports.rs`, the mix the flood test sends). Per window:
//! - the extensions' lag, mean (the histogram's sum over its count, over the window alone) and p99 (the upper
//!   bound of its bucket: the buckets double, so the p99 only moves in steps);
//! - the status headroom: the least validity a held lock's status showed (`validUntil` − now), sampled every
//!   250 ms through the API; status written late, or extensions late, show less;
//! - the operator's cores;
//! - for the flood, the requests answered and the TokenReviews the API server answered meanwhile.
//!
//! Ends with `SUMMARY_FLOOD locks=N requests=N reviews=N reviews_per_request=X lag_mean_ms_idle=X
//! lag_mean_ms_flood=X lag_p99_ms_idle=X lag_p99_ms_flood=X headroom_min_ms_idle=X headroom_min_ms_flood=X
//! cores_idle=X cores_flood=X` and `RATIO flood/idle lag_mean=X lag_p99=X headroom_min=X`.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kube::Api;
use kube::api::ListParams;
use redlock_operator::api::{DistributedLock, LockPhase};
use tokio::time::Instant;

use super::support::forged_reports::{Tally, flood};
use super::{
    BoxError, Operator, cpu_seconds, histogram_buckets, metric, metrics_text, settled_identity_locks,
};

const CLIENTS: usize = 8;

/// One window's figures.
struct Window {
    lag_mean_ms: f64,
    lag_p99_ms: f64,
    headroom_min_ms: f64,
    cores: f64,
}

pub async fn run(locks: usize, window: Duration) -> Result<(), BoxError> {
    println!(
        "a flood of forged reports: {locks} held locks, ttl 10s, {CLIENTS} clients, {}s windows",
        window.as_secs()
    );
    let (cluster, operator, api) = settled_identity_locks(locks).await?;

    let idle = measure(&api, &operator, window, None).await?;
    let tally = Arc::new(Tally::default());
    let reviews_before = cluster.server.token_reviews();
    let end = Instant::now() + window;
    let addr = std::net::SocketAddr::from(([127, 0, 0, 1], operator.reports_port));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|client| tokio::spawn(flood(addr, "default".to_owned(), client, end, tally.clone())))
        .collect();
    let flooded = measure(&api, &operator, window, Some(end)).await?;
    for client in clients {
        client.await?;
    }
    let reviews = cluster.server.token_reviews() - reviews_before;
    let requests = tally.sent.load(Ordering::Relaxed);
    let taken = tally.taken.load(Ordering::Relaxed);
    operator.stop().await?;
    if taken > 0 {
        return Err(format!("{taken} forged reports were taken").into());
    }
    let per_request = reviews as f64 / requests.max(1) as f64;
    println!(
        "  idle:  extension lag mean {:.2} ms, p99 {:.1} ms, status headroom min {:.0} ms, {:.3} cores",
        idle.lag_mean_ms, idle.lag_p99_ms, idle.headroom_min_ms, idle.cores
    );
    println!(
        "  flood: extension lag mean {:.2} ms, p99 {:.1} ms, status headroom min {:.0} ms, {:.3} cores; {requests} requests ({:.0}/s), {reviews} TokenReviews ({per_request:.5} per request)",
        flooded.lag_mean_ms,
        flooded.lag_p99_ms,
        flooded.headroom_min_ms,
        flooded.cores,
        requests as f64 / window.as_secs_f64()
    );
    println!(
        "SUMMARY_FLOOD locks={locks} requests={requests} reviews={reviews} reviews_per_request={per_request:.5} lag_mean_ms_idle={:.2} lag_mean_ms_flood={:.2} lag_p99_ms_idle={:.1} lag_p99_ms_flood={:.1} headroom_min_ms_idle={:.0} headroom_min_ms_flood={:.0} cores_idle={:.3} cores_flood={:.3}",
        idle.lag_mean_ms,
        flooded.lag_mean_ms,
        idle.lag_p99_ms,
        flooded.lag_p99_ms,
        idle.headroom_min_ms,
        flooded.headroom_min_ms,
        idle.cores,
        flooded.cores
    );
    println!(
        "RATIO flood/idle lag_mean={:.2} lag_p99={:.2} headroom_min={:.2}",
        flooded.lag_mean_ms / idle.lag_mean_ms.max(1e-9),
        flooded.lag_p99_ms / idle.lag_p99_ms.max(1e-9),
        flooded.headroom_min_ms / idle.headroom_min_ms.max(1e-9)
    );
    Ok(())
}

/// One window: the lag histogram's growth over it, the least headroom sampled, the operator's cores.
async fn measure(
    api: &Api<DistributedLock>,
    operator: &Operator,
    window: Duration,
    flood_end: Option<Instant>,
) -> Result<Window, BoxError> {
    let before = metrics_text(operator.port).await?;
    let cpu_before = cpu_seconds(operator.pid)?;
    let started = Instant::now();
    let end = flood_end.unwrap_or(started + window);
    let mut headroom_min = f64::INFINITY;
    while Instant::now() < end {
        for lock in api.list(&ListParams::default()).await?.items {
            let Some(status) = lock.status else { continue };
            if status.phase != Some(LockPhase::Held) {
                continue;
            }
            let Some(valid_until) = status.valid_until else {
                continue;
            };
            let now = k8s_openapi::jiff::Timestamp::now();
            let left = valid_until.0.duration_since(now).as_secs_f64() * 1000.0;
            headroom_min = headroom_min.min(left);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let cores = (cpu_seconds(operator.pid)? - cpu_before) / started.elapsed().as_secs_f64();
    let after = metrics_text(operator.port).await?;
    let grown = |name: &str| metric(&after, name) - metric(&before, name);
    let lag_mean_ms =
        grown("redlock_extend_lag_seconds_sum") / grown("redlock_extend_lag_seconds_count").max(1.0) * 1000.0;
    Ok(Window {
        lag_mean_ms,
        lag_p99_ms: quantile_between(&before, &after, "redlock_extend_lag_seconds", 0.99) * 1000.0,
        headroom_min_ms: headroom_min,
        cores,
    })
}

/// The `quantile` of what a Prometheus histogram counted between two scrapes, as the upper bound of its bucket.
fn quantile_between(before: &str, after: &str, name: &str, quantile: f64) -> f64 {
    let (before, after) = (histogram_buckets(before, name), histogram_buckets(after, name));
    let grown: Vec<(f64, f64)> = after
        .iter()
        .map(|(bound, count)| {
            let earlier = before
                .iter()
                .find(|(other, _)| other == bound)
                .map_or(0.0, |(_, count)| *count);
            (*bound, count - earlier)
        })
        .collect();
    let total = grown.last().map_or(0.0, |(_, count)| *count);
    grown
        .iter()
        .find(|(_, count)| *count >= total * quantile)
        .map_or(0.0, |(bound, _)| *bound)
}
