//! The Table format (`Accept: application/json;as=Table;v=v1;g=meta.k8s.io`), which `kubectl get` asks for so
//! that the server chooses the columns. For custom resources it is built as the apiextensions server builds it:
//! a `Name` column, then the CRD version's `additionalPrinterColumns` (or `Age` when it has none), each cell found
//! with the column's JSONPath and typed by the column's type (`date` shown as an age such as `42s` or `3m10s`);
//! rows carry the object's metadata (`includeObject=Metadata`, the default), the whole object (`Object`) or
//! nothing (`None`). The built-in kinds' own printers (pods' READY and STATUS, …) are not modelled: for them the
//! server answers plain JSON when the request accepts it (kubectl then prints names and ages itself), and 406
//! otherwise. Watches are never served as tables.

use axum::body::Body;
use axum::http::{HeaderMap, header};
use axum::response::Response;
use jsonpath_rust::JsonPath;
use k8s_openapi::jiff::Timestamp;
use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult};
use super::kinds::{Kind, Special, kind_of};
use super::routes::Query;
use super::store::State;

/// The ObjectMeta description the real server gives the Name column.
const NAME_DESCRIPTION: &str = "Name must be unique within a namespace. Is required when creating resources, although \
    some resources may allow a client to request the generation of a name automatically. Name is primarily intended \
    for creation idempotence and configuration definition. Cannot be updated. More info: \
    https://kubernetes.io/docs/concepts/overview/working-with-objects/names#names";
const AGE_DESCRIPTION: &str = "CreationTimestamp is a timestamp representing the server time when this object was \
    created.";

/// What the request's Accept header asks for.
pub(super) struct Wanted {
    /// `v1` or `v1beta1` when a Table of meta.k8s.io is acceptable (the first one listed).
    table: Option<&'static str>,
    /// Plain JSON is acceptable too (`application/json` or a wildcard).
    json: bool,
}

impl Wanted {
    pub fn from(headers: &HeaderMap) -> Self {
        let mut wanted = Wanted {
            table: None,
            json: headers.get(header::ACCEPT).is_none(),
        };
        let accept = headers
            .get(header::ACCEPT)
            .and_then(|value| value.to_str().ok())
            .unwrap_or("");
        for media in accept.split(',') {
            let mut parts = media.split(';').map(str::trim);
            let media_type = parts.next().unwrap_or("");
            let params: Vec<(&str, &str)> = parts.filter_map(|p| p.split_once('=')).collect();
            let param = |name: &str| params.iter().find(|(k, _)| *k == name).map(|(_, v)| *v);
            let json_type = matches!(media_type, "application/json" | "application/*" | "*/*");
            match (param("as"), param("g"), param("v")) {
                (Some("Table"), Some("meta.k8s.io"), Some(version))
                    if json_type && wanted.table.is_none() =>
                {
                    wanted.table = match version {
                        "v1" => Some("v1"),
                        "v1beta1" => Some("v1beta1"),
                        _ => None,
                    };
                }
                (None, _, _) if json_type => wanted.json = true,
                _ => {}
            }
        }
        wanted
    }
}

/// The reply to a GET or LIST, as a Table when one is wanted and can be made.
pub(super) fn reply(
    state: &State,
    kind: &'static Kind,
    query: &Query,
    wanted: &Wanted,
    body: Vec<u8>,
) -> ApiResult<Response> {
    let Some(version) = wanted.table else {
        return Ok(super::encode::json_response(200, body));
    };
    let crd = kind
        .is_custom()
        .then(|| state.get(kind_of(Special::Crd), "", &kind.crd_name()))
        .flatten();
    let Some(crd) = crd else {
        return if wanted.json {
            Ok(super::encode::json_response(200, body))
        } else {
            Err(ApiError::new(
                406,
                "NotAcceptable",
                "the test API server builds tables for custom resources only",
            ))
        };
    };
    let include = query.get("includeObject").unwrap_or("Metadata");
    if !matches!(include, "None" | "Metadata" | "Object") {
        return Err(ApiError::bad_request(format!(
            "includeObject: unsupported value {include:?}"
        )));
    }
    let reply: Value = serde_json::from_slice(&body).map_err(super::errors::bad_json)?;
    let columns = printer_columns(&crd, kind.version);
    let now = Timestamp::now();
    let (items, metadata) = match reply.get("items") {
        Some(Value::Array(items)) => (items.clone(), reply["metadata"].clone()),
        _ => (
            vec![reply.clone()],
            json!({"resourceVersion": reply["metadata"]["resourceVersion"]}),
        ),
    };
    let rows: Vec<Value> = items
        .iter()
        .map(|object| {
            let mut cells = vec![object["metadata"]["name"].clone()];
            cells.extend(columns.iter().map(|column| cell(column, object, now)));
            let mut row = json!({"cells": cells});
            match include {
                "Object" => row["object"] = object.clone(),
                "Metadata" => {
                    row["object"] = json!({
                        "kind": "PartialObjectMetadata",
                        "apiVersion": format!("meta.k8s.io/{version}"),
                        "metadata": object["metadata"],
                    })
                }
                _ => {}
            }
            row
        })
        .collect();
    let mut definitions = vec![json!({
        "name": "Name", "type": "string", "format": "name", "description": NAME_DESCRIPTION, "priority": 0,
    })];
    definitions.extend(columns.iter().map(|column| {
        json!({
            "name": column["name"],
            "type": column["type"],
            "format": column.get("format").cloned().unwrap_or_else(|| "".into()),
            "description": column.get("description").cloned().unwrap_or_else(|| "".into()),
            "priority": column.get("priority").cloned().unwrap_or_else(|| 0.into()),
        })
    }));
    let table = json!({
        "kind": "Table",
        "apiVersion": format!("meta.k8s.io/{version}"),
        "metadata": metadata,
        "columnDefinitions": definitions,
        "rows": rows,
    });
    Ok(Response::builder()
        .status(200)
        .header(
            header::CONTENT_TYPE,
            format!("application/json;as=Table;v={version};g=meta.k8s.io"),
        )
        .body(Body::from(table.to_string()))
        .expect("a valid header"))
}

/// The version's printer columns, or the `Age` column the apiextensions server serves when it has none.
fn printer_columns(crd: &Value, version: &str) -> Vec<Value> {
    let columns = crd["spec"]["versions"]
        .as_array()
        .and_then(|versions| versions.iter().find(|v| v["name"] == version))
        .and_then(|v| v["additionalPrinterColumns"].as_array())
        .filter(|columns| !columns.is_empty())
        .cloned();
    columns.unwrap_or_else(|| {
        vec![json!({
            "name": "Age", "type": "date", "description": AGE_DESCRIPTION,
            "jsonPath": ".metadata.creationTimestamp",
        })]
    })
}

/// One cell: the first value the column's JSONPath finds, typed as the apiextensions server types it; null
/// when nothing is found or the value does not fit the type.
fn cell(column: &Value, object: &Value, now: Timestamp) -> Value {
    let path = column["jsonPath"].as_str().unwrap_or("");
    // Kubernetes' JSONPath is relative (`.status.phase`); RFC 9535 wants the root named.
    let path = format!("${path}");
    let Some(value) = object
        .query(&path)
        .ok()
        .and_then(|found| found.first().copied().cloned())
    else {
        return Value::Null;
    };
    match column["type"].as_str().unwrap_or("string") {
        "integer" => match &value {
            Value::Number(n) => n
                .as_i64()
                .or_else(|| n.as_f64().map(|f| f as i64))
                .map_or(Value::Null, Value::from),
            _ => Value::Null,
        },
        "number" => value.as_f64().map_or(Value::Null, Value::from),
        "boolean" => value.as_bool().map_or(Value::Null, Value::from),
        "date" => match value.as_str() {
            Some(text) => match text.parse::<Timestamp>() {
                Ok(at) => human_duration(now.as_second().saturating_sub(at.as_second())).into(),
                Err(_) => "<invalid>".into(),
            },
            None => Value::Null,
        },
        _ => match value {
            Value::String(text) => text.into(),
            Value::Null => Value::Null,
            other => other.to_string().into(),
        },
    }
}

/// An age as kubectl shows it (apimachinery's `duration.HumanDuration`).
fn human_duration(seconds: i64) -> String {
    if seconds < -1 {
        return "<invalid>".into();
    }
    if seconds < 0 {
        return "0s".into();
    }
    if seconds < 120 {
        return format!("{seconds}s");
    }
    let minutes = seconds / 60;
    if minutes < 10 {
        return match seconds % 60 {
            0 => format!("{minutes}m"),
            s => format!("{minutes}m{s}s"),
        };
    }
    if minutes < 180 {
        return format!("{minutes}m");
    }
    let hours = seconds / 3600;
    if hours < 8 {
        return match minutes % 60 {
            0 => format!("{hours}h"),
            m => format!("{hours}h{m}m"),
        };
    }
    if hours < 48 {
        return format!("{hours}h");
    }
    if hours < 24 * 8 {
        return match hours % 24 {
            0 => format!("{}d", hours / 24),
            h => format!("{}d{h}h", hours / 24),
        };
    }
    if hours < 24 * 365 * 2 {
        return format!("{}d", hours / 24);
    }
    if hours < 24 * 365 * 8 {
        return match (hours / 24) % 365 {
            0 => format!("{}y", hours / 24 / 365),
            d => format!("{}y{d}d", hours / 24 / 365),
        };
    }
    format!("{}y", hours / 24 / 365)
}
