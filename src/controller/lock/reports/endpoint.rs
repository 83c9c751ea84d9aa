//! `POST /v1/stopped` on the active replica (and, beside it, `validity`'s `POST /v1/validity`): a holder's `elect` or Job guard reports that its work under a
//! given-up grant has stopped, with the projected service-account token of its pod as the bearer. The API
//! server says which pod sent it (`TokenReview`); the lock and the pod are read directly, not from the caches (a
//! report taken releases a key early, so it is decided on what the API server has now); `rule::judge` decides.
//! A report taken wakes the lock, whose hand-over then releases the key at once.
//!
//! Answers are Kubernetes `Status` objects, so a client reads a refusal's reason and message as it reads the
//! API server's.
//!
//! Anyone who reaches the port may send a report, so nothing a client without a genuine token sends may cost an
//! API call it did not earn: a body over [`MAX_REPORT_BYTES`] is refused before it is read (413), a bearer
//! token that cannot be a projected token for our audience is refused on its text (`token_shape`), a token the
//! API server refused lately is refused again from memory, and reviews (with the reads that follow an accepted
//! one) are bounded in flight and per second (`budget`), beyond which the answer is 429 with `Retry-After`.

use std::sync::Arc;
use std::time::Instant;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use k8s_openapi::api::authentication::v1::{TokenReview, TokenReviewSpec};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use kube::runtime::reflector::ObjectRef;

use super::budget::{Budget, Lane};
use super::rule::{Refused, Taken, judge, reporter_of};
use super::token_shape::{Claimed, claims_of};
use crate::api::DistributedLock;
use crate::api::holder_contract::{REPORT_TOKEN_AUDIENCE, STOPPED_REPORT_PATH, StoppedReport};
use crate::controller::keeper::PermitRef;
use crate::controller::lock::claim::{Custody, custody_of};
use crate::controller::lock::controller_state::LockContext;
use crate::controller::lock::handover::releasing;

/// A report is a lock name, a permit and a token: anything longer is not one.
pub const MAX_REPORT_BYTES: usize = 4096;

/// The metric label of a report refused because the API server refused its token lately.
pub(super) const REFUSED_LATELY: &str = "refused_lately";

/// What the route keeps: the controllers' context and what reports may still cost.
struct Shared {
    ctx: Arc<LockContext>,
    budget: Budget,
}

/// The route, for the wiring to serve beside metrics and health.
pub fn router(ctx: Arc<LockContext>) -> Router {
    // Holders' questions about their grant's validity share the port (and its bounds) with the reports.
    let validity = super::validity::router(ctx.clone());
    Router::new()
        .route(STOPPED_REPORT_PATH, post(take_report))
        .with_state(Arc::new(Shared {
            ctx,
            budget: Budget::default(),
        }))
        .merge(validity)
}

/// A report not taken: the refusal, and when to try again (`Retry-After`, seconds) if it was for the load.
struct NotTaken {
    refused: Refused,
    retry_after: Option<u64>,
}

impl From<Refused> for NotTaken {
    fn from(refused: Refused) -> Self {
        Self {
            refused,
            retry_after: None,
        }
    }
}

async fn take_report(State(shared): State<Arc<Shared>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    let ctx = &shared.ctx;
    let outcome = decide(&shared, &parts.headers, body).await;
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
        Err(NotTaken { refused, retry_after }) => {
            // A flood's refusals (no token, a bad one, too large, too many) are not each logged at info.
            if matches!(refused.code, 401 | 413 | 429) {
                tracing::debug!(code = refused.code, reason = refused.reason, message = %refused.message, "a report of stopped work was refused");
            } else {
                tracing::info!(code = refused.code, reason = refused.reason, message = %refused.message, "a report of stopped work was refused");
            }
            ctx.metrics.stopped_report(refused.reason);
            let code = StatusCode::from_u16(refused.code).unwrap_or(StatusCode::BAD_REQUEST);
            let mut reply = status_reply(code, "Failure", refused.reason, &refused.message);
            if let Some(seconds) = retry_after {
                reply
                    .headers_mut()
                    .insert(header::RETRY_AFTER, HeaderValue::from(seconds));
            }
            reply
        }
    }
}

fn too_large() -> Refused {
    Refused::new(
        413,
        "TooLarge",
        format!("a report is a lock, a permit and a token: at most {MAX_REPORT_BYTES} bytes"),
    )
}

/// Whether the cache shows what a genuine report would be about: the lock in the namespace the token claims,
/// recording the key of that permit as given up with that fencing token. Only a choice of lane.
fn plausible(ctx: &LockContext, claimed: &Claimed, report: &StoppedReport) -> bool {
    let lref = ObjectRef::<DistributedLock>::new(&report.lock).within(&claimed.namespace);
    ctx.locks.get(&lref).is_some_and(|lock| {
        lock.status
            .as_ref()
            .and_then(|status| releasing::recorded(status, report.permit))
            .is_some_and(|entry| entry.fencing_token == report.fencing_token)
    })
}

async fn decide(
    shared: &Shared,
    headers: &HeaderMap,
    body: Body,
) -> Result<(ObjectRef<DistributedLock>, Taken), NotTaken> {
    let ctx = &shared.ctx;
    if !ctx.leadership.is_leader() {
        return Err(Refused::new(
            503,
            "NotActive",
            "this replica is a standby: status.handOverUrl names the active one",
        )
        .into());
    }
    // Refused before a byte of it is read.
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_REPORT_BYTES as u64) {
        return Err(too_large().into());
    }
    let token = headers
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.strip_prefix("Bearer "))
        .map(str::trim)
        .filter(|token| !token.is_empty())
        .ok_or_else(|| Refused::new(401, "Unauthorized", "no bearer token"))?;
    let now = k8s_openapi::jiff::Timestamp::now().as_second();
    let claimed = claims_of(token, REPORT_TOKEN_AUDIENCE, now).map_err(|why| {
        ctx.metrics.stopped_report_refused_locally(why.label());
        Refused::new(401, "Unauthorized", why.message())
    })?;
    let digest = super::budget::Refusals::digest(token);
    if shared.budget.refused(&digest, Instant::now()) {
        ctx.metrics.stopped_report_refused_locally(REFUSED_LATELY);
        return Err(Refused::new(401, "Unauthorized", "the API server refused this token lately").into());
    }
    // Read up to the limit only, whatever the sender declared (or did not: a chunked body).
    let body = axum::body::to_bytes(body, MAX_REPORT_BYTES)
        .await
        .map_err(|_| too_large())?;
    let report: StoppedReport = serde_json::from_slice(&body)
        .map_err(|err| Refused::new(400, "BadRequest", format!("not a report: {err}")))?;
    if report.lock.is_empty() || report.lock.len() > 253 {
        return Err(Refused::new(400, "BadRequest", "lock must be a DistributedLock's name").into());
    }
    let lane: &Lane = if plausible(ctx, &claimed, &report) {
        &shared.budget.plausible
    } else {
        &shared.budget.other
    };
    // Held until the report is decided: the reads after the review count against the same bound.
    let _in_flight = lane.admit(Instant::now()).map_err(|busy| {
        ctx.metrics.stopped_report_refused_locally(busy.label());
        NotTaken {
            refused: Refused::new(
                429,
                "TooManyRequests",
                "too many reports are being reviewed: try again after Retry-After",
            ),
            retry_after: Some(busy.retry_after_secs()),
        }
    })?;
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
    let reporter = reporter_of(reviewed.status.as_ref(), REPORT_TOKEN_AUDIENCE).inspect_err(|_| {
        // Not authenticated, not for our audience, not bound to a pod: it will not be, so it is not asked again.
        shared.budget.remember_refusal(digest, Instant::now());
    })?;
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
    if !matches!(custody_of(&lock, &ctx.installation), Custody::Ours) {
        return Err(Refused::new(
            421,
            "KeptByAnotherInstallation",
            "another installation keeps this lock: report to the handOverUrl its status shows",
        )
        .into());
    }
    let pods: Api<Pod> = Api::namespaced(ctx.client.clone(), &reporter.namespace);
    let pod = pods
        .get_opt(&reporter.pod)
        .await
        .map_err(|err| Refused::new(503, "ReadFailed", format!("the pod could not be read: {err}")))?;
    let taken = judge(&report, &reporter, &lock, pod.as_ref())?;
    let lref = ObjectRef::from_obj(&lock);
    ctx.lock_controller.stopped.record(
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
