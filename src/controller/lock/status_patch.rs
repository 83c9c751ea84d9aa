//! The JSON merge patch (RFC 7386) that turns one status into another, with the resourceVersion it was computed
//! against as a precondition. Pure: `status_write` sends it.
//!
//! Hand-written because it is a dozen lines: the `json-patch` crate computes RFC 6902 patches, whose `replace`
//! and `remove` fail on a path the server's copy lacks (a field this version does not know), where a merge patch
//! just sets or clears it.

use serde_json::{Map, Value};

use crate::api::DistributedLockStatus;

/// The patch that makes `before` into `after` on an object still at `resource_version` (the API server answers
/// 409 Conflict otherwise); `None` when they are equal.
pub fn status_patch(
    resource_version: &str,
    before: &DistributedLockStatus,
    after: &DistributedLockStatus,
) -> Result<Option<Value>, serde_json::Error> {
    let difference = merge_diff(&serde_json::to_value(before)?, &serde_json::to_value(after)?);
    Ok(difference.map(|status| {
        serde_json::json!({
            "metadata": { "resourceVersion": resource_version },
            "status": status,
        })
    }))
}

/// The merge patch from `before` to `after`: changed and new members as they are in `after`, removed ones as
/// `null`, objects member by member, anything else (arrays included: a merge patch replaces them) whole.
fn merge_diff(before: &Value, after: &Value) -> Option<Value> {
    match (before, after) {
        (Value::Object(before), Value::Object(after)) => {
            let mut patch = Map::new();
            for (key, was) in before {
                match after.get(key) {
                    None => {
                        patch.insert(key.clone(), Value::Null);
                    }
                    Some(now) => {
                        if let Some(change) = merge_diff(was, now) {
                            patch.insert(key.clone(), change);
                        }
                    }
                }
            }
            for (key, now) in after {
                if !before.contains_key(key) {
                    patch.insert(key.clone(), now.clone());
                }
            }
            (!patch.is_empty()).then_some(Value::Object(patch))
        }
        _ if before == after => None,
        // A JSON null in `after` would read as "remove" in a merge patch; statuses never hold one (absent
        // fields are skipped when serialized).
        _ => Some(after.clone()),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;
    use crate::api::LockPhase;

    /// What the API server does with a merge patch (RFC 7386), to check that applying the diff gives `after`.
    fn apply(target: &mut Value, patch: &Value) {
        match (target, patch) {
            (Value::Object(target), Value::Object(patch)) => {
                for (key, change) in patch {
                    if change.is_null() {
                        target.remove(key);
                    } else if change.is_object() && target.get(key).is_some_and(Value::is_object) {
                        if let Some(inner) = target.get_mut(key) {
                            apply(inner, change);
                        }
                    } else {
                        target.insert(key.clone(), change.clone());
                    }
                }
            }
            (target, patch) => *target = patch.clone(),
        }
    }

    #[test]
    fn the_diff_applied_to_before_gives_after() {
        let cases = [
            (json!({}), json!({ "phase": "Held", "holder": "a" })),
            (
                json!({ "phase": "Held", "holder": "a" }),
                json!({ "phase": "Pending" }),
            ),
            (
                json!({ "masters": [{ "endpoint": "x" }, { "endpoint": "y" }], "quorum": "3/5" }),
                json!({ "masters": [{ "endpoint": "x" }], "quorum": "3/5" }),
            ),
            (
                json!({ "a": { "b": 1, "c": 2 }, "d": true }),
                json!({ "a": { "b": 1, "e": [1, 2] }, "d": false }),
            ),
            (json!({ "a": { "b": 1 } }), json!({ "a": 5 })),
        ];
        for (before, after) in cases {
            let mut patched = before.clone();
            if let Some(patch) = merge_diff(&before, &after) {
                apply(&mut patched, &patch);
            }
            assert_eq!(patched, after, "{before} -> {after}");
        }
    }

    #[test]
    fn only_what_changed_is_sent() {
        let before = json!({ "phase": "Held", "validUntil": "1", "conditions": [{ "type": "Ready" }] });
        let after = json!({ "phase": "Held", "validUntil": "2", "conditions": [{ "type": "Ready" }] });
        assert_eq!(merge_diff(&before, &after), Some(json!({ "validUntil": "2" })));
        assert_eq!(merge_diff(&before, &before), None);
    }

    #[test]
    fn the_patch_carries_the_resource_version_as_a_precondition() {
        let before = DistributedLockStatus::default();
        let after = DistributedLockStatus {
            phase: Some(LockPhase::Held),
            fencing_token: Some(7),
            ..DistributedLockStatus::default()
        };
        let patch = status_patch("42", &before, &after).ok().flatten();
        assert_eq!(
            patch,
            Some(json!({
                "metadata": { "resourceVersion": "42" },
                "status": { "phase": "Held", "fencingToken": 7 },
            }))
        );
        assert_eq!(status_patch("42", &after, &after).ok().flatten(), None);
    }
}
