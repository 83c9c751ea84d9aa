//! What each kind's registry strategy does on top of the generic store: defaults set at creation, the status
//! subresource split, and the one validation rule modelled (a Job's pod template).

use serde_json::{Map, Value, json};

use super::errors::{ApiError, ApiResult};
use super::kinds::{Kind, Special};
use super::meta::{meta_mut, name_of, now, uid_of};

/// The create half of each kind's strategy (PrepareForCreate and the validation that matters here).
pub(super) fn prepare_create(kind: &Kind, object: &mut Value) -> ApiResult<()> {
    let name = name_of(object).to_owned();
    let uid = uid_of(object).to_owned();
    let Some(map) = object.as_object_mut() else {
        return Err(ApiError::bad_request("the request body must be a JSON object"));
    };
    match kind.special {
        Special::Custom => {
            map.remove("status");
        }
        Special::Pod => {
            map.insert("status".into(), json!({"phase": "Pending"}));
        }
        Special::Job => {
            map.insert("status".into(), json!({}));
            generate_job_selector(map, &name, &uid);
        }
        Special::Crd => prepare_crd(kind, &name, map)?,
        Special::Plain | Special::Secret | Special::Namespace => {}
    }
    Ok(())
}

/// The job strategy's generated selector: the template is labelled with the job's uid and name, and the
/// selector matches the uid, unless `spec.manualSelector` is true.
fn generate_job_selector(job: &mut Map<String, Value>, name: &str, uid: &str) {
    let Some(spec) = job.get_mut("spec").and_then(Value::as_object_mut) else {
        return;
    };
    if spec.get("manualSelector") == Some(&Value::Bool(true)) {
        return;
    }
    let template = spec.entry("template").or_insert_with(|| json!({}));
    if let Some(labels) = meta_mut(template)
        .entry("labels")
        .or_insert_with(|| json!({}))
        .as_object_mut()
    {
        for (key, value) in [
            ("batch.kubernetes.io/controller-uid", uid),
            ("batch.kubernetes.io/job-name", name),
            ("controller-uid", uid),
            ("job-name", name),
        ] {
            labels.entry(key).or_insert_with(|| value.into());
        }
    }
    let selector = spec.entry("selector").or_insert_with(|| json!({}));
    if let Some(match_labels) = selector
        .as_object_mut()
        .map(|s| s.entry("matchLabels").or_insert_with(|| json!({})))
        .and_then(Value::as_object_mut)
    {
        match_labels
            .entry("batch.kubernetes.io/controller-uid")
            .or_insert_with(|| uid.into());
    }
}

/// A CRD must be named `plural.group`; its conditions are set at once (a real server sets them within
/// moments of creation).
fn prepare_crd(kind: &Kind, name: &str, crd: &mut Map<String, Value>) -> ApiResult<()> {
    let spec = crd.get("spec").cloned().unwrap_or_default();
    let plural = spec
        .pointer("/names/plural")
        .and_then(Value::as_str)
        .unwrap_or("");
    let group = spec.get("group").and_then(Value::as_str).unwrap_or("");
    if name != format!("{plural}.{group}") {
        return Err(ApiError::invalid(
            kind,
            name,
            "metadata.name",
            "FieldValueInvalid",
            &format!("Invalid value: \"{name}\": must be spec.names.plural+\".\"+spec.group"),
        ));
    }
    let stored: Vec<Value> = spec
        .get("versions")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|v| v.get("storage") == Some(&Value::Bool(true)))
        .filter_map(|v| v.get("name").cloned())
        .collect();
    let now = now();
    crd.insert(
        "status".into(),
        json!({
            "conditions": [
                {"type": "NamesAccepted", "status": "True", "reason": "NoConflicts",
                 "message": "no conflicts found", "lastTransitionTime": now},
                {"type": "Established", "status": "True", "reason": "InitialNamesAccepted",
                 "message": "the initial names have been accepted", "lastTransitionTime": now},
            ],
            "acceptedNames": spec.get("names").cloned().unwrap_or_default(),
            "storedVersions": stored,
        }),
    );
    Ok(())
}

/// Status subresource rules: the main resource keeps the stored status; `/status` keeps everything else
/// (custom resources and CRDs: also all metadata; built-in kinds: metadata may change).
pub(super) fn isolate_status(kind: &Kind, status: bool, old: &Value, new: &mut Value) {
    if !kind.status {
        return;
    }
    let (Some(new_map), Some(old_map)) = (new.as_object_mut(), old.as_object()) else {
        return;
    };
    if !status {
        match old_map.get("status") {
            Some(stored) => new_map.insert("status".into(), stored.clone()),
            None => new_map.remove("status"),
        };
        return;
    }
    let written = new_map.remove("status");
    if kind.status_only_status() {
        *new_map = old_map.clone();
    } else {
        new_map.retain(|key, _| key == "metadata");
        for (key, value) in old_map.iter().filter(|(k, _)| *k != "metadata" && *k != "status") {
            new_map.insert(key.clone(), value.clone());
        }
    }
    match written {
        Some(written) => new_map.insert("status".into(), written),
        None => new_map.remove("status"),
    };
}

/// A Job's pod template is immutable, except (ValidateJobUpdate) its scheduling directives and its labels and
/// annotations while the Job is suspended and has never started: the exception Job fencing's grant relies on.
pub(super) fn check_job_template_update(kind: &Kind, old: &Value, new: &Value) -> ApiResult<()> {
    let template = |job: &Value| job.pointer("/spec/template").cloned().unwrap_or(Value::Null);
    let (before, after) = (template(old), template(new));
    if before == after {
        return Ok(());
    }
    let never_started = old.pointer("/spec/suspend") == Some(&Value::Bool(true))
        && old.pointer("/status/startTime").is_none_or(Value::is_null);
    let without_mutable = |mut template: Value| {
        if let Some(meta) = template.get_mut("metadata").and_then(Value::as_object_mut) {
            meta.remove("labels");
            meta.remove("annotations");
        }
        if let Some(spec) = template.get_mut("spec").and_then(Value::as_object_mut) {
            for field in ["nodeSelector", "tolerations", "schedulingGates"] {
                spec.remove(field);
            }
            // Of the affinity, only node affinity is a scheduling directive.
            if let Some(affinity) = spec.get_mut("affinity").and_then(Value::as_object_mut) {
                affinity.remove("nodeAffinity");
            }
        }
        template
    };
    if never_started && without_mutable(before) == without_mutable(after) {
        return Ok(());
    }
    Err(ApiError::invalid(
        kind,
        name_of(old),
        "spec.template",
        "FieldValueInvalid",
        "Invalid value: field is immutable",
    ))
}
