//! Every reason the operator gives in Events and in status conditions, with what it means for the user: the
//! reference (docs/reference/events-and-conditions.md) is generated from this table, and a test fails when the
//! code gives a reason that is not here (or this lists one the code no longer gives).

/// Where a reason shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shown {
    /// An Event (`kubectl describe`, `kubectl get events`) of this type on this kind.
    Event { kind: &'static str, warning: bool },
    /// The `reason` of a status condition of this type on this kind.
    Condition {
        kind: &'static str,
        condition: &'static str,
        status: &'static str,
    },
}

pub struct Reason {
    pub name: &'static str,
    pub shown: Shown,
    /// What happened and what the user does about it, in one or two sentences.
    pub meaning: &'static str,
}

pub const REASONS: &[Reason] = &[
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
            ended, or at once if its pod is gone (the note says which); no pod gets it while it is above the \
            count. Nothing to do.",
    },
    Reason {
        name: "QuorumNotFound",
        shown: Shown::Event {
            kind: "DistributedLock",
            warning: true,
        },
        meaning: "The RedisQuorum named in spec.quorum does not exist: anything held is given up. Create it, \
            or set spec.quorum to an existing one.",
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
        meaning: "Nobody holds the lock: the RedisQuorum named in spec.quorum does not exist; create it, or \
            set spec.quorum to an existing one. Ready is False with the same reason.",
    },
    Reason {
        name: "QuorumNotFound",
        shown: Shown::Condition {
            kind: "DistributedLock",
            condition: "Ready",
            status: "False",
        },
        meaning: "The RedisQuorum named in spec.quorum does not exist; create it, or set spec.quorum to an \
            existing one. Nobody holds the lock meanwhile.",
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
    Reason {
        name: "Fenced",
        shown: Shown::Event {
            kind: "Job",
            warning: true,
        },
        meaning: "The lock was lost (or is being deleted): the Job was suspended, its pods stopped by the \
            Job controller. It resumes if it gets the lock back with its token, or is queued again for a new \
            one.",
    },
    Reason {
        name: "GracePeriodTooLong",
        shown: Shown::Event {
            kind: "Job",
            warning: true,
        },
        meaning: "On its grant: the Job's pods may take longer to stop than the lock's fence margin, so if \
            the lock is lost they may outlive its validity. Lower terminationGracePeriodSeconds or raise \
            spec.holder.jobs.fenceMargin.",
    },
    Reason {
        name: "GrantNotPassedToPods",
        shown: Shown::Event {
            kind: "Job",
            warning: true,
        },
        meaning: "On its grant: the Job's pod template hands the grant (redlock.io/fencing-token) to no \
            container through the downward API, so its pods cannot run under redlock-operator guard and only the \
            operator stops them. Run the work under the guard, as examples/job-fencing.yaml does.",
    },
    Reason {
        name: "Granted",
        shown: Shown::Event {
            kind: "Job",
            warning: false,
        },
        meaning: "The Job holds the lock: its fencing token and lock name (and a semaphore's permit) were \
            written into its pod template and it was unsuspended.",
    },
    Reason {
        name: "Requeued",
        shown: Shown::Event {
            kind: "Job",
            warning: false,
        },
        meaning: "The fenced Job's token can no longer be used (the lock could not be taken back with it) \
            and its pods are gone: it was queued again, to run with a new token.",
    },
    Reason {
        name: "Resumed",
        shown: Shown::Event {
            kind: "Job",
            warning: false,
        },
        meaning: "The lock is held again with the fenced Job's own fencing token: the Job was unsuspended.",
    },
    Reason {
        name: "StaleToken",
        shown: Shown::Event {
            kind: "Job",
            warning: true,
        },
        meaning: "The fenced Job's token can no longer be used and clearing its status.startTime was \
            refused, so it stays suspended. Grant the operator patch on jobs/status, or delete the Job or \
            create it anew.",
    },
    Reason {
        name: "Suspended",
        shown: Shown::Event {
            kind: "Job",
            warning: true,
        },
        meaning: "The Job was created (or left) unsuspended without holding the lock: suspended until it \
            holds it. Create Jobs of a lock with spec.suspend: true.",
    },
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
