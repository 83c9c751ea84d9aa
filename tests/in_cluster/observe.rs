//! Watches on the tutorials' namespace for the whole run, and the promises checked on every event: at most one pod
//! carries the leader label; no label outlives the `valid-until` shown beside it; no more Jobs of a lock run than
//! it has permits; tokens rise per lock and permit (from the pods' annotations); a lock shown `Lost`, and a Job
//! suspended, before the validity last shown. Every change goes into a timeline the drills read back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::jiff::Timestamp;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use kube::{Api, Client, ResourceExt};
use redlock_operator::api::DistributedLock;
use redlock_operator::api::holder_contract::{
    DEFAULT_LEADER_LABEL, PERMIT_ANNOTATION, TOKEN_ANNOTATION, VALID_UNTIL_ANNOTATION,
};

const LOCK_ANNOTATION: &str = "redlock.io/lock";
const JOB_NAME_LABEL: &str = "batch.kubernetes.io/job-name";

/// One thing the cluster did, as the watches saw it. Some fields are only read through `Debug`, in the timeline.
#[derive(Clone, Debug)]
#[allow(dead_code)]
pub enum Ev {
    Labelled {
        pod: String,
        token: Option<i64>,
    },
    Unlabelled {
        pod: String,
        valid_until: Option<Timestamp>,
    },
    /// A lock's phase, holder or token changed.
    Lock {
        lock: String,
        phase: String,
        holder: String,
        token: Option<i64>,
    },
    Queue {
        lock: String,
        holder: String,
        queue: Vec<String>,
    },
    JobPodRunning {
        lock: String,
        job: String,
        pod: String,
        permit: i32,
        token: Option<i64>,
    },
    JobPodStopped {
        lock: String,
        job: String,
        pod: String,
    },
    Suspended {
        job: String,
    },
    Unsuspended {
        job: String,
    },
    /// A promise broken: which one, and how.
    Violation(&'static str, String),
}

/// The promises the watches check, as the violations name them.
pub const TWO_LEADERS: &str = "at most one pod carries the leader label";
pub const LEADER_FENCE: &str = "no leader label outlives the valid-until shown with it";
pub const OVER_PERMITS: &str = "no more pods of a lock's Jobs run than it has permits";
pub const TOKENS_RISE: &str = "tokens rise per lock and permit (pods' annotations)";
pub const LATE_FENCE: &str = "locks shown Lost, and Jobs suspended, before the validity shown";
pub const PROMISES: [&str; 5] = [TWO_LEADERS, LEADER_FENCE, OVER_PERMITS, TOKENS_RISE, LATE_FENCE];

#[derive(Default)]
pub struct State {
    pub events: Vec<(Instant, Ev)>,
    /// Leader pods now: pod → (token, valid-until).
    pub leaders: BTreeMap<String, (Option<i64>, Option<Timestamp>)>,
    leader_token: Option<i64>,
    pub max_leaders: usize,
    /// Pods of a Job granted a lock, running now: pod → (lock, job, permit, token).
    running: BTreeMap<String, (String, String, i32, Option<i64>)>,
    /// Permits per lock, as the test declared them.
    pub permits: BTreeMap<String, usize>,
    pub max_running: BTreeMap<String, usize>,
    /// Grants seen on pods, per lock and permit, in the order they appeared: (job, token).
    pub grants: BTreeMap<(String, i32), Vec<(String, i64)>>,
    /// Locks as last seen.
    pub locks: BTreeMap<String, DistributedLock>,
    jobs_suspended: BTreeMap<String, bool>,
    fence_reported: BTreeSet<String>,
}

impl State {
    fn push(&mut self, ev: Ev) {
        self.events.push((Instant::now(), ev));
    }

    fn violation(&mut self, promise: &'static str, what: String) {
        self.push(Ev::Violation(promise, what));
    }

    /// The violations of `promise` so far.
    pub fn violations(&self, promise: &str) -> Vec<String> {
        self.events
            .iter()
            .filter_map(|(_, ev)| match ev {
                Ev::Violation(broken, what) if *broken == promise => Some(what.clone()),
                _ => None,
            })
            .collect()
    }

    /// The events since `since`.
    pub fn since(&self, since: Instant) -> impl Iterator<Item = &(Instant, Ev)> {
        self.events.iter().filter(move |(at, _)| *at >= since)
    }

    pub fn leader(&self) -> Option<(String, Option<i64>)> {
        self.leaders
            .iter()
            .next()
            .map(|(pod, (token, _))| (pod.clone(), *token))
    }

    pub fn lock(&self, name: &str) -> Option<&DistributedLock> {
        self.locks.get(name)
    }

    /// The fencing token the lock's status shows.
    pub fn token(&self, name: &str) -> Option<i64> {
        self.lock(name)?.status.as_ref()?.fencing_token
    }

    /// The token of the first pod of `job` seen running since `since`.
    pub fn job_running_since(&self, job: &str, since: Instant) -> Option<Option<i64>> {
        self.since(since).find_map(|(_, ev)| match ev {
            Ev::JobPodRunning {
                job: running, token, ..
            } if running == job => Some(*token),
            _ => None,
        })
    }

    fn on_pod(&mut self, pod: &Pod, gone: bool) {
        let name = pod.name_any();
        let labelled = !gone && pod.labels().get(DEFAULT_LEADER_LABEL).map(String::as_str) == Some("true");
        let token = annotation_i64(pod, TOKEN_ANNOTATION);
        let valid_until = pod
            .annotations()
            .get(VALID_UNTIL_ANNOTATION)
            .and_then(|text| text.parse::<Timestamp>().ok());
        let was = self.leaders.get(&name).cloned();
        match (was, labelled) {
            (None, true) => {
                if let (Some(new), Some(last)) = (token, self.leader_token)
                    && new <= last
                {
                    self.violation(
                        TOKENS_RISE,
                        format!(
                            "leader token did not rise: {name} labelled with token {new} after token {last}"
                        ),
                    );
                }
                self.leader_token = token.or(self.leader_token);
                self.leaders.insert(name.clone(), (token, valid_until));
                self.push(Ev::Labelled {
                    pod: name.clone(),
                    token,
                });
                self.max_leaders = self.max_leaders.max(self.leaders.len());
                if self.leaders.len() > 1 {
                    let pods: Vec<&String> = self.leaders.keys().collect();
                    self.violation(
                        TWO_LEADERS,
                        format!("{} pods carry the leader label at once: {pods:?}", pods.len()),
                    );
                }
            }
            (Some((old_token, shown)), true) => {
                if token != old_token {
                    self.violation(TOKENS_RISE, format!(
                        "leader {name} kept its label while its token changed from {old_token:?} to {token:?}"
                    ));
                    self.leader_token = token.or(self.leader_token);
                }
                self.leaders.insert(name, (token, valid_until.or(shown)));
            }
            (Some((_, shown)), false) => {
                self.leaders.remove(&name);
                self.push(Ev::Unlabelled {
                    pod: name,
                    valid_until: shown,
                });
            }
            (None, false) => {}
        }
        self.on_job_pod(pod, gone);
    }

    fn on_job_pod(&mut self, pod: &Pod, gone: bool) {
        let name = pod.name_any();
        let Some(lock) = pod.annotations().get(LOCK_ANNOTATION).cloned() else {
            return;
        };
        let job = pod.labels().get(JOB_NAME_LABEL).cloned().unwrap_or_default();
        let permit = annotation_i64(pod, PERMIT_ANNOTATION).unwrap_or(0) as i32;
        let token = annotation_i64(pod, TOKEN_ANNOTATION);
        if let Some(token) = token {
            let grants = self.grants.entry((lock.clone(), permit)).or_default();
            if !grants.iter().any(|(j, t)| *j == job && *t == token) {
                let last = grants.last().cloned();
                grants.push((job.clone(), token));
                if let Some((last_job, last_token)) = last
                    && token <= last_token
                {
                    self.violation(TOKENS_RISE, format!(
                        "token of {lock} permit {permit} did not rise: {job} granted {token} after {last_job} got \
                         {last_token}"
                    ));
                }
            }
        }
        let phase = pod.status.as_ref().and_then(|status| status.phase.as_deref());
        let running = !gone && phase == Some("Running");
        let was = self.running.contains_key(&name);
        if running && !was {
            self.running
                .insert(name.clone(), (lock.clone(), job.clone(), permit, token));
            self.push(Ev::JobPodRunning {
                lock: lock.clone(),
                job,
                pod: name,
                permit,
                token,
            });
            // Pods, not Jobs: a Job's next pod must not run either while a pod of an earlier grant still does.
            let pods: Vec<String> = self
                .running
                .iter()
                .filter(|(_, (l, ..))| *l == lock)
                .map(|(pod, (_, job, permit, token))| {
                    format!("{pod} ({job}, permit {permit}, token {token:?})")
                })
                .collect();
            let count = pods.len();
            let allowed = self.permits.get(&lock).copied().unwrap_or(1);
            let max = self.max_running.entry(lock.clone()).or_default();
            *max = (*max).max(count);
            if count > allowed {
                self.violation(
                    OVER_PERMITS,
                    format!("{count} pods of {lock}'s Jobs run at once ({allowed} permitted): {pods:?}"),
                );
            }
        } else if !running && was {
            self.running.remove(&name);
            self.push(Ev::JobPodStopped { lock, job, pod: name });
        }
    }

    fn on_job(&mut self, job: &Job, gone: bool) {
        let name = job.name_any();
        if gone {
            self.jobs_suspended.remove(&name);
            return;
        }
        let suspended = job.spec.as_ref().and_then(|spec| spec.suspend).unwrap_or(false);
        let was = self.jobs_suspended.insert(name.clone(), suspended);
        match (was, suspended) {
            (Some(false), true) => {
                // A suspension is the operator's fence of a running Job: it must come before the validity shown.
                let shown = self.valid_until_of_holder(&name);
                if let Some(shown) = shown
                    && Timestamp::now() >= shown
                {
                    self.violation(
                        LATE_FENCE,
                        format!("Job {name} suspended at or after the validity shown to it ({shown})"),
                    );
                }
                self.push(Ev::Suspended { job: name });
            }
            (Some(true), false) => self.push(Ev::Unsuspended { job: name }),
            _ => {}
        }
    }

    /// The validity status last showed for `holder`, on any lock and permit.
    fn valid_until_of_holder(&self, holder: &str) -> Option<Timestamp> {
        self.locks.values().find_map(|lock| {
            let status = lock.status.as_ref()?;
            if status.holder.as_deref() == Some(holder) {
                return status.valid_until.as_ref().map(|time| time.0);
            }
            status
                .holders
                .iter()
                .find(|permit| permit.holder == holder)
                .and_then(|permit| permit.valid_until.as_ref().map(|time| time.0))
        })
    }

    fn on_lock(&mut self, lock: &DistributedLock, gone: bool) {
        let name = lock.name_any();
        let old = if gone {
            self.locks.remove(&name)
        } else {
            self.locks.insert(name.clone(), lock.clone())
        };
        if gone {
            return;
        }
        let summary = |lock: &DistributedLock| {
            let status = lock.status.as_ref();
            (
                status
                    .and_then(|s| s.phase)
                    .map(|p| format!("{p:?}"))
                    .unwrap_or_default(),
                status.and_then(|s| s.holder.clone()).unwrap_or_default(),
                status.and_then(|s| s.fencing_token),
                status.map(|s| s.queue.clone()).unwrap_or_default(),
            )
        };
        let (phase, holder, token, queue) = summary(lock);
        let before = old.as_ref().map(summary);
        if before.as_ref().map(|(p, h, t, _)| (p, h, t)) != Some((&phase, &holder, &token)) {
            if phase == "Lost" {
                // Reported lost before the validity it last showed.
                let shown = old
                    .as_ref()
                    .and_then(|old| old.status.as_ref())
                    .and_then(|status| status.valid_until.as_ref())
                    .map(|time| time.0);
                if let Some(shown) = shown
                    && Timestamp::now() >= shown
                {
                    self.violation(
                        LATE_FENCE,
                        format!("{name} shown Lost at or after the validity it had shown ({shown})"),
                    );
                }
            }
            self.push(Ev::Lock {
                lock: name.clone(),
                phase,
                holder: holder.clone(),
                token,
            });
        }
        if before.as_ref().map(|(_, h, _, q)| (h, q)) != Some((&holder, &queue)) && !queue.is_empty() {
            self.push(Ev::Queue {
                lock: name,
                holder,
                queue,
            });
        }
    }

    /// Leader labels past the `valid-until` shown beside them (checked on a timer too: a watch says nothing
    /// while nothing changes).
    fn check_leader_fences(&mut self) {
        let now = Timestamp::now();
        let late: Vec<String> = self
            .leaders
            .iter()
            .filter(|(_, (_, until))| until.is_some_and(|until| now > until))
            .map(|(pod, (token, until))| format!("{pod} (token {token:?}, valid-until {until:?})"))
            .collect();
        for pod in late {
            if self.fence_reported.insert(pod.clone()) {
                self.violation(
                    LEADER_FENCE,
                    format!("leader label still on {pod} after its valid-until"),
                );
            }
        }
    }
}

fn annotation_i64(object: &impl ResourceExt, key: &str) -> Option<i64> {
    object.annotations().get(key).and_then(|value| value.parse().ok())
}

/// The watches and what they saw.
pub struct Observer {
    state: Arc<Mutex<State>>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Drop for Observer {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

impl Observer {
    pub fn start(client: &Client, namespace: &str) -> Self {
        let state = Arc::new(Mutex::new(State::default()));
        let mut tasks = Vec::new();
        let pods: Api<Pod> = Api::namespaced(client.clone(), namespace);
        tasks.push(tokio::spawn(follow(pods, state.clone(), State::on_pod)));
        let jobs: Api<Job> = Api::namespaced(client.clone(), namespace);
        tasks.push(tokio::spawn(follow(jobs, state.clone(), State::on_job)));
        let locks: Api<DistributedLock> = Api::namespaced(client.clone(), namespace);
        tasks.push(tokio::spawn(follow(locks, state.clone(), State::on_lock)));
        let ticking = state.clone();
        tasks.push(tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(100)).await;
                lock_state(&ticking).check_leader_fences();
            }
        }));
        Self { state, tasks }
    }

    pub fn state(&self) -> MutexGuard<'_, State> {
        lock_state(&self.state)
    }

    pub fn set_permits(&self, lock: &str, permits: usize) {
        self.state().permits.insert(lock.to_owned(), permits);
    }

    /// The timeline since `since`, one line per event, times in seconds after `origin`.
    pub fn timeline(&self, origin: Instant, since: Instant) -> String {
        let state = self.state();
        state
            .since(since)
            .map(|(at, ev)| {
                format!(
                    "{:7.2}s {ev:?}\n",
                    at.saturating_duration_since(origin).as_secs_f64()
                )
            })
            .collect()
    }
}

fn lock_state(state: &Mutex<State>) -> MutexGuard<'_, State> {
    state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Follows `api` with a watch, relists included: an object missing from a relist is gone.
async fn follow<K>(api: Api<K>, state: Arc<Mutex<State>>, apply: fn(&mut State, &K, bool))
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    K::DynamicType: Default,
{
    let mut known: BTreeMap<String, K> = BTreeMap::new();
    let mut relisted: Option<BTreeSet<String>> = None;
    let mut stream = watcher::watcher(api, watcher::Config::default())
        .default_backoff()
        .boxed();
    while let Some(event) = stream.next().await {
        let Ok(event) = event else { continue };
        let mut state = lock_state(&state);
        match event {
            Event::Apply(object) | Event::InitApply(object) => {
                let name = object.name_any();
                if let Some(seen) = relisted.as_mut() {
                    seen.insert(name.clone());
                }
                apply(&mut state, &object, false);
                known.insert(name, object);
            }
            Event::Delete(object) => {
                known.remove(&object.name_any());
                apply(&mut state, &object, true);
            }
            Event::Init => relisted = Some(BTreeSet::new()),
            Event::InitDone => {
                let seen = relisted.take().unwrap_or_default();
                let gone: Vec<String> = known
                    .keys()
                    .filter(|name| !seen.contains(*name))
                    .cloned()
                    .collect();
                for name in gone {
                    if let Some(object) = known.remove(&name) {
                        apply(&mut state, &object, true);
                    }
                }
            }
        }
    }
}

/// One check per promise the watches kept an eye on for the whole run.
pub fn summarize(report: &super::report::Report, observer: &Observer) {
    report.step("the promises, as the watches saw them for the whole run");
    let state = observer.state();
    for promise in PROMISES {
        let broken = state.violations(promise);
        let detail = match promise {
            TWO_LEADERS => format!("at most {} at once", state.max_leaders),
            OVER_PERMITS => format!("most running at once per lock: {:?}", state.max_running),
            TOKENS_RISE => format!("grants per lock and permit: {:?}", state.grants),
            _ => String::new(),
        };
        let detail = if broken.is_empty() {
            detail
        } else {
            format!("{detail}; broken: {broken:?}")
        };
        report.check(&format!("throughout: {promise}"), broken.is_empty(), detail);
    }
}
