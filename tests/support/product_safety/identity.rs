//! Identity locks: a fixed holder, whose process believes it holds the key while it sees the lock `Held` by its
//! identity, not being deleted, and before `validUntil` minus its fence margin (what the README asks of a
//! holder reading status). The nemesis deletes them and creates them again, with the next identity.

use std::sync::Arc;
use std::time::Duration;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, DeleteParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, ResourceExt};
use redlock_operator::api::DistributedLock;
use redlock_operator::cli::term::{fence_instant, term_of};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::cluster::Cluster;
use super::follow::{Seen, follow};
use super::leaders::POD_FENCE_MARGIN;
use super::recorder::Recorder;

const ROLE_LABEL: &str = "safety.redlock.io/role";

pub struct IdentityLock {
    pub lock: String,
    pub key: String,
    resource_key: String,
    quorum: String,
    ttl: String,
    created: usize,
}

impl IdentityLock {
    /// Lock `lock` on `resource_key`, with TTL `ttl`.
    pub async fn create(
        cluster: &Cluster,
        quorum: &str,
        (lock, resource_key): (&str, &str),
        ttl: Duration,
    ) -> Self {
        let mut identity = Self {
            lock: lock.to_owned(),
            key: format!("shared:{resource_key}"),
            resource_key: resource_key.to_owned(),
            quorum: quorum.to_owned(),
            ttl: super::duration_text(ttl),
            created: 0,
        };
        identity.create_object(cluster).await;
        identity
    }

    async fn create_object(&mut self, cluster: &Cluster) {
        let object = serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
            "metadata": { "name": self.lock, "labels": { ROLE_LABEL: "identity" } },
            "spec": { "quorum": self.quorum, "ttl": self.ttl, "resourceKey": self.resource_key,
                      "holder": { "identity": format!("{}-{}", self.lock, self.created) } }
        });
        self.created += 1;
        let lock: DistributedLock = serde_json::from_value(object).expect("lock");
        let _ = cluster.locks().create(&PostParams::default(), &lock).await;
    }

    /// Deletes the lock (its finalizer releases the key), waits until it is gone, and creates it again for the
    /// next identity. Gives up waiting after a while (an operator cut off cannot remove the finalizer).
    pub async fn recreate(&mut self, cluster: &Cluster) {
        let _ = cluster.locks().delete(&self.lock, &DeleteParams::default()).await;
        let deadline = Instant::now() + Duration::from_secs(20);
        while cluster.locks().get_opt(&self.lock).await.ok().flatten().is_some() && Instant::now() < deadline
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.create_object(cluster).await;
    }
}

/// What an identity lock's holder sees in it.
fn holding(cluster: &str, lock: &DistributedLock, now: Instant) -> Option<Seen> {
    if lock.metadata.deletion_timestamp.is_some() {
        return None;
    }
    let identity = lock.spec.holder.identity.as_deref()?;
    let term = term_of(lock, identity)?;
    Some(Seen {
        key: format!("shared:{}", lock.spec.resource_key.as_deref()?),
        holder: format!("{cluster}/{}/{identity}", lock.name_any()),
        token: term.token,
        fence_at: fence_instant(&term, POD_FENCE_MARGIN, now, Timestamp::now()),
        evidence: format!(
            "identity holder saw token {} valid until {}",
            term.token, term.valid_until
        ),
    })
}

/// The holders of every identity lock of `cluster`, through `client` (cut with the cluster's outages).
pub async fn follow_locks(
    cluster: String,
    client: Client,
    namespace: String,
    recorder: Arc<Recorder>,
    stop: CancellationToken,
) {
    let api: Api<DistributedLock> = Api::namespaced(client, &namespace);
    let config = watcher::Config::default().labels(&format!("{ROLE_LABEL}=identity"));
    follow(
        api,
        config,
        move |lock, now| holding(&cluster, lock, now),
        (recorder, None),
        stop,
    )
    .await;
}
