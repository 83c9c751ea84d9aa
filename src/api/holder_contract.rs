//! The labels and annotations the operator reads and writes on pods and Jobs (and the finalizer on its own
//! locks): the contract with holders, which users read as one API (docs/reference/holder-contract.md documents each). Every one is
//! defined here and nowhere else.

/// The default leader label (`holder.leaderElection.leaderLabel`): on exactly the pods that lead.
pub const DEFAULT_LEADER_LABEL: &str = "redlock.io/leader";
/// The fencing token: on a leader pod, and in a granted Job's pod template (so on its pods).
pub const TOKEN_ANNOTATION: &str = "redlock.io/fencing-token";
/// The permit of a semaphore (spec.permits above 1) its holder was given: on each leader pod, and in a granted
/// Job's pod template (so on its pods). Absent: permit 0, as for every holder of a lock of one permit.
pub const PERMIT_ANNOTATION: &str = "redlock.io/permit";
/// On a leader pod, next to the leader label and the token: the validity shown to it (RFC 3339).
pub const VALID_UNTIL_ANNOTATION: &str = "redlock.io/valid-until";
/// Jobs carrying `redlock.io/lock: <lock name>` queue for that lock; a grant writes it as a label and an
/// annotation into the Job's pod template, so the pods of a grant carry it too.
pub const LOCK_LABEL: &str = "redlock.io/lock";
/// On a Job: higher runs first (an integer; absent or malformed counts as 0).
pub const PRIORITY_ANNOTATION: &str = "redlock.io/priority";
/// On a Job the operator suspended because the lock was lost (or is being deleted): the token it ran with.
pub const FENCED_ANNOTATION: &str = "redlock.io/fenced-token";
/// With it: when it was suspended (RFC 3339).
pub const FENCED_AT_ANNOTATION: &str = "redlock.io/fenced-at";
/// On a fenced Job whose token can no longer be used and whose pod template could not take a new one: it stays
/// suspended.
pub const STALE_ANNOTATION: &str = "redlock.io/stale";
/// On a fenced Job whose token can no longer be used, once its `status.startTime` was cleared so that its pod
/// template can take a new token: it waits in the queue again.
pub const REQUEUED_ANNOTATION: &str = "redlock.io/requeued";
/// On any namespaced object (put there by users): the lock, in the object's namespace, whose holders alone may
/// update it. The chart's fenced-objects ValidatingAdmissionPolicy admits an update only when the object written
/// carries [`TOKEN_ANNOTATION`] not lower than the lock's status.fencingToken nor than the object's own; the
/// operator itself does not read it.
pub const FENCED_BY_LABEL: &str = "redlock.io/fenced-by";
/// On each DistributedLock: the installation of the operator that keeps it (`<namespace>/<name>`, by default its
/// Lease's). Another installation leaves the lock alone; removing the annotation lets any installation claim it.
pub const INSTALLATION_ANNOTATION: &str = "redlock.io/installation";
/// On each DistributedLock while the operator may still hold its key: deletion waits for the release.
pub const FINALIZER: &str = "redlock.io/release";

/// The audience of the service-account token a holder's `elect` or Job guard presents with its report that its
/// work has stopped (a projected volume in the pod): a token for any other audience is refused, so the API
/// server's own tokens, which the pod also carries, are never sent to the operator.
pub const REPORT_TOKEN_AUDIENCE: &str = "redlock-operator";
/// Where that projected token is mounted, by default.
pub const REPORT_TOKEN_PATH: &str = "/var/run/secrets/redlock.io/token";
/// The path of `status.handOverUrl` on the active replica that takes the reports.
pub const STOPPED_REPORT_PATH: &str = "/v1/stopped";

/// What a holder reports when its work under a grant has stopped and will not start again under it: the lock
/// (in the pod's own namespace), the permit and the fencing token. Who reports is not in the body: it is the pod
/// the bearer token was issued to.
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct StoppedReport {
    pub lock: String,
    #[serde(default)]
    pub permit: u32,
    pub fencing_token: i64,
}

/// The path, on the origin of `status.handOverUrl`, where a holder asks the active replica how long its grant
/// stays valid, counted on the replica's monotonic clock: the holder counts the answer from the moment it sent the
/// question, on its own clock, so that no holder compares its wall clock with the operator's.
pub const VALIDITY_PATH: &str = "/v1/validity";

/// A holder's question: how long the grant of `permit` of the lock `namespace/lock` with `fencingToken` stays
/// valid. Answered only to a caller that names the lock's uid and the token of the grant the replica keeps now:
/// what the answer says, status shows already (no credentials are needed, and none are sent).
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ValidityQuestion {
    pub namespace: String,
    pub lock: String,
    pub uid: String,
    #[serde(default)]
    pub permit: u32,
    pub fencing_token: i64,
}

/// The answer: `remainingMillis`, the grant's validity left when the replica answered (on its monotonic clock,
/// never more than status shows), or `unknown` with the reason (the holder keeps the stop time it has, and never
/// a later one).
#[derive(serde::Serialize, serde::Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
pub struct ValidityAnswer {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub remaining_millis: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub unknown: Option<String>,
}
