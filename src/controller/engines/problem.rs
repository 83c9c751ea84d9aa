//! Why a `RedisQuorum` cannot be used: the reason its `Available` condition shows, the message saying what to fix,
//! and whether the problem is the API server's rather than the quorum's (then the working engine is kept).

#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum QuorumProblem {
    #[error(
        "{field} names namespace `{requested}`, but the operator reads Secrets only from `{allowed}` (its Secrets namespace): move the Secret there and set {field} to `{allowed}` or remove it"
    )]
    SecretNamespaceNotAllowed {
        field: &'static str,
        requested: String,
        allowed: String,
    },
    #[error("Secret {namespace}/{name} does not exist")]
    SecretNotFound { namespace: String, name: String },
    #[error("the operator may not read Secret {namespace}/{name}: {message}")]
    SecretForbidden {
        namespace: String,
        name: String,
        message: String,
    },
    /// The API server failed to hand the Secret over: says nothing about the quorum.
    #[error("cannot read Secret {namespace}/{name}: {message}")]
    SecretUnreadable {
        namespace: String,
        name: String,
        message: String,
    },
    #[error("Secret {namespace}/{name} has no key `{key}`")]
    SecretKeyMissing {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("Secret {namespace}/{name} key `{key}` is not UTF-8")]
    SecretKeyInvalid {
        namespace: String,
        name: String,
        key: String,
    },
    /// A field the schema could not check; the message names it.
    #[error("{0}")]
    InvalidSpec(String),
}

impl QuorumProblem {
    /// The condition reason (CamelCase).
    pub fn reason(&self) -> &'static str {
        match self {
            Self::SecretNamespaceNotAllowed { .. } => "SecretNamespaceNotAllowed",
            Self::SecretNotFound { .. } => "SecretNotFound",
            Self::SecretForbidden { .. } => "SecretForbidden",
            Self::SecretUnreadable { .. } => "SecretUnreadable",
            Self::SecretKeyMissing { .. } => "SecretKeyMissing",
            Self::SecretKeyInvalid { .. } => "SecretKeyInvalid",
            Self::InvalidSpec(_) => "InvalidSpec",
        }
    }

    /// A transient problem does not take a working engine (and the locks on it) away.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::SecretUnreadable { .. })
    }
}
