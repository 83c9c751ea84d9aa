//! `RedisQuorum`: a set of independent Redis masters and how to talk to them.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use kube::{CustomResource, KubeSchema};
use serde::{Deserialize, Serialize};

/// A set of independent Redis masters (no replication between them) that together hold Redlock locks.
#[derive(CustomResource, KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[kube(
    group = "redlock.io",
    version = "v1beta1",
    kind = "RedisQuorum",
    doc = "A set of independent Redis masters that together hold Redlock locks.",
    plural = "redisquorums",
    shortname = "rq",
    status = "RedisQuorumStatus",
    printcolumn = r#"{"name":"Eligible","type":"integer","jsonPath":".status.eligible","description":"Masters that can vote now"}"#,
    printcolumn = r#"{"name":"Required","type":"integer","jsonPath":".status.required","description":"Majority of the configured masters"}"#,
    printcolumn = r#"{"name":"Available","type":"string","jsonPath":".status.conditions[?(@.type==\"Available\")].status"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = Rule::new("!has(self.retry) || !has(self.retry.delayMin) || !has(self.retry.delayMax) || duration(self.retry.delayMin) <= duration(self.retry.delayMax)").message("retry.delayMin must not exceed retry.delayMax"))]
#[schemars(transform = crate::api::schema::one_line_paragraphs)]
pub struct RedisQuorumSpec {
    /// The masters, as `redis://host:port` or `rediss://host:port` (TLS). Put credentials in `auth`, not here.
    /// A `set`: the API server rejects duplicates, since each master must count once.
    #[schemars(length(min = 1, max = 15), inner(length(min = 8, max = 256)))]
    #[schemars(extend("x-kubernetes-list-type" = "set"))]
    #[x_kube(validation = Rule::new("self.all(e, e.startsWith('redis://') || e.startsWith('rediss://'))").message("endpoints must be redis:// or rediss:// URLs"))]
    #[x_kube(validation = Rule::new("self.all(e, !e.contains('@'))").message("put credentials in spec.auth, not in endpoint URLs"))]
    #[x_kube(validation = Rule::new("self.all(e, !e.contains('#'))").message("endpoint URLs take no #fragment: #insecure (no certificate check) is refused; give the CA in spec.tls.caSecretName"))]
    pub endpoints: Vec<String>,

    /// Credentials from a Secret.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub auth: Option<QuorumAuth>,

    /// TLS settings for `rediss://` endpoints.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tls: Option<QuorumTls>,

    /// How long one master may take to answer one command.
    #[serde(default = "default_node_timeout")]
    #[schemars(regex(pattern = crate::duration::PATTERN), length(max = 64))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('1ms') && duration(self) <= duration('10s')").message("nodeTimeout must be between 1ms and 10s"))]
    pub node_timeout: String,

    /// Clock drift allowance as a fraction of the TTL (plus 2ms).
    #[serde(default = "default_drift_factor")]
    #[schemars(range(min = 0.0, max = 0.2))]
    pub drift_factor: f64,

    /// The longest TTL any lock on these masters may use. A master that restarted less than this ago does not
    /// vote, because it may have forgotten live locks.
    #[serde(default = "default_max_ttl")]
    #[schemars(regex(pattern = crate::duration::PATTERN), length(max = 64))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('100ms') && duration(self) <= duration('24h')").message("maxTtl must be between 100ms and 24h"))]
    pub max_ttl: String,

    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry: Option<QuorumRetry>,

    /// Skip the restart quarantine. Only for masters that fsync every write (`appendfsync always`).
    #[serde(default)]
    pub assume_durable: bool,

    /// Namespaces whose locks may share keys. Without it, a lock's key is scoped by its namespace:
    /// `<namespace>/<resourceKey or name>`, so no namespace can take another's key.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_keys: Option<SharedKeys>,
}

/// Which namespaces use shared keys, and the prefix that keeps shared keys apart from namespaced ones.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct SharedKeys {
    /// Namespaces (or `*` for every namespace) whose locks with a `resourceKey` use the key
    /// `<prefix><resourceKey>`, shared with every other such lock on these masters, in any cluster, and with
    /// `redlock-operator lock --key <prefix><resourceKey>`. Their holder names are visible to each other.
    #[schemars(length(max = 256), inner(length(min = 1, max = 63)))]
    #[x_kube(validation = Rule::new("self.all(n, n == '*' || n.matches('^[a-z0-9]([-a-z0-9]*[a-z0-9])?$'))").message("sharedKeys.namespaces must be namespace names or *"))]
    pub namespaces: Vec<String>,
    /// Put in front of every shared key. It must have a character that namespace names cannot have (not
    /// `a-z`, `0-9`, `-`) before any `/`, so that no shared key can equal a namespace's own `<namespace>/...` key.
    #[serde(default = "default_shared_prefix")]
    #[schemars(length(min = 1, max = 64), regex(pattern = r"^[a-z0-9-]*[^a-z0-9/-]"))]
    pub prefix: String,
}

fn default_shared_prefix() -> String {
    "shared:".into()
}

impl SharedKeys {
    pub fn allows(&self, namespace: &str) -> bool {
        self.namespaces
            .iter()
            .any(|allowed| allowed == "*" || allowed == namespace)
    }

    /// Why the prefix could make a shared key equal a namespaced key, if it could.
    pub fn check_prefix(&self) -> Result<(), String> {
        let first_other = self
            .prefix
            .chars()
            .find(|c| !(c.is_ascii_lowercase() || c.is_ascii_digit() || *c == '-'));
        if self.prefix.starts_with(crate::redlock::PERMIT_KEY_PREFIX) {
            return Err(format!(
                "spec.sharedKeys.prefix `{}` must not start with `{}`: the keys of a semaphore's permits do",
                self.prefix,
                crate::redlock::PERMIT_KEY_PREFIX
            ));
        }
        match first_other {
            Some(c) if c != '/' => Ok(()),
            _ => Err(format!(
                "spec.sharedKeys.prefix `{}` needs a character other than a-z, 0-9 and - before any /, such as `shared:`; otherwise a shared key could equal a namespace's own key",
                self.prefix
            )),
        }
    }
}

fn default_node_timeout() -> String {
    "50ms".into()
}

fn default_drift_factor() -> f64 {
    0.01
}

fn default_max_ttl() -> String {
    "60s".into()
}

/// Reference to a Secret holding the masters' credentials.
#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuorumAuth {
    /// Optional: the Secret is always read from the operator's Secrets namespace (its own, or
    /// `--secrets-namespace`). When set, it must name that namespace, or the quorum is not used; it also tells
    /// another installation of the operator (another Secrets namespace) that the quorum is not its own, so that it
    /// leaves the quorum's status and locks to this one (the chart sets it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub secret_namespace: Option<String>,
    /// The Secret, in the operator's Secrets namespace.
    #[schemars(length(min = 1, max = 253))]
    pub secret_name: String,
    /// Key holding the password.
    #[serde(default = "default_password_key")]
    #[schemars(length(min = 1, max = 253))]
    pub password_key: String,
    /// Key holding the user name (Redis ACL); absent means the default user.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub username_key: Option<String>,
}

fn default_password_key() -> String {
    "password".into()
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuorumTls {
    /// Optional, like `auth.secretNamespace`: when set, it must name the operator's Secrets namespace (and tells
    /// another installation the quorum is not its own).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 63))]
    pub ca_secret_namespace: Option<String>,
    /// Secret, in the operator's Secrets namespace, whose key `caKey` holds the PEM CA bundle; absent means the
    /// system roots.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub ca_secret_name: Option<String>,
    #[serde(default = "default_ca_key")]
    #[schemars(length(min = 1, max = 253))]
    pub ca_key: String,
}

fn default_ca_key() -> String {
    "ca.crt".into()
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct QuorumRetry {
    /// Attempts per acquisition, the first included.
    // The counts in these resources are i32, as Kubernetes' API conventions ask: the schema format `int32` is
    // one the API server knows; `uint32` draws an "unrecognized format" warning from `kubectl apply`.
    #[schemars(range(min = 1, max = 100))]
    pub attempts: Option<i32>,
    #[schemars(regex(pattern = crate::duration::PATTERN), length(max = 64))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('0ms') && duration(self) <= duration('1m')").message("delayMin must be between 0ms and 1m"))]
    pub delay_min: Option<String>,
    #[schemars(regex(pattern = crate::duration::PATTERN), length(max = 64))]
    #[x_kube(validation = Rule::new("duration(self) >= duration('0ms') && duration(self) <= duration('1m')").message("delayMax must be between 0ms and 1m"))]
    pub delay_max: Option<String>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = crate::api::schema::one_line_paragraphs)]
pub struct RedisQuorumStatus {
    /// Masters that can vote now (connected, verified, not quarantined).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub eligible: Option<i32>,
    /// The majority of the configured masters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0))]
    pub required: Option<i32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub masters: Vec<MasterStatus>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub conditions: Vec<Condition>,
}

#[derive(KubeSchema, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[serde(rename_all = "camelCase")]
pub struct MasterStatus {
    pub endpoint: String,
    /// `Up`, `Down` or `Quarantined`.
    pub state: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub quarantined_until: Option<Time>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub run_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub latency_ms: Option<f64>,
}
