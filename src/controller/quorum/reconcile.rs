//! The `RedisQuorum` reconciler's steps that talk to the API server and the masters. Standby replicas build and
//! check engines too (nothing of that is a write), so a failover finds them connected; only the active replica
//! writes status and Events.

use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::sync::Arc;

use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::{Resource, ResourceExt};
use tokio::time::Instant;

use super::config::{QuorumSecrets, engine_config};
use super::secret_reads::read_secrets;
use super::status::{QuorumEvent, healthy_status, kept_by_another_installation, unusable_status};
use crate::api::conditions::Stamp;
use crate::api::{RedisQuorum, RedisQuorumStatus};
use crate::controller::context::Context;
use crate::controller::engines::problem::QuorumProblem;
use crate::controller::engines::{QuorumEngine, QuorumLookup};
use crate::controller::error::Error;
use crate::redlock::{NodeHealth, Redlock};

pub async fn reconcile(quorum: Arc<RedisQuorum>, ctx: Arc<Context>) -> Result<Action, Error> {
    let name = quorum.name_any();
    let previous = quorum.status.clone().unwrap_or_default();
    let engine = match build(&quorum, &ctx).await {
        Ok(engine) => engine,
        Err(problem) if problem.is_transient() && ctx.engines.fingerprint(&name).is_some() => {
            // Keep the working engine (and the locks on it) and try again, rather than drop every lock for an
            // error that says nothing about the quorum.
            tracing::warn!(quorum = %name, %problem, "keeping the current engine");
            return Ok(Action::requeue(ctx.health_interval));
        }
        Err(problem) => {
            let was_usable = ctx.engines.fingerprint(&name).is_some();
            ctx.engines.set(&name, QuorumLookup::Unusable(problem.clone()));
            if was_usable {
                ctx.wake_locks_on(&name);
            }
            if kept_by_another_installation(&previous, &problem, quorum.meta().generation) {
                tracing::debug!(quorum = %name, %problem, "another installation keeps this quorum available: its status is left to it");
                return Ok(Action::requeue(ctx.health_interval));
            }
            let status = unusable_status(&previous, &problem, stamp(&quorum));
            ctx.metrics
                .set_quorum_masters(&name, quorum.spec.endpoints.len(), 0);
            if write_status(&quorum, &ctx, &status).await? {
                ctx.publish(
                    &*quorum,
                    EventType::Warning,
                    problem.reason(),
                    problem.to_string(),
                )
                .await;
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
        Instant::now(),
        stamp(&quorum),
    );
    ctx.metrics
        .set_quorum_masters(&name, nodes.len(), status.eligible.unwrap_or(0));
    if write_status(&quorum, &ctx, &status).await? {
        for event in events {
            let (type_, reason, note) = describe(event);
            ctx.publish(&*quorum, type_, reason, note).await;
        }
    }
    ctx.succeeded(&ObjectRef::from_obj(&*quorum));
    Ok(Action::requeue(ctx.health_interval))
}

pub fn error_policy(quorum: Arc<RedisQuorum>, error: &Error, ctx: Arc<Context>) -> Action {
    ctx.backoff(&ObjectRef::from_obj(&*quorum), error, "redisquorum")
}

fn stamp(quorum: &RedisQuorum) -> Stamp {
    Stamp {
        generation: quorum.meta().generation,
        now: Timestamp::now(),
    }
}

fn describe(event: QuorumEvent) -> (EventType, &'static str, String) {
    match event {
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
    }
}

/// The quorum's engine, rebuilt only when its spec or Secrets changed.
async fn build(quorum: &RedisQuorum, ctx: &Context) -> Result<Arc<QuorumEngine>, QuorumProblem> {
    let name = quorum.name_any();
    let secrets = read_secrets(quorum, ctx).await?;
    let config = engine_config(&quorum.spec, &secrets).map_err(QuorumProblem::InvalidSpec)?;
    let fingerprint = fingerprint(quorum, &secrets);
    if ctx.engines.fingerprint(&name) == Some(fingerprint)
        && let QuorumLookup::Ready(engine) = ctx.engines.lookup(&name)
    {
        return Ok(engine);
    }
    let engine = Redlock::connect(config)
        .await
        .map_err(|err| QuorumProblem::InvalidSpec(err.to_string()))?;
    tracing::info!(quorum = %name, masters = quorum.spec.endpoints.len(), "connected to the quorum's masters");
    let engine = Arc::new(QuorumEngine {
        engine,
        fingerprint,
        shared_keys: quorum.spec.shared_keys.clone(),
    });
    ctx.engines.set(&name, QuorumLookup::Ready(engine.clone()));
    ctx.wake_locks_on(&name);
    Ok(engine)
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
    let mut fields = serde_json::to_value(status)?;
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
    api.patch_status(&quorum.name_any(), &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    Ok(true)
}
