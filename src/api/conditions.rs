//! `metav1.Condition` updates that keep `lastTransitionTime` when a condition's status does not change.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;

/// The generation a status edit observed and the time it is made: what every condition it sets carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Stamp {
    pub generation: Option<i64>,
    pub now: Timestamp,
}

/// One condition's new state. Resource modules build these with a named constructor per condition.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Update {
    pub type_: &'static str,
    pub status: bool,
    pub reason: &'static str,
    pub message: String,
}

impl Update {
    pub fn new(type_: &'static str, status: bool, reason: &'static str, message: impl Into<String>) -> Self {
        Self {
            type_,
            status,
            reason,
            message: message.into(),
        }
    }
}

/// Sets one condition in `conditions`: the transition time moves only when the status changes.
pub fn set(conditions: &mut Vec<Condition>, update: Update, stamp: Stamp) {
    let status = if update.status { "True" } else { "False" }.to_owned();
    match conditions
        .iter_mut()
        .find(|condition| condition.type_ == update.type_)
    {
        Some(existing) => {
            if existing.status != status {
                existing.last_transition_time = Time(stamp.now);
            }
            existing.status = status;
            existing.reason = update.reason.to_owned();
            existing.message = update.message;
            existing.observed_generation = stamp.generation;
        }
        None => conditions.push(Condition {
            type_: update.type_.to_owned(),
            status,
            reason: update.reason.to_owned(),
            message: update.message,
            observed_generation: stamp.generation,
            last_transition_time: Time(stamp.now),
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
        let at = |second| Stamp {
            generation: Some(1),
            now: Timestamp::from_second(second).unwrap(),
        };
        let mut conditions = Vec::new();
        set(
            &mut conditions,
            Update::new("Held", true, "Acquired", "held"),
            at(1_000),
        );
        set(
            &mut conditions,
            Update::new("Held", true, "Extended", "still held"),
            at(2_000),
        );
        assert_eq!(conditions[0].last_transition_time, Time(at(1_000).now));
        assert_eq!(conditions[0].reason, "Extended");
        set(
            &mut conditions,
            Update::new("Held", false, "Lost", "lost"),
            at(3_000),
        );
        assert_eq!(conditions[0].last_transition_time, Time(at(3_000).now));
        assert!(!is_true(&conditions, "Held"));
    }
}
