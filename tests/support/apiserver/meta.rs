//! Reading and writing object metadata in stored JSON, and the normalisation every stored object gets.

use k8s_openapi::jiff::Timestamp;
use serde_json::{Map, Value, json};

use super::kinds::{Kind, Special};

pub(super) fn meta(object: &Value) -> Option<&Map<String, Value>> {
    object.get("metadata")?.as_object()
}

pub(super) fn meta_str<'a>(object: &'a Value, field: &str) -> Option<&'a str> {
    meta(object)?.get(field)?.as_str()
}

/// The metadata map, created when missing. Stored and incoming objects are JSON objects (checked on the way
/// in), so this cannot fail on them.
pub(super) fn meta_mut(object: &mut Value) -> &mut Map<String, Value> {
    if !object.is_object() {
        *object = json!({});
    }
    let Value::Object(root) = object else {
        unreachable!("made an object above")
    };
    let metadata = root.entry("metadata").or_insert_with(|| json!({}));
    if !metadata.is_object() {
        *metadata = json!({});
    }
    let Value::Object(metadata) = metadata else {
        unreachable!("made an object above")
    };
    metadata
}

pub(super) fn name_of(object: &Value) -> &str {
    meta_str(object, "name").unwrap_or("")
}

pub(super) fn namespace_of(object: &Value) -> &str {
    meta_str(object, "namespace").unwrap_or("")
}

pub(super) fn uid_of(object: &Value) -> &str {
    meta_str(object, "uid").unwrap_or("")
}

pub(super) fn finalizers(object: &Value) -> Vec<&str> {
    meta(object)
        .and_then(|m| m.get("finalizers"))
        .and_then(Value::as_array)
        .map(|list| list.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

pub(super) fn is_deleting(object: &Value) -> bool {
    meta(object)
        .and_then(|m| m.get("deletionTimestamp"))
        .is_some_and(|t| !t.is_null())
}

/// A pod in a terminal phase: its containers have stopped for good.
pub(super) fn pod_finished(pod: &Value) -> bool {
    matches!(
        pod.pointer("/status/phase").and_then(Value::as_str),
        Some("Succeeded" | "Failed")
    )
}

pub(super) fn grace_period(object: &Value) -> Option<i64> {
    meta(object)?.get("deletionGracePeriodSeconds")?.as_i64()
}

pub(super) fn generation(object: &Value) -> i64 {
    meta(object)
        .and_then(|m| m.get("generation"))
        .and_then(Value::as_i64)
        .unwrap_or(0)
}

/// The generation after a change (saturating: the stored number is JSON, not a bounded counter).
pub(super) fn next_generation(object: &Value) -> i64 {
    generation(object).saturating_add(1)
}

pub(super) fn timestamp(at: Timestamp) -> String {
    at.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()
}

pub(super) fn now() -> String {
    timestamp(Timestamp::now())
}

pub(super) fn new_uid() -> String {
    // A version 4 UUID, as the real server generates.
    let mut bits: u128 = rand::random();
    bits = (bits & !(0xf << 76)) | (0x4 << 76);
    bits = (bits & !(0x3 << 62)) | (0x2 << 62);
    let hex = format!("{bits:032x}");
    format!(
        "{}-{}-{}-{}-{}",
        &hex[..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..]
    )
}

/// The suffix `generateName` gets: five characters from the real name generator's alphabet.
pub(super) fn name_suffix() -> String {
    const ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";
    (0..5)
        .map(|_| ALPHABET[rand::random_range(0..ALPHABET.len())] as char)
        .collect()
}

fn strip_nulls(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|_, v| !v.is_null());
            map.values_mut().for_each(strip_nulls);
        }
        Value::Array(items) => items.iter_mut().for_each(strip_nulls),
        _ => {}
    }
}

/// What a round trip through the Go types leaves: metadata fields are all `omitempty`, and built-in kinds
/// cannot hold JSON nulls. (Custom resources keep nulls: their schemas mark optional fields nullable.)
pub(super) fn normalize(kind: &Kind, object: &mut Value) {
    if kind.special == Special::Secret {
        fold_string_data(object);
    }
    if !kind.is_custom() {
        strip_nulls(object);
    }
    meta_mut(object).retain(|field, value| {
        let empty = match value {
            Value::Null => true,
            Value::String(s) => s.is_empty(),
            Value::Array(a) => a.is_empty(),
            Value::Object(o) => o.is_empty(),
            _ => false,
        };
        let zero_generation = field == "generation" && value.as_i64() == Some(0);
        !(empty || zero_generation)
    });
}

/// A Secret's write-only `stringData` is merged into `data` (base64) on every write and never stored.
fn fold_string_data(secret: &mut Value) {
    let Some(map) = secret.as_object_mut() else {
        return;
    };
    let Some(Value::Object(strings)) = map.remove("stringData") else {
        return;
    };
    let data = map.entry("data").or_insert_with(|| json!({}));
    if !data.is_object() {
        *data = json!({});
    }
    if let Some(data) = data.as_object_mut() {
        for (key, value) in strings {
            if let Some(text) = value.as_str() {
                let bytes = k8s_openapi::ByteString(text.as_bytes().to_vec());
                data.insert(
                    key,
                    serde_json::to_value(bytes).expect("bytes serialize as base64"),
                );
            }
        }
    }
}

/// Compares everything but metadata (and status, for kinds whose status is a subresource).
pub(super) fn same_spec(a: &Value, b: &Value, skip_status: bool) -> bool {
    let relevant = |key: &String| key != "metadata" && !(skip_status && key == "status");
    let (Some(a), Some(b)) = (a.as_object(), b.as_object()) else {
        return a == b;
    };
    let a_fields: Vec<_> = a.iter().filter(|(k, _)| relevant(k)).collect();
    let b_fields: Vec<_> = b.iter().filter(|(k, _)| relevant(k)).collect();
    a_fields.len() == b_fields.len() && a_fields.iter().all(|(k, v)| b.get(k.as_str()) == Some(v))
}
