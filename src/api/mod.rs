//! The custom resources (group `redlock.io`, version `v1alpha1`) and what they share.

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

use kube::CustomResourceExt;

pub const GROUP: &str = "redlock.io";

/// The CRDs as YAML documents, in a stable order: what `redlock-operator crd` prints and `crds/` holds.
pub fn crd_documents() -> Result<Vec<(&'static str, String)>, serde_yaml_ng::Error> {
    Ok(vec![
        (
            "redisquorums.redlock.io.yaml",
            serde_yaml_ng::to_string(&RedisQuorum::crd())?,
        ),
        (
            "distributedlocks.redlock.io.yaml",
            serde_yaml_ng::to_string(&DistributedLock::crd())?,
        ),
    ])
}
