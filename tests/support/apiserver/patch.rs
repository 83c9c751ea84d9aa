//! PATCH: JSON merge patch, JSON patch (RFC 6902, with the Go library's `test`) and server-side apply.
//! Strategic merge patch is refused (415), as for custom resources: nothing here sends one.

use std::sync::Arc;

use json_patch::PatchOperation;
use serde_json::Value;

use super::apply::applied_object;
use super::errors::{ApiError, ApiResult, bad_json};
use super::routes::{Query, Route};
use super::store::State;
use super::write::{check_preconditions, create, update};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PatchType {
    Merge,
    Json,
    Apply,
}

fn patch_type(content_type: &str) -> ApiResult<PatchType> {
    match content_type {
        "application/merge-patch+json" => Ok(PatchType::Merge),
        "application/json-patch+json" => Ok(PatchType::Json),
        "application/apply-patch+yaml" => Ok(PatchType::Apply),
        _ => Err(ApiError::new(
            415,
            "UnsupportedMediaType",
            "the body of the request was in an unknown format - accepted media types include: \
             application/json-patch+json, application/merge-patch+json, application/apply-patch+yaml",
        )),
    }
}

/// Applies a patch; 201 when server-side apply created the object, 200 otherwise.
pub(super) fn patch(
    state: &mut State,
    route: &Route,
    query: &Query,
    content_type: &str,
    body: &[u8],
) -> ApiResult<(u16, Arc<Value>)> {
    let kind = route.kind;
    let name = route.name();
    let patch_type = patch_type(content_type)?;
    let options_invalid = |field: &str, detail: &str| {
        let message = format!("PatchOptions.meta.k8s.io \"\" is invalid: {field}: {detail}");
        Err(ApiError::new(422, "Invalid", message))
    };
    if patch_type == PatchType::Apply && query.get("fieldManager").is_none_or(str::is_empty) {
        return options_invalid("fieldManager", "Required value: is required for apply patch");
    }
    let Some(old) = state.get(kind, route.namespace(), name) else {
        if patch_type == PatchType::Apply && !route.status {
            // Server-side apply creates what does not exist.
            let applied = applied_object(route, body)?;
            return Ok((201, create(state, kind, route.namespace(), applied)?));
        }
        return Err(ApiError::not_found(kind, name));
    };
    let mut document = (*old).clone();
    match patch_type {
        PatchType::Merge => {
            json_patch::merge(&mut document, &serde_json::from_slice(body).map_err(bad_json)?)
        }
        PatchType::Json => apply_json_patch(&mut document, body)?,
        PatchType::Apply => json_patch::merge(&mut document, &applied_object(route, body)?),
    }
    if !document.is_object() {
        return Err(ApiError::unprocessable("the patched object is not a JSON object"));
    }
    // The patched object is an object of this kind whatever the patch did to its type fields.
    document["apiVersion"] = kind.api_version().into();
    document["kind"] = kind.kind.into();
    check_preconditions(kind, &old, &document, false)?;
    Ok((200, update(state, kind, route.status, &old, document)?))
}

/// RFC 6902 with the Go library's `test`: a missing member tests equal to null, as it does for the real
/// server (kube_runtime's finalizer helper relies on that).
fn apply_json_patch(document: &mut Value, body: &[u8]) -> ApiResult<()> {
    let patch: json_patch::Patch = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid JSON patch: {e}")))?;
    for operation in &patch.0 {
        match operation {
            PatchOperation::Test(test) => {
                let path = test.path.as_str();
                let actual = match document.pointer(path) {
                    Some(actual) => actual,
                    None => {
                        let parent = path.rsplit_once('/').map_or("", |(parent, _)| parent);
                        if document.pointer(parent).is_none() {
                            let detail = format!("test operation does not apply: is missing path: {path}");
                            return Err(ApiError::unprocessable(detail));
                        }
                        &Value::Null
                    }
                };
                if *actual != test.value {
                    return Err(ApiError::unprocessable(format!(
                        "testing value {path} failed: test failed"
                    )));
                }
            }
            other => json_patch::patch(document, std::slice::from_ref(other))
                .map_err(|e| ApiError::unprocessable(e.to_string()))?,
        }
    }
    Ok(())
}
