//! Job fencing's queue: which Job may run, which must be suspended, and what to do next. Pure, so every rule
//! is tested without a cluster.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Pod, PodSpec};
use k8s_openapi::jiff::Timestamp;

use crate::api::holder_contract::{
    FENCED_ANNOTATION, FENCED_AT_ANNOTATION, LOCK_LABEL, PERMIT_ANNOTATION, PRIORITY_ANNOTATION,
    REQUEUED_ANNOTATION, STALE_ANNOTATION, TOKEN_ANNOTATION,
};
use crate::controller::cache::finished_pods::owning_job;

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct JobView {
    pub name: String,
    pub created: Option<Timestamp>,
    pub priority: i64,
    pub suspended: bool,
    /// Complete or Failed.
    pub finished: bool,
    /// The token written into its pod template when it was granted the lock.
    pub granted_token: Option<i64>,
    pub fenced_token: Option<i64>,
    pub fenced_at: Option<Timestamp>,
    /// Since when the Job controller has shown the Job suspended (its `Suspended=True` condition).
    pub suspended_since: Option<Timestamp>,
    pub stale: bool,
    pub requeued: bool,
    /// Active plus terminating pods.
    pub pods: i32,
    /// How long its pods may take to stop (the pod template's termination grace period, 30 s by default).
    pub grace: Duration,
    /// The permit its grant named (0 when it names none).
    pub permit: u32,
    /// Whether its pod template hands the grant's token to a container (what the guard needs to run the work).
    pub receives_grant: bool,
}

impl JobView {
    pub fn of(job: &Job) -> Self {
        let annotations = job.metadata.annotations.clone().unwrap_or_default();
        let template_annotations = job
            .spec
            .as_ref()
            .and_then(|spec| spec.template.metadata.as_ref())
            .and_then(|meta| meta.annotations.clone())
            .unwrap_or_default();
        let status = job.status.as_ref();
        let finished = status
            .and_then(|status| status.conditions.as_ref())
            .is_some_and(|conditions| {
                conditions
                    .iter()
                    .any(|c| (c.type_ == "Complete" || c.type_ == "Failed") && c.status == "True")
            });
        let suspended_since = status
            .and_then(|status| status.conditions.as_ref())
            .and_then(|conditions| {
                conditions
                    .iter()
                    .find(|c| c.type_ == "Suspended" && c.status == "True")
            })
            .map(|c| {
                c.last_transition_time
                    .as_ref()
                    .map_or(Timestamp::UNIX_EPOCH, |t| t.0)
            });
        let pods = status.map_or(0, |status| {
            status.active.unwrap_or(0) + status.terminating.unwrap_or(0)
        });
        let grace = job
            .spec
            .as_ref()
            .and_then(|spec| spec.template.spec.as_ref())
            .and_then(|pod| pod.termination_grace_period_seconds)
            .unwrap_or(30);
        Self {
            name: job.metadata.name.clone().unwrap_or_default(),
            created: job.metadata.creation_timestamp.as_ref().map(|time| time.0),
            priority: annotations
                .get(PRIORITY_ANNOTATION)
                .and_then(|p| p.trim().parse().ok())
                .unwrap_or(0),
            suspended: job.spec.as_ref().and_then(|spec| spec.suspend).unwrap_or(false),
            finished,
            granted_token: template_annotations
                .get(TOKEN_ANNOTATION)
                .and_then(|t| t.parse().ok()),
            fenced_token: annotations.get(FENCED_ANNOTATION).and_then(|t| t.parse().ok()),
            fenced_at: annotations.get(FENCED_AT_ANNOTATION).and_then(|t| t.parse().ok()),
            suspended_since,
            stale: annotations
                .get(STALE_ANNOTATION)
                .is_some_and(|value| value == "true"),
            requeued: annotations
                .get(REQUEUED_ANNOTATION)
                .is_some_and(|value| value == "true"),
            pods,
            grace: Duration::from_secs(u64::try_from(grace).unwrap_or(0)),
            permit: permit_of(&template_annotations),
            receives_grant: job
                .spec
                .as_ref()
                .and_then(|spec| spec.template.spec.as_ref())
                .is_some_and(receives_grant),
        }
    }

    /// Whether the Job controller has acted on the fencing: until it shows the Job suspended since the fencing,
    /// it may still be creating a pod from the Job as it was, one its status and our pod cache do not count yet.
    /// Conditions carry whole seconds, hence the comparison with the second of the fencing.
    fn fencing_acknowledged(&self) -> bool {
        if !self.suspended {
            return false;
        }
        match (self.suspended_since, self.fenced_at) {
            (None, _) => false,
            (Some(_), None) => true,
            (Some(since), Some(at)) => {
                Timestamp::from_second(at.as_second()).is_ok_and(|second| since >= second)
            }
        }
    }

    /// Waiting for a grant: never granted, or requeued for a new token.
    pub(super) fn waiting(&self) -> bool {
        !self.finished
            && !self.stale
            && (self.requeued || (self.granted_token.is_none() && self.fenced_token.is_none()))
    }
}

/// A pod started by a grant of the lock (the grant wrote the lock's name and the token into its template) that
/// has not finished. Counted from the pods themselves, not only from Job status: the pods of a deleted Job, or
/// of a Job whose status lags (or, before Kubernetes 1.29, does not count terminating pods), still run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantedPod {
    pub name: String,
    /// The Job that owns it; none once orphaned.
    pub job: Option<String>,
    pub token: Option<i64>,
    /// The permit of the grant that started it.
    pub permit: u32,
}

impl GrantedPod {
    /// The pod, if a grant of `lock` started it and its containers may still run.
    pub fn of(pod: &Pod, lock: &str) -> Option<Self> {
        let annotations = pod.metadata.annotations.as_ref()?;
        if annotations.get(LOCK_LABEL).map(String::as_str) != Some(lock) {
            return None;
        }
        let token = annotations.get(TOKEN_ANNOTATION)?.parse().ok();
        let phase = pod.status.as_ref().and_then(|status| status.phase.as_deref());
        if matches!(phase, Some("Succeeded" | "Failed")) {
            return None;
        }
        let job = owning_job(pod);
        Some(Self {
            name: pod.metadata.name.clone().unwrap_or_default(),
            job,
            token,
            permit: permit_of(annotations),
        })
    }

    fn describe(&self) -> String {
        let job = self
            .job
            .as_deref()
            .map_or_else(|| "no Job".to_owned(), |job| format!("Job {job}"));
        match self.token {
            Some(token) => format!("{} ({job}, token {token})", self.name),
            None => format!("{} ({job})", self.name),
        }
    }
}

/// The permit a grant's annotations name: 0 where they name none (a grant of a lock of one permit) or one that
/// is not a number, which only a hand edit can write; a permit the lock does not have holds nothing.
fn permit_of(annotations: &std::collections::BTreeMap<String, String>) -> u32 {
    annotations
        .get(PERMIT_ANNOTATION)
        .and_then(|permit| permit.parse().ok())
        .unwrap_or(0)
}

/// Jobs waiting for the lock, in the order they get it: priority (highest first), creation time, name.
pub fn queue(jobs: &[JobView]) -> Vec<&JobView> {
    let mut waiting: Vec<&JobView> = jobs.iter().filter(|job| job.waiting()).collect();
    waiting.sort_by(|a, b| {
        b.priority
            .cmp(&a.priority)
            .then_with(|| a.created.cmp(&b.created))
            .then_with(|| a.name.cmp(&b.name))
    });
    waiting
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobStep {
    /// The current holder is still running: keep its lock.
    Hold(String),
    /// The current holder completed, failed or is gone: release, then grant the next.
    ReleaseFinished(String),
    /// A fenced Job still has pods: no one else may run until they are gone.
    WaitForFenced(String),
    /// Pods of an earlier grant still run (a deleted Job's, say): no one else may run until they are gone.
    WaitForPods(Vec<String>),
    /// A fenced Job's pods are gone and its token is still the latest: take the lock back with that token and
    /// resume it.
    ResumeFenced { job: String, token: i64 },
    /// A fenced Job's pods are gone but its token can no longer be used (someone holds a newer one): queue it
    /// again to run with a new token, or where its template cannot take one, leave it suspended as stale.
    Requeue { job: String, token: i64 },
    /// Give the lock to this Job.
    Grant(String),
    /// Nothing to run.
    Idle,
}

/// `current`: the Job holding (or, per status, last holding) the lock; `pods`: the unfinished pods of its
/// grants; `latest_token`: the token in status.
/// When the pods of a lock's grants are counted again from the API server before its steps are taken.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Recount {
    /// No step lets a Job run.
    NotNeeded,
    /// Before the attempt.
    Now,
    /// Only grants let a Job run, and the lock waits behind another holder of its key: once the key is won, before
    /// anything shows the grant.
    AfterTheKey,
}

/// The recount `steps` need; `queued`: the lock waits in its key's queue behind another holder. Resuming or
/// requeueing a fenced Job is never deferred. Pure.
pub fn recount(steps: &[JobStep], queued: bool) -> Recount {
    let resumes = |step: &JobStep| matches!(step, JobStep::ResumeFenced { .. } | JobStep::Requeue { .. });
    let grants = |step: &JobStep| matches!(step, JobStep::Grant(_));
    if !steps.iter().any(|step| grants(step) || resumes(step)) {
        Recount::NotNeeded
    } else if queued && !steps.iter().any(resumes) {
        Recount::AfterTheKey
    } else {
        Recount::Now
    }
}

pub fn next_step(jobs: &[JobView], pods: &[GrantedPod], current: Option<&str>, latest_token: i64) -> JobStep {
    if let Some(current) = current {
        return match jobs.iter().find(|job| job.name == current) {
            Some(job) if !job.finished && job.fenced_token.is_none() => JobStep::Hold(current.to_owned()),
            _ => JobStep::ReleaseFinished(current.to_owned()),
        };
    }
    // A Job that was granted the lock and is not the holder was fenced, whether or not the cache shows the
    // annotation yet.
    let fenced = jobs.iter().find(|job| {
        !job.stale
            && !job.finished
            && !job.requeued
            && (job.fenced_token.is_some() || job.granted_token.is_some())
    });
    if let Some(job) = fenced {
        let token = job.fenced_token.or(job.granted_token).unwrap_or(0);
        let own_pods = pods
            .iter()
            .any(|pod| pod.job.as_deref() == Some(job.name.as_str()));
        return if job.pods > 0 || own_pods || !job.fencing_acknowledged() {
            JobStep::WaitForFenced(job.name.clone())
        } else if !pods.is_empty() {
            wait_for_pods(pods)
        } else if token == latest_token {
            JobStep::ResumeFenced {
                job: job.name.clone(),
                token,
            }
        } else {
            JobStep::Requeue {
                job: job.name.clone(),
                token,
            }
        };
    }
    if let Some(job) = jobs.iter().find(|job| job.fenced_token.is_some() && job.pods > 0) {
        // Stale or finished, but its pods still run: they must be gone before anyone else runs.
        return JobStep::WaitForFenced(job.name.clone());
    }
    match queue(jobs).first() {
        None => JobStep::Idle,
        Some(_) if !pods.is_empty() => wait_for_pods(pods),
        Some(job) => JobStep::Grant(job.name.clone()),
    }
}

fn wait_for_pods(pods: &[GrantedPod]) -> JobStep {
    JobStep::WaitForPods(pods.iter().map(GrantedPod::describe).collect())
}

/// Whether a pod spec hands the grant's fencing token (the `redlock.io/fencing-token` annotation the operator
/// writes into a granted Job's pod template) to one of its containers, through the downward API: an environment
/// variable, or a `downwardAPI` volume (or projected volume) item of that annotation or of all annotations.
/// Without it no container can know which grant it runs under, so none runs the guard (which refuses to start
/// the work without the token); with it, one most likely does — the operator cannot tell the guard from other
/// code that reads the token, so only the absence is warned about.
pub fn receives_grant(pod: &PodSpec) -> bool {
    let annotation_path = format!("metadata.annotations['{TOKEN_ANNOTATION}']");
    let names_it = |path: &str| path == annotation_path || path == "metadata.annotations";
    let in_env = pod
        .containers
        .iter()
        .chain(pod.init_containers.iter().flatten())
        .flat_map(|container| container.env.iter().flatten())
        .filter_map(|var| var.value_from.as_ref()?.field_ref.as_ref())
        .any(|field| names_it(&field.field_path));
    let in_volume = pod.volumes.iter().flatten().any(|volume| {
        let direct = volume
            .downward_api
            .iter()
            .flat_map(|downward| downward.items.iter().flatten());
        let projected = volume
            .projected
            .iter()
            .flat_map(|projected| projected.sources.iter().flatten())
            .filter_map(|source| source.downward_api.as_ref())
            .flat_map(|downward| downward.items.iter().flatten());
        direct
            .chain(projected)
            .filter_map(|item| item.field_ref.as_ref())
            .any(|field| names_it(&field.field_path))
    });
    in_env || in_volume
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;

    /// A waiting Job (never granted, suspended, no pods).
    pub(in crate::controller::lock::policy::jobs) fn job(name: &str, created: i64, priority: i64) -> JobView {
        JobView {
            name: name.into(),
            created: Timestamp::from_second(created).ok(),
            priority,
            suspended: true,
            finished: false,
            granted_token: None,
            fenced_token: None,
            fenced_at: None,
            suspended_since: Some(Timestamp::UNIX_EPOCH),
            stale: false,
            requeued: false,
            pods: 0,
            grace: Duration::from_secs(30),
            permit: 0,
            receives_grant: true,
        }
    }

    #[test]
    fn priority_then_age_then_name() {
        let jobs = [
            job("old-low", 1, 0),
            job("new-high", 5, 10),
            job("b-mid", 3, 5),
            job("a-mid", 3, 5),
        ];
        let order: Vec<&str> = queue(&jobs).iter().map(|job| job.name.as_str()).collect();
        assert_eq!(order, ["new-high", "a-mid", "b-mid", "old-low"]);
        assert_eq!(next_step(&jobs, &[], None, 0), JobStep::Grant("new-high".into()));
    }

    #[test]
    fn the_holder_runs_until_it_finishes_or_goes() {
        let mut running = job("a", 1, 0);
        running.suspended = false;
        running.granted_token = Some(1);
        let jobs = [running.clone(), job("b", 2, 0)];
        assert_eq!(next_step(&jobs, &[], Some("a"), 1), JobStep::Hold("a".into()));
        running.finished = true;
        assert_eq!(
            next_step(&[running, job("b", 2, 0)], &[], Some("a"), 1),
            JobStep::ReleaseFinished("a".into())
        );
        assert_eq!(
            next_step(&[job("b", 2, 0)], &[], Some("a"), 1),
            JobStep::ReleaseFinished("a".into()),
            "deleted"
        );
    }

    #[test]
    fn a_fenced_job_blocks_the_queue_until_its_pods_are_gone() {
        let mut fenced = job("a", 1, 0);
        fenced.granted_token = Some(4);
        fenced.fenced_token = Some(4);
        fenced.pods = 2;
        let jobs = [fenced.clone(), job("b", 2, 0)];
        assert_eq!(next_step(&jobs, &[], None, 4), JobStep::WaitForFenced("a".into()));
        fenced.pods = 0;
        assert_eq!(
            next_step(&[fenced.clone(), job("b", 2, 0)], &[], None, 4),
            JobStep::ResumeFenced {
                job: "a".into(),
                token: 4
            }
        );
        assert_eq!(
            next_step(&[fenced.clone(), job("b", 2, 0)], &[], None, 5),
            JobStep::Requeue {
                job: "a".into(),
                token: 4
            },
            "someone got a newer token: the fenced Job may not run with its old one"
        );
        let mut stale = fenced.clone();
        stale.stale = true;
        assert_eq!(
            next_step(&[stale, job("b", 2, 0)], &[], None, 5),
            JobStep::Grant("b".into())
        );
        // Requeued (its start cleared, so its template can take a new token): it queues in its own place again.
        let mut requeued = fenced;
        requeued.fenced_token = None;
        requeued.requeued = true;
        assert_eq!(
            next_step(&[requeued.clone(), job("b", 2, 0)], &[], None, 5),
            JobStep::Grant("a".into())
        );
        let mut waiting_b = job("b", 2, 0);
        waiting_b.priority = 1;
        let order: Vec<String> = queue(&[requeued, waiting_b])
            .iter()
            .map(|job| job.name.clone())
            .collect();
        assert_eq!(order, ["b", "a"], "still by priority");
    }

    #[test]
    fn a_fenced_job_waits_until_the_job_controller_shows_it_suspended_since_the_fencing() {
        let at = |seconds: f64| Timestamp::from_millisecond((seconds * 1000.0) as i64).ok();
        let mut fenced = job("a", 1, 0);
        fenced.granted_token = Some(4);
        fenced.fenced_token = Some(4);
        fenced.fenced_at = at(10.5);
        let resume = JobStep::ResumeFenced {
            job: "a".into(),
            token: 4,
        };
        let step = |fenced: &JobView| next_step(&[fenced.clone(), job("b", 2, 0)], &[], None, 4);

        fenced.suspended_since = at(9.0);
        assert_eq!(
            step(&fenced),
            JobStep::WaitForFenced("a".into()),
            "suspended before the fencing: the controller has not acted on it yet"
        );
        fenced.suspended_since = None;
        assert_eq!(step(&fenced), JobStep::WaitForFenced("a".into()));
        fenced.suspended_since = at(10.0);
        assert_eq!(step(&fenced), resume, "the same second counts");
        fenced.suspended = false;
        assert_eq!(
            step(&fenced),
            JobStep::WaitForFenced("a".into()),
            "unsuspended again (by hand): not fenced any more"
        );
    }

    #[test]
    fn a_granted_job_that_does_not_hold_the_lock_counts_as_fenced() {
        let mut granted = job("a", 1, 0);
        granted.granted_token = Some(2);
        granted.pods = 1;
        assert_eq!(
            next_step(&[granted, job("b", 2, 0)], &[], None, 2),
            JobStep::WaitForFenced("a".into())
        );
    }

    /// An unfinished pod of a grant of permit 0.
    pub(in crate::controller::lock::policy::jobs) fn pod_of(
        name: &str,
        job: Option<&str>,
        token: i64,
    ) -> GrantedPod {
        GrantedPod {
            name: name.into(),
            job: job.map(Into::into),
            token: Some(token),
            permit: 0,
        }
    }

    #[test]
    fn pods_of_an_earlier_grant_block_the_next_grant_until_they_are_gone() {
        let waiting = [job("b", 2, 0)];
        let orphan = pod_of("a-x7k2p", None, 3);
        assert_eq!(
            next_step(&waiting, std::slice::from_ref(&orphan), None, 3),
            JobStep::WaitForPods(vec!["a-x7k2p (no Job, token 3)".into()]),
            "a deleted Job's pods still run"
        );
        assert_eq!(next_step(&waiting, &[], None, 3), JobStep::Grant("b".into()));
        assert_eq!(next_step(&[], &[orphan], None, 3), JobStep::Idle);
    }

    #[test]
    fn a_fenced_job_waits_for_the_pods_its_status_does_not_count_yet() {
        let mut fenced = job("a", 1, 0);
        fenced.granted_token = Some(4);
        fenced.fenced_token = Some(4);
        let jobs = [fenced, job("b", 2, 0)];
        assert_eq!(
            next_step(&jobs, &[pod_of("a-1", Some("a"), 4)], None, 4),
            JobStep::WaitForFenced("a".into())
        );
        assert_eq!(
            next_step(&jobs, &[pod_of("gone-1", Some("gone"), 3)], None, 4),
            JobStep::WaitForPods(vec!["gone-1 (Job gone, token 3)".into()]),
            "not resumed while another grant's pods run"
        );
    }

    #[test]
    fn only_unfinished_pods_of_this_locks_grants_count() {
        let pod = |lock: &str, phase: &str, owner: bool| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": {
                    "name": "p",
                    "annotations": { LOCK_LABEL: lock, TOKEN_ANNOTATION: "7" },
                    "ownerReferences": if owner {
                        serde_json::json!([{ "apiVersion": "batch/v1", "kind": "Job", "name": "j", "uid": "u" }])
                    } else {
                        serde_json::json!([])
                    }
                },
                "status": { "phase": phase }
            }))
            .expect("pod")
        };
        assert_eq!(
            GrantedPod::of(&pod("batch", "Running", true), "batch"),
            Some(pod_of("p", Some("j"), 7))
        );
        assert_eq!(
            GrantedPod::of(&pod("batch", "Pending", false), "batch"),
            Some(pod_of("p", None, 7))
        );
        assert_eq!(GrantedPod::of(&pod("batch", "Succeeded", true), "batch"), None);
        assert_eq!(GrantedPod::of(&pod("batch", "Failed", true), "batch"), None);
        assert_eq!(GrantedPod::of(&pod("other", "Running", true), "batch"), None);
    }

    #[test]
    fn a_grant_names_its_permit_and_a_grant_without_one_is_permit_0() {
        let pod = |annotations: serde_json::Value| -> Pod {
            serde_json::from_value(serde_json::json!({
                "metadata": { "name": "p", "annotations": annotations },
                "status": { "phase": "Running" }
            }))
            .expect("pod")
        };
        let granted = |permit: Option<&str>| {
            let mut annotations = serde_json::json!({ LOCK_LABEL: "batch", TOKEN_ANNOTATION: "7" });
            if let Some(permit) = permit {
                annotations[PERMIT_ANNOTATION] = permit.into();
            }
            annotations
        };
        let permit = |annotations| GrantedPod::of(&pod(annotations), "batch").map(|pod| pod.permit);
        assert_eq!(permit(granted(Some("2"))), Some(2));
        assert_eq!(permit(granted(None)), Some(0));
        assert_eq!(
            permit(granted(Some("two"))),
            Some(0),
            "only a hand edit writes that"
        );
        let job: Job = serde_json::from_value(serde_json::json!({
            "metadata": { "name": "j" },
            "spec": { "template": { "metadata": { "annotations": granted(Some("3")) } } }
        }))
        .expect("job");
        let view = JobView::of(&job);
        assert_eq!((view.granted_token, view.permit), (Some(7), 3));
    }

    #[test]
    fn no_jobs_is_idle() {
        assert_eq!(next_step(&[], &[], None, 0), JobStep::Idle);
    }

    #[test]
    fn a_pod_receives_its_grant_through_the_downward_api_only() {
        let spec = |value: serde_json::Value| -> PodSpec { serde_json::from_value(value).unwrap() };
        let env = |path: &str| {
            spec(serde_json::json!({ "containers": [{ "name": "work", "env": [
                { "name": "REDLOCK_GRANTED_TOKEN", "valueFrom": { "fieldRef": { "fieldPath": path } } },
            ] }] }))
        };
        assert!(receives_grant(&env(
            "metadata.annotations['redlock.io/fencing-token']"
        )));
        assert!(!receives_grant(&env("metadata.annotations['redlock.io/permit']")));
        assert!(!receives_grant(&env("metadata.name")));
        assert!(!receives_grant(&spec(
            serde_json::json!({ "containers": [{ "name": "work" }] })
        )));
        let volume = spec(serde_json::json!({
            "containers": [{ "name": "work" }],
            "volumes": [{ "name": "grant", "downwardAPI": { "items": [
                { "path": "annotations", "fieldRef": { "fieldPath": "metadata.annotations" } },
            ] } }],
        }));
        assert!(receives_grant(&volume));
        let projected = spec(serde_json::json!({
            "containers": [{ "name": "work" }],
            "volumes": [{ "name": "grant", "projected": { "sources": [{ "downwardAPI": { "items": [
                { "path": "token", "fieldRef": { "fieldPath": "metadata.annotations['redlock.io/fencing-token']" } },
            ] } }] } }],
        }));
        assert!(receives_grant(&projected));
    }

    #[test]
    fn a_queued_lock_recounts_its_pods_for_a_grant_only_once_it_has_the_key() {
        let grant = JobStep::Grant("next".into());
        let resume = JobStep::ResumeFenced {
            job: "fenced".into(),
            token: 3,
        };
        assert_eq!(recount(std::slice::from_ref(&grant), false), Recount::Now);
        assert_eq!(recount(std::slice::from_ref(&grant), true), Recount::AfterTheKey);
        assert_eq!(
            recount(&[grant.clone(), resume.clone()], true),
            Recount::Now,
            "a resume is never deferred"
        );
        assert_eq!(recount(&[resume], true), Recount::Now);
        assert_eq!(
            recount(&[JobStep::Hold("running".into())], true),
            Recount::NotNeeded
        );
        assert_eq!(recount(&[JobStep::Idle], false), Recount::NotNeeded);
    }
}
