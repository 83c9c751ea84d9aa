//! Leader election's API side: candidates from the pod cache, and the leader label and annotations on pods.
//! The order of writes is what fences: a leader's label goes before its lock moves or lapses, and the next
//! leader is labelled only once it holds the lock.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use kube::core::{Selector, SelectorExt};
use kube::runtime::reflector::ObjectRef;

use super::rule::{PodView, candidates, choose_leaders, labels_to_remove};
use crate::api::DistributedLock;
use crate::api::holder_contract::VALID_UNTIL_ANNOTATION;
use crate::api::holder_contract::{PERMIT_ANNOTATION, TOKEN_ANNOTATION};
use crate::api::lock::LeaderElectionPolicy;
use crate::controller::cache::finished_pods::is_finished;
use crate::controller::cache::pod_index::pods_selected;
use crate::controller::error::{Error, is_not_found};
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::permit_count::{is_closing, open_permits};

/// One look at the pods of a leader-election lock. A semaphore (spec.permits above 1) elects one leader per
/// permit; a lock of one permit is the semaphore of one.
pub struct Election {
    api: Api<Pod>,
    label: String,
    selector: Selector,
    preference: Vec<String>,
    pods: Vec<PodView>,
    /// Each permit's holder now, per this replica's lease or status.
    current: Vec<Option<String>>,
    /// The leader pods carry their permit number (a semaphore's).
    semaphore: bool,
    /// How many permits are held now (spec.permits): `current` may name holders of permits above, left from a
    /// higher count, which are given up.
    open: usize,
    /// Holders that stopped their work for want of answers (silent past the validity told to them): unready
    /// to the election, whatever their pods' conditions say.
    silent: Vec<String>,
    /// Candidates in election order, for status.
    pub candidates: Vec<String>,
    /// The pod that should hold each permit now, where any can.
    pub chosen: Vec<Option<String>>,
}

impl Election {
    /// Reads the pods from the cache; `current[i]` is permit i's holder now (one entry for a lock of one
    /// permit). `Err` is a message for the `Ready` condition (a selector that cannot be evaluated).
    pub fn observe(
        ctx: &LockContext,
        lock: &DistributedLock,
        policy: &LeaderElectionPolicy,
        current: Vec<Option<String>>,
        silent: Vec<String>,
    ) -> Result<Self, String> {
        let namespace = lock.namespace().unwrap_or_default();
        let selector = Selector::try_from(policy.selector.clone())
            .map_err(|err| format!("spec.holder.leaderElection.selector: {err}"))?;
        let no_labels = BTreeMap::new();
        let required = policy.selector.match_labels.as_ref().unwrap_or(&no_labels);
        let pods = pods_selected(&ctx.pods, &ctx.pod_index, &namespace, required, &selector)
            .iter()
            .map(|pod| PodView::of(pod, &policy.leader_label))
            .collect();
        let mut election = Self {
            api: Api::namespaced(ctx.client.clone(), &namespace),
            label: policy.leader_label.clone(),
            selector,
            preference: policy.preference.clone(),
            pods,
            semaphore: current.len() > 1,
            open: usize::try_from(open_permits(lock)).unwrap_or(1),
            current,
            silent,
            candidates: Vec::new(),
            chosen: Vec::new(),
        };
        election.elect();
        Ok(election)
    }

    fn elect(&mut self) {
        for pod in &mut self.pods {
            if self.silent.contains(&pod.name) {
                pod.candidate = false;
            }
        }
        self.candidates = candidates(&self.pods, &self.preference)
            .iter()
            .map(|pod| pod.name.clone())
            .collect();
        let current: Vec<Option<&str>> = self.current.iter().map(Option::as_deref).collect();
        self.chosen = choose_leaders(&self.pods, &current, &self.preference, self.open);
    }

    /// Whether `permit` is above the count now held (spec.permits), left from a higher one.
    pub fn is_closing(&self, permit: u32) -> bool {
        is_closing(permit, self.open)
    }

    /// The pod that should hold `permit` now.
    pub fn chosen_for(&self, permit: u32) -> Option<&str> {
        let index = usize::try_from(permit).ok()?;
        self.chosen.get(index)?.as_deref()
    }

    /// The holders that keep their permits: each still the one chosen for it.
    fn kept(&self) -> Vec<&str> {
        self.current
            .iter()
            .zip(&self.chosen)
            .filter(|(current, chosen)| current == chosen)
            .filter_map(|(current, _)| current.as_deref())
            .collect()
    }

    /// The cache says a current leader can no longer lead (gone, unready, relabelled). Before its label is
    /// removed and its lock moves, its pod is read from the API server: a cache that lags behind must not move a
    /// leader that is still a candidate.
    pub async fn confirm_current(&mut self) -> Result<(), Error> {
        let moved: Vec<String> = self
            .current
            .iter()
            .zip(&self.chosen)
            .filter(|(current, chosen)| current.is_some() && current != chosen)
            .filter_map(|(current, _)| current.clone())
            .collect();
        if moved.is_empty() {
            return Ok(());
        }
        for current in &moved {
            let fresh = self.api.get_opt(current).await?;
            self.pods.retain(|pod| pod.name != *current);
            if let Some(pod) = fresh.filter(|pod| {
                self.selector
                    .matches(pod.metadata.labels.as_ref().unwrap_or(&BTreeMap::new()))
            }) {
                self.pods.push(PodView::of(&pod, &self.label));
            }
        }
        self.elect();
        for current in self.kept() {
            if moved.iter().any(|name| name == current) {
                tracing::info!(
                    pod = current,
                    "the pod cache lagged: the leader is still a candidate"
                );
            }
        }
        Ok(())
    }

    /// Removes the leader label from every pod but the leaders that keep their permits. Done before anything
    /// else, so that no pod carries the label of a permit another may take.
    pub async fn unlabel_all_but_kept(&self) -> Result<(), Error> {
        self.unlabel_all_but(&self.kept()).await
    }

    /// Removes the leader label from every pod but `keep`, the leader whose lock is held. Done before anything
    /// else, so that two pods never carry the label.
    pub async fn unlabel_all_but(&self, keep: &[&str]) -> Result<(), Error> {
        for pod in labels_to_remove(&self.pods, keep) {
            self.unlabel(&pod).await?;
        }
        Ok(())
    }

    pub async fn unlabel(&self, pod: &str) -> Result<(), Error> {
        let patch = serde_json::json!({
            "metadata": {
                "labels": { self.label.clone(): null },
                "annotations": { TOKEN_ANNOTATION: null, VALID_UNTIL_ANNOTATION: null, PERMIT_ANNOTATION: null },
            }
        });
        match self
            .api
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
        {
            Ok(_) => {
                tracing::info!(pod, label = %self.label, "leader label removed");
                Ok(())
            }
            // A pod that is gone carries no label.
            Err(err) if is_not_found(&err) => Ok(()),
            Err(err) => Err(Error::pod_write(err)),
        }
    }

    /// Whether `pod` has stopped for sure, so that its key need not wait for the validity it was shown: it shows a
    /// finished phase (its kubelet stopped its containers for good), or its object is gone (read directly) and
    /// the watch showed it finished when it was deleted. A pod merely gone may have been force-deleted while its
    /// containers run on (`finished_pods`); its key waits. A pod the cache shows running is there; what would
    /// let the key go is read directly (the cache may lag behind a pod created again under its name).
    pub async fn pod_stopped(&self, ctx: &LockContext, pod: &str) -> Result<bool, Error> {
        let namespace = self.api_namespace();
        let cached = ctx.pods.get(&ObjectRef::new(pod).within(&namespace));
        if cached.as_ref().is_some_and(|cached| !is_finished(cached)) {
            return Ok(false);
        }
        Ok(match self.api.get_opt(pod).await? {
            Some(current) => is_finished(&current),
            // Finished when the cache last showed it (its delete event may not have come yet), or when deleted.
            None => cached.is_some() || ctx.pod_index.deleted_finished(&namespace, pod),
        })
    }

    /// Labels `pod` as the leader with its fencing token and validity (and a semaphore's permit number), unless
    /// it already shows exactly that.
    pub async fn label(
        &self,
        ctx: &LockContext,
        pod: &str,
        permit: u32,
        token: i64,
        valid_until: &MicroTime,
    ) -> Result<(), Error> {
        let permit = self.semaphore.then(|| permit.to_string());
        let valid_until = serde_json::to_value(valid_until)?;
        let current = self.pods.iter().find(|view| view.name == pod);
        let cached = ctx.pods.get(&ObjectRef::new(pod).within(&self.api_namespace()));
        let shown = cached
            .as_ref()
            .and_then(|pod| pod.metadata.annotations.clone())
            .unwrap_or_default();
        let up_to_date = current.is_some_and(|view| view.labelled)
            && shown.get(TOKEN_ANNOTATION) == Some(&token.to_string())
            && valid_until.as_str() == shown.get(VALID_UNTIL_ANNOTATION).map(String::as_str)
            && shown.get(PERMIT_ANNOTATION) == permit.as_ref();
        if up_to_date {
            return Ok(());
        }
        let patch = serde_json::json!({
            "metadata": {
                "labels": { self.label.clone(): "true" },
                "annotations": {
                    TOKEN_ANNOTATION: token.to_string(),
                    VALID_UNTIL_ANNOTATION: valid_until,
                    PERMIT_ANNOTATION: permit,
                },
            }
        });
        self.api
            .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .map_err(Error::pod_write)?;
        if !current.is_some_and(|view| view.labelled) {
            tracing::info!(pod, token, permit, "leader labelled");
        }
        Ok(())
    }

    fn api_namespace(&self) -> String {
        self.api.namespace().unwrap_or_default().to_owned()
    }
}
