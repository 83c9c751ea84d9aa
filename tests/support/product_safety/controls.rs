//! Negative controls: each breaks one safeguard of the operator (`src/negative_controls.rs`, compiled into test
//! builds only, switched on in the replicas' environment) in a run built to need that safeguard, and the checker
//! must catch it. Run without the switch (its clean twin), the same run must pass: what the checker catches is
//! the switch, not the run. They always use test API servers.

use std::fmt;
use std::time::Duration;

use redlock_operator::api::LockPhase;
use redlock_operator::negative_controls::Control;
use tokio::time::Instant;

use super::checker::Report;
use super::leaders::set_ready;
use super::{Scenario, World};
use crate::support::fault_proxy::Direction;
use crate::support::history::find_overlaps;

/// A control's run with its switch on, and (when asked for) its clean twin.
pub struct Outcome {
    /// The control's name: an operator switch's (`Control::name`), or a holder's that breaks a rule itself.
    pub name: &'static str,
    pub broken: Report,
    pub clean: Option<Report>,
}

impl Outcome {
    /// The checker caught the broken safeguard.
    pub fn caught(&self) -> bool {
        !self.broken.is_safe()
    }
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let verdict = if self.caught() { "DETECTED" } else { "NOT DETECTED" };
        write!(f, "negative control {}: {verdict} — {}", self.name, self.broken)?;
        if let Some(clean) = &self.clean {
            let verdict = if clean.is_safe() { "passes" } else { "FAILS" };
            write!(f, "\nclean twin of {}: {verdict} — {clean}", self.name)?;
        }
        Ok(())
    }
}

/// Runs `control` with its switch on, and then without it.
#[allow(dead_code)] // Only the bench (benches/operator_safety.rs) runs both twins; the test runs the broken one.
pub async fn run(control: Control, seed: u64) -> Outcome {
    let broken = scenario_for(control, seed, true).await;
    let clean = Some(scenario_for(control, seed, false).await);
    Outcome {
        name: control.name(),
        broken,
        clean,
    }
}

/// Runs `control` with its switch on only.
#[allow(dead_code)] // Only the test (tests/operator_safety.rs) runs the broken twin alone; the bench runs `run`.
pub async fn run_broken(control: Control, seed: u64) -> Outcome {
    Outcome {
        name: control.name(),
        broken: scenario_for(control, seed, true).await,
        clean: None,
    }
}

/// Runs `control`'s clean twin only (its switch off): it must pass.
#[allow(dead_code)] // Only the test (tests/operator_safety.rs) runs the clean twin alone, on demand.
pub async fn run_clean(control: Control, seed: u64) -> Report {
    scenario_for(control, seed, false).await
}

pub(super) fn base(seed: u64, switched_on: Option<Control>) -> Scenario {
    Scenario {
        seed,
        job_seconds: 20.0..30.0,
        failing_jobs: false,
        controls: switched_on
            .map(|control| control.name().to_owned())
            .unwrap_or_default(),
        ..Scenario::default()
    }
}

async fn scenario_for(control: Control, seed: u64, on: bool) -> Report {
    let switched = on.then_some(control);
    match control {
        Control::NoQuarantine => no_quarantine(seed, switched).await,
        Control::NoFloorRecord => no_floor_record(seed, switched).await,
        Control::FenceAfterValidity => fence_after_validity(seed, switched).await,
        Control::ReleaseAtOnce => release_at_once(seed, switched).await,
        // A holder's control: the guards' switch, not the operator's.
        Control::HoldersTrustWallClock => {
            super::guard_controls::skewed_run(seed, super::guard_controls::Skew::Behind, on).await
        }
    }
}

/// Whether the history holds an overlap already.
pub(super) fn overlapped(world: &World) -> bool {
    !find_overlaps(&world.recorder.beliefs(), 1).is_empty()
}

/// Whether the history shows the run's safeguard broken already: an overlap, a belief past the validity shown, a
/// promise seen broken, or a fence the operator logged after the validity it showed (in a run that checks it).
pub(super) fn caught(world: &World) -> bool {
    let late_fence = world.scenario.fences_before_validity
        && world.sides.iter().flat_map(|side| &side.replicas).any(|replica| {
            !super::fences::Fences(super::fences::parse(&replica.log()))
                .late()
                .is_empty()
        });
    overlapped(world)
        || !world.recorder.late_beliefs().is_empty()
        || !world.recorder.broken_promises().is_empty()
        || late_fence
}

/// Waits (at most a minute) until a holder acts on `key` with `token` (writes the protected resource with it):
/// the holder believes, however slow the machine was to show it the grant, before a fault is thrown at it.
pub(super) async fn acting(world: &World, key: &str, token: Option<i64>) -> bool {
    let Some(token) = token else { return false };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        let writes = world.recorder.resource.writes();
        if writes
            .iter()
            .any(|write| write.key == key && write.token == token)
        {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    false
}

/// Waits (at most a minute) until lock `name` of side `side` shows `Held`; its token.
pub(super) async fn held(world: &World, side: usize, name: &str) -> Option<i64> {
    let locks = world.sides[side].cluster.locks();
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(lock) = locks.get(name).await
            && let Some(status) = lock.status
            && status.phase == Some(LockPhase::Held)
        {
            return status.fencing_token;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Which side holds `name` now, if one does.
pub(super) async fn holding_side(world: &World, name: &str) -> Option<usize> {
    for (index, side) in world.sides.iter().enumerate() {
        if let Ok(lock) = side.cluster.locks().get(name).await
            && lock.status.and_then(|status| status.phase) == Some(LockPhase::Held)
        {
            return Some(index);
        }
    }
    None
}

fn restart_masters(world: &mut World, targets: &[usize]) {
    world
        .recorder
        .nemesis(format!("masters {targets:?} SIGKILLed and restarted empty"));
    let (masters, recorder) = (&mut world.masters, &world.recorder);
    tokio::task::block_in_place(|| {
        for &index in targets {
            masters[index].restart().expect("restart a master");
            recorder.master_restarted(index);
        }
    });
}

const NO_QUARANTINE_TTL: Duration = Duration::from_secs(20);

/// Two clusters' identity locks on one key. A majority of masters restarts empty while one cluster holds the
/// key, and that cluster is cut from them (so its keeper cannot write the key back there) until the other cluster
/// holds the key, or the quarantine has passed: the other cluster's operator, trusting the empty masters at once,
/// takes the key while they are quarantined. That grant is counted as a violation by construction
/// (`Scenario::grants_after_quarantine`), whether or not the cut-off holder still believed then; with the
/// quarantine, no grant comes before it ends.
async fn no_quarantine(seed: u64, switched: Option<Control>) -> Report {
    let mut world = World::start(Scenario {
        clusters: 2,
        identity_locks: 1,
        // At 20 s the cut-off holder believes for 6 s or more after the cut, so the grant usually overlaps it too
        // (at 3 s it never did in eight rounds, seed 17155454537170762093); the quarantine (20.3 s) is what
        // the check counts on.
        identity_ttl: NO_QUARANTINE_TTL,
        ttl: NO_QUARANTINE_TTL,
        grants_after_quarantine: true,
        ..base(seed, switched)
    })
    .await;
    let from = Instant::now();
    let key = world.sides[0].identities[0].key.clone();
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut holder = None;
    while holder.is_none() && Instant::now() < deadline {
        holder = holding_side(&world, "ident-0").await;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let Some(side) = holder else {
        return world.finish(from).await;
    };
    let token = held(&world, side, "ident-0").await;
    acting(&world, &key, token).await;
    let cluster = world.sides[side].cluster.name.clone();
    world.recorder.nemesis(format!(
        "{cluster} cut from masters [0, 1, 2] until the other cluster holds the key"
    ));
    for index in 0..3 {
        world.sides[side].links[index].hold(Direction::Both, true);
    }
    restart_masters(&mut world, &[0, 1, 2]);
    let other = (side + 1) % world.sides.len();
    let until = Instant::now() + super::quarantine(NO_QUARANTINE_TTL) + Duration::from_secs(5);
    let mut other_holds = false;
    while !other_holds && Instant::now() < until {
        other_holds = holding_side_is(&world, other, "ident-0").await == Some(true);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    for index in 0..3 {
        world.sides[side].links[index].hold(Direction::Both, false);
    }
    if other_holds {
        // Its holder acts on the grant before the run ends: its belief is what the check counts.
        let token = held(&world, other, "ident-0").await;
        acting(&world, &key, token).await;
    }
    world.finish(from).await
}

/// Whether side `side` shows lock `name` `Held`, if the lock could be read.
async fn holding_side_is(world: &World, side: usize, name: &str) -> Option<bool> {
    let lock = world.sides[side].cluster.locks().get(name).await.ok()?;
    Some(lock.status.and_then(|status| status.phase) == Some(LockPhase::Held))
}

/// Holdings (beliefs of a holder and token not believed before the restarts: a grant from empty masters may give
/// the token again) that began while a majority of the `masters` were in
/// their restart `quarantine`: no majority could vote for them then. The restarts are stamped once a master is
/// up again, a little after it started counting its quarantine: a second less of it is counted, so that a grant
/// right at its end is not taken for one inside it.
pub(super) fn grants_in_quarantine(
    recorder: &super::recorder::Recorder,
    masters: usize,
    quarantine: Duration,
) -> Vec<String> {
    let counted = quarantine.saturating_sub(Duration::from_secs(1));
    let restarts = recorder.master_restarts();
    let beliefs = recorder.beliefs();
    let mut found = Vec::new();
    for belief in &beliefs {
        let quarantined: Vec<(usize, Instant)> = (0..masters)
            .filter_map(|master| {
                restarts
                    .iter()
                    .filter(|&&(index, at)| {
                        index == master && at <= belief.start && belief.start < at + counted
                    })
                    .map(|&(_, at)| (master, at))
                    .max_by_key(|&(_, at)| at)
            })
            .collect();
        if quarantined.len() <= masters / 2 {
            continue;
        }
        let Some(first_restart) = quarantined.iter().map(|&(_, at)| at).min() else {
            continue;
        };
        let known_before = beliefs.iter().any(|earlier| {
            earlier.resource == belief.resource
                && earlier.client == belief.client
                && earlier.token == belief.token
                && earlier.start < first_restart
        });
        if !known_before {
            found.push(format!(
                "{} began believing token {} of {} {} ms after {} of {masters} masters restarted, inside their quarantine of {} ms",
                belief.client,
                belief.token,
                belief.resource,
                (belief.start - first_restart).as_millis(),
                quarantined.len(),
                quarantine.as_millis()
            ));
        }
    }
    found
}

/// One identity lock, deleted and created again (each object starts with no status, so its token comes from
/// the masters' counters and the cluster's floor record), then every master restarts empty and the lock is
/// created once more: without the floor record its token starts again from 1.
async fn no_floor_record(seed: u64, switched: Option<Control>) -> Report {
    let mut world = World::start(Scenario {
        identity_locks: 1,
        ..base(seed, switched)
    })
    .await;
    let from = Instant::now();
    let key = world.sides[0].identities[0].key.clone();
    // Each identity's holder acts on its grant before the next: the later token 1 is then a regression against
    // a belief recorded, however late the holder saw its status.
    let token = held(&world, 0, "ident-0").await;
    acting(&world, &key, token).await;
    for _ in 0..2 {
        world.recorder.nemesis("ident-0 deleted and created again".into());
        let side = &mut world.sides[0];
        side.identities[0].recreate(&side.cluster).await;
        let token = held(&world, 0, "ident-0").await;
        acting(&world, &key, token).await;
    }
    world.recorder.nemesis("ident-0 deleted".into());
    let _ = world.sides[0]
        .cluster
        .locks()
        .delete("ident-0", &Default::default())
        .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    restart_masters(&mut world, &[0, 1, 2, 3, 4]);
    world.recorder.nemesis("ident-0 created again".into());
    let side = &mut world.sides[0];
    side.identities[0].recreate(&side.cluster).await;
    let token = held(&world, 0, "ident-0").await;
    acting(&world, &key, token).await;
    world.finish(from).await
}

/// A Job lock whose Jobs run long, and a `lock` process outside Kubernetes on the same key. The cluster is cut
/// from a majority of masters while a Job runs: its lock cannot be extended, and the Job must be stopped before
/// the validity ends, when the outside process gets the key. Its pods run without the guard: the operator's
/// fencing is what this control breaks, and users whose Jobs do not run under the guard have only that.
async fn fence_after_validity(seed: u64, switched: Option<Control>) -> Report {
    cut_while_jobs_run(seed, switched, 1).await
}

/// The operator's fence timing where issue 29 saw a Job run 0.57 s past a `lock` process's grant: the clean
/// twin of `fence-after-validity` on a Job lock of three permits (a semaphore: the reconcile that fences one permit
/// also acquires and shows the others) contended by `lock --permits 3` processes. Its report gives, per fence,
/// how late the lock was looked at, how long the fence's writes took and how much validity was left.
#[allow(dead_code)] // Only the bench (benches/operator_safety.rs) runs it.
pub async fn semaphore_fence_timing(seed: u64) -> Report {
    cut_while_jobs_run(seed, None, 3).await
}

/// A Job lock of `permits` whose Jobs run long (without the guard), `lock` processes on its key, and the cluster
/// cut from a majority of masters half a second after a grant, six times.
async fn cut_while_jobs_run(seed: u64, switched: Option<Control>, permits: usize) -> Report {
    let world = World::start(Scenario {
        job_locks: 1,
        job_guard: None,
        outside_clients: permits,
        churn_keys: 1,
        permits,
        // Only the masters are cut: the operator runs and reaches its API server throughout, so it must fence
        // before the validity it showed, whether or not a `lock` process takes the key in time to overlap.
        fences_before_validity: true,
        ..base(seed, switched)
    })
    .await;
    let from = Instant::now();
    let key = world.sides[0].jobs[0].key.clone();
    for _ in 0..6 {
        let token = held(&world, 0, "jobs-0").await;
        // A Job's pod works under the grant (with permits, under one of them) before the cut.
        if permits == 1 {
            acting(&world, &key, token).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        world
            .recorder
            .nemesis("east cut from masters [0, 1, 2] for 8s".into());
        for index in 0..3 {
            world.sides[0].links[index].hold(Direction::Both, true);
        }
        tokio::time::sleep(Duration::from_secs(8)).await;
        for index in 0..3 {
            world.sides[0].links[index].hold(Direction::Both, false);
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
        // A late fence is in the replica's log once written: the broken twin ends at its first.
        if caught(&world) {
            break;
        }
    }
    world.finish(from).await
}

/// A leader-election lock of three pods, and a `lock` process outside Kubernetes on its key. The pods' link to the
/// API server stalls (they go on believing up to the validity they were shown: they stop at their fence time) and
/// the leader becomes unready: the operator removes its label — which it cannot see — and gives the key up. It
/// must not release it before the validity shown to the old leader has ended, or the `lock` process takes it
/// while the old leader still acts. The key is read on every master directly throughout, and a release (its
/// value gone from a majority) while its leader still believed is counted as a violation by construction,
/// whether or not the `lock` process took the key in that gap.
async fn release_at_once(seed: u64, switched: Option<Control>) -> Report {
    let world = World::start(Scenario {
        leader_locks: 1,
        pods_per_lock: 3,
        outside_clients: 1,
        outside_on_cluster_keys: true,
        ..base(seed, switched)
    })
    .await;
    let from = Instant::now();
    let key = world.sides[0].leaders[0].key.clone();
    let watch = KeyWatch::start(world.masters.urls(), key.clone());
    for _ in 0..3 {
        let token = held(&world, 0, "leader-0").await;
        // The leader acts on its grant before its link stalls, however slow the machine.
        acting(&world, &key, token).await;
        let side = &world.sides[0];
        let Some(leader) = side.leaders[0].labelled(&side.cluster).await.into_iter().next() else {
            continue;
        };
        world.recorder.nemesis(format!(
            "the pods' API link stalled for 5s, and {leader} unready for 5s"
        ));
        side.holders_link.hold(Direction::Both, true);
        set_ready(&side.cluster, &leader, false).await;
        tokio::time::sleep(Duration::from_secs(5)).await;
        side.holders_link.hold(Direction::Both, false);
        set_ready(&side.cluster, &leader, true).await;
        tokio::time::sleep(Duration::from_secs(1)).await;
        // The old leader's belief is recorded once its pod sees the label gone, after the stall.
        for broken in watch.released_while_believed(&world.recorder.beliefs()) {
            world.recorder.broken_promise(broken);
        }
        if caught(&world) {
            break;
        }
    }
    watch.stop().await;
    world.finish(from).await
}

/// What a majority of the masters held for one key, read directly (no lock logic in between).
#[derive(Clone, Debug)]
struct KeySample {
    /// When the reads were sent, and when the last answered.
    sent: Instant,
    answered: Instant,
    value: Option<String>,
}

/// Reads a key on every master every 20 ms, until stopped.
struct KeyWatch {
    key: String,
    samples: std::sync::Arc<std::sync::Mutex<Vec<KeySample>>>,
    stop: tokio_util::sync::CancellationToken,
    task: tokio::task::JoinHandle<()>,
}

impl KeyWatch {
    fn start(urls: Vec<String>, key: String) -> Self {
        let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let stop = tokio_util::sync::CancellationToken::new();
        let task = tokio::spawn(watch_key(urls, key.clone(), samples.clone(), stop.clone()));
        Self {
            key,
            samples,
            stop,
            task,
        }
    }

    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }

    /// Each belief of the key by a leader during which the value a majority of masters held changed: the key was
    /// released (or taken) while its holder still believed. A change is placed no later than the answer that
    /// showed it, and counted only if that answer came before the belief ended, after a read sent once it began.
    fn released_while_believed(&self, beliefs: &[crate::support::history::Interval]) -> Vec<String> {
        let samples = self.samples.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let mut found = Vec::new();
        for belief in beliefs
            .iter()
            .filter(|belief| belief.resource == self.key && super::rules::is_leader_holder(&belief.client))
        {
            let mut inside = samples
                .iter()
                .filter(|sample| sample.sent > belief.start && sample.answered < belief.end);
            let Some(first) = inside.next() else { continue };
            if first.value.is_none() {
                continue;
            }
            if let Some(changed) = inside.find(|sample| sample.value != first.value) {
                found.push(format!(
                    "key {} released while {} believed token {}: its value left a majority of the masters {} ms before the belief ended",
                    self.key,
                    belief.client,
                    belief.token,
                    (belief.end - changed.answered).as_millis()
                ));
            }
        }
        found
    }
}

async fn watch_key(
    urls: Vec<String>,
    key: String,
    samples: std::sync::Arc<std::sync::Mutex<Vec<KeySample>>>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut connections: Vec<Option<redis::aio::MultiplexedConnection>> = vec![None; urls.len()];
    while !stop.is_cancelled() {
        let sent = Instant::now();
        let mut values = Vec::new();
        let mut complete = true;
        for (url, connection) in urls.iter().zip(connections.iter_mut()) {
            if connection.is_none() {
                *connection = match redis::Client::open(url.as_str()) {
                    Ok(client) => client.get_multiplexed_async_connection().await.ok(),
                    Err(_) => None,
                };
            }
            let Some(conn) = connection.as_mut() else {
                complete = false;
                continue;
            };
            let read = tokio::time::timeout(
                Duration::from_millis(200),
                redis::cmd("GET").arg(&key).query_async::<Option<String>>(conn),
            )
            .await;
            match read {
                Ok(Ok(value)) => values.push(value),
                _ => {
                    *connection = None;
                    complete = false;
                }
            }
        }
        let answered = Instant::now();
        // A master not read says nothing of the key: the sample is left out rather than taken for a release.
        if !complete {
            tokio::time::sleep(Duration::from_millis(20)).await;
            continue;
        }
        let majority = values.iter().flatten().find(|value| {
            values
                .iter()
                .filter(|other| other.as_ref() == Some(*value))
                .count()
                > urls.len() / 2
        });
        let sample = KeySample {
            sent,
            answered,
            value: majority.cloned(),
        };
        samples.lock().unwrap_or_else(|e| e.into_inner()).push(sample);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}
