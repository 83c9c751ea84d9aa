//! `fieldValidation=Strict` for custom resources, which `kubectl apply` sends (its default `--validate=strict`
//! leaves validation to a server whose OpenAPI document lists the parameter, see openapi.rs): a create, update or
//! patch whose object has fields its CRD's schema does not declare is refused with 400, naming them as the real
//! server does (`DistributedLock in version "v1beta1" cannot be handled as a DistributedLock: strict decoding
//! error: unknown field "spec.foo"`). Fields are known by the schema's `properties`, `additionalProperties`,
//! `items` and `x-kubernetes-preserve-unknown-fields`; `apiVersion`, `kind` and `metadata` are not checked.
//! A merge or apply patch is checked as sent (its fields are those it sets); a JSON patch is not checked.
//!
//! Not modelled: `Warn` (the default) sends no `Warning` header, unknown fields are stored rather than pruned,
//! and built-in kinds are not checked (their schemas are not modelled); duplicate fields are not detected.

use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::kinds::{Kind, Special, kind_of};
use super::routes::Query;
use super::store::State;

/// Refuses `object` when `fieldValidation=Strict` and it has fields the CRD does not declare.
pub(super) fn check(state: &State, kind: &Kind, query: &Query, object: &Value) -> ApiResult<()> {
    match query.get("fieldValidation").unwrap_or("") {
        "" | "Ignore" | "Warn" => return Ok(()),
        "Strict" => {}
        other => {
            return Err(ApiError::bad_request(format!(
                "fieldValidation: Invalid value: \"{other}\": fieldValidation must be one of \"Ignore\", \"Warn\", or \"Strict\""
            )));
        }
    }
    if !kind.is_custom() {
        return Ok(());
    }
    let Some(crd) = state.get(kind_of(Special::Crd), "", &kind.crd_name()) else {
        return Ok(());
    };
    let schema = crd["spec"]["versions"]
        .as_array()
        .and_then(|versions| versions.iter().find(|v| v["name"] == kind.version))
        .map(|version| &version["schema"]["openAPIV3Schema"]);
    let Some(schema) = schema.filter(|schema| schema.is_object()) else {
        return Ok(());
    };
    let mut unknown = Vec::new();
    if let Some(fields) = object.as_object() {
        for (field, value) in fields {
            if matches!(field.as_str(), "apiVersion" | "kind" | "metadata") {
                continue;
            }
            match schema["properties"].get(field) {
                Some(declared) => find_unknown(value, declared, field, &mut unknown),
                None if preserves_unknown(schema) || value.is_null() => {}
                None => unknown.push(field.clone()),
            }
        }
    }
    if unknown.is_empty() {
        return Ok(());
    }
    let fields: Vec<String> = unknown
        .iter()
        .map(|field| format!("unknown field \"{field}\""))
        .collect();
    Err(ApiError::bad_request(format!(
        "{kind} in version \"{version}\" cannot be handled as a {kind}: strict decoding error: {}",
        fields.join(", "),
        kind = kind.kind,
        version = kind.version,
    )))
}

fn preserves_unknown(schema: &Value) -> bool {
    schema["x-kubernetes-preserve-unknown-fields"] == Value::Bool(true)
}

/// Appends the paths of `value`'s fields that `schema` does not declare.
fn find_unknown(value: &Value, schema: &Value, path: &str, unknown: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            let embedded = schema["x-kubernetes-embedded-resource"] == Value::Bool(true);
            for (field, value) in fields {
                let child = format!("{path}.{field}");
                if embedded && matches!(field.as_str(), "apiVersion" | "kind" | "metadata") {
                    continue;
                }
                match (
                    schema["properties"].get(field),
                    schema.get("additionalProperties"),
                ) {
                    (Some(declared), _) => find_unknown(value, declared, &child, unknown),
                    (None, Some(Value::Object(_))) => {
                        find_unknown(value, &schema["additionalProperties"], &child, unknown)
                    }
                    (None, Some(Value::Bool(true))) => {}
                    _ if preserves_unknown(schema) => {}
                    // A null sets nothing (a merge patch removing a field).
                    _ if value.is_null() => {}
                    _ => unknown.push(child),
                }
            }
        }
        Value::Array(items) => {
            for (index, item) in items.iter().enumerate() {
                find_unknown(item, &schema["items"], &format!("{path}[{index}]"), unknown);
            }
        }
        _ => {}
    }
}
