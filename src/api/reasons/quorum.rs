//! The reasons shown on a RedisQuorum: its Events, then its conditions' reasons.

use super::{Reason, Shown};

pub(super) const REASONS: &[Reason] = &[
    Reason {
        name: "InvalidSpec",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "The quorum cannot be used: a field the schema could not check is wrong (the message names \
            it, such as a nodeTimeout above a tenth of maxTtl), or the engine could not be built from it; \
            fix the field.",
    },
    Reason {
        name: "MasterDown",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "A master became unreachable (the note gives the error) and cannot vote. Bring it back \
            before another fails.",
    },
    Reason {
        name: "MasterQuarantined",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "A master restarted recently and may have forgotten locks: it does not vote until its \
            quarantine ends (the note says in how many seconds), then votes again.",
    },
    Reason {
        name: "MasterUp",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: false,
        },
        meaning: "A master that was down or quarantined is up and voting again.",
    },
    Reason {
        name: "SecretForbidden",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "The quorum cannot be used: the operator may not read the Secret named in spec.auth or \
            spec.tls; grant it get on that Secret.",
    },
    Reason {
        name: "SecretKeyInvalid",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "The quorum cannot be used: a key of the Secret named in spec.auth or spec.tls is not \
            UTF-8; fix the Secret.",
    },
    Reason {
        name: "SecretKeyMissing",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "The quorum cannot be used: the Secret named in spec.auth or spec.tls has no such key; add \
            it, or fix the key name in the spec.",
    },
    Reason {
        name: "SecretNamespaceNotAllowed",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "The quorum cannot be used: spec.auth.secretNamespace or spec.tls.caSecretNamespace names \
            another namespace than the operator's Secrets namespace; move the Secret there and set the field \
            to it or remove it.",
    },
    Reason {
        name: "SecretNotFound",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "The quorum cannot be used: the Secret named in spec.auth or spec.tls does not exist in the \
            operator's Secrets namespace; create it.",
    },
    Reason {
        name: "SecretUnreadable",
        shown: Shown::Event {
            kind: "RedisQuorum",
            warning: true,
        },
        meaning: "The quorum cannot be used: the API server failed to hand a Secret over and there was no \
            working engine to keep (a quorum in use keeps working through this); tried again at the next \
            health check.",
    },
    Reason {
        name: "AllMastersVoting",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "False",
        },
        meaning: "Every master is up and voting.",
    },
    Reason {
        name: "InvalidSpec",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "False",
        },
        meaning: "The quorum cannot be used, no lock on it is acquired or extended: a field the schema could \
            not check is wrong (the message names it, such as a nodeTimeout above a tenth of maxTtl), or the \
            engine could not be built from it; fix the field.",
    },
    Reason {
        name: "InvalidSpec",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "True",
        },
        meaning: "Set with Available=False for the same problem: a field the schema could not check is wrong \
            (the message names it, such as a nodeTimeout above a tenth of maxTtl), or the engine could not \
            be built from it; fix the field.",
    },
    Reason {
        name: "MastersNotVoting",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "True",
        },
        meaning: "Some masters cannot vote (the message lists them); locks still work while Available is \
            True. Bring them back before another fails.",
    },
    Reason {
        name: "QuorumReachable",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "True",
        },
        meaning: "Enough masters can vote for locks to be acquired and extended; the message says how many \
            of how many, and how many are needed.",
    },
    Reason {
        name: "SecretForbidden",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "False",
        },
        meaning: "The quorum cannot be used, no lock on it is acquired or extended: the operator may not \
            read the Secret named in spec.auth or spec.tls; grant it get on that Secret.",
    },
    Reason {
        name: "SecretForbidden",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "True",
        },
        meaning: "Set with Available=False for the same problem: the operator may not read the Secret named \
            in spec.auth or spec.tls; grant it get on that Secret.",
    },
    Reason {
        name: "SecretKeyInvalid",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "False",
        },
        meaning: "The quorum cannot be used, no lock on it is acquired or extended: a key of the Secret \
            named in spec.auth or spec.tls is not UTF-8; fix the Secret.",
    },
    Reason {
        name: "SecretKeyInvalid",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "True",
        },
        meaning: "Set with Available=False for the same problem: a key of the Secret named in spec.auth or \
            spec.tls is not UTF-8; fix the Secret.",
    },
    Reason {
        name: "SecretKeyMissing",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "False",
        },
        meaning: "The quorum cannot be used, no lock on it is acquired or extended: the Secret named in \
            spec.auth or spec.tls has no such key; add it, or fix the key name in the spec.",
    },
    Reason {
        name: "SecretKeyMissing",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "True",
        },
        meaning: "Set with Available=False for the same problem: the Secret named in spec.auth or spec.tls \
            has no such key; add it, or fix the key name in the spec.",
    },
    Reason {
        name: "SecretNamespaceNotAllowed",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "False",
        },
        meaning: "The quorum cannot be used, no lock on it is acquired or extended: \
            spec.auth.secretNamespace or spec.tls.caSecretNamespace names another namespace than the \
            operator's Secrets namespace; move the Secret there and set the field to it or remove it.",
    },
    Reason {
        name: "SecretNamespaceNotAllowed",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "True",
        },
        meaning: "Set with Available=False for the same problem: spec.auth.secretNamespace or \
            spec.tls.caSecretNamespace names another namespace than the operator's Secrets namespace; move \
            the Secret there and set the field to it or remove it.",
    },
    Reason {
        name: "SecretNotFound",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "False",
        },
        meaning: "The quorum cannot be used, no lock on it is acquired or extended: the Secret named in \
            spec.auth or spec.tls does not exist in the operator's Secrets namespace; create it.",
    },
    Reason {
        name: "SecretNotFound",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "True",
        },
        meaning: "Set with Available=False for the same problem: the Secret named in spec.auth or spec.tls \
            does not exist in the operator's Secrets namespace; create it.",
    },
    Reason {
        name: "SecretUnreadable",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "False",
        },
        meaning: "The quorum cannot be used, no lock on it is acquired or extended: the API server failed to \
            hand a Secret over and there was no working engine to keep (a quorum in use keeps working \
            through this); tried again at the next health check.",
    },
    Reason {
        name: "SecretUnreadable",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Degraded",
            status: "True",
        },
        meaning: "Set with Available=False for the same problem: the API server failed to hand a Secret over \
            and there was no working engine to keep (a quorum in use keeps working through this); tried \
            again at the next health check.",
    },
    Reason {
        name: "TooFewMasters",
        shown: Shown::Condition {
            kind: "RedisQuorum",
            condition: "Available",
            status: "False",
        },
        meaning: "Fewer masters can vote than are needed (the message lists those down, with the error, or \
            quarantined): locks cannot be acquired or extended. Fix the masters; quarantined ones vote again \
            at quarantinedUntil.",
    },
];
