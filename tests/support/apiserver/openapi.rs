//! OpenAPI v3, as `kubectl apply` reads it: `/openapi/v3` (the index of group-version documents, each with a
//! hash in its URL) and `/openapi/v3/api/v1`, `/openapi/v3/apis/{group}/{version}`. kubectl looks there for the
//! `fieldValidation` parameter of a resource's PATCH operation, to leave validation to the server
//! (`--validate=strict`, its default); without it, it would download the OpenAPI v2 document as protobuf,
//! which this server does not speak (`/openapi/v2` is not served).
//!
//! Each document has the paths of its served resources with their operations (`x-kubernetes-action`,
//! `x-kubernetes-group-version-kind`) and the query parameters this server honours (`fieldManager`,
//! `fieldValidation`, and `force` for PATCH; not `dryRun`, which it refuses). A custom resource's schema is its
//! CRD's `openAPIV3Schema`, as on the real server; the built-in kinds' schemas are not modelled (an object with
//! its group-version-kind and no properties).

use std::hash::{DefaultHasher, Hash, Hasher};

use axum::http::Method;
use axum::response::Response;
use serde_json::{Map, Value, json};

use super::Shared;
use super::discovery::{Served, served};
use super::encode::json_response;
use super::kinds::Kind;

/// The group-version part of a document's path: `api/v1` or `apis/{group}/{version}`.
fn document_path(kind: &Kind) -> String {
    if kind.group.is_empty() {
        format!("api/{}", kind.version)
    } else {
        format!("apis/{}/{}", kind.group, kind.version)
    }
}

/// The schema's name in `components.schemas`, as the real server names it.
fn schema_name(kind: &Kind) -> String {
    let package = match kind.group {
        "" => "io.k8s.api.core".to_owned(),
        "apiextensions.k8s.io" => "io.k8s.apiextensions-apiserver.pkg.apis.apiextensions".to_owned(),
        group if group.ends_with(".k8s.io") => {
            format!("io.k8s.api.{}", group.trim_end_matches(".k8s.io"))
        }
        "batch" => "io.k8s.api.batch".to_owned(),
        // A custom resource: its group reversed (redlock.io → io.redlock).
        group => group.split('.').rev().collect::<Vec<_>>().join("."),
    };
    format!("{package}.{}.{}", kind.version, kind.kind)
}

fn gvk(kind: &Kind) -> Value {
    json!({"group": kind.group, "version": kind.version, "kind": kind.kind})
}

fn query(name: &str, description: &str) -> Value {
    json!({"name": name, "in": "query", "description": description, "schema": {"type": "string", "uniqueItems": true}})
}

fn write_parameters(patch: bool) -> Vec<Value> {
    let mut parameters = vec![
        query(
            "fieldManager",
            "a name associated with the actor or entity that is making these changes",
        ),
        query(
            "fieldValidation",
            "how the server treats unknown fields in the object: Ignore, Warn or Strict",
        ),
    ];
    if patch {
        parameters.push(
            json!({"name": "force", "in": "query", "schema": {"type": "boolean", "uniqueItems": true}}),
        );
    }
    parameters
}

fn operation(kind: &Kind, action: &str, id: &str, parameters: Vec<Value>) -> Value {
    let reference = json!({"$ref": format!("#/components/schemas/{}", schema_name(kind))});
    json!({
        "operationId": format!("{action}{}", id),
        "parameters": parameters,
        "responses": {"200": {"description": "OK", "content": {"application/json": {"schema": reference}}}},
        "x-kubernetes-action": action,
        "x-kubernetes-group-version-kind": gvk(kind),
    })
}

fn add_paths(paths: &mut Map<String, Value>, kind: &Kind) {
    let base = format!("/{}", document_path(kind));
    let scope = if kind.namespaced {
        format!("{base}/namespaces/{{namespace}}/{}", kind.plural)
    } else {
        format!("{base}/{}", kind.plural)
    };
    let id = kind.kind;
    paths.insert(
        scope.clone(),
        json!({
            "get": operation(kind, "list", id, vec![]),
            "post": operation(kind, "post", id, write_parameters(false)),
            "delete": operation(kind, "deletecollection", id, vec![]),
        }),
    );
    let item = json!({
        "get": operation(kind, "get", id, vec![]),
        "put": operation(kind, "put", id, write_parameters(false)),
        "patch": operation(kind, "patch", id, write_parameters(true)),
        "delete": operation(kind, "delete", id, vec![]),
    });
    paths.insert(format!("{scope}/{{name}}"), item);
    if kind.status {
        let status_id = format!("{id}Status");
        paths.insert(
            format!("{scope}/{{name}}/status"),
            json!({
                "get": operation(kind, "get", &status_id, vec![]),
                "put": operation(kind, "put", &status_id, write_parameters(false)),
                "patch": operation(kind, "patch", &status_id, write_parameters(true)),
            }),
        );
    }
    if kind.namespaced {
        paths.insert(
            format!("{base}/{}", kind.plural),
            json!({"get": operation(kind, "list", &format!("{id}ForAllNamespaces"), vec![])}),
        );
    }
}

fn schema(resource: &Served) -> Value {
    let kind = resource.kind;
    let from_crd = resource.crd.as_ref().and_then(|crd| {
        crd["spec"]["versions"]
            .as_array()?
            .iter()
            .find(|version| version["name"] == kind.version)
            .map(|version| version["schema"]["openAPIV3Schema"].clone())
    });
    let mut schema = match from_crd {
        Some(Value::Object(schema)) => Value::Object(schema),
        _ if resource.crd.is_some() => {
            json!({"type": "object", "x-kubernetes-preserve-unknown-fields": true})
        }
        _ => json!({"type": "object", "description": "(schema not modelled by the test API server)"}),
    };
    schema["x-kubernetes-group-version-kind"] = json!([gvk(kind)]);
    schema
}

/// The document of one group version, or `None` when nothing is served there.
fn document(resources: &[Served], path: &str) -> Option<Value> {
    let mut paths = Map::new();
    let mut schemas = Map::new();
    for resource in resources.iter().filter(|r| document_path(r.kind) == path) {
        add_paths(&mut paths, resource.kind);
        schemas.insert(schema_name(resource.kind), schema(resource));
    }
    (!paths.is_empty()).then(|| {
        json!({
            "openapi": "3.0.0",
            "info": {"title": "Kubernetes", "version": "v1.33.0"},
            "paths": paths,
            "components": {"schemas": schemas},
        })
    })
}

fn hash_of(document: &Value) -> String {
    let mut hasher = DefaultHasher::new();
    document.to_string().hash(&mut hasher);
    format!("{:016X}", hasher.finish())
}

/// Answers an OpenAPI v3 GET, or `None` when `path` is not one of its documents.
pub(super) fn serve(shared: &Shared, method: &Method, path: &str) -> Option<Response> {
    if method != Method::GET {
        return None;
    }
    let rest = path.strip_prefix("/openapi/v3")?;
    let resources = served(&shared.lock());
    let body = if rest.is_empty() || rest == "/" {
        let mut index = Map::new();
        let mut seen = Vec::new();
        for resource in &resources {
            let path = document_path(resource.kind);
            if seen.contains(&path) {
                continue;
            }
            let document = document(&resources, &path)?;
            index.insert(
                path.clone(),
                json!({"serverRelativeURL": format!("/openapi/v3/{path}?hash={}", hash_of(&document))}),
            );
            seen.push(path);
        }
        json!({"paths": index})
    } else {
        document(&resources, rest.trim_start_matches('/'))?
    };
    Some(json_response(200, body.to_string().into_bytes()))
}
