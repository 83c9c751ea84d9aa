//! The run's history: every holder's belief intervals (as the holder saw them), every nemesis event, and the
//! periods when faults (and recovery from them) excuse a key having no holder. One monotonic clock.

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use super::holder_cut::CutRecord;
use super::protected::ProtectedResource;
use crate::support::history::Interval;

/// How often a believing holder writes to the protected resource.
pub const ACT_INTERVAL: Duration = Duration::from_millis(25);

#[derive(Clone, Debug)]
pub struct NemesisEvent {
    pub at: Instant,
    pub what: String,
}

#[derive(Default)]
pub struct Recorder {
    beliefs: Mutex<Vec<Interval>>,
    events: Mutex<Vec<NemesisEvent>>,
    excused: Mutex<Vec<(Instant, Instant)>>,
    restarts: Mutex<Vec<(usize, Instant)>>,
    /// The Jobs of the Job locks' first queues (`cluster/job`), and those of them that completed.
    first_queue: Mutex<(BTreeSet<String>, BTreeSet<String>)>,
    /// Beliefs that outlasted every validity their holder was shown (in runs that check it).
    late_beliefs: Mutex<Vec<String>>,
    /// Safeguards' promises seen broken (in runs that check them).
    broken_promises: Mutex<Vec<String>>,
    pub resource: ProtectedResource,
    /// What each holder cut off came to (`holder_cut.rs`).
    pub cuts: CutRecord,
}

impl Recorder {
    pub fn belief(&self, interval: Interval) {
        if std::env::var_os("REDLOCK_SAFETY_LOG").is_some() {
            eprintln!(
                "{:?} belief {} {} token {} {:?}..{:?} ({})",
                Instant::now(),
                interval.resource,
                interval.client,
                interval.token,
                interval.start,
                interval.end,
                interval.evidence
            );
        }
        self.beliefs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(interval);
    }

    pub fn beliefs(&self) -> Vec<Interval> {
        self.beliefs.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn nemesis(&self, what: String) {
        if std::env::var_os("REDLOCK_SAFETY_LOG").is_some() {
            eprintln!("{:?} nemesis {what}", Instant::now());
        }
        let event = NemesisEvent {
            at: Instant::now(),
            what,
        };
        self.events.lock().unwrap_or_else(|e| e.into_inner()).push(event);
    }

    pub fn nemesis_events(&self) -> Vec<NemesisEvent> {
        self.events.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// From now until `recovered` after `until`, keys may have no holder because of a fault.
    pub fn excuse(&self, from: Instant, until: Instant) {
        self.excused
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push((from, until));
    }

    /// Master `index` restarted empty now: it forgot every key and every fencing counter.
    pub fn master_restarted(&self, index: usize) {
        let restart = (index, Instant::now());
        self.restarts
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(restart);
    }

    pub fn master_restarts(&self) -> Vec<(usize, Instant)> {
        self.restarts.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Job `job` (`cluster/name`) is one of a first queue.
    pub fn queued_first(&self, job: String) {
        self.first_queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .insert(job);
    }

    /// Job `job` completed (it ran to its end: a Job completes only by running).
    pub fn job_completed(&self, job: &str) {
        let mut queue = self.first_queue.lock().unwrap_or_else(|e| e.into_inner());
        if queue.0.contains(job) {
            queue.1.insert(job.to_owned());
        }
    }

    pub fn first_queue(&self) -> BTreeSet<String> {
        self.first_queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .0
            .clone()
    }

    pub fn first_queue_completed(&self) -> BTreeSet<String> {
        self.first_queue
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .1
            .clone()
    }

    /// A belief that ended after every validity its holder was shown had ended: what, and by how much.
    pub fn late_belief(&self, what: String) {
        self.late_beliefs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(what);
    }

    pub fn late_beliefs(&self) -> Vec<String> {
        self.late_beliefs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// A safeguard's promise seen broken: what, and by how much.
    pub fn broken_promise(&self, what: String) {
        self.broken_promises
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .push(what);
    }

    pub fn broken_promises(&self) -> Vec<String> {
        self.broken_promises
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    pub fn excused(&self) -> Vec<(Instant, Instant)> {
        self.excused.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

/// A holder's current belief, as its process keeps it: from when it saw the grant, with the token it saw, until
/// it sees the grant gone or its own fence time comes.
#[derive(Clone, Debug)]
pub struct Belief {
    pub key: String,
    pub holder: String,
    pub token: i64,
    pub start: Instant,
    /// When the holder stops acting on its own, whatever it sees or does not see.
    pub fence_at: Instant,
    pub evidence: String,
}

impl Belief {
    /// Acts on the protected resource, if the holder still may (its fence time has not come).
    pub fn act(&self, recorder: &Recorder) {
        if Instant::now() < self.fence_at {
            recorder.resource.write(&self.key, self.token, &self.holder);
        }
    }

    /// Ends the belief at `now`, or at its fence time if that came first, and records it.
    pub fn end(self, recorder: &Recorder, now: Instant, why: &str) {
        let end = now.min(self.fence_at).max(self.start);
        recorder.belief(Interval {
            resource: self.key,
            client: self.holder,
            start: self.start,
            end,
            token: self.token,
            evidence: format!("{}; ended: {why}", self.evidence),
        });
    }
}
