//! Requests: the URL and query, the verb, and dispatch to the store; LIST and DELETECOLLECTION live here
//! because they are the store seen through a query.

use std::sync::Arc;
use std::time::Duration;

use axum::extract::{Request, State as AxumState};
use axum::http::{Method, header};
use axum::response::Response;
use serde_json::Value;

use super::Shared;
use super::encode::{error_response, json_response, list_body};
use super::errors::{ApiError, ApiResult};
use super::field_validation;
use super::kinds::{self, Kind};
use super::lifecycle::{DeleteOptions, delete, delete_reply};
use super::meta::{name_of, namespace_of};
use super::patch::patch;
use super::selectors::Filter;
use super::store::{Page, State};
use super::write::{create, incoming, replace};

const MAX_BODY: usize = 16 << 20;

pub(super) struct Query(Vec<(String, String)>);

impl Query {
    fn parse(raw: Option<&str>) -> Self {
        let pairs = raw
            .map(|q| url::form_urlencoded::parse(q.as_bytes()).into_owned().collect())
            .unwrap_or_default();
        Query(pairs)
    }

    pub fn get(&self, key: &str) -> Option<&str> {
        self.0.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
    }

    pub fn flag(&self, key: &str) -> bool {
        matches!(self.get(key), Some("true" | "1"))
    }

    pub fn number<T: std::str::FromStr>(&self, key: &str) -> ApiResult<Option<T>> {
        self.get(key)
            .filter(|v| !v.is_empty())
            .map(|v| {
                v.parse()
                    .map_err(|_| ApiError::bad_request(format!("invalid {key}: {v:?}")))
            })
            .transpose()
    }

    pub fn filter(&self, kind: &Kind) -> ApiResult<Filter> {
        Filter::parse(kind, self.get("labelSelector"), self.get("fieldSelector"))
    }
}

pub(super) struct Route {
    pub kind: &'static Kind,
    pub namespace: Option<String>,
    pub name: Option<String>,
    pub status: bool,
}

impl Route {
    pub fn namespace(&self) -> &str {
        self.namespace.as_deref().unwrap_or("")
    }

    pub fn name(&self) -> &str {
        self.name.as_deref().unwrap_or("")
    }

    /// The resource as counted and matched by fault injection.
    pub fn resource(&self) -> String {
        if self.status {
            format!("{}/status", self.kind.plural)
        } else {
            self.kind.plural.to_owned()
        }
    }
}

/// `/api/v1/...` or `/apis/{group}/{version}/...`, then `[namespaces/{ns}/]{plural}[/{name}[/status]]`.
fn parse_route(path: &str) -> Option<Route> {
    let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
    let (group, version, rest) = match segments.as_slice() {
        ["api", version, rest @ ..] => ("", *version, rest),
        ["apis", group, version, rest @ ..] => (*group, *version, rest),
        _ => return None,
    };
    let (namespace, rest) = if rest.len() >= 3 && rest[0] == "namespaces" {
        (Some(rest[1].to_owned()), &rest[2..])
    } else {
        (None, rest)
    };
    let (plural, name, subresource) = match rest {
        [plural] => (*plural, None, None),
        [plural, name] => (*plural, Some(*name), None),
        [plural, name, subresource] => (*plural, Some(*name), Some(*subresource)),
        _ => return None,
    };
    let kind = kinds::find(group, version, plural)?;
    let scoped_right = if kind.namespaced {
        namespace.is_some() || name.is_none()
    } else {
        namespace.is_none()
    };
    let status = match subresource {
        None => false,
        Some("status") if kind.status => true,
        Some(_) => return None,
    };
    scoped_right.then(|| Route {
        kind,
        namespace,
        name: name.map(str::to_owned),
        status,
    })
}

fn request_verb(method: &Method, route: &Route, query: &Query) -> ApiResult<&'static str> {
    let named = route.name.is_some();
    let verb = match *method {
        Method::GET if query.flag("watch") && !named => "watch",
        Method::GET if named => "get",
        Method::GET => "list",
        Method::POST if !named => "create",
        Method::PUT if named => "update",
        Method::PATCH if named => "patch",
        Method::DELETE if named => "delete",
        Method::DELETE => "deletecollection",
        _ => {
            return Err(ApiError::method_not_allowed(
                "the server does not allow this method on the requested resource",
            ));
        }
    };
    let subresource_ok = !route.status || matches!(verb, "get" | "update" | "patch");
    let scope_ok =
        !matches!(verb, "create" | "deletecollection") || !route.kind.namespaced || route.namespace.is_some();
    if subresource_ok && scope_ok {
        Ok(verb)
    } else {
        Err(ApiError::method_not_allowed(
            "the server does not allow this method on the requested resource",
        ))
    }
}

/// Marks requests of the cluster's own controllers played next to the server: no late lists for them.
pub(crate) const SYNCED_CONTROLLER_HEADER: &str = "x-redlock-test-synced-controller";

/// Every request: late by the request latency, counted, then refused while down, failed by an injected
/// fault, or served.
pub(super) async fn handle(AxumState(shared): AxumState<Arc<Shared>>, request: Request) -> Response {
    pause(shared.dice.delay(shared.realism.request_latency)).await;
    let (parts, body) = request.into_parts();
    let synced_controller = parts.headers.contains_key(SYNCED_CONTROLLER_HEADER);
    let query = Query::parse(parts.uri.query());
    let route = parse_route(parts.uri.path()).filter(|route| shared.lock().served(route.kind));
    let verb = route
        .as_ref()
        .map(|route| request_verb(&parts.method, route, &query));
    // Counted even while down: a client hammering an unavailable server is what tests look for.
    if let (Some(route), Some(Ok(verb))) = (&route, &verb) {
        shared.count(verb, route);
        if parts.headers.contains_key(super::controls::OPERATOR_HEADER) {
            shared.record_operator_request(verb, route, query.get("labelSelector"));
        }
    }
    if shared.is_down() {
        return error_response(&ApiError::unavailable("set_down"));
    }
    let (Some(route), Some(verb)) = (route, verb) else {
        if let Some(endpoint) = super::tokens::Endpoint::of(&parts.method, parts.uri.path()) {
            if parts.headers.contains_key(super::controls::OPERATOR_HEADER) {
                let (group, resource) = endpoint.resource();
                shared.record_operator_entry(group, resource.to_owned(), "create");
            }
            let body = match axum::body::to_bytes(body, MAX_BODY).await {
                Ok(body) => body,
                Err(error) => return error_response(&ApiError::bad_request(error.to_string())),
            };
            let answer = shared.tokens.serve(&shared.lock(), &endpoint, &body);
            return match answer {
                Ok((code, body)) => json_response(code, body),
                Err(error) => error_response(&error),
            };
        }
        // Not a resource: discovery and OpenAPI documents (kubectl), or nothing.
        let (method, path) = (&parts.method, parts.uri.path());
        return super::discovery::serve(&shared, method, path)
            .or_else(|| super::openapi::serve(&shared, method, path))
            .unwrap_or_else(|| error_response(&ApiError::no_such_resource()));
    };
    let verb = match verb {
        Ok(verb) => verb,
        Err(error) => return error_response(&error),
    };
    if let Some(fault) = shared.take_fault(verb, &route) {
        return error_response(&fault);
    }
    if verb == "watch" {
        return match shared.start_watch(&route, &query) {
            Ok(session) => session.into_response(),
            Err(error) => error_response(&error),
        };
    }
    let body = match axum::body::to_bytes(body, MAX_BODY).await {
        Ok(body) => body,
        Err(error) => return error_response(&ApiError::bad_request(error.to_string())),
    };
    let content_type = parts
        .headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .unwrap_or("")
        .trim();
    let reply = shared.serve(verb, &route, &query, content_type, &body);
    // A slow list shows the state as of the request, so its answer is held after it was taken.
    if verb == "list" && query.get("continue").is_none_or(str::is_empty) && !synced_controller {
        let slowed = shared.control().list_delay(route.kind.plural);
        pause(shared.realism.list_delay(route.kind.plural).max(slowed)).await;
    }
    match reply {
        // Reads as `kubectl get` asks for them: a Table, when it can be made (table.rs).
        Ok((200, body)) if matches!(verb, "get" | "list") => {
            let wanted = super::table::Wanted::from(&parts.headers);
            super::table::reply(&shared.lock(), route.kind, &query, &wanted, body)
                .unwrap_or_else(|error| error_response(&error))
        }
        Ok((code, body)) => json_response(code, body),
        Err(error) => error_response(&error),
    }
}

async fn pause(delay: Duration) {
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
}

fn object_body(object: &Value) -> Vec<u8> {
    object.to_string().into_bytes()
}

impl Shared {
    /// Everything but WATCH: the status code and body.
    fn serve(
        &self,
        verb: &str,
        route: &Route,
        query: &Query,
        content_type: &str,
        body: &[u8],
    ) -> ApiResult<(u16, Vec<u8>)> {
        if query.get("dryRun").is_some_and(|v| !v.is_empty()) {
            return Err(ApiError::unsupported("dryRun"));
        }
        let kind = route.kind;
        match verb {
            "get" => {
                let object = self.lock().get(kind, route.namespace(), route.name());
                let object = object.ok_or_else(|| ApiError::not_found(kind, route.name()))?;
                Ok((200, object_body(&object)))
            }
            "list" => self.list(route, query),
            "create" => {
                let object = incoming(kind, body)?;
                field_validation::check(&self.lock(), kind, query, &object)?;
                let created = create(&mut self.lock(), kind, route.namespace(), object)?;
                Ok((201, object_body(&created)))
            }
            "update" => {
                let object = incoming(kind, body)?;
                field_validation::check(&self.lock(), kind, query, &object)?;
                let stored = replace(&mut self.lock(), route, object)?;
                Ok((200, object_body(&stored)))
            }
            "patch" => {
                if content_type != "application/json-patch+json"
                    && let Ok(sent) = serde_yaml_ng::from_slice::<Value>(body)
                {
                    field_validation::check(&self.lock(), kind, query, &sent)?;
                }
                let (code, stored) = patch(&mut self.lock(), route, query, content_type, body)?;
                Ok((code, object_body(&stored)))
            }
            "delete" => {
                let options = DeleteOptions::parse(query, body)?;
                let outcome = delete(&mut self.lock(), kind, route.namespace(), route.name(), &options)?;
                Ok((200, object_body(&delete_reply(kind, &outcome))))
            }
            "deletecollection" => self.delete_collection(route, query, body),
            _ => Err(ApiError::method_not_allowed(format!("{verb} is not supported"))),
        }
    }

    /// A LIST: always the current state (a real server may answer resourceVersion "0" from its cache, which is
    /// never newer than this); `limit`/`continue` page through one snapshot.
    fn list(&self, route: &Route, query: &Query) -> ApiResult<(u16, Vec<u8>)> {
        let kind = route.kind;
        let limit = query.number::<usize>("limit")?.unwrap_or(0);
        if query.get("resourceVersionMatch") == Some("Exact") {
            return Err(ApiError::unsupported("resourceVersionMatch=Exact"));
        }
        let mut state = self.lock();
        let (id, page, offset) = match query.get("continue").filter(|c| !c.is_empty()) {
            Some(token) => find_page(&state, token)?,
            None => {
                let filter = query.filter(kind)?;
                let items = state.select(kind, route.namespace.as_deref(), &filter);
                let page = Page {
                    rv: state.rv,
                    items,
                    filtered: !filter.is_empty(),
                };
                (None, Arc::new(page), 0)
            }
        };
        let end = if limit == 0 {
            page.items.len()
        } else {
            offset.saturating_add(limit).min(page.items.len())
        };
        let continue_token = (end < page.items.len()).then(|| {
            let id = id.unwrap_or_else(|| state.save_page(page.clone()));
            format!("{id}:{end}")
        });
        drop(state);
        // Like the real server: a remaining count only for unfiltered lists.
        let remaining = (continue_token.is_some() && !page.filtered).then(|| page.items.len() - end);
        let body = list_body(kind, &page.items[offset..end], page.rv, continue_token, remaining);
        Ok((200, body))
    }

    fn delete_collection(&self, route: &Route, query: &Query, body: &[u8]) -> ApiResult<(u16, Vec<u8>)> {
        let kind = route.kind;
        let options = DeleteOptions::parse(query, body)?;
        let filter = query.filter(kind)?;
        let mut state = self.lock();
        let targets = state.select(kind, route.namespace.as_deref(), &filter);
        let mut items = Vec::new();
        for target in targets {
            let outcome = delete(
                &mut state,
                kind,
                namespace_of(&target),
                name_of(&target),
                &options,
            )?;
            items.push(outcome.into_object());
        }
        let rv = state.rv;
        drop(state);
        Ok((200, list_body(kind, &items, rv, None, None)))
    }
}

fn find_page(state: &State, token: &str) -> ApiResult<(Option<u64>, Arc<Page>, usize)> {
    let expired = || {
        ApiError::expired(
            "The provided continue parameter is too old to display a consistent list result. You can start a new \
             list without the continue parameter.",
        )
    };
    let (id, offset) = token.split_once(':').ok_or_else(expired)?;
    let (id, offset): (u64, usize) = (
        id.parse().map_err(|_| expired())?,
        offset.parse().map_err(|_| expired())?,
    );
    let page = state
        .pages
        .iter()
        .find(|(i, _)| *i == id)
        .ok_or_else(expired)?
        .1
        .clone();
    if offset > page.items.len() {
        return Err(expired());
    }
    Ok((Some(id), page, offset))
}
