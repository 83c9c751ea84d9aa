//! Discovery, as kubectl reads it to map `kubectl get dlock` to a resource: `/api`, `/api/v1`, `/apis`,
//! `/apis/{group}` and `/apis/{group}/{version}` (the unaggregated documents: a client asking for aggregated
//! discovery, as kubectl does first, gets these and falls back to reading them, as it does from servers without
//! aggregation). Only the served resources are listed: the kinds of the table, custom ones while their CRD exists,
//! with the names, short names and categories the real server gives them (a CRD's from its `spec.names`).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::http::Method;
use axum::response::Response;
use serde_json::{Value, json};

use super::Shared;
use super::encode::json_response;
use super::kinds::{KINDS, Kind, Special};
use super::store::State;

/// One served resource with what discovery and the OpenAPI documents say about it.
pub(super) struct Served {
    pub kind: &'static Kind,
    pub singular: String,
    pub short_names: Vec<String>,
    pub categories: Vec<String>,
    pub verbs: &'static [&'static str],
    /// The CRD of a custom resource.
    pub crd: Option<Arc<Value>>,
}

const ALL_VERBS: &[&str] = &[
    "create",
    "delete",
    "deletecollection",
    "get",
    "list",
    "patch",
    "update",
    "watch",
];
/// Namespaces have no deletecollection on a real server.
const NAMESPACE_VERBS: &[&str] = &["create", "delete", "get", "list", "patch", "update", "watch"];
const STATUS_VERBS: &[&str] = &["get", "patch", "update"];

/// Short names and categories of the built-in kinds, as kube-apiserver 1.33 lists them.
fn built_in_names(kind: &Kind) -> (&'static [&'static str], &'static [&'static str]) {
    match (kind.group, kind.plural) {
        ("", "pods") => (&["po"], &["all"]),
        ("", "configmaps") => (&["cm"], &[]),
        ("", "namespaces") => (&["ns"], &[]),
        ("events.k8s.io", "events") => (&["ev"], &[]),
        ("batch", "jobs") => (&[], &["all"]),
        ("apiextensions.k8s.io", "customresourcedefinitions") => (&["crd", "crds"], &["api-extensions"]),
        _ => (&[], &[]),
    }
}

fn strings(value: &Value) -> Vec<String> {
    value
        .as_array()
        .map(|items| {
            items
                .iter()
                .filter_map(|s| s.as_str().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
}

/// Every resource served right now, in the table's order.
pub(super) fn served(state: &State) -> Vec<Served> {
    let crd_kind = super::kinds::kind_of(Special::Crd);
    KINDS
        .iter()
        .filter_map(|kind| {
            if kind.is_custom() {
                let crd = state.get(crd_kind, "", &kind.crd_name())?;
                let names = &crd["spec"]["names"];
                return Some(Served {
                    kind,
                    singular: names["singular"]
                        .as_str()
                        .map_or_else(|| kind.kind.to_lowercase(), str::to_owned),
                    short_names: strings(&names["shortNames"]),
                    categories: strings(&names["categories"]),
                    verbs: ALL_VERBS,
                    crd: Some(crd),
                });
            }
            let (short_names, categories) = built_in_names(kind);
            Some(Served {
                kind,
                singular: kind.kind.to_lowercase(),
                short_names: short_names.iter().map(|s| (*s).to_owned()).collect(),
                categories: categories.iter().map(|s| (*s).to_owned()).collect(),
                verbs: if kind.special == Special::Namespace {
                    NAMESPACE_VERBS
                } else {
                    ALL_VERBS
                },
                crd: None,
            })
        })
        .collect()
}

/// `(group, version)` → its served resources, groups in the table's order.
fn by_group_version(served: &[Served]) -> Vec<((&'static str, &'static str), Vec<&Served>)> {
    let mut groups: Vec<((&str, &str), Vec<&Served>)> = Vec::new();
    for resource in served {
        let key = (resource.kind.group, resource.kind.version);
        match groups.iter_mut().find(|(known, _)| *known == key) {
            Some((_, list)) => list.push(resource),
            None => groups.push((key, vec![resource])),
        }
    }
    groups
}

fn resource_list(group_version: String, resources: &[&Served]) -> Value {
    let mut entries = Vec::new();
    for resource in resources {
        let kind = resource.kind;
        let mut entry = json!({
            "name": kind.plural,
            "singularName": resource.singular,
            "namespaced": kind.namespaced,
            "kind": kind.kind,
            "verbs": resource.verbs,
        });
        if !resource.short_names.is_empty() {
            entry["shortNames"] = json!(resource.short_names);
        }
        if !resource.categories.is_empty() {
            entry["categories"] = json!(resource.categories);
        }
        entries.push(entry);
        if kind.status {
            entries.push(json!({
                "name": format!("{}/status", kind.plural),
                "singularName": "",
                "namespaced": kind.namespaced,
                "kind": kind.kind,
                "verbs": STATUS_VERBS,
            }));
        }
    }
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": group_version,
        "resources": entries,
    })
}

fn api_group(group: &str, versions: &[&str]) -> Value {
    let versions: Vec<Value> = versions
        .iter()
        .map(|version| json!({"groupVersion": format!("{group}/{version}"), "version": version}))
        .collect();
    json!({
        "name": group,
        "versions": versions,
        "preferredVersion": versions.first(),
    })
}

/// Answers a discovery GET, or `None` when `path` is not a discovery document.
pub(super) fn serve(shared: &Shared, method: &Method, path: &str) -> Option<Response> {
    if method != Method::GET {
        return None;
    }
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let served = served(&shared.lock());
    let groups = by_group_version(&served);
    let named_groups = || {
        let mut versions: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
        let mut order = Vec::new();
        for ((group, version), _) in &groups {
            if group.is_empty() {
                continue;
            }
            if !versions.contains_key(group) {
                order.push(*group);
            }
            versions.entry(group).or_default().push(version);
        }
        order
            .into_iter()
            .map(|group| (group, versions.remove(group).unwrap_or_default()))
            .collect::<Vec<_>>()
    };
    let body = match segments.as_slice() {
        ["api"] => json!({
            "kind": "APIVersions",
            "versions": ["v1"],
            "serverAddressByClientCIDRs": [{"clientCIDR": "0.0.0.0/0", "serverAddress": shared.addr.to_string()}],
        }),
        ["api", "v1"] => {
            let core = groups.iter().find(|((group, _), _)| group.is_empty());
            resource_list("v1".into(), core.map_or(&[][..], |(_, list)| list))
        }
        ["apis"] => {
            let list: Vec<Value> = named_groups()
                .iter()
                .map(|(group, versions)| api_group(group, versions))
                .collect();
            json!({"kind": "APIGroupList", "apiVersion": "v1", "groups": list})
        }
        ["apis", group] => {
            let (name, versions) = named_groups().into_iter().find(|(name, _)| name == group)?;
            let mut body = api_group(name, &versions);
            body["kind"] = "APIGroup".into();
            body["apiVersion"] = "v1".into();
            body
        }
        ["apis", group, version] => {
            let (_, list) = groups.iter().find(|(key, _)| *key == (*group, *version))?;
            resource_list(format!("{group}/{version}"), list)
        }
        _ => return None,
    };
    Some(json_response(200, body.to_string().into_bytes()))
}
