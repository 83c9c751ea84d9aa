//! The product-level safety checker, long run: two clusters sharing one quorum, two operator replicas each,
//! leader, identity and Job locks and `lock` processes on shared keys, under the seeded nemesis, for
//! `OPERATOR_SAFETY_SECONDS` (default 840); then the negative controls, each of which the checker must catch.
//! Run with `cargo bench --bench operator_safety`; `REDLOCK_SAFETY_SEED` repeats a run's random choices;
//! `OPERATOR_SAFETY_CONTROLS=none` skips the controls and the fence timing below (for more runs of the main one
//! in the same time), `=fence-timing` runs the fence timing without the controls;
//! `OPERATOR_SAFETY_MODE=semaphore` makes the main run the semaphore mode's (Job locks of three permits with a
//! first queue of ten Jobs per cluster, `lock --permits 3` processes, a master and an active replica killed at
//! fixed points); in both modes the long run also forces no replica of a cluster for twice the TTL, a Job lock
//! deleted while its Jobs run, and an API-server outage of a cluster with its cut from a majority of masters
//! (issue 29). After the controls, the operator's fence timing where issue 29 saw a late fence (a Job lock of
//! three permits, its Jobs without the guard, cut from a majority of masters): how late each lost permit was
//! looked at, how long its fence's writes took, how much validity was left. `OPERATOR_SAFETY_SECONDS=0` leaves
//! out the long run (its last line is then `SUMMARY negative_controls_detected=K/K`). The last line is
//! `SUMMARY transitions=N overlaps=N excess_holders=N token_regressions=N stale_writes_accepted=N
//! nemesis_events=N longest_unavailable_ms=N negative_controls_detected=K/K`. The Job pods' guards run with wall
//! clocks 4 s behind the operator's (`OPERATOR_SAFETY_GUARD_SKEW_MS`, 0 for none; issue 48), and a belief that
//! outlasts every validity its guard was shown is a violation of its own (listed as `LATE BELIEF` in the run's
//! report).

#[path = "../tests/e2e/mod.rs"]
mod e2e;
#[path = "../tests/support/product_safety/mod.rs"]
mod product_safety;
#[path = "../tests/support/mod.rs"]
mod support;

use std::time::Duration;

use product_safety::Scenario;
use product_safety::nemesis::Forced;
use product_safety::{controls, fenced, guard_controls, holder_cut, semaphore};
use redlock_operator::negative_controls::Control;

fn main() {
    let seconds: u64 = std::env::var("OPERATOR_SAFETY_SECONDS")
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(840);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("cannot start the runtime: {err}");
            std::process::exit(1);
        }
    };
    let semaphore_mode = std::env::var("OPERATOR_SAFETY_MODE").is_ok_and(|mode| mode == "semaphore");
    runtime.block_on(async move {
        let seed = Scenario::seed_from_env();
        let duration = Duration::from_secs(seconds);
        let scenario = if semaphore_mode {
            Scenario {
                progress: Some(Duration::from_secs(60)),
                ..semaphore::scenario(seed, duration)
            }
        } else {
            Scenario {
            seed,
            duration,
            clusters: 2,
            replicas: 2,
            leader_locks: 2,
            pods_per_lock: 3,
            identity_locks: 1,
            job_locks: 2,
            outside_clients: 4,
            outside_on_cluster_keys: true,
            churn_keys: 4,
            job_seconds: 0.3..1.5,
            real_clusters: true,
            nemesis: true,
            controls: String::new(),
            progress: Some(Duration::from_secs(60)),
            ..Scenario::default()
            }
        };
        // Issue 29's faults, at fixed points of the long run whatever the nemesis does: no replica of a cluster
        // for twice the TTL, a Job lock deleted while its Jobs run, and a cluster's API-server outage together
        // with its cut from a majority of masters.
        let mut scenario = scenario;
        // Issue 48: the guards' wall clocks are off the operator's (4 s behind unless OPERATOR_SAFETY_GUARD_SKEW_MS
        // says otherwise, 0 for none), and a belief that outlasts every validity its guard was shown counts.
        let skew_ms = std::env::var("OPERATOR_SAFETY_GUARD_SKEW_MS")
            .ok()
            .and_then(|ms| ms.trim().parse::<i64>().ok())
            .unwrap_or(-4_000);
        scenario.guard_clock.offset = k8s_openapi::jiff::SignedDuration::from_millis(skew_ms);
        scenario.beliefs_within_shown_validity = true;
        scenario.forced.extend([
            (duration / 2, Forced::LongFailover),
            (duration * 2 / 3, Forced::JobLockDeleted),
            (duration * 5 / 6, Forced::OutageAndCut),
        ]);
        let mode = if semaphore_mode { "semaphore mode, " } else { "" };
        println!("the operator under the nemesis for {seconds}s ({mode}seed {seed}, guards' clocks {skew_ms} ms off)…");
        // 0 s leaves the long run out: the controls and the fence timing only.
        let main = if seconds > 0 {
            let main = product_safety::run(scenario).await;
            println!("nemesis run: {main}");
            Some(main)
        } else {
            None
        };

        let mut detected = 0;
        let mut total = 0;
        let controls_env = std::env::var("OPERATOR_SAFETY_CONTROLS").unwrap_or_default();
        let with_timing = controls_env != "none";
        let with_controls = with_timing && controls_env != "fence-timing";
        for control in Control::ALL.into_iter().filter(|_| with_controls) {
            total += 1;
            let outcome = controls::run(control, Scenario::seed_from_env()).await;
            detected += usize::from(outcome.caught());
            println!("{outcome}");
        }
        if with_controls {
            for outcome in [
                semaphore::miscounting_client(Scenario::seed_from_env()).await,
                guard_controls::unguarded_jobs(Scenario::seed_from_env()).await,
                guard_controls::report_before_stop(Scenario::seed_from_env()).await,
                holder_cut::keeps_working_when_cut(Scenario::seed_from_env()).await,
                fenced::paused_holder(Scenario::seed_from_env()).await,
            ] {
                total += 1;
                detected += usize::from(outcome.caught());
                println!("{outcome}");
            }
            // `holders-trust-wall-clock` ran above with its clean twin 4 s behind; the clean run 4 s ahead.
            let ahead = guard_controls::skewed_run(Scenario::seed_from_env(), guard_controls::Skew::Ahead, false).await;
            let verdict = if ahead.is_safe() { "passes" } else { "FAILS" };
            println!("guarded Job pods 4 s ahead of the operator's clock through a long failover: {verdict} — {ahead}");
        }
        if with_timing {
            let timing = controls::semaphore_fence_timing(Scenario::seed_from_env()).await;
            let verdict = if timing.is_safe() { "passes" } else { "FAILS" };
            println!("operator fence timing, a Job lock of 3 permits cut from a majority: {verdict} — {timing}");
        }
        let Some(main) = main else {
            println!("SUMMARY negative_controls_detected={detected}/{total}");
            return;
        };
        println!(
            "SUMMARY transitions={} overlaps={} excess_holders={} token_regressions={} stale_writes_accepted={} nemesis_events={} longest_unavailable_ms={} negative_controls_detected={detected}/{total}",
            main.transitions_total(),
            main.overlaps.len(),
            main.excess_holders.len(),
            main.token_regressions.len(),
            main.stale_writes_accepted.len(),
            main.nemesis_events,
            main.longest_unavailable.as_millis(),
        );
    });
}
