//! The nemesis: random faults, one at a time, chosen by the run's seeded random generator (the seed is
//! printed; the same seed makes the same choices, though not the same timing). Every fault is recorded, with the
//! time it and its recovery excuse keys having no holder.

use std::time::Duration;

use rand::Rng;
use rand::seq::SliceRandom;
use tokio::time::Instant;

use super::World;
use super::leaders::{Removal, set_ready};
use super::permits::excess_holders;
use super::replica::takeover_allowance;
use super::rules::FORCED;
use crate::support::fault_proxy::{Direction, FaultProxy};

/// The longest TTL of the run's locks (the quorum's `maxTtl`), which the recovery from a fault may need.
fn ttl(world: &World) -> Duration {
    world.scenario.ttl
}

/// How long a restarted master does not vote.
fn quarantine(world: &World) -> Duration {
    super::quarantine(world.scenario.ttl)
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    KillActive,
    KillStandby,
    StopActive,
    StopStandby,
    ApiOutage,
    EndWatches,
    RestartMasters,
    StopMasters,
    CutFromMajority,
    Latency,
    LeaderUnready,
    LeaderDeleted,
    LockRecreated,
    JobFails,
}

impl Fault {
    const ALL: [Fault; 14] = [
        Fault::KillActive,
        Fault::KillStandby,
        Fault::StopActive,
        Fault::StopStandby,
        Fault::ApiOutage,
        Fault::EndWatches,
        Fault::RestartMasters,
        Fault::StopMasters,
        Fault::CutFromMajority,
        Fault::Latency,
        Fault::LeaderUnready,
        Fault::LeaderDeleted,
        Fault::LockRecreated,
        Fault::JobFails,
    ];

    fn possible(self, world: &World) -> bool {
        match self {
            Fault::KillStandby | Fault::StopStandby => world.scenario.replicas >= 2,
            Fault::LeaderUnready | Fault::LeaderDeleted => world.scenario.leader_locks > 0,
            Fault::LockRecreated => world.scenario.leader_locks + world.scenario.identity_locks > 0,
            Fault::JobFails => world.scenario.job_locks > 0,
            _ => true,
        }
    }
}

/// A fault a scenario forces at a fixed point of its run (the random nemesis may also choose it, any time).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Forced {
    /// One master, chosen by the seed, SIGKILLed; it stays down for a while and comes back empty.
    KillMaster,
    /// The active operator replica of a cluster chosen by the seed SIGKILLed; restarted a moment later.
    KillActiveReplica,
    /// No replica of a cluster active for twice the TTL: the active one SIGKILLed, the others SIGSTOPped, then
    /// restarted and continued. Its Job locks lapse while nobody can suspend a Job.
    LongFailover,
    /// A Job lock of a cluster deleted while its Jobs run, and created again once it is gone.
    #[allow(dead_code)] // Forced in the long run only (benches/operator_safety.rs).
    JobLockDeleted,
    /// A cluster's API server unreachable, and the cluster cut from a majority of masters, at once, for twice
    /// the TTL: its locks cannot be extended, and neither its operator nor its holders can see status.
    #[allow(dead_code)] // Forced in the long run only (benches/operator_safety.rs).
    OutageAndCut,
}

/// Faults until `until`, then heals everything. The scenario's forced faults come at their points (as soon as
/// the fault in progress, if any, is over).
pub async fn run(world: &mut World, until: Instant) {
    let started = Instant::now();
    let mut next_progress = world.scenario.progress.map(|every| started + every);
    let mut forced = world.scenario.forced.clone();
    forced.sort_by_key(|(at, _)| *at);
    forced.reverse();
    while Instant::now() < until {
        if let (Some(due), Some(every)) = (next_progress, world.scenario.progress)
            && Instant::now() >= due
        {
            progress(world, started);
            next_progress = Some(due + every);
        }
        if forced
            .last()
            .is_some_and(|(at, _)| started + *at <= Instant::now())
            && let Some((_, fault)) = forced.pop()
        {
            force(world, fault).await;
            continue;
        }
        let possible: Vec<Fault> = Fault::ALL
            .into_iter()
            .filter(|fault| fault.possible(world))
            .collect();
        let fault = possible[world.rng.random_range(0..possible.len())];
        let side = world.rng.random_range(0..world.sides.len());
        inject(world, fault, side).await;
        let pause = Duration::from_millis(world.rng.random_range(100..800));
        tokio::time::sleep(pause).await;
    }
    heal(world);
}

/// No faults: only progress lines until `until`.
pub async fn watch_only(world: &World, until: Instant) {
    let started = Instant::now();
    while Instant::now() < until {
        let every = world.scenario.progress.unwrap_or(Duration::from_secs(3600));
        tokio::time::sleep_until(until.min(Instant::now() + every)).await;
        if world.scenario.progress.is_some() && Instant::now() < until {
            progress(world, started);
        }
    }
}

fn progress(world: &World, started: Instant) {
    let beliefs = world.recorder.beliefs();
    let transitions: usize = crate::support::history::transitions(&beliefs).values().sum();
    let mut overlaps = crate::support::history::find_overlaps(&beliefs, 1);
    overlaps.extend(excess_holders(&beliefs, &world.bounds()));
    println!(
        "  … {:.0}s: {} transitions, {} overlaps so far, {} nemesis events",
        started.elapsed().as_secs_f64(),
        transitions,
        overlaps.len(),
        world.recorder.nemesis_events().len()
    );
    // A long run shows what it found as it goes, with the faults just before it.
    if let Some(last) = overlaps.last() {
        println!("    latest overlap: {last}");
        for event in world.recorder.nemesis_events().iter().filter(|event| {
            event.at + Duration::from_secs(10) > last.second.start && event.at < last.first.end
        }) {
            println!("    nemesis at {:?}: {}", event.at, event.what);
        }
    }
}

fn millis(world: &mut World, range: std::ops::Range<u64>) -> Duration {
    Duration::from_millis(world.rng.random_range(range))
}

/// `count` distinct masters, chosen at random.
fn some_masters(world: &mut World, count: usize) -> Vec<usize> {
    let mut all: Vec<usize> = (0..world.masters.len()).collect();
    all.shuffle(&mut world.rng);
    all.truncate(count);
    all
}

/// One or two masters, now and then a majority.
fn how_many_masters(world: &mut World) -> usize {
    if world.rng.random_bool(0.25) {
        world.masters.len() / 2 + 1
    } else {
        world.rng.random_range(1..=world.masters.len() / 2)
    }
}

async fn inject(world: &mut World, fault: Fault, side: usize) {
    let started = Instant::now();
    let cluster = world.sides[side].cluster.name.clone();
    let recovery = match fault {
        Fault::KillActive | Fault::KillStandby | Fault::StopActive | Fault::StopStandby => {
            let active = world.sides[side].active().await;
            let count = world.sides[side].replicas.len();
            let target = match (fault, active) {
                (Fault::KillActive | Fault::StopActive, Some(active)) => active,
                (_, Some(active)) if count > 1 => (active + 1) % count,
                _ => world.rng.random_range(0..count),
            };
            let hold = millis(world, 300..4_000);
            let kill = matches!(fault, Fault::KillActive | Fault::KillStandby);
            let replica = &mut world.sides[side].replicas[target];
            let what = format!(
                "{} {} ({}) for {hold:?}",
                if kill { "SIGKILL" } else { "SIGSTOP" },
                replica.identity,
                if Some(target) == active {
                    "active"
                } else {
                    "standby"
                }
            );
            world.recorder.nemesis(what);
            if kill {
                replica.kill();
                tokio::time::sleep(hold).await;
                replica.restart();
            } else {
                replica.stop();
                tokio::time::sleep(hold).await;
                replica.cont();
            }
            takeover_allowance() + ttl(world)
        }
        Fault::ApiOutage | Fault::EndWatches => {
            let outage = fault == Fault::ApiOutage;
            let hold = if outage {
                millis(world, 1_000..6_000)
            } else {
                Duration::ZERO
            };
            let what = if outage {
                format!("API server of {cluster} unreachable for {hold:?}")
            } else {
                format!("every connection to the API server of {cluster} cut (watches end)")
            };
            world.recorder.nemesis(what);
            let side = &world.sides[side];
            let proxies = side
                .replicas
                .iter()
                .map(|replica| &replica.proxy)
                .chain(std::iter::once(&side.holders_link));
            for proxy in proxies.clone() {
                proxy.refuse(outage);
                proxy.cut_all();
            }
            tokio::time::sleep(hold).await;
            for proxy in proxies {
                proxy.refuse(false);
            }
            ttl(world) + takeover_allowance()
        }
        Fault::RestartMasters => {
            let count = how_many_masters(world);
            let targets = some_masters(world, count);
            let what = format!("masters {targets:?} SIGKILLed and restarted empty");
            world.recorder.nemesis(what);
            let (masters, recorder) = (&mut world.masters, &world.recorder);
            tokio::task::block_in_place(|| {
                for &index in &targets {
                    masters[index].restart().expect("restart a master");
                    recorder.master_restarted(index);
                }
            });
            quarantine(world) + ttl(world) * 2
        }
        Fault::StopMasters => {
            let count = how_many_masters(world);
            let targets = some_masters(world, count);
            let hold = millis(world, 200..3_000);
            let what = format!("masters {targets:?} SIGSTOPped for {hold:?}");
            world.recorder.nemesis(what);
            for &index in &targets {
                world.masters[index].stop();
            }
            tokio::time::sleep(hold).await;
            for &index in &targets {
                world.masters[index].cont();
            }
            ttl(world) * 2
        }
        Fault::CutFromMajority => {
            let count = world.masters.len() / 2 + 1;
            let targets = some_masters(world, count);
            let hold = millis(world, 1_000..5_000);
            let what = format!("{cluster} cut from masters {targets:?} for {hold:?}");
            world.recorder.nemesis(what);
            for &index in &targets {
                world.sides[side].links[index].hold(Direction::Both, true);
            }
            tokio::time::sleep(hold).await;
            for &index in &targets {
                world.sides[side].links[index].hold(Direction::Both, false);
            }
            ttl(world) * 2
        }
        Fault::Latency => {
            let count = how_many_masters(world);
            let targets = some_masters(world, count);
            let latency = millis(world, 5..60);
            let hold = millis(world, 1_000..5_000);
            let what = format!("{latency:?} of latency to masters {targets:?} for {hold:?}");
            world.recorder.nemesis(what);
            for side in &world.sides {
                for &index in &targets {
                    side.links[index].set_latency(Direction::Both, latency);
                }
            }
            tokio::time::sleep(hold).await;
            for side in &world.sides {
                for &index in &targets {
                    side.links[index].set_latency(Direction::Both, Duration::ZERO);
                }
            }
            ttl(world)
        }
        Fault::LeaderUnready | Fault::LeaderDeleted => {
            let lock = world.rng.random_range(0..world.sides[side].leaders.len());
            let hold = millis(world, 300..2_000);
            // A drain's deletion (the kubelet stops the process before the object goes), or a force deletion
            // while the process runs on: the operator cannot tell them apart by the object's absence alone.
            let removal = if world.rng.random_bool(0.5) {
                Removal::Drain
            } else {
                Removal::Force
            };
            let side = &mut world.sides[side];
            let set = &mut side.leaders[lock];
            let Some(leader) = set.labelled(&side.cluster).await.into_iter().next() else {
                world
                    .recorder
                    .nemesis(format!("{cluster}/{}: no leader to disturb", set.lock));
                return;
            };
            if fault == Fault::LeaderUnready {
                let what = format!("{cluster}/{leader} unready for {hold:?}");
                world.recorder.nemesis(what);
                set_ready(&side.cluster, &leader, false).await;
                tokio::time::sleep(hold).await;
                set_ready(&side.cluster, &leader, true).await;
            } else {
                world
                    .recorder
                    .nemesis(format!("{cluster}/{leader} deleted ({removal:?}) and replaced"));
                side.leaders[lock]
                    .replace(&side.cluster, &side.kubelet, &leader, removal)
                    .await;
            }
            // A failover excuses nothing: the next leader should hold the key at once.
            return;
        }
        Fault::JobFails => {
            let pick = world.rng.random_range(0..world.sides[side].jobs.len());
            let side = &mut world.sides[side];
            let lock = &mut side.jobs[pick];
            world
                .recorder
                .nemesis(format!("{cluster}/{}: a failing Job queued first", lock.lock));
            lock.queue_failing_job(&side.cluster).await;
            return;
        }
        Fault::LockRecreated => {
            let side = &mut world.sides[side];
            let (leaders, identities) = (side.leaders.len(), side.identities.len());
            let pick = world.rng.random_range(0..leaders + identities);
            if pick < leaders {
                let set = &mut side.leaders[pick];
                world
                    .recorder
                    .nemesis(format!("{cluster}/{} deleted and created again", set.lock));
                set.recreate(&side.cluster).await;
            } else {
                let lock = &mut side.identities[pick - leaders];
                world
                    .recorder
                    .nemesis(format!("{cluster}/{} deleted and created again", lock.lock));
                lock.recreate(&side.cluster).await;
            }
            return;
        }
    };
    world.recorder.excuse(started, Instant::now() + recovery);
}

/// A forced fault, now.
pub async fn force(world: &mut World, fault: Forced) {
    let started = Instant::now();
    let recovery = match fault {
        Forced::KillMaster => {
            let index = world.rng.random_range(0..world.masters.len());
            let down = millis(world, 1_000..3_000);
            world.recorder.nemesis(format!(
                "{FORCED}master {index} SIGKILLed, restarted empty after {down:?}"
            ));
            world.masters[index].kill();
            tokio::time::sleep(down).await;
            let (masters, recorder) = (&mut world.masters, &world.recorder);
            tokio::task::block_in_place(|| {
                masters[index].restart().expect("restart a master");
                recorder.master_restarted(index);
            });
            quarantine(world) + ttl(world) * 2
        }
        Forced::KillActiveReplica => {
            let side = world.rng.random_range(0..world.sides.len());
            // The Lease names the active replica once one renewed it: a replica killed just before may leave
            // none named for a moment.
            let deadline = Instant::now() + Duration::from_secs(60);
            let mut active = world.sides[side].active().await;
            while active.is_none() && Instant::now() < deadline {
                tokio::time::sleep(Duration::from_millis(100)).await;
                active = world.sides[side].active().await;
            }
            let Some(active) = active else {
                let cluster = &world.sides[side].cluster.name;
                world
                    .recorder
                    .nemesis(format!("{cluster}: no active replica to kill"));
                return;
            };
            let hold = millis(world, 300..2_000);
            let replica = &mut world.sides[side].replicas[active];
            world.recorder.nemesis(format!(
                "{FORCED}SIGKILL {} (active), restarted after {hold:?}",
                replica.identity
            ));
            replica.kill();
            tokio::time::sleep(hold).await;
            replica.restart();
            takeover_allowance() + ttl(world)
        }
        Forced::LongFailover => {
            let side = world.rng.random_range(0..world.sides.len());
            let active = world.sides[side].active().await;
            let hold = ttl(world) * 2;
            let cluster = world.sides[side].cluster.name.clone();
            world.recorder.nemesis(format!(
                "{FORCED}no replica of {cluster} for {hold:?}: the active one SIGKILLed, the others SIGSTOPped"
            ));
            for (index, replica) in world.sides[side].replicas.iter_mut().enumerate() {
                if Some(index) == active {
                    replica.kill();
                } else {
                    replica.stop();
                }
            }
            tokio::time::sleep(hold).await;
            for (index, replica) in world.sides[side].replicas.iter_mut().enumerate() {
                if Some(index) == active {
                    replica.restart();
                } else {
                    replica.cont();
                }
            }
            takeover_allowance() + ttl(world) * 2
        }
        Forced::JobLockDeleted => {
            let side = world.rng.random_range(0..world.sides.len());
            let side = &world.sides[side];
            let Some(lock) = side.jobs.first() else {
                return;
            };
            world.recorder.nemesis(format!(
                "{FORCED}{}/{} deleted while its Jobs run, created again once gone",
                side.cluster.name, lock.lock
            ));
            lock.recreate(&side.cluster, Duration::ZERO).await;
            ttl(world) * 2
        }
        Forced::OutageAndCut => {
            let side = world.rng.random_range(0..world.sides.len());
            let hold = ttl(world) * 2;
            let targets = some_masters(world, world.masters.len() / 2 + 1);
            let side = &world.sides[side];
            world.recorder.nemesis(format!(
                "{FORCED}API server of {} unreachable and {} cut from masters {targets:?}, for {hold:?}",
                side.cluster.name, side.cluster.name
            ));
            let proxies: Vec<&FaultProxy> = side
                .replicas
                .iter()
                .map(|replica| &replica.proxy)
                .chain(std::iter::once(&side.holders_link))
                .collect();
            for proxy in &proxies {
                proxy.refuse(true);
                proxy.cut_all();
            }
            for &index in &targets {
                side.links[index].hold(Direction::Both, true);
            }
            tokio::time::sleep(hold).await;
            for &index in &targets {
                side.links[index].hold(Direction::Both, false);
            }
            for proxy in &proxies {
                proxy.refuse(false);
            }
            takeover_allowance() + ttl(world) * 2
        }
    };
    world.recorder.excuse(started, Instant::now() + recovery);
}

/// Every fault undone: masters running, links clear, replicas running and not stopped.
pub fn heal(world: &mut World) {
    for index in 0..world.masters.len() {
        world.masters[index].cont();
    }
    for side in &mut world.sides {
        for link in &side.links {
            link.heal();
        }
        side.holders_link.heal();
        if let Some(cuts) = &side.cuts {
            cuts.heal_all();
        }
        for replica in &mut side.replicas {
            replica.proxy.heal();
            if replica.is_stopped() {
                replica.cont();
            }
            if !replica.is_running() {
                replica.restart();
            }
        }
    }
}
