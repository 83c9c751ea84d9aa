//! The pods that reported their work stopped under a given-up grant (taken by `lock::reports`). A report stays
//! true for good (the work never starts again under that grant), so it is kept past the key's release: a lock
//! being deleted gives up what its status still shows after the key went, and finds the report again. Kept in
//! the active replica's memory only, for an hour: a successor that never heard a report waits for the validity
//! shown, as it would for a holder that does not report.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use tokio::time::Instant;

use crate::controller::keeper::PermitRef;

/// How long a report is kept: far longer than any validity a grant can show (and a hand-over waits no longer).
const KEPT_FOR: Duration = Duration::from_secs(3600);

#[derive(Default)]
pub struct StoppedPods {
    reported: Mutex<HashMap<(PermitRef, i64), Reported>>,
}

struct Reported {
    pods: Vec<String>,
    since: Instant,
}

impl StoppedPods {
    /// Records that `pod` stopped its work under `token` of `permit`.
    pub fn record(&self, permit: PermitRef, token: i64, pod: &str) {
        let now = Instant::now();
        let mut reported = self
            .reported
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        reported.retain(|_, entry| now.duration_since(entry.since) < KEPT_FOR);
        let entry = reported.entry((permit, token)).or_insert_with(|| Reported {
            pods: Vec::new(),
            since: now,
        });
        if !entry.pods.iter().any(|known| known == pod) {
            entry.pods.push(pod.to_owned());
        }
    }

    /// The pods that reported stopping under `token` of `permit`.
    pub fn pods(&self, permit: &PermitRef, token: i64) -> Vec<String> {
        let reported = self
            .reported
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        reported
            .get(&(permit.clone(), token))
            .map(|entry| entry.pods.clone())
            .unwrap_or_default()
    }

    /// Whether `pod` reported stopping under `token` of `permit`.
    pub fn has(&self, permit: &PermitRef, token: i64, pod: &str) -> bool {
        self.pods(permit, token).iter().any(|known| known == pod)
    }
}

#[cfg(test)]
mod tests {
    use kube::runtime::reflector::ObjectRef;

    use super::*;

    #[test]
    fn reports_are_kept_per_grant() {
        let stopped = StoppedPods::default();
        let permit = PermitRef::new(ObjectRef::new("web").within("shop"), 0);
        stopped.record(permit.clone(), 7, "web-0");
        stopped.record(permit.clone(), 7, "web-0");
        stopped.record(permit.clone(), 7, "web-1");
        assert_eq!(stopped.pods(&permit, 7), ["web-0", "web-1"]);
        assert!(stopped.has(&permit, 7, "web-0"));
        assert!(!stopped.has(&permit, 8, "web-0"), "another grant");
        assert!(
            !stopped.has(&PermitRef::new(permit.lock.clone(), 1), 7, "web-0"),
            "another permit"
        );
    }
}
