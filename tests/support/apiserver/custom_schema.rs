//! What the custom resource registry does with a CRD's structural schema before it stores a write: nulls the
//! schema does not allow are dropped, defaults filled in, and then the validation rules
//! (`x-kubernetes-validations`, `validation_rules.rs`) evaluated, on the defaulted object. The schema is read
//! from the stored CRD at each write, so a test that changes the CRD changes what is admitted, as on a real
//! server (where the change takes a moment to reach the handlers; here it is immediate).
//!
//! Not modelled: the OpenAPI value validations (`type`, `pattern`, `maxLength`, `required`, `minimum`, …), so an
//! error they would report first, or instead of a rule's (a type error stops the rules on a real server), does
//! not happen here; pruning of unknown fields (they are stored as sent, and invisible to the rules).

use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::kinds::{Kind, Special, kind_of};
use super::meta::name_of;
use super::store::State;
use super::validation_rules::validate;

/// Defaults `object` and evaluates the rules of its kind's CRD: `old` is the stored object on an update (the
/// transition rules, which read `oldSelf`, apply only then), None on a create. Built-in kinds pass untouched.
pub(super) fn admit_custom_resource(
    state: &State,
    kind: &Kind,
    object: &mut Value,
    old: Option<&Value>,
) -> ApiResult<()> {
    if !kind.is_custom() {
        return Ok(());
    }
    let Some(crd) = state.get(kind_of(Special::Crd), "", &kind.crd_name()) else {
        return Ok(());
    };
    let Some(schema) = served_schema(&crd, kind.version) else {
        return Ok(());
    };
    apply_defaults(schema, object);
    // A real server defaults what it reads from storage too: a default added to the CRD later shows in oldSelf.
    let old = old.cloned().map(|mut old| {
        apply_defaults(schema, &mut old);
        old
    });
    let errors = validate(schema, object, old.as_ref());
    if errors.is_empty() {
        Ok(())
    } else {
        Err(ApiError::invalid_fields(kind, name_of(object), &errors))
    }
}

/// The openAPIV3Schema of `version` in a stored CRD.
fn served_schema<'a>(crd: &'a Value, version: &str) -> Option<&'a Value> {
    crd.pointer("/spec/versions")?
        .as_array()?
        .iter()
        .find(|v| v.get("name").and_then(Value::as_str) == Some(version))?
        .pointer("/schema/openAPIV3Schema")
}

/// The decoder's structural defaulting: nulls in fields that are neither nullable nor defaulted are dropped
/// (PruneNonNullableNullsWithoutDefaults), then missing fields, and nulls in non-nullable fields, get their
/// default, inside every object present (structuraldefaulting.Default).
pub(super) fn apply_defaults(schema: &Value, object: &mut Value) {
    prune_nulls(Some(schema), object);
    fill_defaults(schema, object);
}

fn is_nullable(schema: &Value) -> bool {
    schema.get("nullable") == Some(&Value::Bool(true))
}

/// The schema of a field of an object: a named property, else additionalProperties when it is a schema.
fn field_schema<'a>(schema: Option<&'a Value>, field: &str) -> Option<&'a Value> {
    let schema = schema?;
    schema
        .get("properties")
        .and_then(|properties| properties.get(field))
        .or_else(|| schema.get("additionalProperties").filter(|s| s.is_object()))
}

fn prune_nulls(schema: Option<&Value>, value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.retain(|field, value| {
                let dropped = value.is_null()
                    && field_schema(schema, field)
                        .is_some_and(|s| !is_nullable(s) && s.get("default").is_none());
                !dropped
            });
            for (field, value) in map.iter_mut() {
                prune_nulls(field_schema(schema, field), value);
            }
        }
        Value::Array(items) => {
            let items_schema = schema.and_then(|s| s.get("items"));
            for item in items {
                prune_nulls(items_schema, item);
            }
        }
        _ => {}
    }
}

fn fill_defaults(schema: &Value, value: &mut Value) {
    let non_nullable_null = |value: &Value, schema: &Value| value.is_null() && !is_nullable(schema);
    match value {
        Value::Object(map) => {
            if let Some(properties) = schema.get("properties").and_then(Value::as_object) {
                for (field, property) in properties {
                    let Some(default) = property.get("default") else {
                        continue;
                    };
                    if map
                        .get(field)
                        .is_none_or(|value| non_nullable_null(value, property))
                    {
                        map.insert(field.clone(), default.clone());
                    }
                }
            }
            let additional = schema.get("additionalProperties").filter(|s| s.is_object());
            for (field, value) in map.iter_mut() {
                if let Some(property) = schema.get("properties").and_then(|p| p.get(field)) {
                    fill_defaults(property, value);
                } else if let Some(additional) = additional {
                    if let Some(default) = additional.get("default")
                        && non_nullable_null(value, additional)
                    {
                        *value = default.clone();
                    }
                    fill_defaults(additional, value);
                }
            }
        }
        Value::Array(items) => {
            let Some(items_schema) = schema.get("items") else {
                return;
            };
            for item in items {
                if let Some(default) = items_schema.get("default")
                    && non_nullable_null(item, items_schema)
                {
                    *item = default.clone();
                }
                fill_defaults(items_schema, item);
            }
        }
        _ => {}
    }
}
