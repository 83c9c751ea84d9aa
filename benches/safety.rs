//! The safety checker, long version: random faults until at least 10,000 grants (or `SAFETY_GRANTS`), then fair
//! mode (clients waiting in the fair queue) under random faults for `SAFETY_FAIR_SECONDS` (120) and 30 s without,
//! then the negative controls (fair mode's: a client that skips the queue) and their clean twins. Run with
//! `cargo bench --bench safety`; the last line is the SUMMARY.

#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use support::safety::scripted::{
    fast_clocks, majority_restart_tokens, restart_majority_while_held, run_without_faults,
};
use support::safety::{Workload, random_run};

/// Stop even if the grant target is not reached (a run that makes no progress is a finding too).
const TIME_CAP: Duration = Duration::from_secs(20 * 60);

fn main() {
    let target: usize = std::env::var("SAFETY_GRANTS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(10_000);
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cannot start the runtime: {err}");
            std::process::exit(1);
        }
    };
    if std::env::var_os("SAFETY_LOG").is_some() {
        redlock_operator::telemetry::init(
            redlock_operator::telemetry::LogFormat::Text,
            "redlock_operator=debug",
        );
    }
    runtime.block_on(async move {
        let workload = Workload {
            clients: 12,
            resources: Workload::resources(16),
            ttl: Duration::from_secs(1),
            hold: Duration::from_millis(1)..Duration::from_millis(20),
            pause_probability: 0.02,
            long_hold_probability: 0.05,
            floor_lag: Some(Duration::ZERO..Duration::from_millis(20)),
            permits: 1,
            miscounted_permits: None,
fair_wait: None,
queue_skipper: false,
        };
        println!("random faults until {target} grants (at most {}s)…", TIME_CAP.as_secs());
        let progress = Some(Duration::from_secs(15));
        let main = random_run(workload, Duration::from_millis(50), Duration::from_millis(1_500), progress, move |recorder, elapsed| {
            recorder.grants().len() >= target || elapsed >= TIME_CAP
        })
        .await;
        println!("random faults: {main}");

        // Fair mode (issue 31): every client waits in the fair queue, on two keys so that queues form.
        let fair_for = Duration::from_secs(std::env::var("SAFETY_FAIR_SECONDS").ok().and_then(|s| s.parse().ok()).unwrap_or(120));
        let fair = random_run(Workload::fair(false), Duration::from_millis(50), Duration::from_millis(1_500), progress, move |_, elapsed| elapsed >= fair_for).await;
        println!("fair mode, random faults: {fair}");
        let fair_quiet = run_without_faults(Workload::fair(false), Duration::from_millis(50), Duration::from_secs(30)).await;
        println!("fair mode, no faults: {fair_quiet}");
        let skipper = run_without_faults(Workload::fair(true), Duration::from_millis(50), Duration::from_secs(30)).await;

        let controls = [
            ("restart of a majority, quarantine off", restart_majority_while_held(false).await),
            ("clocks 50% fast", fast_clocks(1.5).await),
            ("restart of a majority, counters without the durable floor", majority_restart_tokens(false).await),
        ];
        let twins = [
            ("restart of a majority, quarantine on", restart_majority_while_held(true).await),
            ("clocks 0.5% fast (within the allowance)", fast_clocks(1.005).await),
            ("restart of a majority, counters and the durable floor", majority_restart_tokens(true).await),
        ];
        let mut detected = 0;
        for (name, report) in &controls {
            let found = !report.overlaps.is_empty() || !report.token_regressions.is_empty();
            detected += usize::from(found);
            println!("negative control, {name}: {} — {report}", if found { "DETECTED" } else { "NOT DETECTED" });
        }
        let skipper_found = !skipper.order_inversions.is_empty();
        detected += usize::from(skipper_found);
        println!(
            "negative control, fair mode with a client that skips the queue: {} — {skipper}",
            if skipper_found { "DETECTED" } else { "NOT DETECTED" }
        );
        let mut overlaps = main.overlaps.len() + fair.overlaps.len() + fair_quiet.overlaps.len();
        let mut regressions =
            main.token_regressions.len() + fair.token_regressions.len() + fair_quiet.token_regressions.len();
        let order_inversions = fair.order_inversions.len() + fair_quiet.order_inversions.len();
        for (name, report) in &twins {
            overlaps += report.overlaps.len();
            regressions += report.token_regressions.len();
            println!("clean twin, {name}: {report}");
        }
        println!(
            "SUMMARY grants={} overlaps={} token_regressions={} nemesis_events={} longest_unavailable_ms={} fair_acquisitions={} order_inversions={order_inversions} excused_by_faults={} negative_controls_detected={}/{}",
            main.grants,
            overlaps,
            regressions,
            main.nemesis_events,
            main.longest_unavailable.as_millis(),
            fair.fair_acquisitions + fair_quiet.fair_acquisitions,
            fair.excused_inversions,
            detected,
            controls.len() + 1
        );
    });
}
