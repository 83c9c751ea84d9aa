//! Job fencing's queue: which Job may run, which must be suspended, and what to do next. Pure, so every rule
//! is tested without a cluster.

use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::jiff::Timestamp;

use super::election::TOKEN_ANNOTATION;

/// Jobs carrying `redlock.io/lock: <lock name>` queue for that lock.
pub const LOCK_LABEL: &str = "redlock.io/lock";
/// Higher runs first (an integer; absent or malformed counts as 0).
pub const PRIORITY_ANNOTATION: &str = "redlock.io/priority";
/// On a Job the operator suspended because the lock was lost: the token it ran with.
pub const FENCED_ANNOTATION: &str = "redlock.io/fenced-token";
/// On a fenced Job whose token is no longer the latest: it stays suspended.
pub const STALE_ANNOTATION: &str = "redlock.io/stale";

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
    pub stale: bool,
    /// Active plus terminating pods.
    pub pods: i32,
    /// How long its pods may take to stop (the pod template's termination grace period, 30 s by default).
    pub grace: Duration,
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
            stale: annotations
                .get(STALE_ANNOTATION)
                .is_some_and(|value| value == "true"),
            pods,
            grace: Duration::from_secs(u64::try_from(grace).unwrap_or(0)),
        }
    }

    fn waiting(&self) -> bool {
        !self.finished && !self.stale && self.granted_token.is_none() && self.fenced_token.is_none()
    }
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

/// Jobs that run (are not suspended) without holding the lock: created unsuspended, or left running by a
/// failed suspension. They are suspended at once.
pub fn strays<'a>(jobs: &'a [JobView], current: Option<&str>) -> Vec<&'a JobView> {
    jobs.iter()
        .filter(|job| !job.suspended && !job.finished && Some(job.name.as_str()) != current)
        .collect()
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum JobStep {
    /// The current holder is still running: keep its lock.
    Hold(String),
    /// The current holder completed, failed or is gone: release, then grant the next.
    ReleaseFinished(String),
    /// A fenced Job still has pods: no one else may run until they are gone.
    WaitForFenced(String),
    /// A fenced Job's pods are gone and its token is still the latest: take the lock back with that token and
    /// resume it.
    ResumeFenced { job: String, token: i64 },
    /// A fenced Job's token is no longer the latest: it stays suspended, marked stale.
    MarkStale { job: String, token: i64 },
    /// Give the lock to this Job.
    Grant(String),
    /// Nothing to run.
    Idle,
}

/// `current`: the Job holding (or, per status, last holding) the lock; `latest_token`: the token in status.
pub fn next_step(jobs: &[JobView], current: Option<&str>, latest_token: i64) -> JobStep {
    if let Some(current) = current {
        return match jobs.iter().find(|job| job.name == current) {
            Some(job) if !job.finished && job.fenced_token.is_none() => JobStep::Hold(current.to_owned()),
            _ => JobStep::ReleaseFinished(current.to_owned()),
        };
    }
    // A Job that was granted the lock and is not the holder was fenced, whether or not the cache shows the
    // annotation yet.
    let fenced = jobs.iter().find(|job| {
        !job.stale && !job.finished && (job.fenced_token.is_some() || job.granted_token.is_some())
    });
    if let Some(job) = fenced {
        let token = job.fenced_token.or(job.granted_token).unwrap_or(0);
        return if job.pods > 0 {
            JobStep::WaitForFenced(job.name.clone())
        } else if token == latest_token {
            JobStep::ResumeFenced {
                job: job.name.clone(),
                token,
            }
        } else {
            JobStep::MarkStale {
                job: job.name.clone(),
                token,
            }
        };
    }
    if let Some(job) = jobs.iter().find(|job| job.fenced_token.is_some() && job.pods > 0) {
        // Stale or finished, but its pods still run: they must be gone before anyone else runs.
        return JobStep::WaitForFenced(job.name.clone());
    }
    queue(jobs)
        .first()
        .map_or(JobStep::Idle, |job| JobStep::Grant(job.name.clone()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn job(name: &str, created: i64, priority: i64) -> JobView {
        JobView {
            name: name.into(),
            created: Timestamp::from_second(created).ok(),
            priority,
            suspended: true,
            finished: false,
            granted_token: None,
            fenced_token: None,
            stale: false,
            pods: 0,
            grace: Duration::from_secs(30),
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
        assert_eq!(next_step(&jobs, None, 0), JobStep::Grant("new-high".into()));
    }

    #[test]
    fn the_holder_runs_until_it_finishes_or_goes() {
        let mut running = job("a", 1, 0);
        running.suspended = false;
        running.granted_token = Some(1);
        let jobs = [running.clone(), job("b", 2, 0)];
        assert_eq!(next_step(&jobs, Some("a"), 1), JobStep::Hold("a".into()));
        running.finished = true;
        assert_eq!(
            next_step(&[running, job("b", 2, 0)], Some("a"), 1),
            JobStep::ReleaseFinished("a".into())
        );
        assert_eq!(
            next_step(&[job("b", 2, 0)], Some("a"), 1),
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
        assert_eq!(next_step(&jobs, None, 4), JobStep::WaitForFenced("a".into()));
        fenced.pods = 0;
        assert_eq!(
            next_step(&[fenced.clone(), job("b", 2, 0)], None, 4),
            JobStep::ResumeFenced {
                job: "a".into(),
                token: 4
            }
        );
        assert_eq!(
            next_step(&[fenced.clone(), job("b", 2, 0)], None, 5),
            JobStep::MarkStale {
                job: "a".into(),
                token: 4
            },
            "someone got a newer token: the fenced Job may not run with its old one"
        );
        fenced.stale = true;
        assert_eq!(
            next_step(&[fenced, job("b", 2, 0)], None, 5),
            JobStep::Grant("b".into())
        );
    }

    #[test]
    fn a_granted_job_that_does_not_hold_the_lock_counts_as_fenced() {
        let mut granted = job("a", 1, 0);
        granted.granted_token = Some(2);
        granted.pods = 1;
        assert_eq!(
            next_step(&[granted, job("b", 2, 0)], None, 2),
            JobStep::WaitForFenced("a".into())
        );
    }

    #[test]
    fn unsuspended_jobs_without_the_lock_are_strays() {
        let mut sneaky = job("sneaky", 1, 0);
        sneaky.suspended = false;
        let mut holder = job("holder", 0, 0);
        holder.suspended = false;
        let jobs = [sneaky, holder, job("waiting", 2, 0)];
        let names: Vec<&str> = strays(&jobs, Some("holder"))
            .iter()
            .map(|job| job.name.as_str())
            .collect();
        assert_eq!(names, ["sneaky"]);
        assert_eq!(next_step(&[], None, 0), JobStep::Idle);
    }
}
