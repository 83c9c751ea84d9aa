//! `metav1.Condition` helpers that keep `lastTransitionTime` when a condition's status does not change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// Sets `condition_type` in `conditions`: the transition time moves only when the status changes.
pub fn set(
    conditions: &mut Vec<Condition>,
    condition_type: &str,
    status: bool,
    reason: &str,
    message: impl Into<String>,
    observed_generation: Option<i64>,
    now: Timestamp,
) {
    let status = if status { "True" } else { "False" }.to_owned();
    let message = message.into();
    match conditions
        .iter_mut()
        .find(|condition| condition.type_ == condition_type)
    {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = Time(now);
            }
            existing.status = status;
            existing.reason = reason.to_owned();
            existing.message = message;
            existing.observed_generation = observed_generation;
        }
        None => conditions.push(Condition {
            type_: condition_type.to_owned(),
            status,
            reason: reason.to_owned(),
            message,
            observed_generation,
            last_transition_time: Time(now),
        }),
    }
}

pub fn is_true(conditions: &[Condition], condition_type: &str) -> bool {
    conditions
        .iter()
        .any(|condition| condition.type_ == condition_type && condition.status == "True")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn transition_time_moves_only_on_status_change() {
        let t0 = Timestamp::from_second(1_000).unwrap();
        let t1 = Timestamp::from_second(2_000).unwrap();
        let t2 = Timestamp::from_second(3_000).unwrap();
        let mut conditions = Vec::new();
        set(&mut conditions, "Held", true, "Acquired", "held", Some(1), t0);
        set(
            &mut conditions,
            "Held",
            true,
            "Extended",
            "still held",
            Some(1),
            t1,
        );
        assert_eq!(conditions[0].last_transition_time, Time(t0));
        assert_eq!(conditions[0].reason, "Extended");
        set(&mut conditions, "Held", false, "Lost", "lost", Some(1), t2);
        assert_eq!(conditions[0].last_transition_time, Time(t2));
        assert!(!is_true(&conditions, "Held"));
    }
}
