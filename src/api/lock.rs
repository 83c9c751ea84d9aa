//! `DistributedLock`: one named lock on a `RedisQuorum`, and who holds it.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, LabelSelector, MicroTime, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A lock held as a Redlock quorum on a `RedisQuorum`; the operator acquires it for the holder the policy
/// chooses, keeps it extended, and fences the holder before it can expire.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "redlock.io",
    version = "v1beta1",
    kind = "DistributedLock",
    doc = "A named lock held as a Redlock quorum, with its holder, fencing token and validity in status.",
    plural = "distributedlocks",
    shortname = "dlock",
    namespaced,
    status = "DistributedLockStatus",
    printcolumn = r#"{"name":"Holder","type":"string","jsonPath":".status.holder"}"#,
    printcolumn = r#"{"name":"Phase","type":"string","jsonPath":".status.phase"}"#,
    // Empty unless the lock waits in its key's fair queue.
    printcolumn = r#"{"name":"Place","type":"integer","jsonPath":".status.queuePlace","description":"Place in the key's fair queue while waiting for it (1: next)"}"#,
    // Permits held of spec.permits (`2/3`); `1/1` or `0/1` for a plain lock.
    printcolumn = r#"{"name":"Held","type":"string","jsonPath":".status.held"}"#,
    printcolumn = r#"{"name":"Token","type":"integer","jsonPath":".status.fencingToken"}"#,
    // A string, not a date: kubectl shows future dates as `<invalid>`.
    printcolumn = r#"{"name":"Valid-Until","type":"string","jsonPath":".status.validUntil"}"#,
    printcolumn = r#"{"name":"Quorum","type":"string","jsonPath":".status.quorum"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("has(self.resourceKey) == has(oldSelf.resourceKey) && (!has(self.resourceKey) || self.resourceKey == oldSelf.resourceKey)").message("resourceKey is immutable: create a new DistributedLock to lock another key"))]
#[x_kube(validation = Rule::new("!has(self.holder.leaderElection) || !has(self.holder.leaderElection.fenceMargin) || duration(self.holder.leaderElection.fenceMargin) < duration(self.ttl)").message("holder.leaderElection.fenceMargin must be shorter than ttl"))]
#[x_kube(validation = Rule::new("!has(self.permits) || self.permits == 1 || !has(self.holder.identity)").message("permits above 1 cannot be used with holder.identity: one identity holds one permit"))]
#[x_kube(validation = Rule::new("!has(self.holder.jobs) || !has(self.holder.jobs.fenceMargin) || duration(self.holder.jobs.fenceMargin) < duration(self.ttl)").message("holder.jobs.fenceMargin must be shorter than ttl"))]
#[schemars(transform = crate::api::schema::one_line_paragraphs)]
pub struct DistributedLockSpec {
    /// The `RedisQuorum` holding this lock.
    #[serde(default = "default_quorum")]
    #[schemars(length(min = 1, max = 253))]
    pub quorum: String,

    /// Names the lock's Redis key; defaults to the lock's name. The key is scoped by the lock's namespace:
    /// `<namespace>/<resourceKey>`, so two locks on the same masters contend only when they name the same key in
    /// namespaces of the same name (in one cluster, or in several). Where the quorum's `sharedKeys` lists the
    /// namespace, the key is `<prefix><resourceKey>` instead, shared with every such lock on these masters.
    /// Immutable.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 512))]
    pub resource_key: Option<String>,

    /// Time to live of the lock in Redis; it is extended well before it runs out. At most the quorum's maxTtl.
    #[serde(default = "default_ttl")]
    #[schemars(regex(pattern = crate::duration::PATTERN), length(max = 64))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('100ms') && duration(self) <= duration('1h')").message("ttl must be between 100ms and 1h"))]
    pub ttl: String,

    /// Who holds the lock: exactly one policy.
    pub holder: HolderPolicy,

    /// How many holders the lock admits at once (a counting semaphore); 1, the default, is a plain lock. Permit
    /// 0 is the lock's key; permit i is the key `permit:<i>:<key>` with its own fencing token sequence, so the
    /// masters keep one key and one counter per permit; the `lock` command's `--permits` counts against the same
    /// permits. With holder.jobs, up to that many Jobs of the queue run at once, each with its permit's token;
    /// with holder.leaderElection, up to that many pods carry the leader label, each with its permit number and
    /// token. Above 1 it is refused with holder.identity (one identity holds one permit). It can change on a
    /// held lock: raised, the new permits are handed out at once; lowered, the permits above the new count are
    /// handed to nobody and released only once their holders are done (a Job runs to its end; a leader loses its
    /// label and its validity runs out), never before.
    #[serde(default = "default_permits")]
    #[schemars(range(min = 1, max = 100))]
    pub permits: i32,
}

fn default_permits() -> i32 {
    1
}

fn default_quorum() -> String {
    "default".into()
}

fn default_ttl() -> String {
    "10s".into()
}

/// Exactly one of `identity`, `leaderElection` and `jobs`.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("[has(self.identity), has(self.leaderElection), has(self.jobs)].filter(x, x).size() == 1").message("set exactly one of holder.identity, holder.leaderElection and holder.jobs"))]
pub struct HolderPolicy {
    /// A fixed holder name, for example a process outside Kubernetes that reads the token from status.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub identity: Option<String>,
    /// The leader among the pods matching a selector.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub leader_election: Option<LeaderElectionPolicy>,
    /// One Job at a time among those labelled `redlock.io/lock: <lock name>`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub jobs: Option<JobsPolicy>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.selector.matchLabels) || !(self.leaderLabel in self.selector.matchLabels)").message("leaderLabel must not be a key of selector.matchLabels: the operator removes it from every candidate but the leader"))]
#[x_kube(validation = Rule::new("!has(self.selector.matchExpressions) || self.selector.matchExpressions.all(e, e.key != self.leaderLabel)").message("leaderLabel must not be a key of selector.matchExpressions: the operator removes it from every candidate but the leader"))]
pub struct LeaderElectionPolicy {
    /// Candidate pods, in the lock's namespace.
    #[schemars(schema_with = "bounded_label_selector")]
    pub selector: LabelSelector,
    /// The label the leader carries (and no other pod). A label key, and not a key of the selector: the operator
    /// removes it from every other candidate.
    #[serde(default = "default_leader_label")]
    #[schemars(length(min = 1, max = 317))]
    #[schemars(regex(
        pattern = r"^([a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?(\.[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
    ))]
    pub leader_label: String,
    /// Pod names preferred as leader, most preferred first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 253)))]
    pub preference: Vec<String>,
    /// Remove the leader label this long before the lock's validity ends when it cannot be extended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = crate::duration::PATTERN), length(max = 64))]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("fenceMargin must be greater than 0"))]
    pub fence_margin: Option<String>,
}

/// `LabelSelector`'s schema with its lists and map bounded, so that the CEL rules reading them have a bounded
/// cost and a selector cannot be made arbitrarily large.
fn bounded_label_selector(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let mut schema = <LabelSelector as schemars::JsonSchema>::json_schema(generator);
    if let Some(properties) = schema
        .get_mut("properties")
        .and_then(|value| value.as_object_mut())
    {
        if let Some(labels) = properties
            .get_mut("matchLabels")
            .and_then(|value| value.as_object_mut())
        {
            labels.insert("maxProperties".into(), 32.into());
        }
        if let Some(expressions) = properties
            .get_mut("matchExpressions")
            .and_then(|value| value.as_object_mut())
        {
            expressions.insert("maxItems".into(), 32.into());
            if let Some(values) = expressions
                .get_mut("items")
                .and_then(|item| item.get_mut("properties"))
                .and_then(|item| item.get_mut("values"))
                .and_then(|value| value.as_object_mut())
            {
                values.insert("maxItems".into(), 64.into());
            }
        }
    }
    schema
}

fn default_leader_label() -> String {
    super::holder_contract::DEFAULT_LEADER_LABEL.into()
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
#[serde(rename_all = "camelCase")]
pub struct JobsPolicy {
    /// Suspend the running Job this long before the lock's validity ends when it cannot be extended.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = crate::duration::PATTERN), length(max = 64))]
    #[x_kube(validation = Rule::new("duration(self) > duration('0s')").message("fenceMargin must be greater than 0"))]
    pub fence_margin: Option<String>,
}

#[derive(schemars::JsonSchema, Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq)]
pub enum LockPhase {
    /// Waiting to be acquired (quorum not ready, or backing off).
    Pending,
    /// Held by `status.holder`, extended in time.
    Held,
    /// Another holder has the key; `status.blockedBy` says who.
    Contended,
    /// Could not be extended: the holder was fenced before `validUntil`; re-acquiring.
    Lost,
    /// The spec cannot be acted on; see the `Ready` condition.
    Invalid,
    /// Being deleted: releasing the key.
    Releasing,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::schema::one_line_paragraphs)]
pub struct DistributedLockStatus {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<LockPhase>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub holder: Option<String>,
    /// Rises with each grant of this lock's key, within the limits the guarantees page states (a majority of
    /// masters that forgot it, with no floor record that saw it); hand it to what the holder writes to, so stale
    /// holders are rejected.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fencing_token: Option<i64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,
    /// When the operation that last granted or extended the lock started (microseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub renewed_at: Option<MicroTime>,
    /// No other holder can exist before this time (TTL minus elapsed time minus clock drift), in microseconds:
    /// the holder must stop acting on the lock by then unless status shows a later time. Refreshed while held,
    /// before less than half a TTL of it is left.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<MicroTime>,
    /// Votes of the last acquisition or extension, as `votes/masters`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quorum: Option<String>,
    /// Per-master outcome of the last operation.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masters: Vec<MasterOutcome>,
    /// Leader election: the pods that could lead now (running, ready, not terminating), in election order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub candidates: Vec<String>,
    /// Job fencing: the Jobs waiting for the lock, in the order they get it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub queue: Vec<String>,
    /// Who holds the key when this lock cannot get it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub blocked_by: Option<String>,
    /// While this lock waits for a key others hold or wait for: its place in the key's fair queue, which
    /// `lock --wait` commands and other clusters' locks on a shared key join too (1: next once the holder lets
    /// go). The key goes to the waiters in the order they asked.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub queue_place: Option<i64>,
    /// Permits held of spec.permits, as `held/permits` (`1/1` for a held plain lock).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
    /// With spec.permits above 1: who holds each permit (permit 0's holder is also in holder, fencingToken and
    /// validUntil above). Empty for a plain lock, whose holder those fields show.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub holders: Vec<PermitHolder>,
    /// Keys given up and not released yet: each is released at its releaseAt, when the validity shown to its
    /// holder ends (sooner if the holder is known to have stopped), by whichever operator replica is active then.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 100))]
    pub releasing: Vec<ReleasingKey>,
    /// Where a holder's `elect` or Job guard reports that its work has stopped for a key given up, so that the key
    /// is released at once instead of at its releaseAt: the active operator replica's address (https).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 2048))]
    pub hand_over_url: Option<String>,
    /// The SHA-256 (lowercase hex) of the certificate the server at handOverUrl shows: holders send their report,
    /// and their token, only to a server with this certificate.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(regex(pattern = r"^[0-9a-f]{64}$"))]
    pub hand_over_certificate_sha256: Option<String>,
    /// Holder changes and losses so far.
    #[serde(default)]
    pub transitions: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

impl DistributedLockStatus {
    /// The status of a lock that has none yet, to borrow instead of building one per reconcile.
    pub fn none() -> &'static Self {
        static NONE: std::sync::LazyLock<DistributedLockStatus> =
            std::sync::LazyLock::new(DistributedLockStatus::default);
        &NONE
    }
}

/// One held permit of a semaphore (spec.permits above 1).
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct PermitHolder {
    /// The permit's number, from 0 to spec.permits - 1; its key is the lock's key for 0, `permit:<i>:<key>`
    /// otherwise.
    pub permit: i32,
    pub holder: String,
    /// Rises with each grant of this permit, within the same limits as `fencingToken`: permits are separate
    /// token sequences.
    pub fencing_token: i64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub acquired_at: Option<Time>,
    /// No other holder of this permit can exist before this time (microseconds).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub valid_until: Option<MicroTime>,
}

/// A key given up by its holder and waiting to be released (see `status.releasing`): recorded where a successor
/// replica finds it, so that it releases the key then instead of leaving it to expire.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct ReleasingKey {
    /// The permit whose key it is (0 for a plain lock).
    pub permit: i32,
    /// Who held it, with which token: the value on the masters derives from them.
    pub holder: String,
    pub fencing_token: i64,
    /// The RedisQuorum the key is on.
    pub quorum: String,
    /// The key on the masters.
    pub key: String,
    /// Released then: the end of the validity shown to the holder.
    pub release_at: MicroTime,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MasterOutcome {
    pub endpoint: String,
    /// granted, recreated, held-by-other, token-too-low, queued, not-held, timeout, error, quarantined, unavailable
    /// or pending.
    pub outcome: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
}
