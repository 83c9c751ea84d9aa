//! Job fencing's API side: Jobs from a watched cache, and the patches that grant, fence, resume and mark them.
//! Every change to a Job is one merge patch, and every one is told to the Job's owner with an Event on it.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::Pod;
use kube::ResourceExt;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::runtime::events::EventType;

use super::permits::{PermitState, plan, stopped_grants, strays, waiting_shown};
use super::queue::{GrantedPod, JobStep, JobView, Recount, recount};
use crate::api::DistributedLock;
use crate::api::holder_contract::{
    FENCED_ANNOTATION, FENCED_AT_ANNOTATION, LOCK_LABEL, PERMIT_ANNOTATION, REQUEUED_ANNOTATION,
    STALE_ANNOTATION, TOKEN_ANNOTATION,
};
use crate::controller::cache::pod_index::pods_in;
use crate::controller::error::{Error, is_not_found};
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::permit_count::open_permits;

/// One look at the Jobs queued for a lock.
pub struct JobQueue {
    api: Api<Job>,
    pod_api: Api<Pod>,
    lock: String,
    /// Per permit (one for a plain lock): the Job holding it, and the highest token known for it.
    permits: Vec<(Option<String>, i64)>,
    /// How many permits take waiting Jobs (spec.permits); `permits` may list more, left from a higher count.
    open: usize,
    jobs: Vec<Arc<Job>>,
    views: Vec<JobView>,
    pods: Vec<GrantedPod>,
    /// What each permit does next, in permit order (see [`plan`]).
    pub steps: Vec<JobStep>,
    /// The Jobs granted a permit since the Jobs were read: status shows them holding, not waiting.
    granted: std::sync::Mutex<Vec<String>>,
    /// The lock waits in its key's fair queue behind another holder: a grant's recount of the pods waits until
    /// the key is won ([`Self::grant_still_clear`]), instead of a list at every attempt that cannot hold.
    defer_pod_recount: bool,
    /// The preparation left a grant's recount to [`Self::grant_still_clear`].
    recount_deferred: bool,
}

impl JobQueue {
    /// The Jobs of a lock of `permits.len()` permits: `permits[i]` is permit i's holder and highest token known.
    /// `queued`: the lock waits in its key's fair queue behind another holder.
    pub fn observe_permits(
        ctx: &LockContext,
        lock: &DistributedLock,
        permits: Vec<(Option<String>, i64)>,
        queued: bool,
    ) -> Self {
        let namespace = lock.namespace().unwrap_or_default();
        let name = lock.name_any();
        let jobs: Vec<Arc<Job>> = ctx
            .jobs
            .state()
            .into_iter()
            .filter(|job| job.namespace().as_deref() == Some(namespace.as_str()))
            .filter(|job| job.labels().get(LOCK_LABEL) == Some(&name))
            .filter(|job| job.metadata.deletion_timestamp.is_none())
            .collect();
        let views: Vec<JobView> = jobs.iter().map(|job| JobView::of(job)).collect();
        let pods: Vec<GrantedPod> = pods_in(&ctx.pods, &ctx.pod_index, &namespace)
            .iter()
            .filter_map(|pod| GrantedPod::of(pod, &name))
            .collect();
        let mut observed = Self {
            api: Api::namespaced(ctx.client.clone(), &namespace),
            pod_api: Api::namespaced(ctx.client.clone(), &namespace),
            lock: name,
            permits,
            open: usize::try_from(open_permits(lock)).unwrap_or(1),
            jobs,
            views,
            pods,
            steps: Vec::new(),
            granted: std::sync::Mutex::default(),
            defer_pod_recount: queued,
            recount_deferred: false,
        };
        observed.steps = observed.plan(&observed.pods);
        observed
    }

    /// Permit 0's step: a plain lock's only one.
    pub fn step(&self) -> &JobStep {
        self.steps.first().unwrap_or(&JobStep::Idle)
    }

    fn states(&self) -> Vec<PermitState<'_>> {
        self.permits
            .iter()
            .map(|(current, latest_token)| PermitState {
                current: current.as_deref(),
                latest_token: *latest_token,
            })
            .collect()
    }

    fn plan(&self, pods: &[GrantedPod]) -> Vec<JobStep> {
        plan(&self.views, pods, &self.states(), self.open)
    }

    /// The waiting Jobs status shows while `holder` (if any) is shown holding a permit, in the order they get one:
    /// never a Job that holds a permit or was granted one in this look (see [`waiting_shown`]).
    pub fn queue_shown(&self, holder: Option<&str>) -> Vec<String> {
        let granted = self
            .granted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let mut shown_holding: Vec<&str> = granted.iter().map(String::as_str).collect();
        shown_holding.extend(holder);
        waiting_shown(&self.views, &self.states(), &shown_holding)
    }

    /// The grants of `permit` whose Jobs stopped for good, with their tokens (see [`stopped_grants`]).
    pub fn stopped_grants(&self, permit: u32) -> Vec<(String, i64)> {
        stopped_grants(&self.views, permit)
    }

    /// Before a Job is let run (granted, resumed or requeued), the pods of earlier grants are counted again
    /// from the API server itself, not the watch cache, which may not show a pod created a moment ago. Grants
    /// label their pods `redlock.io/lock`; the cache still covers pods started before grants did. A grant of a
    /// lock waiting in its key's queue is counted again only once the key is won ([`Self::grant_still_clear`]).
    pub async fn recheck_pods(&mut self, ctx: &LockContext) -> Result<(), Error> {
        match recount(&self.steps, self.defer_pod_recount) {
            Recount::NotNeeded => return Ok(()),
            Recount::AfterTheKey => {
                self.recount_deferred = true;
                return Ok(());
            }
            Recount::Now => {}
        }
        let pods = self.recounted_pods(ctx).await?;
        self.steps = self.plan(&pods);
        self.pods = pods;
        Ok(())
    }

    /// The preparation left a grant's recount of the pods until the key is won.
    pub fn recount_deferred(&self) -> bool {
        self.recount_deferred
    }

    /// Whether the grant of `permit` to `holder` still stands once the pods are counted again from the API server:
    /// the recount a queued lock left until its key was won. `true` when no grant's recount was left (made before
    /// the attempt, or the step is not a grant: a Job holding already, a fenced one resumed).
    pub async fn grant_still_clear(
        &self,
        ctx: &LockContext,
        permit: u32,
        holder: &str,
    ) -> Result<bool, Error> {
        let index = usize::try_from(permit).ok();
        let planned = index.and_then(|index| self.steps.get(index));
        if !self.recount_deferred || !matches!(planned, Some(JobStep::Grant(job)) if job == holder) {
            return Ok(true);
        }
        let pods = self.recounted_pods(ctx).await?;
        let steps = self.plan(&pods);
        Ok(index.and_then(|index| steps.get(index)) == planned)
    }

    /// The pods of this lock's grants: the cache's, and those a direct list shows that the cache does not yet.
    async fn recounted_pods(&self, ctx: &LockContext) -> Result<Vec<GrantedPod>, Error> {
        ctx.ensure_leader()?;
        let selector = format!("{LOCK_LABEL}={}", self.lock);
        let listed = self
            .pod_api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let mut pods = self.pods.clone();
        for pod in listed
            .items
            .iter()
            .filter_map(|pod| GrantedPod::of(pod, &self.lock))
        {
            if !pods.iter().any(|known| known.name == pod.name) {
                pods.push(pod);
            }
        }
        Ok(pods)
    }

    /// A step decided from the cache that gives up or stops something (release a holder that looks finished or
    /// gone, resume or requeue a fenced Job) is confirmed with a direct read of that Job first: the cache may lag
    /// behind, or not have received its first list.
    pub async fn confirm(&mut self) -> Result<(), Error> {
        let named: Vec<String> = self
            .steps
            .iter()
            .filter_map(|step| match step {
                JobStep::ReleaseFinished(job)
                | JobStep::ResumeFenced { job, .. }
                | JobStep::Requeue { job, .. } => Some(job.clone()),
                _ => None,
            })
            .collect();
        if named.is_empty() {
            return Ok(());
        }
        let before = self.steps.clone();
        for name in &named {
            let fresh = self.api.get_opt(name).await?;
            self.jobs
                .retain(|job| job.metadata.name.as_deref() != Some(name.as_str()));
            if let Some(job) = fresh.filter(|job| self.queues_here(job)) {
                self.jobs.push(Arc::new(job));
            }
        }
        self.views = self.jobs.iter().map(|job| JobView::of(job)).collect();
        self.steps = self.plan(&self.pods);
        if self.steps != before {
            tracing::info!(lock = %self.lock, jobs = ?named, ?before, after = ?self.steps, "the Job cache lagged: decided again from the API server");
        }
        Ok(())
    }

    fn queues_here(&self, job: &Job) -> bool {
        job.labels().get(LOCK_LABEL) == Some(&self.lock) && job.metadata.deletion_timestamp.is_none()
    }

    fn job(&self, name: &str) -> Option<&Arc<Job>> {
        self.jobs
            .iter()
            .find(|job| job.metadata.name.as_deref() == Some(name))
    }

    /// Jobs whose pods may take longer to stop than the fence margin leaves: fencing them may come late.
    pub fn slow(&self, margin: Duration) -> Vec<(String, Duration)> {
        self.views
            .iter()
            .filter(|job| !job.finished && job.grace > margin)
            .map(|job| (job.name.clone(), job.grace))
            .collect()
    }

    /// Unfinished Jobs whose pod template hands the grant to no container: their pods cannot run the guard.
    pub fn unguarded(&self) -> Vec<String> {
        self.views
            .iter()
            .filter(|job| !job.finished && !job.receives_grant)
            .map(|job| job.name.clone())
            .collect()
    }

    /// Suspends every Job that runs without holding the lock (any of its permits), as the API server shows it
    /// (the cache may show a Job unsuspended that was suspended, or granted, a moment ago).
    pub async fn suspend_strays(&self, ctx: &LockContext) -> Result<(), Error> {
        for stray in strays(&self.views, &self.states()) {
            let Some(job) = self.api.get_opt(&stray.name).await? else {
                continue;
            };
            let view = JobView::of(&job);
            if view.suspended || view.finished || !self.queues_here(&job) {
                continue;
            }
            self.patch(&stray.name, serde_json::json!({ "spec": { "suspend": true } }))
                .await?;
            let note = "created (or left) unsuspended without holding the lock: suspended until it holds it; create Jobs of this lock with spec.suspend: true".to_owned();
            self.event(ctx, &stray.name, EventType::Warning, "Suspended", note)
                .await;
        }
        Ok(())
    }

    /// Grants the lock: the token and lock name (and, for a semaphore's `permit`, its number) into the pod
    /// template, and unsuspend — one patch, allowed because the Job never started. Nothing is written when it
    /// already runs with this token.
    pub async fn grant(
        &self,
        ctx: &LockContext,
        job: &str,
        token: i64,
        lock: &str,
        permit: Option<u32>,
        margin: Duration,
    ) -> Result<(), Error> {
        self.granted
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .push(job.to_owned());
        let view = self.views.iter().find(|view| view.name == job);
        if view.is_some_and(|view| {
            view.granted_token == Some(token) && !view.suspended && view.permit == permit.unwrap_or(0)
        }) {
            return Ok(());
        }
        let mut annotations = serde_json::json!({ TOKEN_ANNOTATION: token.to_string(), LOCK_LABEL: lock });
        if let Some(permit) = permit {
            annotations[PERMIT_ANNOTATION] = permit.to_string().into();
        }
        self.patch(
            job,
            serde_json::json!({
                "metadata": { "annotations": { REQUEUED_ANNOTATION: null } },
                "spec": {
                    "suspend": false,
                    "template": { "metadata": {
                        "labels": { LOCK_LABEL: lock },
                        "annotations": annotations,
                    } }
                }
            }),
        )
        .await?;
        let note = format!("holds lock {lock} with fencing token {token}: unsuspended");
        self.event(ctx, job, EventType::Normal, "Granted", note).await;
        if let Some(view) = view.filter(|view| view.grace > margin) {
            let note = format!(
                "its pods may take {}s to stop, longer than the fence margin ({}): if the lock is lost they may outlive its validity; lower terminationGracePeriodSeconds or raise the lock's spec.holder.jobs.fenceMargin",
                view.grace.as_secs(),
                crate::duration::format(margin)
            );
            self.event(ctx, job, EventType::Warning, "GracePeriodTooLong", note)
                .await;
        }
        if view.is_some_and(|view| !view.receives_grant) {
            let note = format!(
                "its pods are not handed their grant (no container gets the annotation {TOKEN_ANNOTATION} through the downward API): they cannot run their work under redlock-operator guard, and only the operator stops them, which a failover or an API-server outage can delay past the lock's validity"
            );
            self.event(ctx, job, EventType::Warning, "GrantNotPassedToPods", note)
                .await;
        }
        Ok(())
    }

    /// Whether the grant of `job` with `token` has stopped for good, as the API server shows it: the Job is gone,
    /// suspended or finished (so no pod of that grant starts again), and no pod started by the grant — owned by
    /// the Job, or carrying its token — is left running or stopping. Then nobody can be acting on the key, and it
    /// need not wait for the validity shown. Pods the cache still shows count too: it lags behind deletions, and
    /// only pods of grants carry the label the direct list selects.
    ///
    /// `reported`: pods that reported their work under this grant stopped for good (`lock::reports`); they count
    /// as stopped while their containers wind down.
    pub async fn grant_stopped(&self, job: &str, token: i64, reported: &[String]) -> Result<bool, Error> {
        if let Some(fresh) = self.api.get_opt(job).await? {
            let view = JobView::of(&fresh);
            if !view.suspended && !view.finished {
                return Ok(false);
            }
        }
        let selector = format!("{LOCK_LABEL}={}", self.lock);
        let listed = self
            .pod_api
            .list(&ListParams::default().labels(&selector))
            .await?;
        let of_grant = |pod: &GrantedPod| pod.job.as_deref() == Some(job) || pod.token == Some(token);
        let live = listed
            .items
            .iter()
            .filter_map(|pod| GrantedPod::of(pod, &self.lock))
            .chain(self.pods.iter().cloned())
            .filter(|pod| !reported.contains(&pod.name))
            .any(|pod| of_grant(&pod));
        Ok(!live)
    }

    /// The lock is being deleted: suspend `job`, which holds one of its permits with `token`, unless the API
    /// server shows it suspended or finished already. Marked fenced like a Job whose lock was lost, so that a lock
    /// created again under the name resumes or requeues it rather than letting it run with its old token. `true`
    /// when it was suspended now.
    pub async fn fence_for_deletion(&self, ctx: &LockContext, job: &str, token: i64) -> Result<bool, Error> {
        let Some(fresh) = self.api.get_opt(job).await? else {
            return Ok(false);
        };
        let view = JobView::of(&fresh);
        if view.suspended || view.finished {
            return Ok(false);
        }
        self.fence(ctx, job, token, "the DistributedLock is being deleted")
            .await?;
        Ok(true)
    }

    /// The lock was lost: suspend the holder (its pods are stopped by the Job controller) and remember the
    /// token it ran with.
    pub async fn fence(&self, ctx: &LockContext, job: &str, token: i64, reason: &str) -> Result<(), Error> {
        self.patch(
            job,
            serde_json::json!({
                "metadata": { "annotations": {
                    FENCED_ANNOTATION: token.to_string(),
                    FENCED_AT_ANNOTATION: k8s_openapi::jiff::Timestamp::now().to_string(),
                } },
                "spec": { "suspend": true }
            }),
        )
        .await?;
        let note = format!(
            "suspended: the lock was lost ({reason}); it resumes if it gets the lock back with token {token}"
        );
        self.event(ctx, job, EventType::Warning, "Fenced", note).await;
        Ok(())
    }

    /// The lock is back with the fenced Job's own token: let it run again.
    pub async fn resume(&self, ctx: &LockContext, job: &str, token: i64) -> Result<(), Error> {
        self.patch(
            job,
            serde_json::json!({
                "metadata": { "annotations": { FENCED_ANNOTATION: null, FENCED_AT_ANNOTATION: null } },
                "spec": { "suspend": false }
            }),
        )
        .await?;
        let note = format!("resumed: the lock is held again with its fencing token {token}");
        self.event(ctx, job, EventType::Normal, "Resumed", note).await;
        Ok(())
    }

    /// The fenced Job's pods are gone and its token can no longer be used: give it a new one. A started Job's
    /// pod template is immutable, but the API server allows changing its annotations again once the Job is
    /// suspended and `status.startTime` is cleared (as Kueue and JobSet do to re-admit Jobs); the Job controller
    /// sets it again when the Job runs. Where that is refused (no permission on `jobs/status`, say), the Job
    /// stays suspended, marked stale: it never runs with a token that can no longer be used.
    pub async fn requeue_or_mark_stale(&self, ctx: &LockContext, job: &str, token: i64) -> Result<(), Error> {
        let cleared = self
            .api
            .patch_status(
                job,
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "status": { "startTime": null } })),
            )
            .await;
        match cleared {
            Ok(_) => {}
            Err(err) if is_not_found(&err) => return Ok(()),
            Err(kube::Error::Api(status)) if status.is_forbidden() || status.is_invalid() => {
                return self.mark_stale(ctx, job, token, &status.message).await;
            }
            Err(err) => return Err(Error::job_write(err)),
        }
        self.patch(
            job,
            serde_json::json!({ "metadata": { "annotations": {
                FENCED_ANNOTATION: null, FENCED_AT_ANNOTATION: null, REQUEUED_ANNOTATION: "true",
            } } }),
        )
        .await?;
        let note = format!(
            "its fencing token {token} can no longer be used (the lock could not be taken back with it) and its pods are gone: queued again, to run with a new token"
        );
        self.event(ctx, job, EventType::Normal, "Requeued", note).await;
        Ok(())
    }

    async fn mark_stale(&self, ctx: &LockContext, job: &str, token: i64, refusal: &str) -> Result<(), Error> {
        self.patch(
            job,
            serde_json::json!({ "metadata": { "annotations": { STALE_ANNOTATION: "true" } } }),
        )
        .await?;
        let note = format!(
            "stays suspended: it ran with fencing token {token}, which can no longer be used, and its pod template could not be given a new one (clearing status.startTime was refused: {refusal}); grant the operator patch on jobs/status, or delete the Job or create it anew to queue again"
        );
        self.event(ctx, job, EventType::Warning, "StaleToken", note).await;
        Ok(())
    }

    async fn patch(&self, job: &str, patch: serde_json::Value) -> Result<(), Error> {
        match self
            .api
            .patch(job, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => Ok(()),
            Err(err) if is_not_found(&err) => Ok(()),
            Err(err) => Err(Error::job_write(err)),
        }
    }

    async fn event(&self, ctx: &LockContext, job: &str, type_: EventType, reason: &str, note: String) {
        match self.job(job) {
            Some(job) => ctx.publish(&**job, type_, reason, note).await,
            None => tracing::debug!(job, reason, "no cached Job to attach an event to"),
        }
    }
}
