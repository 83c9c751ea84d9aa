//! The reasons shown on a Job that holds or waits for a lock (the `jobs` holder): Events only.

use super::{Reason, Shown};

pub(super) const REASONS: &[Reason] = &[
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
];
