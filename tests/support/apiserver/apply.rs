//! Server-side apply's applied configuration. It is merged into the live object (maps recursively, lists as
//! a whole); field ownership, conflicts between managers and removal of fields a manager stops applying are
//! not modelled.

use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::meta::{meta_mut, name_of};
use super::routes::Route;
use super::write::check_type_meta;

/// The applied configuration of a server-side apply: YAML or JSON, naming this kind and this object.
pub(super) fn applied_object(route: &Route, body: &[u8]) -> ApiResult<Value> {
    let mut applied: Value = match serde_json::from_slice(body) {
        Ok(value) => value,
        Err(_) => serde_yaml_ng::from_slice(body)
            .map_err(|e| ApiError::bad_request(format!("error decoding YAML: {e}")))?,
    };
    if !applied.is_object() {
        return Err(ApiError::bad_request(
            "the applied configuration must be an object",
        ));
    }
    for field in ["apiVersion", "kind"] {
        if applied
            .get(field)
            .and_then(Value::as_str)
            .is_none_or(str::is_empty)
        {
            return Err(ApiError::bad_request(format!(
                "invalid object: {field} must be set"
            )));
        }
    }
    check_type_meta(route.kind, &mut applied)?;
    let name = name_of(&applied);
    if !name.is_empty() && name != route.name() {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({name}) does not match the name on the URL ({})",
            route.name()
        )));
    }
    meta_mut(&mut applied).insert("name".into(), route.name().into());
    Ok(applied)
}
