//! A Job pod's `redlock-operator guard`, as the harness plays it: the guard's own functions (`term::follow`,
//! `guard::granted_term`, `term::current_term`, `term::watch_term`, `report::report_stopped`), composed as
//! `guard::run` composes them, on a watch of the lock through the holders' link to the API server (which the
//! nemesis cuts with the cluster's outages). The guard's command is the pod's work: it starts once the pod runs
//! and the grant the pod was created under shows current, and stops when the guard's watch fires (the grant gone,
//! or its fence time come, whatever the API server or the operator do; SIGKILLed half a margin later if it takes
//! longer), when the pod is deleted (the kubelet's SIGTERM, passed on: the work takes `work_stop_delay` to exit),
//! or when the pod stops running, whichever comes first. Then the guard reports the work stopped to the operator,
//! with a token bound to the pod, as the real one does.
//!
//! Played in the harness, not run as a process in the pod, so that the same run works on a real cluster, whose
//! Job pods run an image without the binary; the functions are the binary's. What the harness cannot play there
//! is the pod's exit: on a test API server, a pod whose guard stopped its work fails with exit status 76 (the
//! harness is its kubelet), as a real guarded pod does, and the Job's `podFailurePolicy` ignores it; on a real
//! cluster its container runs on, idle, until it ends by itself.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use redlock_operator::api::DistributedLock;
use redlock_operator::api::holder_contract::REPORT_TOKEN_AUDIENCE;
use redlock_operator::cli::exit_code;
use redlock_operator::cli::guard::{Grant, granted_term};
use redlock_operator::cli::report::{Reporter, report_stopped};
use redlock_operator::cli::stop_time::{Ask, Asked, HolderClock, Stopping, over_the_channel};
use redlock_operator::cli::term::{Sinks, Term, current_term, follow, watch_term};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::holder_cut::HolderCuts;
use super::recorder::{ACT_INTERVAL, Belief, Recorder};
use crate::support::pod_token::pod_token;

/// When a guard tells the operator that its work stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reports {
    /// Once the work has exited, as `guard` does.
    AfterTheWorkStopped,
    /// A negative control: as soon as it passes the stop on, while the work still runs.
    BeforeTheWorkStopped,
}

/// How the harness plays the guards of one cluster's Job pods.
#[derive(Clone)]
pub struct Guarding {
    /// The guards' link to the API server (cut with the cluster's outages).
    pub client: Client,
    /// The guards' `--fence-margin`.
    pub margin: Duration,
    pub reports: Reports,
    /// How long the work takes to exit once the guard passed SIGTERM on (0: at once, as `sleep` does).
    pub work_stop_delay: Duration,
    /// The guards' wall clock (shifted from the operator's, or trusted against status: `Scenario::guard_clock`).
    pub clock: HolderClock,
    /// Whether a belief that outlasts every validity its guard was shown is recorded as a violation.
    pub within_shown_validity: bool,
    /// Whether the harness is the Job pods' kubelet (a test API server's), and ends a pod whose guard stopped
    /// its work with exit status 76.
    pub ends_pods: bool,
    /// Where the pods' report tokens are written (the projected volume of a real pod).
    pub token_dir: Arc<tempfile::TempDir>,
    /// The pods cut off from the API server and the operator (`holder_cut.rs`).
    pub cuts: Arc<HolderCuts>,
    /// The negative control `holder-keeps-working-when-cut`: a cut pod's guard lets its work run on when its
    /// grant is not told current in time.
    pub keeps_working_when_cut: bool,
}

/// The pod a guard runs in, and what it was created under.
pub struct GuardedPod {
    pub name: String,
    pub namespace: String,
    pub lock: String,
    pub job: String,
    pub grant: Grant,
    /// The resource its work acts on (the grant's permit of its key), and its holder name in the history.
    pub resource: String,
    pub holder: String,
}

/// Why the work ended.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stopped {
    /// The guard stopped it: its grant ended or was not shown current in time (exit 76, reported).
    OnLoss,
    /// The pod is being deleted: the kubelet's SIGTERM, passed on (reported).
    Signalled,
    /// The pod stopped running otherwise (the work ended by itself), or the run ended: not reported.
    Otherwise,
}

/// Runs the pod's guard until the pod stops running, its guard stopped the work, or `stop`; records the work's
/// interval (if it ever started) and reports it stopped. `pods` reads the pod directly (the harness's own
/// client).
pub async fn run(
    pod: GuardedPod,
    guarding: Guarding,
    pods: Api<Pod>,
    recorder: Arc<Recorder>,
    stop: CancellationToken,
) {
    let locks: Api<DistributedLock> = Api::namespaced(guarding.client.clone(), &pod.namespace);
    let (terms_sender, mut terms) = watch::channel(None::<Term>);
    let (seen, latest) = watch::channel(None);
    let watching = CancellationToken::new();
    let _stop_watching = watching.clone().drop_guard();
    let (job, grant) = (pod.job.clone(), pod.grant);
    // The watch's deliveries pass through a relay that holds them while the pod is cut off, as a route that
    // drops its packets holds a watch's: nothing arrives, and what the API server shows comes once it is back.
    let (watched_terms, watched_seen) = (watch::channel(None::<Term>), watch::channel(None));
    tokio::spawn(follow(
        locks,
        pod.lock.clone(),
        move |lock| granted_term(lock, &job, grant),
        Sinks {
            terms: watched_terms.0,
            seen: watched_seen.0,
        },
        watching.clone(),
    ));
    tokio::spawn(relay_unless_cut(
        (watched_terms.1, watched_seen.1),
        Sinks {
            terms: terms_sender,
            seen,
        },
        (guarding.cuts.clone(), pod.name.clone()),
        watching.clone(),
    ));
    let token_file = write_report_token(&pods, &pod, &guarding).await;

    // The command starts once the grant shows current and the active replica tells how long it stays valid, if
    // the pod still runs then.
    let told = Arc::new(Mutex::new(None::<Instant>));
    let stopping = Stopping {
        margin: guarding.margin,
        max_clock_skew: Duration::from_secs(1),
        namespace: pod.namespace.clone(),
        lock: pod.lock.clone(),
        ask: recording_answers(told.clone(), (guarding.cuts.clone(), pod.name.clone())),
        tool: "guard (product checker)",
        clock: guarding.clock,
    };
    let (current, stop_at) = {
        let waiting = current_term(&mut terms, &latest, &stopping);
        let mut waiting = std::pin::pin!(waiting);
        loop {
            tokio::select! {
                current = &mut waiting => match current {
                    Some(current) => break current,
                    None => return,
                },
                () = stop.cancelled() => return,
                () = tokio::time::sleep(ACT_INTERVAL) => {
                    if read(&pods, &pod.name).await != PodState::Running {
                        return;
                    }
                }
            }
        }
    };
    let lost = CancellationToken::new();
    let fence = tokio::spawn(watch_term(
        (terms.clone(), latest.clone()),
        current.clone(),
        stop_at,
        stopping.clone(),
        lost.clone(),
    ));
    let belief = Belief {
        key: pod.resource.clone(),
        holder: pod.holder.clone(),
        token: current.token,
        start: Instant::now(),
        // The guard's watch ends the work; it has no fence time of its own beside it.
        fence_at: Instant::now() + Duration::from_secs(24 * 3600),
        evidence: format!(
            "Job pod {}'s guard started its work with token {}",
            pod.name, current.token
        ),
    };
    let report = |token_file: PathBuf| {
        let (job, lock, current, latest) =
            (pod.job.clone(), pod.lock.clone(), current.clone(), latest.clone());
        async move {
            let reporter = Reporter {
                holder: &job,
                lock: &lock,
                token_file: &token_file,
                tool: "guard (product checker)",
            };
            report_stopped(&reporter, &current, latest).await;
        }
    };
    // The latest end of a validity status showed for the grant, on this process's clock (the operator's: one
    // machine), beside what the replica told (`told`).
    let mut shown_until = belief.start;
    // The first moment the work ran past every validity shown so far, and how far: a validity shown only later (a
    // replica that resumed the grant after a lapse) does not cover the lapse, when anyone could have taken the key.
    let mut past_shown: Option<Duration> = None;
    let mut early_report = None;
    let mut last_running = belief.start;
    // When the guard passed the kubelet's SIGTERM on, and when its own fence fired (SIGTERM to the work, SIGKILL
    // half a margin later).
    let (mut signalled_at, mut lost_at): (Option<Instant>, Option<Instant>) = (None, None);
    let far = Instant::now() + Duration::from_secs(24 * 3600);
    let (end, stopped) = loop {
        let exits_at = [
            signalled_at.map(|at| at + guarding.work_stop_delay),
            lost_at.map(|at| at + guarding.work_stop_delay.min(guarding.margin / 2)),
        ]
        .into_iter()
        .flatten()
        .min();
        // The work acts until it has exited, not after.
        if exits_at.is_none_or(|at| Instant::now() < at) {
            belief.act(&recorder);
        }
        if let Some(shown) = latest
            .borrow()
            .as_deref()
            .and_then(|lock| granted_term(lock, &pod.job, pod.grant))
        {
            shown_until = shown_until.max(instant_of(shown.valid_until));
        }
        let known = told
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map_or(shown_until, |told| told.max(shown_until));
        let now = Instant::now();
        if now > known && past_shown.is_none() {
            past_shown = Some(now - known);
        }
        let why = if lost_at.is_some() {
            Stopped::OnLoss
        } else {
            Stopped::Signalled
        };
        let early = |token_file: &Option<PathBuf>, early_report: &mut Option<_>| {
            if guarding.reports == Reports::BeforeTheWorkStopped
                && let Some(file) = token_file.clone()
            {
                early_report.get_or_insert_with(|| (Instant::now(), tokio::spawn(report(file))));
            }
        };
        // The control's guard lets the work run on once it is cut off: its asks unanswered, it ignores the stop.
        let ignores_loss = guarding.keeps_working_when_cut && guarding.cuts.is_cut(&pod.name);
        tokio::select! {
            () = lost.cancelled(), if lost_at.is_none() && !ignores_loss => {
                lost_at = Some(Instant::now());
                early(&token_file, &mut early_report);
                continue;
            }
            () = tokio::time::sleep_until(exits_at.unwrap_or(far)), if exits_at.is_some() => {
                break (exits_at.unwrap_or(far), why);
            }
            () = stop.cancelled() => break (Instant::now(), Stopped::Otherwise),
            () = tokio::time::sleep(ACT_INTERVAL) => {}
        }
        let asked = Instant::now();
        match read(&pods, &pod.name).await {
            PodState::Running => last_running = asked,
            // The kubelet's SIGTERM came after the last read that showed the pod not being deleted.
            PodState::Deleting => {
                if signalled_at.is_none() {
                    signalled_at = Some(last_running);
                    early(&token_file, &mut early_report);
                }
            }
            PodState::Ended => {
                let why = if lost_at.is_some() || signalled_at.is_some() {
                    why
                } else {
                    Stopped::Otherwise
                };
                break (last_running, why);
            }
        }
    };
    fence.abort();
    let shown_until = told
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .map_or(shown_until, |told| told.max(shown_until));
    if guarding.within_shown_validity && end > shown_until {
        recorder.late_belief(format!(
            "Job pod {}'s work under token {} ran {} ms past every validity its guard was shown (status's, or told by the active replica)",
            pod.name,
            belief.token,
            (end - shown_until).as_millis()
        ));
    } else if guarding.within_shown_validity
        && let Some(past) = past_shown
    {
        recorder.late_belief(format!(
            "Job pod {}'s work under token {} ran past every validity its guard had been shown by then ({} ms past, the first time it looked), before a later one was shown",
            pod.name,
            belief.token,
            past.as_millis()
        ));
    }
    let token = belief.token;
    belief.end(&recorder, end, "its work exited");
    // A pod still cut off reaches no operator: its report is never taken.
    if stopped != Stopped::Otherwise
        && guarding.reports == Reports::AfterTheWorkStopped
        && !guarding.cuts.is_cut(&pod.name)
        && let Some(file) = token_file
    {
        report(file).await;
    }
    if let Some((sent, early)) = early_report {
        // The guard's promise, counted whether or not a `lock` process took the key in time to overlap: the
        // operator releases a key on the word, so a report sent while the work runs lets another holder in.
        if sent < end {
            recorder.broken_promise(format!(
                "Job pod {}'s guard reported its work under token {} stopped {} ms before it exited",
                pod.name,
                token,
                (end - sent).as_millis()
            ));
        }
        let _ = early.await;
    }
    if stopped == Stopped::OnLoss && guarding.ends_pods {
        fail_with_lock_lost(&pods, &pod.name).await;
    }
}

/// How long an ask of a cut-off pod waits for its answer before it fails: the guard's own ask timeout.
const CUT_ASK_TIMEOUT: Duration = Duration::from_secs(2);

/// Asks over the pinned channel as the guard does, keeping in `told` the latest end of a validity the replica told
/// (when the answer came, plus what it said: never before the validity's true end). While `pod` is cut off an ask
/// gets no answer: it fails after the guard's timeout, as over a route that drops its packets.
fn recording_answers(told: Arc<Mutex<Option<Instant>>>, (cuts, pod): (Arc<HolderCuts>, String)) -> Ask {
    let channel = over_the_channel();
    Arc::new(move |to, question| {
        let told = told.clone();
        if cuts.is_cut(&pod) {
            return Box::pin(async move {
                tokio::time::sleep(CUT_ASK_TIMEOUT).await;
                Asked::Failed {
                    message: "no answer in time (the pod is cut off)".into(),
                    retry_after: None,
                }
            });
        }
        let asked = channel(to, question);
        Box::pin(async move {
            let answer = asked.await;
            if let Asked::Valid { remaining, .. } = &answer {
                let until = Instant::now() + *remaining;
                let mut told = told.lock().unwrap_or_else(|e| e.into_inner());
                *told = Some(told.map_or(until, |earlier| earlier.max(until)));
            }
            answer
        })
    })
}

/// Passes what the pod's watch delivers on to its guard while the pod is not cut off, and the latest of it once
/// the cut is healed.
async fn relay_unless_cut(
    (mut terms, mut seen): (
        watch::Receiver<Option<Term>>,
        watch::Receiver<Option<Arc<DistributedLock>>>,
    ),
    sinks: Sinks,
    (cuts, pod): (Arc<HolderCuts>, String),
    stop: CancellationToken,
) {
    let mut changes = cuts.changes();
    loop {
        // Taken as seen whether or not it is passed on: once healed, the change of the cut passes the latest on.
        let term = terms.borrow_and_update().clone();
        let lock = seen.borrow_and_update().clone();
        changes.borrow_and_update();
        if !cuts.is_cut(&pod) {
            if *sinks.terms.borrow() != term {
                sinks.terms.send_replace(term);
            }
            let same = match (&*sinks.seen.borrow(), &lock) {
                (Some(relayed), Some(lock)) => Arc::ptr_eq(relayed, lock),
                (None, None) => true,
                _ => false,
            };
            if !same {
                sinks.seen.send_replace(lock);
            }
        }
        tokio::select! {
            changed = terms.changed() => if changed.is_err() { return },
            changed = seen.changed() => if changed.is_err() { return },
            changed = changes.changed() => if changed.is_err() { return },
            () = stop.cancelled() => return,
        }
    }
}

/// The instant of this process's monotonic clock when its wall clock shows `at`.
pub(super) fn instant_of(at: Timestamp) -> Instant {
    let now = Instant::now();
    let left = at.duration_since(Timestamp::now());
    match Duration::try_from(left) {
        Ok(ahead) => now + ahead,
        Err(_) => now
            .checked_sub(Duration::try_from(-left).unwrap_or_default())
            .unwrap_or(now),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum PodState {
    Running,
    /// Being deleted: its kubelet sent SIGTERM.
    Deleting,
    /// Gone, or no longer running.
    Ended,
}

/// The pod as the API server shows it now (a direct read; an error counts as running, as a kubelet's container
/// goes on).
async fn read(pods: &Api<Pod>, name: &str) -> PodState {
    match pods.get_opt(name).await {
        Ok(Some(seen))
            if seen.status.as_ref().and_then(|status| status.phase.as_deref()) != Some("Running") =>
        {
            PodState::Ended
        }
        Ok(Some(seen)) if seen.metadata.deletion_timestamp.is_some() => PodState::Deleting,
        Ok(Some(_)) | Err(_) => PodState::Running,
        Ok(None) => PodState::Ended,
    }
}

/// The pod's projected token for the operator's audience, asked for as its kubelet asks (bound to the pod), in a
/// file of its own; `None` when the API server gave none (the guard then does not report).
async fn write_report_token(pods: &Api<Pod>, pod: &GuardedPod, guarding: &Guarding) -> Option<PathBuf> {
    let client: Client = pods.clone().into_client();
    for _ in 0..5 {
        if let Ok(token) = pod_token(&client, &pod.namespace, &pod.name, REPORT_TOKEN_AUDIENCE).await
            && !token.is_empty()
        {
            let file = guarding.token_dir.path().join(&pod.name);
            std::fs::write(&file, token).ok()?;
            return Some(file);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    None
}

/// The pod's container exited with the guard's status for a grant that ended: the Job's `podFailurePolicy`
/// ignores it, and the Job controller starts a new pod that waits for its grant again.
async fn fail_with_lock_lost(pods: &Api<Pod>, name: &str) {
    let status = serde_json::json!({ "status": {
        "phase": "Failed",
        "containerStatuses": [{
            "name": "main", "image": "", "imageID": "", "ready": false, "restartCount": 0,
            "state": { "terminated": { "exitCode": exit_code::LOCK_LOST, "reason": "Error" } },
        }],
    }});
    let _ = pods
        .patch_status(name, &PatchParams::default(), &Patch::Merge(status))
        .await;
}
