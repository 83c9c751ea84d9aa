//! Response bodies: objects, lists and watch event lines, as the real server serializes them.

use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::http::header;
use axum::response::Response;
use serde::Serialize;
use serde::ser::{SerializeMap, Serializer};
use serde_json::{Value, json};

use super::errors::ApiError;
use super::kinds::Kind;

pub(super) fn json_response(code: u16, body: Vec<u8>) -> Response {
    Response::builder()
        .status(code)
        .header(header::CONTENT_TYPE, "application/json")
        .body(Body::from(body))
        .expect("a status code from the server's own table")
}

pub(super) fn error_response(error: &ApiError) -> Response {
    json_response(error.code, error.status().to_string().into_bytes())
}

/// Serializes an object for a response: list items of built-in kinds carry no apiVersion/kind (typed lists
/// do not), custom resource items and watch event objects do.
pub(super) struct View<'a> {
    pub kind: &'static Kind,
    pub object: &'a Value,
    pub list_item: bool,
}

impl Serialize for View<'_> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self.object.as_object() {
            Some(map) if self.list_item && !self.kind.is_custom() => {
                let mut out = serializer.serialize_map(None)?;
                for (key, value) in map.iter().filter(|(k, _)| *k != "apiVersion" && *k != "kind") {
                    out.serialize_entry(key, value)?;
                }
                out.end()
            }
            _ => self.object.serialize(serializer),
        }
    }
}

pub(super) fn list_body(
    kind: &'static Kind,
    items: &[Arc<Value>],
    rv: u64,
    continue_token: Option<String>,
    remaining: Option<usize>,
) -> Vec<u8> {
    #[derive(Serialize)]
    struct List<'a> {
        kind: String,
        #[serde(rename = "apiVersion")]
        api_version: String,
        metadata: Value,
        items: Vec<View<'a>>,
    }
    let mut metadata = json!({"resourceVersion": rv.to_string()});
    if let Some(token) = continue_token {
        metadata["continue"] = token.into();
    }
    if let Some(remaining) = remaining {
        metadata["remainingItemCount"] = remaining.into();
    }
    let list = List {
        kind: format!("{}List", kind.kind),
        api_version: kind.api_version(),
        metadata,
        items: items
            .iter()
            .map(|object| View {
                kind,
                object,
                list_item: true,
            })
            .collect(),
    };
    serde_json::to_vec(&list).expect("JSON values serialize")
}

/// One line of a watch stream: `{"type": …, "object": …}` and a newline.
pub(super) fn watch_line(event: &str, object: &impl Serialize) -> Bytes {
    #[derive(Serialize)]
    struct Line<'a, T: Serialize> {
        #[serde(rename = "type")]
        event: &'a str,
        object: &'a T,
    }
    let mut bytes = serde_json::to_vec(&Line { event, object }).expect("JSON values serialize");
    bytes.push(b'\n');
    Bytes::from(bytes)
}
