//! Create and update, the generic store's half of every write: names, system fields, preconditions,
//! finalizer rules and generation; then the commit (or nothing, when nothing changed).

use std::sync::Arc;

use serde_json::Value;

use super::admission::{Operation, Request, admit};
use super::custom_schema::admit_custom_resource;
use super::errors::{ApiError, ApiResult, bad_json};
use super::kinds::{Kind, Special};
use super::meta::{
    finalizers, grace_period, is_deleting, meta, meta_mut, meta_str, name_of, name_suffix, namespace_of,
    new_uid, next_generation, normalize, now, same_spec, uid_of,
};
use super::routes::Route;
use super::store::{EventType, State};
use super::strategy::{check_job_template_update, isolate_status, prepare_create};

const OPTIMISTIC_LOCK: &str =
    "the object has been modified; please apply your changes to the latest version and try again";

/// Parses a request body and checks it is `kind`'s object (filling a missing apiVersion/kind).
pub(super) fn incoming(kind: &Kind, body: &[u8]) -> ApiResult<Value> {
    let mut object: Value = serde_json::from_slice(body).map_err(bad_json)?;
    check_type_meta(kind, &mut object)?;
    Ok(object)
}

pub(super) fn check_type_meta(kind: &Kind, object: &mut Value) -> ApiResult<()> {
    let map = object
        .as_object_mut()
        .ok_or_else(|| ApiError::bad_request("the request body must be a JSON object"))?;
    let expected = [("apiVersion", kind.api_version()), ("kind", kind.kind.to_owned())];
    for (field, expected) in expected {
        match map.get(field).and_then(Value::as_str) {
            Some(actual) if actual != expected => {
                return Err(ApiError::bad_request(format!(
                    "the {field} in the data ({actual}) does not match the expected {field} ({expected})"
                )));
            }
            Some(_) => {}
            None => {
                map.insert(field.into(), expected.into());
            }
        }
    }
    Ok(())
}

pub(super) fn create(
    state: &mut State,
    kind: &'static Kind,
    namespace: &str,
    mut object: Value,
) -> ApiResult<Arc<Value>> {
    place_in_namespace(kind, namespace, &mut object)?;
    let had_resource_version = meta_str(&object, "resourceVersion").is_some_and(|rv| !rv.is_empty());
    let name = choose_name(kind, &mut object)?;
    let metadata = meta_mut(&mut object);
    metadata.insert("uid".into(), new_uid().into());
    metadata.insert("creationTimestamp".into(), now().into());
    for field in [
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "resourceVersion",
        "selfLink",
        "managedFields",
    ] {
        metadata.remove(field);
    }
    if kind.generation {
        metadata.insert("generation".into(), 1.into());
    } else {
        metadata.remove("generation");
    }
    prepare_create(kind, &mut object)?;
    admit_custom_resource(state, kind, &mut object, None)?;
    admit(
        state,
        &Request {
            kind,
            operation: Operation::Create,
            status: false,
            object: &object,
            old: None,
        },
    )?;
    if had_resource_version {
        // The storage layer's error, which the real server reports as a 500 with an unknown reason.
        return Err(ApiError::new(
            500,
            "",
            "resourceVersion should not be set on objects to be created",
        ));
    }
    if state.get(kind, namespace, &name).is_some() {
        return Err(ApiError::already_exists(kind, &name));
    }
    normalize(kind, &mut object);
    Ok(state.commit(kind, EventType::Added, object, None))
}

/// The namespace comes from the path; a different one in the body is an error, none is filled in, and
/// cluster-scoped objects lose theirs (as EnsureObjectNamespaceMatchesRequestNamespace does).
fn place_in_namespace(kind: &Kind, namespace: &str, object: &mut Value) -> ApiResult<()> {
    let metadata = meta_mut(object);
    if !kind.namespaced {
        metadata.remove("namespace");
        return Ok(());
    }
    match metadata.get("namespace").and_then(Value::as_str) {
        Some(ns) if !ns.is_empty() && ns != namespace => Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        )),
        _ => {
            metadata.insert("namespace".into(), namespace.into());
            Ok(())
        }
    }
}

fn choose_name(kind: &Kind, object: &mut Value) -> ApiResult<String> {
    if let Some(name) = meta_str(object, "name").filter(|n| !n.is_empty()) {
        return Ok(name.to_owned());
    }
    let Some(prefix) = meta_str(object, "generateName").filter(|p| !p.is_empty()) else {
        return Err(ApiError::invalid(
            kind,
            "",
            "metadata.name",
            "FieldValueRequired",
            "Required value: name or generateName is required",
        ));
    };
    let name = format!("{prefix}{}", name_suffix());
    meta_mut(object).insert("name".into(), name.clone().into());
    Ok(name)
}

/// PUT: the whole object, to an object that exists.
pub(super) fn replace(state: &mut State, route: &Route, object: Value) -> ApiResult<Arc<Value>> {
    let kind = route.kind;
    let name = route.name();
    let body_name = name_of(&object);
    if body_name != name {
        return Err(ApiError::bad_request(format!(
            "the name of the object ({body_name}) does not match the name on the URL ({name})"
        )));
    }
    let body_namespace = namespace_of(&object);
    if kind.namespaced && !body_namespace.is_empty() && body_namespace != route.namespace() {
        return Err(ApiError::bad_request(
            "the namespace of the provided object does not match the namespace sent on the request",
        ));
    }
    let old = state
        .get(kind, route.namespace(), name)
        .ok_or_else(|| ApiError::not_found(kind, name))?;
    check_preconditions(kind, &old, &object, true)?;
    update(state, kind, route.status, &old, object)
}

/// A uid in the new object is a precondition (409 when it differs), so is a resourceVersion; a PUT without
/// resourceVersion is an unconditional update, which only some kinds allow.
pub(super) fn check_preconditions(kind: &Kind, old: &Value, new: &Value, put: bool) -> ApiResult<()> {
    let name = name_of(old);
    if let Some(uid) = meta_str(new, "uid").filter(|u| !u.is_empty())
        && uid != uid_of(old)
    {
        let why = format!(
            "Precondition failed: UID in precondition: {uid}, UID in object meta: {}",
            uid_of(old)
        );
        return Err(ApiError::conflict(kind, name, &why));
    }
    match meta_str(new, "resourceVersion").filter(|rv| !rv.is_empty()) {
        Some(rv) if Some(rv) != meta_str(old, "resourceVersion") => {
            Err(ApiError::conflict(kind, name, OPTIMISTIC_LOCK))
        }
        Some(_) => Ok(()),
        None if put && !kind.unconditional_update => Err(ApiError::invalid(
            kind,
            name,
            "metadata.resourceVersion",
            "FieldValueInvalid",
            "Invalid value: 0x0: must be specified for an update",
        )),
        None => Ok(()),
    }
}

/// The server's half of every update: the strategy, system fields, finalizer rules, generation; then store
/// (nothing when nothing changed) or delete (when the last finalizer of a deleted object went).
pub(super) fn update(
    state: &mut State,
    kind: &'static Kind,
    status: bool,
    old: &Arc<Value>,
    mut new: Value,
) -> ApiResult<Arc<Value>> {
    isolate_status(kind, status, old, &mut new);
    keep_system_fields(kind, old, &mut new)?;
    if kind.special == Special::Job && !status {
        check_job_template_update(kind, old, &new)?;
    }
    if is_deleting(old) {
        let before = finalizers(old);
        let added: Vec<&str> = finalizers(&new)
            .into_iter()
            .filter(|f| !before.contains(f))
            .collect();
        if !added.is_empty() {
            let detail = format!(
                "Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers {added:?}"
            );
            return Err(ApiError::invalid(
                kind,
                name_of(old),
                "metadata.finalizers",
                "FieldValueForbidden",
                &detail,
            ));
        }
    }
    admit_custom_resource(state, kind, &mut new, Some(old))?;
    admit(
        state,
        &Request {
            kind,
            operation: Operation::Update,
            status,
            object: &new,
            old: Some(old),
        },
    )?;
    if kind.generation && !same_spec(old, &new, kind.status) {
        meta_mut(&mut new).insert("generation".into(), next_generation(old).into());
    }
    normalize(kind, &mut new);
    if new == **old {
        return Ok(old.clone());
    }
    if is_deleting(&new) && finalizers(&new).is_empty() && grace_period(&new) == Some(0) {
        // The store deletes instead of updating; the deleted object is the stored one.
        state.commit(kind, EventType::Deleted, (**old).clone(), Some(old.clone()));
        return Ok(old.clone());
    }
    Ok(state.commit(kind, EventType::Modified, new, Some(old.clone())))
}

/// Fields only the server sets (rest.BeforeUpdate and ValidateObjectMetaUpdate).
fn keep_system_fields(kind: &Kind, old: &Value, new: &mut Value) -> ApiResult<()> {
    let name = name_of(old).to_owned();
    let immutable = |field: &str, value: &Value| {
        let detail = format!("Invalid value: {value}: field is immutable");
        Err(ApiError::invalid(
            kind,
            &name,
            &format!("metadata.{field}"),
            "FieldValueInvalid",
            &detail,
        ))
    };
    let old_meta = meta(old).cloned().unwrap_or_default();
    let new_meta = meta_mut(new);
    // A missing or empty name or namespace takes the stored one; a cluster-scoped object has none.
    let identity: &[&str] = if kind.namespaced {
        &["name", "namespace"]
    } else {
        &["name"]
    };
    for field in identity {
        match new_meta.get(*field) {
            Some(after) if !after.is_null() && after != "" && Some(after) != old_meta.get(*field) => {
                return immutable(field, after);
            }
            _ => {}
        }
    }
    match (
        old_meta.get("deletionTimestamp"),
        new_meta.get("deletionTimestamp"),
    ) {
        (None, Some(after)) if !after.is_null() => return immutable("deletionTimestamp", after),
        _ => {}
    }
    let grace_before = old_meta.get("deletionGracePeriodSeconds");
    if let Some(after) = new_meta
        .get("deletionGracePeriodSeconds")
        .filter(|g| !g.is_null())
        && Some(after) != grace_before
    {
        return immutable("deletionGracePeriodSeconds", after);
    }
    for field in [
        "name",
        "namespace",
        "uid",
        "creationTimestamp",
        "deletionTimestamp",
        "deletionGracePeriodSeconds",
        "generation",
        "resourceVersion",
    ] {
        match old_meta.get(field) {
            Some(value) => new_meta.insert(field.into(), value.clone()),
            None => new_meta.remove(field),
        };
    }
    new_meta.remove("managedFields");
    new_meta.remove("selfLink");
    Ok(())
}
