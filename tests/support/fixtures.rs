//! Objects and setup the API-server tests share.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, PostParams};
use redlock_operator::api::{DistributedLock, RedisQuorum};
use serde_json::json;

/// What a real cluster needs before custom resources can be used, done the same way.
pub async fn install_crds(client: &Client) {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        redlock_operator::api::served_crd::<DistributedLock>(),
        redlock_operator::api::served_crd::<RedisQuorum>(),
    ] {
        crds.create(&PostParams::default(), &crd)
            .await
            .expect("create CRD");
    }
}

/// A lock held for the fixed holder `me` on the quorum `default`.
pub fn identity_lock(name: &str) -> DistributedLock {
    serde_json::from_value(json!({
        "apiVersion": "redlock.io/v1beta1",
        "kind": "DistributedLock",
        "metadata": {"name": name},
        "spec": {"quorum": "default", "ttl": "10s", "holder": {"identity": "me"}},
    }))
    .expect("a DistributedLock")
}
