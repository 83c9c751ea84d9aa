//! The `RedisQuorum` reconciler: dereference Secrets → validate → (re)build the engine when what it is built
//! from changed → check the masters → write status and Events. Standby replicas build and check engines too
//! (nothing of that is a write), so a failover finds them connected; only the active replica writes.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tokio::time::Instant;

use super::context::{Context, Error};
use super::engines::{QuorumEngine, QuorumLookup};
use super::quorum_config::{QuorumSecrets, engine_config};
use super::quorum_status::{QuorumEvent, healthy_status, unusable_status};
use crate::api::{RedisQuorum, RedisQuorumStatus};
use crate::redlock::{NodeHealth, Redlock};

/// The reason for a Secret read that failed for a reason of the API server's, not of the quorum's.
const TRANSIENT: &str = "SecretUnreadable";

pub async fn reconcile(quorum: Arc<RedisQuorum>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = quorum.name_any();
    let generation = quorum.meta().generation;
    let previous = quorum.status.clone().unwrap_or_default();
    let engine = match build(&quorum, &ctx).await {
        Ok(engine) => engine,
        Err((reason, message)) if reason == TRANSIENT && ctx.engines.fingerprint(&name).is_some() => {
            // The API server failed to hand over a Secret: keep the working engine (and the locks on it) and
            // try again, rather than dropping every lock for an error that says nothing about the quorum.
            tracing::warn!(quorum = %name, %message, "keeping the current engine");
            return Ok(Action::requeue(ctx.health_interval));
        }
        Err((reason, message)) => {
            let was_usable = ctx.engines.fingerprint(&name).is_some();
            ctx.engines.set(
                &name,
                QuorumLookup::Unusable {
                    reason,
                    message: message.clone(),
                },
            );
            if was_usable {
                ctx.wake_locks_on(&name);
            }
            let status = unusable_status(&previous, reason, &message, generation, Timestamp::now());
            ctx.metrics
                .set_quorum_masters(&name, quorum.spec.endpoints.len(), 0);
            if write_status(&quorum, &ctx, &status).await? {
                ctx.publish(&*quorum, EventType::Warning, reason, message).await;
            }
            return Ok(Action::requeue(ctx.health_interval));
        }
    };
    let nodes = engine.engine.check_masters().await;
    for node in &nodes {
        let state = match node.health {
            NodeHealth::Up => "up",
            NodeHealth::Quarantined => "quarantined",
            NodeHealth::Down => "down",
        };
        ctx.metrics.set_master_state(&name, &node.endpoint, state);
    }
    let (status, events) = healthy_status(
        &previous,
        &nodes,
        engine.engine.quorum(),
        generation,
        Instant::now(),
        Timestamp::now(),
    );
    ctx.metrics
        .set_quorum_masters(&name, nodes.len(), status.eligible.unwrap_or(0));
    if write_status(&quorum, &ctx, &status).await? {
        for event in events {
            let (type_, reason, note) = match event {
                QuorumEvent::Quarantined { endpoint, seconds } => (
                    EventType::Warning,
                    "MasterQuarantined",
                    format!(
                        "{endpoint} restarted recently and may have forgotten locks: it does not vote for {seconds}s"
                    ),
                ),
                QuorumEvent::Down { endpoint, error } => (
                    EventType::Warning,
                    "MasterDown",
                    format!("{endpoint} is unreachable: {error}"),
                ),
                QuorumEvent::Recovered { endpoint } => (
                    EventType::Normal,
                    "MasterUp",
                    format!("{endpoint} is up and voting again"),
                ),
            };
            ctx.publish(&*quorum, type_, reason, note).await;
        }
    }
    ctx.succeeded(&ObjectRef::from_obj(&*quorum));
    Ok(Action::requeue(ctx.health_interval))
}

pub fn error_policy(quorum: Arc<RedisQuorum>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.backoff(&ObjectRef::from_obj(&*quorum), error, "redisquorum")
}

/// The quorum's engine, rebuilt only when its spec or Secrets changed.
async fn build(quorum: &RedisQuorum, ctx: &Context) -> Result<Arc<QuorumEngine>, (&'static str, String)> {
    let name = quorum.name_any();
    let secrets = read_secrets(quorum, ctx).await?;
    let config = engine_config(&quorum.spec, &secrets).map_err(|message| ("InvalidSpec", message))?;
    let fingerprint = fingerprint(quorum, &secrets);
    if ctx.engines.fingerprint(&name) == Some(fingerprint)
        && let QuorumLookup::Ready(engine) = ctx.engines.lookup(&name)
    {
        return Ok(engine);
    }
    let engine = Redlock::connect(config)
        .await
        .map_err(|err| ("InvalidSpec", err.to_string()))?;
    tracing::info!(quorum = %name, masters = quorum.spec.endpoints.len(), "connected to the quorum's masters");
    let engine = Arc::new(QuorumEngine { engine, fingerprint });
    ctx.engines.set(&name, QuorumLookup::Ready(engine.clone()));
    ctx.wake_locks_on(&name);
    Ok(engine)
}

/// Reads the Secrets the spec names. Read on every health check rather than watched: the operator then needs
/// `get` on Secrets only, not a cluster-wide cache of every Secret; a rotated password is picked up within
/// one health interval.
async fn read_secrets(quorum: &RedisQuorum, ctx: &Context) -> Result<QuorumSecrets, (&'static str, String)> {
    let mut secrets = QuorumSecrets::default();
    if let Some(auth) = &quorum.spec.auth {
        let secret = get_secret(ctx, &auth.secret_namespace, &auth.secret_name).await?;
        secrets.password = Some(secret_text(
            &secret,
            &auth.secret_namespace,
            &auth.secret_name,
            &auth.password_key,
        )?);
        if let Some(key) = &auth.username_key {
            secrets.username = Some(secret_text(
                &secret,
                &auth.secret_namespace,
                &auth.secret_name,
                key,
            )?);
        }
    }
    if let Some(tls) = &quorum.spec.tls {
        match (&tls.ca_secret_namespace, &tls.ca_secret_name) {
            (Some(namespace), Some(name)) => {
                let secret = get_secret(ctx, namespace, name).await?;
                secrets.ca_pem = Some(secret_text(&secret, namespace, name, &tls.ca_key)?.into_bytes());
            }
            (None, None) => {}
            _ => {
                return Err((
                    "InvalidSpec",
                    "spec.tls needs both caSecretNamespace and caSecretName, or neither".to_owned(),
                ));
            }
        }
    }
    Ok(secrets)
}

async fn get_secret(ctx: &Context, namespace: &str, name: &str) -> Result<Secret, (&'static str, String)> {
    let api: Api<Secret> = Api::namespaced(ctx.client.clone(), namespace);
    match api.get_opt(name).await {
        Ok(Some(secret)) => Ok(secret),
        Ok(None) => Err((
            "SecretNotFound",
            format!("Secret {namespace}/{name} does not exist"),
        )),
        Err(kube::Error::Api(status)) if status.code == 403 => Err((
            "SecretForbidden",
            format!(
                "the operator may not read Secret {namespace}/{name}: {}",
                status.message
            ),
        )),
        Err(err) => Err((
            "SecretUnreadable",
            format!("cannot read Secret {namespace}/{name}: {err}"),
        )),
    }
}

fn secret_text(
    secret: &Secret,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<String, (&'static str, String)> {
    let bytes = secret
        .data
        .as_ref()
        .and_then(|data| data.get(key))
        .map(|value| value.0.clone())
        .or_else(|| {
            secret
                .string_data
                .as_ref()
                .and_then(|data| data.get(key))
                .map(|value| value.clone().into_bytes())
        })
        .ok_or_else(|| {
            (
                "SecretKeyMissing",
                format!("Secret {namespace}/{name} has no key `{key}`"),
            )
        })?;
    String::from_utf8(bytes).map_err(|_| {
        (
            "SecretKeyInvalid",
            format!("Secret {namespace}/{name} key `{key}` is not UTF-8"),
        )
    })
}

fn fingerprint(quorum: &RedisQuorum, secrets: &QuorumSecrets) -> u64 {
    let mut hasher = DefaultHasher::new();
    serde_json::to_string(&quorum.spec)
        .unwrap_or_default()
        .hash(&mut hasher);
    secrets.username.hash(&mut hasher);
    secrets.password.hash(&mut hasher);
    secrets.ca_pem.hash(&mut hasher);
    hasher.finish()
}

/// Writes status when it changed and this replica is the active one; `Ok(true)` when it wrote.
async fn write_status(
    quorum: &RedisQuorum,
    ctx: &Context,
    status: &RedisQuorumStatus,
) -> Result<bool, Error> {
    if quorum.status.as_ref() == Some(status) || !ctx.leadership.is_leader() {
        return Ok(false);
    }
    let api: Api<RedisQuorum> = Api::all(ctx.client.clone());
    // A merge patch replaces lists whole; fields the new status leaves out are nulled, so nothing stale
    // survives (an empty master list is not serialized at all).
    let mut fields = serde_json::to_value(status).unwrap_or_default();
    if let Some(fields) = fields.as_object_mut() {
        for key in [
            "eligible",
            "required",
            "masters",
            "observedGeneration",
            "conditions",
        ] {
            fields.entry(key).or_insert(serde_json::Value::Null);
        }
    }
    let patch = serde_json::json!({ "status": fields });
    ctx.ensure_leader()?;
    api.patch_status(&quorum.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(true)
}
