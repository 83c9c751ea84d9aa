//! The reasons shown on a DistributedLock: its Events, then its conditions' reasons.

use super::{Reason, Shown};

pub(super) const REASONS: &[Reason] = &[
    Reason {
        name: "Acquired",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: false,
        },
        meaning: "The operator acquired the lock for its holder with a new fencing token on a majority of \
            masters (the note names holder, token and votes; a semaphore's, the permit). Nothing to do.",
    },
    Reason {
        name: "Contended",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: false,
        },
        meaning: "Another holder has the key on the masters (the note and status.blockedBy name it); the \
            operator retries. Wait, or find the other lock that uses the same resourceKey.",
    },
    Reason {
        name: "FencingTokenExhausted",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "No fencing token can be granted above the largest one (9223372036854775807); the note says \
            where it is. Stop every holder, then reset the three places the note names to 0 (looked at again \
            every minute).",
    },
    Reason {
        name: "HolderAsking",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: false,
        },
        meaning: "Every holder shown that had fallen silent asks the active replica for its grant's validity \
            again (its path to the reports port is back). Nothing to do.",
    },
    Reason {
        name: "HolderNotAsking",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "A leader pod or a granted Job's pod has not asked the active replica how long its grant stays \
            valid since it was granted (its elect or guard then starts no work), or has stopped asking (it stops \
            its work on its own clock); the note names the pod and the address it cannot reach. Let the holder's \
            pods reach the operator's pods on the reports port (handOver.port, 8443): a NetworkPolicy egress \
            rule, docs/how-to/install.md#networkpolicies; or find what cut the pod off.",
    },
    Reason {
        name: "InvalidFenceMargin",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "spec.holder.leaderElection.fenceMargin or spec.holder.jobs.fenceMargin is not a duration, \
            or not greater than 0 and shorter than spec.ttl. Fix the field the note names.",
    },
    Reason {
        name: "InvalidFencingFloor",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "The key's fencing-token floor record ConfigMap makes no sense (another quorum or key, no \
            data.token, not an integer of at least 0): nothing is acquired. Set data.token to the highest \
            token granted, or delete it.",
    },
    Reason {
        name: "InvalidHolder",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "The spec does not set exactly one of spec.holder.identity (not empty), \
            spec.holder.leaderElection and spec.holder.jobs. Set exactly one.",
    },
    Reason {
        name: "InvalidLeaderLabel",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "spec.holder.leaderElection.leaderLabel is not a valid label key, is a key of the selector, \
            or is one Kubernetes sets or reserves. Use another key, such as redlock.io/leader.",
    },
    Reason {
        name: "InvalidPermits",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "spec.permits is not between 1 and 100, or is above 1 with spec.holder.identity (one \
            identity holds one permit). Fix spec.permits.",
    },
    Reason {
        name: "InvalidSelector",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "spec.holder.leaderElection.selector cannot be evaluated (or a semaphore names \
            spec.holder.identity, which holds one permit). Fix the field the note names.",
    },
    Reason {
        name: "InvalidSharedKeys",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "The RedisQuorum shares keys with the lock's namespace, but its spec.sharedKeys.prefix is \
            unsafe (starts like a permit key, or has only a-z, 0-9 and - before a /). Fix the quorum's \
            prefix.",
    },
    Reason {
        name: "InvalidTtl",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "spec.ttl is not a valid duration in range, or not a whole number of milliseconds (or the \
            engine refused it). Fix spec.ttl.",
    },
    Reason {
        name: "KeptByAnotherInstallation",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: false,
        },
        meaning: "Another installation of the operator keeps this lock (annotation redlock.io/installation): \
            this one leaves it alone, said once per process. Remove the annotation to let another \
            installation claim it.",
    },
    Reason {
        name: "LeftForAnotherInstallation",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: false,
        },
        meaning: "This installation does not claim the lock: its quorum reads Secrets from a namespace this \
            installation does not read, so the installation whose Secrets namespace that is keeps it; said once \
            per process. With no such installation, move the quorum's Secrets to this one's Secrets namespace.",
    },
    Reason {
        name: "Lost",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "The lock could not be extended in time, or was taken over: its holder was fenced (a leader \
            unlabelled, a Job suspended; an identity sees it in status) and the lock is acquired again.",
    },
    Reason {
        name: "NoCandidates",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "Leader election: the lock was held, but no running and ready pod matching the selector is \
            free to hold it now, so the key is given up. Check the pods' readiness.",
    },
    Reason {
        name: "PermitsLowered",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: false,
        },
        meaning: "Leader election, spec.permits lowered: the permit the note names, above the new count, was \
            given up: its leader lost the label, and the permit is released once the validity shown to it has \
            ended, or at once if its pod was deleted once finished (the note says which); no pod gets it while it is above the \
            count. Nothing to do.",
    },
    Reason {
        name: "QuorumNotFound",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "The RedisQuorum named in spec.quorum does not exist, or is not one this installation looks at \
            (--quorum-selector): anything held is given up. Create it, or set spec.quorum to an existing one.",
    },
    Reason {
        name: "QuorumNotReady",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "The RedisQuorum exists but cannot be used (the note quotes its problem): anything held is \
            given up and the lock waits. See the quorum's Available condition.",
    },
    Reason {
        name: "QuorumUnavailable",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "Too few masters of the RedisQuorum could vote to acquire the lock (the note says which and \
            why); retried every 2 s. See the quorum's status.",
    },
    Reason {
        name: "Released",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: false,
        },
        meaning: "The operator released the key: the spec wants another holder, the holding Job finished or \
            is gone, or the lock was deleted. A key shown to a holder is released once the validity it was \
            shown has ended, or at once when its elect or guard reported its work stopped.",
    },
    Reason {
        name: "Releasing",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: false,
        },
        meaning: "The lock is being deleted: its holders were fenced and its keys are released once the \
            validity shown to them has ended, or once they stopped (their pods gone, or their elect or guard \
            reported it); the finalizer stays until then.",
    },
    Reason {
        name: "SlowMasters",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "A majority granted the lock too slowly to leave any validity; the operator retries. Check \
            the masters' latency (status.masters) and the network to them.",
    },
    Reason {
        name: "TtlAboveMaxTtl",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "spec.ttl exceeds the RedisQuorum's maxTtl: restarted masters are kept out only for maxTtl, \
            so a longer lock could be granted twice. Lower the ttl or raise the quorum's maxTtl.",
    },
    Reason {
        name: "TtlBelowNodeTimeouts",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "spec.ttl is shorter than ten of the RedisQuorum's nodeTimeouts, so the lock would be \
            reported lost before it could be extended. Raise the ttl or lower the quorum's nodeTimeout.",
    },
    Reason {
        name: "Contended",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Another holder has the key (status.blockedBy names it); the operator retries. Wait, or \
            find the other lock that uses the same resourceKey.",
    },
    Reason {
        name: "FencingTokenExhausted",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: no fencing token can be granted above the largest one; the message \
            says where it is and which three places to reset to 0 once every holder is stopped. Ready is \
            False with the same reason.",
    },
    Reason {
        name: "FencingTokenExhausted",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "No fencing token can be granted above the largest one; the message says where it is and \
            which three places to reset to 0 once every holder is stopped. Nobody holds the lock meanwhile.",
    },
    Reason {
        name: "GracePeriodTooLong",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "FencingMayBeLate",
            status: "True",
        },
        meaning: "Job fencing: a queued Job's termination grace period exceeds the fence margin, so its pods \
            may outlive the lock's validity. Lower terminationGracePeriodSeconds or raise \
            spec.holder.jobs.fenceMargin.",
    },
    Reason {
        name: "GrantNotPassedToPods",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "FencingMayBeLate",
            status: "True",
        },
        meaning: "Job fencing: a queued Job's pod template hands the grant (the annotation \
            redlock.io/fencing-token) to no container through the downward API, so its pods cannot run their work \
            under redlock-operator guard and only the operator stops them: a failover or an API-server outage can \
            leave them running past the validity. Run the work under the guard, as examples/job-fencing.yaml does.",
    },
    Reason {
        name: "GracePeriodsFit",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "FencingMayBeLate",
            status: "False",
        },
        meaning: "Job fencing: every queued Job's pods are handed their grant (so can run under the guard) and \
            stop within the fence margin. Nothing to do.",
    },
    Reason {
        name: "Held",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "True",
        },
        meaning: "The lock is held (a semaphore: at least one permit); the message names each holder and its \
            fencing token.",
    },
    Reason {
        name: "HolderAsking",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "HolderReachesOperator",
            status: "True",
        },
        meaning: "Leader election and Job fencing: every holder shown that is judged (injected by the chart, or \
            one that asked during its grant) asks the active replica how long its grant stays valid, over the \
            reports port. The condition is left out while no holder is judged. Nothing to do.",
    },
    Reason {
        name: "HolderNotAsking",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "HolderReachesOperator",
            status: "False",
        },
        meaning: "A holder shown has not asked the active replica how long its grant stays valid within 5 s (or \
            half the TTL, if longer) and 5 s more of its pod running, so its elect or guard runs no work; or it \
            asked and then fell silent for that long, so it stops its work on its own clock. The message names \
            the pods and the address. Let the holder's pods reach the operator's pods on the reports port \
            (a NetworkPolicy egress rule: docs/how-to/install.md#networkpolicies), or find what cut the pod off.",
    },
    Reason {
        name: "HolderChanged",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "The key was released for a holder the spec no longer wants, or a Job that finished: nobody \
            holds the lock until the next acquisition, which follows by itself.",
    },
    Reason {
        name: "InvalidFenceMargin",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: the fence margin is not a duration, or not greater than 0 and \
            shorter than spec.ttl; fix the field the message names. Ready is False with the same reason.",
    },
    Reason {
        name: "InvalidFenceMargin",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "The fence margin is not a duration, or not greater than 0 and shorter than spec.ttl; fix \
            the field the message names. A held lock keeps its holder under the last valid spec until then; \
            otherwise nobody holds it.",
    },
    Reason {
        name: "InvalidFencingFloor",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: the key's fencing-token floor record ConfigMap makes no sense; set \
            its data.token to the highest token granted, or delete it. Ready is False with the same reason.",
    },
    Reason {
        name: "InvalidFencingFloor",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "The key's fencing-token floor record ConfigMap makes no sense; set its data.token to the \
            highest token granted, or delete it. Nobody holds the lock meanwhile.",
    },
    Reason {
        name: "InvalidHolder",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: the spec does not set exactly one holder policy (identity, \
            leaderElection, jobs); set exactly one. Ready is False with the same reason.",
    },
    Reason {
        name: "InvalidHolder",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "The spec does not set exactly one holder policy (identity, leaderElection, jobs); set \
            exactly one. A held lock keeps its holder under the last valid spec until then; otherwise nobody \
            holds it.",
    },
    Reason {
        name: "InvalidLeaderLabel",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: the leader label is not a valid key, is a key of the selector, or \
            is reserved; use another key, such as redlock.io/leader. Ready is False with the same reason.",
    },
    Reason {
        name: "InvalidLeaderLabel",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "The leader label is not a valid key, is a key of the selector, or is reserved; use another \
            key, such as redlock.io/leader. A held lock keeps its holder under the last valid spec until \
            then; otherwise nobody holds it.",
    },
    Reason {
        name: "InvalidPermits",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: spec.permits is not between 1 and 100, or is above 1 with \
            spec.holder.identity; fix spec.permits. Ready is False with the same reason.",
    },
    Reason {
        name: "InvalidPermits",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "spec.permits is not between 1 and 100, or is above 1 with spec.holder.identity; fix \
            spec.permits. A held lock keeps its holder under the last valid spec until then; otherwise \
            nobody holds it.",
    },
    Reason {
        name: "InvalidSelector",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: spec.holder.leaderElection.selector cannot be evaluated (or a \
            semaphore names an identity); fix the field the message names. Ready is False with the same \
            reason.",
    },
    Reason {
        name: "InvalidSelector",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "spec.holder.leaderElection.selector cannot be evaluated (or a semaphore names an \
            identity); fix the field the message names. A held lock keeps its holder under the last valid \
            spec until then; otherwise nobody holds it.",
    },
    Reason {
        name: "InvalidSharedKeys",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: the RedisQuorum's spec.sharedKeys.prefix is unsafe for the keys it \
            shares; fix the quorum's prefix. Ready is False with the same reason.",
    },
    Reason {
        name: "InvalidSharedKeys",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "The RedisQuorum's spec.sharedKeys.prefix is unsafe for the keys it shares; fix the \
            quorum's prefix. A held lock keeps its holder under the last valid spec until then; otherwise \
            nobody holds it.",
    },
    Reason {
        name: "InvalidTtl",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: spec.ttl is not a valid duration in range or not a whole number of \
            milliseconds; fix spec.ttl. Ready is False with the same reason.",
    },
    Reason {
        name: "InvalidTtl",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "spec.ttl is not a valid duration in range or not a whole number of milliseconds; fix \
            spec.ttl. A held lock keeps its holder under the last valid spec until then; otherwise nobody \
            holds it.",
    },
    Reason {
        name: "Lost",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "The lock could not be extended in time, or was taken over: its holder was fenced before \
            validUntil and the lock is acquired again (a fenced Job resumes with its own token if its keys \
            survived).",
    },
    Reason {
        name: "NoCandidates",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Leader election: no running and ready pod matching spec.holder.leaderElection.selector is \
            free to hold the lock. Check the pods' readiness.",
    },
    Reason {
        name: "NoPermitHeld",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "A semaphore has no permit held now. Its Held condition tells of every permit, not why one \
            waits: see the phase, the queue or candidates, Ready and the Events.",
    },
    Reason {
        name: "QueueEmpty",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Job fencing: no Job labelled redlock.io/lock with the lock's name is waiting. Create one, \
            with spec.suspend: true.",
    },
    Reason {
        name: "QuorumNotFound",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: the RedisQuorum named in spec.quorum does not exist, or is not one \
            this installation looks at (--quorum-selector); create it, or set spec.quorum to an existing one. \
            Ready is False with the same reason.",
    },
    Reason {
        name: "QuorumNotFound",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "The RedisQuorum named in spec.quorum does not exist, or is not one this installation looks at \
            (--quorum-selector); create it, or set spec.quorum to an existing one. Nobody holds the lock \
            meanwhile.",
    },
    Reason {
        name: "QuorumNotReady",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: the RedisQuorum cannot be used (the message quotes why); see its \
            Available condition. Ready is False with the same reason.",
    },
    Reason {
        name: "QuorumNotReady",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "The RedisQuorum cannot be used (the message quotes why); see its Available condition. \
            Nobody holds the lock meanwhile.",
    },
    Reason {
        name: "QuorumUnavailable",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Too few masters of the RedisQuorum could vote to acquire the lock (the message says which \
            and why); retried every 2 s. See the quorum's status.",
    },
    Reason {
        name: "SlowMasters",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "A majority granted the lock too slowly to leave any validity; the operator retries. Check \
            the masters' latency (status.masters) and the network to them.",
    },
    Reason {
        name: "TtlAboveMaxTtl",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: spec.ttl exceeds the RedisQuorum's maxTtl; lower the ttl or raise \
            the quorum's maxTtl. Ready is False with the same reason.",
    },
    Reason {
        name: "TtlAboveMaxTtl",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "spec.ttl exceeds the RedisQuorum's maxTtl; lower the ttl or raise the quorum's maxTtl. A \
            held lock keeps its holder under the last valid spec until then; otherwise nobody holds it.",
    },
    Reason {
        name: "TtlBelowNodeTimeouts",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Nobody holds the lock: spec.ttl is shorter than ten of the RedisQuorum's nodeTimeouts; \
            raise the ttl or lower the quorum's nodeTimeout. Ready is False with the same reason.",
    },
    Reason {
        name: "TtlBelowNodeTimeouts",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "spec.ttl is shorter than ten of the RedisQuorum's nodeTimeouts; raise the ttl or lower the \
            quorum's nodeTimeout. A held lock keeps its holder under the last valid spec until then; \
            otherwise nobody holds it.",
    },
    Reason {
        name: "Valid",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "True",
        },
        meaning: "The spec is valid and its quorum can be used.",
    },
    Reason {
        name: "WaitingForEarlierPods",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Job fencing: pods of an earlier grant (the message names them) still run or stop; the next \
            Job runs once they are gone. Wait; a Job deleted with propagationPolicy Orphan leaves its pods \
            running: delete them.",
    },
    Reason {
        name: "WaitingForFencedJob",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Held",
            status: "False",
        },
        meaning: "Job fencing: the pods of a fenced Job are still stopping; nobody else runs until they are \
            gone. Wait, or delete the Job.",
    },
];
