//! The custom resources (group `redlock.io`, version `v1beta1`, `v1alpha1` still served) and what they share.

pub mod conditions;
pub mod holder_contract;
pub mod label_key;
pub mod limits;
pub mod lock;
pub mod quorum;
pub mod reasons;
pub mod schema;

pub use lock::{DistributedLock, DistributedLockSpec, DistributedLockStatus, HolderPolicy, LockPhase};
pub use quorum::{RedisQuorum, RedisQuorumSpec, RedisQuorumStatus, SharedKeys};

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::CustomResourceExt;

pub const GROUP: &str = "redlock.io";
/// The version the operator reads and writes, and the API server stores.
pub const VERSION: &str = "v1beta1";
/// Versions still served beside [`VERSION`], with the same schema: the API server converts between them by
/// changing `apiVersion` alone (conversion strategy `None`), so objects written as any of them are read as all.
pub const EARLIER_VERSIONS: [&str; 1] = ["v1alpha1"];

/// The CRD of `K` as the API server gets it: [`VERSION`], served and stored, and each of [`EARLIER_VERSIONS`]
/// served beside it with the same schema, deprecated (kubectl warns on each request for it). Generated from the
/// Rust types, as `crds/` is.
pub fn served_crd<K: CustomResourceExt>() -> CustomResourceDefinition {
    let mut crd = K::crd();
    let earlier: Vec<_> = crd
        .spec
        .versions
        .iter()
        .filter(|version| version.name == VERSION)
        .flat_map(|current| {
            EARLIER_VERSIONS.iter().map(|name| {
                let mut version = current.clone();
                version.name = (*name).to_owned();
                version.storage = false;
                version.deprecated = Some(true);
                version.deprecation_warning = Some(format!(
                    "{GROUP}/{name} {} is deprecated: use {GROUP}/{VERSION} (the same fields)",
                    crd.spec.names.kind
                ));
                version
            })
        })
        .collect();
    crd.spec.versions.extend(earlier);
    crd
}

/// The CRDs as YAML documents, in a stable order: what `redlock-operator crd` prints and `crds/` holds.
pub fn crd_documents() -> Result<Vec<(&'static str, String)>, serde_yaml_ng::Error> {
    Ok(vec![
        (
            "redisquorums.redlock.io.yaml",
            serde_yaml_ng::to_string(&served_crd::<RedisQuorum>())?,
        ),
        (
            "distributedlocks.redlock.io.yaml",
            serde_yaml_ng::to_string(&served_crd::<DistributedLock>())?,
        ),
    ])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_current_version_is_stored_and_the_earlier_ones_served_with_the_same_schema() {
        for crd in [served_crd::<DistributedLock>(), served_crd::<RedisQuorum>()] {
            let names: Vec<&str> = crd.spec.versions.iter().map(|v| v.name.as_str()).collect();
            assert_eq!(names, ["v1beta1", "v1alpha1"]);
            let stored: Vec<&str> = crd
                .spec
                .versions
                .iter()
                .filter(|v| v.storage)
                .map(|v| v.name.as_str())
                .collect();
            assert_eq!(stored, [VERSION]);
            assert!(crd.spec.versions.iter().all(|v| v.served));
            let (current, earlier) = (&crd.spec.versions[0], &crd.spec.versions[1]);
            assert_eq!(current.schema, earlier.schema);
            assert_eq!(current.subresources, earlier.subresources);
            assert_eq!(
                current.additional_printer_columns,
                earlier.additional_printer_columns
            );
            assert_eq!(earlier.deprecated, Some(true));
            assert!(crd.spec.conversion.is_none(), "conversion None: the same fields");
        }
    }
}
