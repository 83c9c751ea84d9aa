//! The rows of the troubleshooting table (docs/how-to/troubleshooting-by-condition.md): what each condition
//! reason that names a problem means, and what to do about it.

/// What to do about each condition reason that names a problem (a condition in its unhealthy state: `Ready`,
/// `Held` or `Available` False, `FencingMayBeLate` or `Degraded` True): the reason, what it means, what to do.
/// The rows of docs/how-to/troubleshooting-by-condition.md, in this order; where each reason shows comes from
/// `api::reasons`. A problem reason without an entry here fails the test, so the page cannot miss one.
pub const TROUBLESHOOTING: &[(&str, &str, &str)] = &[
    (
        "QuorumNotFound",
        "no `RedisQuorum` of the name in `spec.quorum` (`default` when left out: the one the chart makes)",
        "create it, or fix `spec.quorum`",
    ),
    (
        "QuorumNotReady",
        "the quorum exists but cannot be used; the message quotes its condition",
        "see the quorum's `Available` condition (below)",
    ),
    (
        "TtlAboveMaxTtl",
        "`spec.ttl` is above the quorum's `maxTtl`",
        "lower `spec.ttl` or raise the quorum's `maxTtl`",
    ),
    (
        "TtlBelowNodeTimeouts",
        "`spec.ttl` is shorter than ten of the quorum's `nodeTimeout`s",
        "raise `spec.ttl` or lower the quorum's `nodeTimeout`",
    ),
    (
        "InvalidTtl",
        "`spec.ttl` is not a duration in range, or not a whole number of milliseconds ([durations](#durations))",
        "fix `spec.ttl` (`1.5s`, not `1500.5ms`)",
    ),
    (
        "InvalidHolder",
        "the spec does not set exactly one of `holder.identity` (not empty), `holder.leaderElection` and \
         `holder.jobs`",
        "set exactly one",
    ),
    (
        "InvalidPermits",
        "`spec.permits` is not between 1 and 100, or is above 1 with `holder.identity`",
        "fix `spec.permits`; an identity holds one permit, so N holders need `leaderElection` or `jobs`",
    ),
    (
        "InvalidFenceMargin",
        "the fence margin (`holder.leaderElection.fenceMargin`, `holder.jobs.fenceMargin`) is not a duration, or \
         not above 0 and shorter than `spec.ttl`",
        "fix the field named in the message",
    ),
    (
        "InvalidSelector",
        "`holder.leaderElection.selector` cannot be evaluated (or a semaphore names an identity)",
        "fix the field named in the message",
    ),
    (
        "InvalidLeaderLabel",
        "`holder.leaderElection.leaderLabel` is not a valid label key, is a key of the selector, or is reserved",
        "use another key, such as the default `redlock.io/leader`",
    ),
    (
        "InvalidSharedKeys",
        "the quorum's `spec.sharedKeys.prefix` is unsafe for the keys it shares",
        "fix the quorum's prefix ([shared keys](../tutorials/sharing-a-lock-across-clusters.md#sharing-across-namespaces-sharedkeys))",
    ),
    (
        "InvalidFencingFloor",
        "the key's floor record ConfigMap makes no sense (another key, no `data.token`, not an integer ≥ 0)",
        "set `data.token` to the highest token granted for the key, or delete the ConfigMap (see the message for \
         the risk)",
    ),
    (
        "FencingTokenExhausted",
        "no token can be granted above the largest one (`9223372036854775807`); the message says where it is: \
         status, the key's counter on the masters, or its floor record",
        "stop every holder; once every protected resource forgot the highest token it accepted, reset the three \
         places the message names to 0 (looked at again every minute)",
    ),
    (
        "QueueEmpty",
        "Job fencing: no Job labelled `redlock.io/lock: <name>` is waiting",
        "create one, suspended ([a Job queue](../tutorials/job-queue.md))",
    ),
    (
        "WaitingForFencedJob",
        "a fenced Job still has pods; nobody else runs until they are gone",
        "wait, or delete the Job",
    ),
    (
        "WaitingForEarlierPods",
        "pods started by an earlier grant (a deleted Job's, say) still run or stop; the message names them and \
         their tokens",
        "wait; a Job deleted with `propagationPolicy: Orphan` leaves its pods running: delete them",
    ),
    (
        "NoCandidates",
        "leader election: no pod matching the selector is running, ready and free to hold the lock",
        "check the pods' readiness (no readiness probe may depend on the leader-only process)",
    ),
    (
        "Contended",
        "another holder has the key; `blockedBy` names it, `PLACE` is the lock's place in the key's fair queue",
        "wait, or find the other lock (or `lock` command) with the same key",
    ),
    (
        "QuorumUnavailable",
        "too few masters can vote; the message says which and why (retried every 2 s)",
        "see the quorum's status",
    ),
    (
        "SlowMasters",
        "a majority granted the lock too slowly to leave any validity; retried",
        "check the masters' latency (`kubectl describe rq`: `status.masters[].latencyMs`) and the network to them",
    ),
    (
        "Lost",
        "the lock could not be extended in time, or was taken over",
        "the holder was told before `validUntil`; it is re-acquired with a new token",
    ),
    (
        "HolderChanged",
        "the key was released for a holder the spec no longer wants, or for a Job that finished",
        "nothing: the next acquisition follows by itself",
    ),
    (
        "NoPermitHeld",
        "a semaphore holds no permit now; `Held` speaks of every permit, not of why one waits",
        "see the phase, `status.queue` or `status.candidates`, `Ready` and the Events",
    ),
    (
        "GracePeriodTooLong",
        "a queued Job's pods may take longer to stop than the fence margin",
        "lower `terminationGracePeriodSeconds` or raise `fenceMargin`",
    ),
    (
        "GrantNotPassedToPods",
        "a queued Job's pod template hands the grant to no container, so its pods cannot run under the guard and \
         stop only when the operator suspends the Job",
        "run the work under `redlock-operator guard`, with `REDLOCK_GRANTED_TOKEN` from the annotation \
         `redlock.io/fencing-token` ([a Job queue](../tutorials/job-queue.md#3-run-the-work-under-the-guard))",
    ),
    (
        "TooFewMasters",
        "fewer than a majority of masters can vote; the message lists them (down, with the error, or quarantined)",
        "fix the masters; quarantined ones vote again at `quarantinedUntil`",
    ),
    (
        "MastersNotVoting",
        "some masters cannot vote (the message lists them); locks still work while `Available=True`",
        "bring them back before another fails",
    ),
    (
        "SecretNotFound",
        "the Secret named in `spec.auth` or `spec.tls` is not in the operator's Secrets namespace",
        "create it there (the chart's `operator.secretsNamespace`, by default its release namespace)",
    ),
    (
        "SecretKeyMissing",
        "the Secret named in `spec.auth` or `spec.tls` has no such key",
        "add the key, or fix the key's name in the spec",
    ),
    (
        "SecretKeyInvalid",
        "a key of the Secret named in `spec.auth` or `spec.tls` is not UTF-8",
        "fix the Secret",
    ),
    (
        "SecretForbidden",
        "the operator may not read the Secret named in `spec.auth` or `spec.tls`",
        "grant it `get` on that Secret",
    ),
    (
        "SecretNamespaceNotAllowed",
        "`spec.auth.secretNamespace` or `spec.tls.caSecretNamespace` names another namespace than the operator's \
         Secrets namespace",
        "move the Secret to the operator's Secrets namespace, and set the field to it or remove it",
    ),
    (
        "SecretUnreadable",
        "the API server failed to hand a Secret over, and the quorum had no working engine to keep (one in use \
         keeps working)",
        "nothing if it passes: tried again at the next health check; else see the API server",
    ),
    (
        "InvalidSpec",
        "a field the schema could not check (for example `delayMin > delayMax`, or a `nodeTimeout` above a tenth \
         of `maxTtl`)",
        "fix the field named in the message",
    ),
];
