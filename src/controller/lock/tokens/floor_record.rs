//! The cluster's floor record of a key's fencing tokens (see `super::floor`): read before an acquisition,
//! written after the masters granted and before status, labels or grants show the token. Every write carries
//! the resourceVersion it was decided on, so two writers (replicas, locks sharing the key) cannot lower it.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, ObjectMeta, PostParams};

use crate::controller::error::{Error, is_conflict, is_not_found};
use crate::controller::lock::acquisition::Record;
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::tokens::floor::{
    AfterGrant, MANAGED_BY, after_grant, floor_of, invalid_record_message, record_data, record_name,
};

/// Writes lost to other writers before giving the reconciler back (each loss re-reads the record).
const WRITE_ATTEMPTS: u32 = 4;

/// The floor as read, with the version a write must match.
#[derive(Clone, Debug)]
pub struct Floor {
    pub token: i64,
    /// `None`: there is no record yet.
    resource_version: Option<String>,
}

fn api(ctx: &LockContext) -> Api<ConfigMap> {
    Api::namespaced(ctx.client.clone(), &ctx.secrets_namespace)
}

/// Reads the key's floor (a direct GET, not a cache: a cache may lag behind the last write). The inner error
/// is the message for a record that makes no sense.
pub async fn read(ctx: &LockContext, quorum: &str, key: &str) -> Result<Result<Floor, String>, Error> {
    let name = record_name(quorum, key);
    let Some(record) = api(ctx).get_opt(&name).await? else {
        return Ok(Ok(Floor {
            token: 0,
            resource_version: None,
        }));
    };
    Ok(floor_of(record.data.as_ref(), quorum, key)
        .map(|token| Floor {
            token,
            resource_version: record.metadata.resource_version,
        })
        .map_err(|problem| invalid_record_message(&ctx.secrets_namespace, &name, &problem)))
}

/// Records `granted` as the key's floor unless the record (as `seen`, then as re-read after every lost write)
/// already holds at least that.
pub async fn record(
    ctx: &LockContext,
    quorum: &str,
    key: &str,
    mut seen: Floor,
    granted: i64,
) -> Result<Record, Error> {
    let name = record_name(quorum, key);
    for _ in 0..WRITE_ATTEMPTS {
        if let AfterGrant::Reacquire { floor } = after_grant(seen.token, granted) {
            return Ok(Record::Above { floor });
        }
        let object = ConfigMap {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(ctx.secrets_namespace.clone()),
                labels: Some(BTreeMap::from([(
                    MANAGED_BY.0.to_owned(),
                    MANAGED_BY.1.to_owned(),
                )])),
                resource_version: seen.resource_version.clone(),
                ..ObjectMeta::default()
            },
            data: Some(record_data(quorum, key, granted)),
            ..ConfigMap::default()
        };
        let written = match &seen.resource_version {
            None => api(ctx).create(&PostParams::default(), &object).await,
            Some(_) => api(ctx).replace(&name, &PostParams::default(), &object).await,
        };
        match written {
            Ok(_) => return Ok(Record::Written),
            // Another writer got there first, or deleted the record: decide again on what is there now.
            Err(err) if is_conflict(&err) || is_already_exists(&err) || is_not_found(&err) => {
                seen = match read(ctx, quorum, key).await? {
                    Ok(floor) => floor,
                    Err(message) => return Ok(Record::Invalid(message)),
                };
            }
            Err(err) => return Err(Error::floor_record(err)),
        }
    }
    Err(Error::Conflict)
}

fn is_already_exists(err: &kube::Error) -> bool {
    matches!(err, kube::Error::Api(status) if status.is_already_exists())
}
