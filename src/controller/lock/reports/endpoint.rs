//! `POST /v1/stopped` on the active replica: a holder's `elect` or Job guard reports that its work under a
//! given-up grant has stopped, with the projected service-account token of its pod as the bearer. The API
//! server says which pod sent it (`TokenReview`); the lock and the pod are read directly, not from the caches (a
//! report taken releases a key early, so it is decided on what the API server has now); `rule::judge` decides.
//! A report taken wakes the lock, whose hand-over then releases the key at once.
//!
//! Answers are Kubernetes `Status` objects, so a client reads a refusal's reason and message as it reads the
//! API server's.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;

use super::rule::{Refused, Taken, judge, reporter_of};
use crate::api::DistributedLock;
use crate::api::holder_contract::{REPORT_TOKEN_AUDIENCE, STOPPED_REPORT_PATH, StoppedReport};
use crate::controller::context::Context;
use crate::controller::keeper::PermitRef;
use crate::controller::lock::claim::{Keeper, keeper_of};

/// A report is a lock name, a permit and a token: anything longer is not one.
const MAX_REPORT_BYTES: usize = 4096;

/// The route, for the wiring to serve beside metrics and health.
pub fn router(ctx: Arc<Context>) -> Router {
    Router::new()
        .route(STOPPED_REPORT_PATH, post(take_report))
        .with_state(ctx)
}

async fn take_report(State(ctx): State<Arc<Context>>, headers: HeaderMap, body: Bytes) -> Response {
    let outcome = decide(&ctx, &headers, &body).await;
    match outcome {
        Ok((lock, taken)) => {
            tracing::info!(lock = %lock, permit = taken.permit, token = taken.token, pod = %taken.pod, "the holder reported its work stopped: the key given up goes at once");
            ctx.metrics.stopped_report("taken");
            let message = format!(
                "taken: the key of permit {} given up with fencing token {} is released now",
                taken.permit, taken.token
            );
            status_reply(StatusCode::OK, "Success", "Taken", &message)
        }
        Err(refused) => {
            tracing::info!(code = refused.code, reason = refused.reason, message = %refused.message, "a report of stopped work was refused");
            ctx.metrics.stopped_report(refused.reason);
            let code = StatusCode::from_u16(refused.code).unwrap_or(StatusCode::BAD_REQUEST);
            status_reply(code, "Failure", refused.reason, &refused.message)
        }
    }
}

async fn decide(
    ctx: &Context,
    headers: &HeaderMap,
    body: &[u8],
) -> Result<(ObjectRef<DistributedLock>, Taken), Refused> {
    if !ctx.leadership.is_leader() {
        return Err(Refused::new(
            503,
            "NotActive",
            "this replica is a standby: status.handOverUrl names the active one",
        ));
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| Refused::new(401, "Unauthorized", "no bearer token"))?;
    if body.len() > MAX_REPORT_BYTES {
        return Err(Refused::new(
            413,
            "TooLarge",
            "a report is a lock, a permit and a token",
        ));
    }
    let report: StoppedReport = serde_json::from_slice(body)
        .map_err(|err| Refused::new(400, "BadRequest", format!("not a report: {err}")))?;
    if report.lock.is_empty() || report.lock.len() > 253 {
        return Err(Refused::new(
            400,
            "BadRequest",
            "lock must be a DistributedLock's name",
        ));
    }
    let review = TokenReview {
        spec: TokenReviewSpec {
            token: Some(token.to_owned()),
            audiences: Some(vec![REPORT_TOKEN_AUDIENCE.to_owned()]),
        },
        ..TokenReview::default()
    };
    let reviews: Api<TokenReview> = Api::all(ctx.client.clone());
    let reviewed = reviews
        .create(&PostParams::default(), &review)
        .await
        .map_err(|err| {
            Refused::new(
                503,
                "ReviewFailed",
                format!("the token could not be reviewed: {err}"),
            )
        })?;
    let reporter = reporter_of(reviewed.status.as_ref(), REPORT_TOKEN_AUDIENCE)?;
    let locks: Api<DistributedLock> = Api::namespaced(ctx.client.clone(), &reporter.namespace);
    let lock = locks
        .get_opt(&report.lock)
        .await
        .map_err(|err| Refused::new(503, "ReadFailed", format!("the lock could not be read: {err}")))?
        .ok_or_else(|| {
            Refused::new(
                404,
                "NotFound",
                format!("no DistributedLock {}/{}", reporter.namespace, report.lock),
            )
        })?;
    if !matches!(keeper_of(&lock, &ctx.installation), Keeper::Ours) {
        return Err(Refused::new(
            421,
            "KeptByAnotherInstallation",
            "another installation keeps this lock: report to the handOverUrl its status shows",
        ));
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &reporter.namespace);
    let pod = pods
        .get_opt(&reporter.pod)
        .await
        .map_err(|err| Refused::new(503, "ReadFailed", format!("the pod could not be read: {err}")))?;
    let taken = judge(&report, &reporter, &lock, pod.as_ref())?;
    let lref = ObjectRef::from_obj(&lock);
    ctx.stopped.record(
        PermitRef::new(lref.clone(), taken.permit),
        taken.token,
        &taken.pod,
    );
    ctx.keeper.wake(lref.clone());
    Ok((lref, taken))
}

fn status_reply(code: StatusCode, status: &str, reason: &str, message: &str) -> Response {
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Status",
        "status": status,
        "reason": reason,
        "message": message,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}
