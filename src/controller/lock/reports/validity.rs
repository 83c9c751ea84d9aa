//! `POST /v1/validity` on the reports port: a holder (`elect`, the Job guard, a custom holder) asks how long its
//! grant stays valid, and counts the answer from the moment it sent the question on its own monotonic clock, so
//! that its stop time never rests on comparing its wall clock with the operator's (Gray and Cheriton's leases).
//!
//! Answered from memory only, at no API call: the lock from the cache, the grant from the keeper. Nobody is
//! authenticated, so the answer says nothing status does not show: only a caller that names the lock's uid and
//! the token of the grant this replica keeps for the permit now, shown in status with this replica's pin (after a
//! failover, the new active replica answers once it has resumed the lock and written that), is told the lease's
//! validity left, and never more than the validity status shows. Anything else is "unknown", never a guess, and
//! no status time is ever converted.

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Body;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use kube::runtime::reflector::ObjectRef;
use tokio::time::Instant;

use crate::api::holder_contract::{VALIDITY_PATH, ValidityAnswer, ValidityQuestion};
use crate::api::{DistributedLock, DistributedLockStatus, LockPhase};
use crate::controller::keeper::{HeldValidity, PermitRef};
use crate::controller::lock::controller_state::LockContext;

/// A question is a namespace, a name, a uid, a permit and a token: anything longer is not one.
pub const MAX_QUESTION_BYTES: usize = 1024;

/// Why the answer is "unknown".
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unknown {
    /// A standby: only the active replica keeps grants.
    NotActive,
    /// No lock of that name and uid in the cache (one answer for both, so names cannot be probed).
    NotThisLock,
    /// Status does not show that token for the permit, or shows another replica's pin (not resumed here yet).
    NotShown,
    /// This replica keeps no grant of the permit with that token.
    NotKept,
    /// The grant could not be extended: the holder is being fenced.
    Lost,
}

impl Unknown {
    pub fn reason(self) -> &'static str {
        match self {
            Unknown::NotActive => "NotActive",
            Unknown::NotThisLock => "NotThisLock",
            Unknown::NotShown => "NotShown",
            Unknown::NotKept => "NotKept",
            Unknown::Lost => "Lost",
        }
    }
}

/// What the answer rests on, all from memory.
pub struct Facts<'a> {
    pub active: bool,
    /// The lock named by the question, from the cache.
    pub lock: Option<&'a DistributedLock>,
    /// This replica's pin, shown in status beside `handOverUrl` by the replica that wrote it.
    pub pin: Option<&'a str>,
    /// The grant the keeper holds for the permit.
    pub held: Option<HeldValidity>,
}

/// The validity left of the grant `question` names, at `now`. Pure.
pub fn answer(question: &ValidityQuestion, facts: &Facts<'_>, now: Instant) -> Result<Duration, Unknown> {
    if !facts.active {
        return Err(Unknown::NotActive);
    }
    let lock = facts
        .lock
        .filter(|lock| lock.metadata.uid.as_deref() == Some(question.uid.as_str()))
        .ok_or(Unknown::NotThisLock)?;
    let status = lock.status.as_ref().ok_or(Unknown::NotShown)?;
    let ours = facts
        .pin
        .is_some_and(|pin| status.hand_over_certificate_sha256.as_deref() == Some(pin));
    if !ours || !shows(status, question.permit, question.fencing_token) {
        return Err(Unknown::NotShown);
    }
    let held = facts
        .held
        .filter(|held| held.token == question.fencing_token)
        .ok_or(Unknown::NotKept)?;
    if held.lost {
        return Err(Unknown::Lost);
    }
    // Never more than status shows: the hand-over waits for the validity shown (or the lease's, which is later),
    // and a successor that keeps nothing of the lock knows only status's.
    let shown = held.status_valid_until.ok_or(Unknown::NotShown)?;
    Ok(held.valid_until.min(shown).saturating_duration_since(now))
}

/// Whether status shows the grant of `permit` with `token` held, as a holder reads it (`cli::term::term_of`).
fn shows(status: &DistributedLockStatus, permit: u32, token: i64) -> bool {
    if status.phase != Some(LockPhase::Held) {
        return false;
    }
    if status.holders.is_empty() {
        return permit == 0 && status.fencing_token == Some(token);
    }
    status
        .holders
        .iter()
        .any(|held| u32::try_from(held.permit).ok() == Some(permit) && held.fencing_token == token)
}

/// The route, served beside the reports.
pub fn router(ctx: Arc<LockContext>) -> Router {
    Router::new()
        .route(VALIDITY_PATH, post(take_question))
        .with_state(ctx)
}

async fn take_question(State(ctx): State<Arc<LockContext>>, request: Request) -> Response {
    let (parts, body) = request.into_parts();
    // Refused before a byte of it is read.
    let declared = parts
        .headers
        .get(header::CONTENT_LENGTH)
        .and_then(|value| value.to_str().ok())
        .and_then(|value| value.parse::<u64>().ok());
    if declared.is_some_and(|length| length > MAX_QUESTION_BYTES as u64) {
        return refused(StatusCode::PAYLOAD_TOO_LARGE, "a question is at most 1024 bytes");
    }
    let question = match read_question(body).await {
        Ok(question) => question,
        Err(reply) => return reply,
    };
    let lref = ObjectRef::<DistributedLock>::new(&question.lock).within(&question.namespace);
    let lock = ctx.locks.get(&lref);
    let permit = PermitRef::new(lref, question.permit);
    let held = ctx.keeper.validity(&permit);
    let facts = Facts {
        active: ctx.leadership.is_leader(),
        lock: lock.as_deref(),
        pin: ctx.lock_controller.hand_over_pin.as_deref(),
        held,
    };
    let now = Instant::now();
    let answered = match answer(&question, &facts, now) {
        Ok(left) => {
            // Told its validity: the holder of this grant reaches the operator (`holder_liveness`).
            ctx.lock_controller.asks.asked(
                permit,
                (question.fencing_token, ctx.leadership.term()),
                now,
                left,
            );
            ValidityAnswer {
                remaining_millis: Some(u64::try_from(left.as_millis()).unwrap_or(u64::MAX)),
                unknown: None,
            }
        }
        Err(unknown) => {
            tracing::debug!(reason = unknown.reason(), "a validity question answered unknown");
            ValidityAnswer {
                remaining_millis: None,
                unknown: Some(unknown.reason().to_owned()),
            }
        }
    };
    (StatusCode::OK, axum::Json(answered)).into_response()
}

async fn read_question(body: Body) -> Result<ValidityQuestion, Response> {
    // Read up to the limit only, whatever the sender declared (or did not: a chunked body).
    let body = axum::body::to_bytes(body, MAX_QUESTION_BYTES)
        .await
        .map_err(|_| refused(StatusCode::PAYLOAD_TOO_LARGE, "a question is at most 1024 bytes"))?;
    let question: ValidityQuestion = serde_json::from_slice(&body)
        .map_err(|err| refused(StatusCode::BAD_REQUEST, &format!("not a question: {err}")))?;
    if question.lock.is_empty()
        || question.lock.len() > 253
        || question.namespace.is_empty()
        || question.namespace.len() > 63
    {
        return Err(refused(
            StatusCode::BAD_REQUEST,
            "namespace and lock must name a DistributedLock",
        ));
    }
    Ok(question)
}

fn refused(code: StatusCode, message: &str) -> Response {
    let body = serde_json::json!({
        "apiVersion": "v1",
        "kind": "Status",
        "status": "Failure",
        "reason": if code == StatusCode::PAYLOAD_TOO_LARGE { "TooLarge" } else { "BadRequest" },
        "message": message,
        "code": code.as_u16(),
    });
    (code, axum::Json(body)).into_response()
}

#[cfg(test)]
mod tests {
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
    use k8s_openapi::jiff::Timestamp;

    use super::*;
    use crate::api::lock::PermitHolder;

    const PIN: &str = "ab";

    fn lock(token: i64, pin: &str) -> DistributedLock {
        let mut lock: DistributedLock = serde_json::from_value(serde_json::json!({
            "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock",
            "metadata": {"name": "web", "namespace": "shop", "uid": "u-1"},
            "spec": {"holder": {"leaderElection": {"selector": {}}}}
        }))
        .unwrap();
        lock.status = Some(DistributedLockStatus {
            phase: Some(LockPhase::Held),
            holder: Some("web-0".into()),
            fencing_token: Some(token),
            valid_until: Some(MicroTime(Timestamp::from_second(1_000).unwrap())),
            hand_over_certificate_sha256: Some(pin.into()),
            ..DistributedLockStatus::default()
        });
        lock
    }

    fn question(token: i64) -> ValidityQuestion {
        ValidityQuestion {
            namespace: "shop".into(),
            lock: "web".into(),
            uid: "u-1".into(),
            permit: 0,
            fencing_token: token,
        }
    }

    fn held(token: i64, now: Instant, lease_s: u64, shown_s: Option<u64>) -> HeldValidity {
        HeldValidity {
            token,
            valid_until: now + Duration::from_secs(lease_s),
            status_valid_until: shown_s.map(|s| now + Duration::from_secs(s)),
            lost: false,
        }
    }

    fn facts(lock: &DistributedLock, held: Option<HeldValidity>) -> Facts<'_> {
        Facts {
            active: true,
            lock: Some(lock),
            pin: Some(PIN),
            held,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn the_grant_kept_and_shown_is_answered_with_no_more_than_status_shows() {
        let now = Instant::now();
        let shown = lock(7, PIN);
        assert_eq!(
            answer(&question(7), &facts(&shown, Some(held(7, now, 9, Some(6)))), now),
            Ok(Duration::from_secs(6)),
            "extended since status was written: status's"
        );
        assert_eq!(
            answer(&question(7), &facts(&shown, Some(held(7, now, 4, Some(6)))), now),
            Ok(Duration::from_secs(4)),
            "the lease's, when shorter"
        );
        let later = now + Duration::from_secs(10);
        assert_eq!(
            answer(
                &question(7),
                &facts(&shown, Some(held(7, now, 4, Some(6)))),
                later
            ),
            Ok(Duration::ZERO),
            "ended: nothing left"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn whoever_does_not_name_the_lock_and_the_grant_kept_now_learns_nothing() {
        let now = Instant::now();
        let shown = lock(7, PIN);
        let kept = Some(held(7, now, 9, Some(6)));
        let mut other_uid = question(7);
        other_uid.uid = "u-2".into();
        assert_eq!(
            answer(&other_uid, &facts(&shown, kept), now),
            Err(Unknown::NotThisLock)
        );
        let no_lock = Facts {
            lock: None,
            ..facts(&shown, kept)
        };
        assert_eq!(answer(&question(7), &no_lock, now), Err(Unknown::NotThisLock));
        assert_eq!(
            answer(&question(6), &facts(&shown, kept), now),
            Err(Unknown::NotShown),
            "another token than status shows"
        );
        let next = lock(8, PIN);
        assert_eq!(
            answer(&question(8), &facts(&next, kept), now),
            Err(Unknown::NotKept),
            "status shows a grant this replica does not keep"
        );
        assert_eq!(
            answer(&question(7), &facts(&shown, None), now),
            Err(Unknown::NotKept)
        );
        let mut permit_1 = question(7);
        permit_1.permit = 1;
        assert_eq!(
            answer(&permit_1, &facts(&shown, kept), now),
            Err(Unknown::NotShown)
        );
        let lost = Some(HeldValidity {
            lost: true,
            ..held(7, now, 9, Some(6))
        });
        assert_eq!(
            answer(&question(7), &facts(&shown, lost), now),
            Err(Unknown::Lost)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_standby_or_a_replica_status_does_not_name_yet_answers_unknown() {
        let now = Instant::now();
        let kept = Some(held(7, now, 9, Some(6)));
        let shown = lock(7, PIN);
        let standby = Facts {
            active: false,
            ..facts(&shown, kept)
        };
        assert_eq!(answer(&question(7), &standby, now), Err(Unknown::NotActive));
        // Failed over: status still shows the predecessor's pin until this replica has resumed the lock.
        let predecessors = lock(7, "cd");
        assert_eq!(
            answer(&question(7), &facts(&predecessors, kept), now),
            Err(Unknown::NotShown)
        );
        assert_eq!(
            answer(&question(7), &facts(&shown, Some(held(7, now, 9, None))), now),
            Err(Unknown::NotShown),
            "resumed, but status not written by this replica yet"
        );
        let no_pin = Facts {
            pin: None,
            ..facts(&shown, kept)
        };
        assert_eq!(answer(&question(7), &no_pin, now), Err(Unknown::NotShown));
        let mut pending = lock(7, PIN);
        if let Some(status) = pending.status.as_mut() {
            status.phase = Some(LockPhase::Lost);
        }
        assert_eq!(
            answer(&question(7), &facts(&pending, kept), now),
            Err(Unknown::NotShown)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_semaphores_permit_is_answered_by_its_own_entry() {
        let now = Instant::now();
        let mut semaphore = lock(3, PIN);
        if let Some(status) = semaphore.status.as_mut() {
            status.holders = vec![PermitHolder {
                permit: 2,
                holder: "web-1".into(),
                fencing_token: 9,
                acquired_at: None,
                valid_until: None,
            }];
        }
        let mut permit_2 = question(9);
        permit_2.permit = 2;
        let kept = Some(held(9, now, 5, Some(5)));
        assert_eq!(
            answer(&permit_2, &facts(&semaphore, kept), now),
            Ok(Duration::from_secs(5))
        );
        assert_eq!(
            answer(&question(3), &facts(&semaphore, kept), now),
            Err(Unknown::NotShown),
            "the top-level token is not a permit's grant"
        );
    }
}
