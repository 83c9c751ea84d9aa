//! What the operator benchmarks that run in-process share: an API server with the CRDs and a `default` quorum on
//! local masters.

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::PostParams;
use kube::{Api, Client};
use redlock_operator::api::{DistributedLock, RedisQuorum};

use crate::support::redis_server::RedisCluster;

pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Creates the object described by `value`.
pub async fn create<K>(api: &Api<K>, value: serde_json::Value) -> Result<(), BoxError>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let object: K = serde_json::from_value(value)?;
    api.create(&PostParams::default(), &object).await?;
    Ok(())
}

/// The CRDs, and a `RedisQuorum` named `default` on `masters` (maxTtl 10 s, durable: no start-up quarantine).
pub async fn install_with_default_quorum(client: &Client, masters: &RedisCluster) -> Result<(), BoxError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in [
        redlock_operator::api::served_crd::<RedisQuorum>(),
        redlock_operator::api::served_crd::<DistributedLock>(),
    ] {
        crds.create(&PostParams::default(), &crd).await?;
    }
    create(
        &Api::<RedisQuorum>::all(client.clone()),
        serde_json::json!({ "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": "default" },
            "spec": { "endpoints": masters.urls(), "maxTtl": "10s", "assumeDurable": true } }),
    )
    .await
}
