//! Service-account tokens bound to pods: TokenRequest (`POST .../serviceaccounts/{name}/token`, what the kubelet
//! asks for a projected `serviceAccountToken` volume, and what the end-to-end tests ask for in its place) and
//! TokenReview (`POST /apis/authentication.k8s.io/v1/tokenreviews`, what the operator asks to learn which pod
//! sent a report).
//!
//! As the real server (`pkg/registry/core/serviceaccount/storage/token.go`, `pkg/serviceaccount/claims.go`):
//! a token is bound to a pod of the service account it is requested for (400 when the pod runs as another
//! one, 404 when the pod does not exist, 409 on a uid that is not the pod's); a review authenticates it only for
//! an audience it was issued for (none given: the server's own), while it has not expired, and while its pod
//! exists with the same uid and was not marked for deletion more than 60 s ago; the user is
//! `system:serviceaccount:<namespace>:<name>` with the pod's name and uid in `extra`.
//!
//! A token is a JWT with the real claims (`aud`, `exp`, `iat`, `nbf`, `iss`, `sub`, `jti`, and `kubernetes.io`
//! with the namespace, the pod's name and uid and the service account), so that what reads a token's text (the
//! operator refuses locally what cannot be one) meets the real format. Left out: the signature is random bytes,
//! not RS256 (a review looks the token up among those issued); the ServiceAccount object is not required to
//! exist (the kind is not served); tokens bound to Secrets or Nodes, and unbound tokens, are refused with 400.
//! Reviews are counted ([`TestApiServer::token_reviews`]).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, PoisonError};

use base64::Engine as _;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;

use k8s_openapi::jiff::{SignedDuration, Timestamp};
use serde_json::{Value, json};

use super::TestApiServer;
use super::errors::{ApiError, ApiResult, bad_json};
use super::kinds::{self, Special};
use super::store::State;

/// The audience a review checks when it names none: the API server's own.
const API_SERVER_AUDIENCE: &str = "https://kubernetes.default.svc.cluster.local";
/// A pod-bound token outlives its pod's deletion mark by this much (`claims.go`).
const DELETION_LEEWAY: SignedDuration = SignedDuration::from_secs(60);

/// The two endpoints, recognised from a request's method and path.
pub(super) enum Endpoint {
    Request {
        namespace: String,
        service_account: String,
    },
    Review,
}

impl Endpoint {
    pub fn of(method: &axum::http::Method, path: &str) -> Option<Self> {
        if method != axum::http::Method::POST {
            return None;
        }
        let segments: Vec<&str> = path.split('/').filter(|s| !s.is_empty()).collect();
        match segments.as_slice() {
            [
                "api",
                "v1",
                "namespaces",
                namespace,
                "serviceaccounts",
                name,
                "token",
            ] => Some(Self::Request {
                namespace: (*namespace).to_owned(),
                service_account: (*name).to_owned(),
            }),
            ["apis", "authentication.k8s.io", "v1", "tokenreviews"] => Some(Self::Review),
            _ => None,
        }
    }
}

impl Endpoint {
    /// The API group and resource, as RBAC names them.
    pub fn resource(&self) -> (&'static str, &'static str) {
        match self {
            Self::Request { .. } => ("", "serviceaccounts/token"),
            Self::Review => ("authentication.k8s.io", "tokenreviews"),
        }
    }
}

struct Issued {
    namespace: String,
    service_account: String,
    audiences: Vec<String>,
    pod: String,
    pod_uid: String,
    expires: Timestamp,
}

struct Vouched {
    namespace: String,
    service_account: String,
    pod: String,
    pod_uid: String,
}

#[derive(Default)]
pub(super) struct Tokens {
    issued: Mutex<HashMap<String, Issued>>,
    reviews: AtomicU64,
}

impl TestApiServer {
    /// TokenReviews received so far (each one answered, authenticated or not).
    pub fn token_reviews(&self) -> u64 {
        self.shared.tokens.reviews.load(Ordering::SeqCst)
    }
}

impl Tokens {
    /// Answers `endpoint` with the state of the store: `(201, body)`.
    pub fn serve(&self, state: &State, endpoint: &Endpoint, body: &[u8]) -> ApiResult<(u16, Vec<u8>)> {
        let sent: Value = serde_json::from_slice(body).map_err(bad_json)?;
        let answer = match endpoint {
            Endpoint::Request {
                namespace,
                service_account,
            } => self.request(state, namespace, service_account, sent)?,
            Endpoint::Review => self.review(state, sent),
        };
        Ok((201, answer.to_string().into_bytes()))
    }

    fn request(
        &self,
        state: &State,
        namespace: &str,
        service_account: &str,
        mut sent: Value,
    ) -> ApiResult<Value> {
        let spec = &sent["spec"];
        let bound = &spec["boundObjectRef"];
        if bound["kind"].as_str() != Some("Pod") {
            return Err(ApiError::bad_request(
                "this test server issues tokens bound to a Pod only (spec.boundObjectRef.kind: Pod)",
            ));
        }
        let pod_name = bound["name"].as_str().unwrap_or_default();
        let pods = kinds::kind_of(Special::Pod);
        let pod = state
            .get(pods, namespace, pod_name)
            .ok_or_else(|| ApiError::not_found(pods, pod_name))?;
        let pod_uid = pod["metadata"]["uid"].as_str().unwrap_or_default().to_owned();
        if let Some(uid) = bound["uid"].as_str().filter(|uid| !uid.is_empty())
            && uid != pod_uid
        {
            return Err(ApiError::new(
                409,
                "Conflict",
                format!(
                    "the UID in the bound object reference ({uid}) does not match the UID in record. The object might have been deleted and then recreated"
                ),
            ));
        }
        let runs_as = pod["spec"]["serviceAccountName"].as_str().unwrap_or("default");
        if runs_as != service_account {
            return Err(ApiError::bad_request(format!(
                "cannot bind token for serviceaccount \"{service_account}\" to pod running with different serviceaccount name."
            )));
        }
        let audiences: Vec<String> = match spec["audiences"].as_array() {
            Some(listed) if !listed.is_empty() => listed
                .iter()
                .filter_map(|audience| audience.as_str().map(str::to_owned))
                .collect(),
            _ => vec![API_SERVER_AUDIENCE.to_owned()],
        };
        let seconds = spec["expirationSeconds"]
            .as_i64()
            .unwrap_or(3600)
            .clamp(600, 86_400 * 2);
        let expires = Timestamp::now() + SignedDuration::from_secs(seconds);
        let token = jwt(&json!({
            "aud": audiences,
            "exp": expires.as_second(),
            "iat": Timestamp::now().as_second(),
            "nbf": Timestamp::now().as_second(),
            "iss": API_SERVER_AUDIENCE,
            "jti": format!("{:032x}", rand::random::<u128>()),
            "kubernetes.io": {
                "namespace": namespace,
                "pod": {"name": pod_name, "uid": pod_uid},
                "serviceaccount": {"name": service_account},
            },
            "sub": format!("system:serviceaccount:{namespace}:{service_account}"),
        }));
        self.issued.lock().unwrap_or_else(PoisonError::into_inner).insert(
            token.clone(),
            Issued {
                namespace: namespace.to_owned(),
                service_account: service_account.to_owned(),
                audiences: audiences.clone(),
                pod: pod_name.to_owned(),
                pod_uid,
                expires,
            },
        );
        sent["apiVersion"] = json!("authentication.k8s.io/v1");
        sent["kind"] = json!("TokenRequest");
        sent["spec"]["audiences"] = json!(audiences);
        sent["spec"]["expirationSeconds"] = json!(seconds);
        sent["status"] = json!({"token": token, "expirationTimestamp": expires.strftime("%Y-%m-%dT%H:%M:%SZ").to_string()});
        Ok(sent)
    }

    fn review(&self, state: &State, mut sent: Value) -> Value {
        self.reviews.fetch_add(1, Ordering::SeqCst);
        let token = sent["spec"]["token"].as_str().unwrap_or_default().to_owned();
        let wanted: Vec<String> = match sent["spec"]["audiences"].as_array() {
            Some(listed) if !listed.is_empty() => listed
                .iter()
                .filter_map(|audience| audience.as_str().map(str::to_owned))
                .collect(),
            _ => vec![API_SERVER_AUDIENCE.to_owned()],
        };
        let status = match self.authenticate(state, &token, &wanted) {
            Ok((vouched, audiences)) => json!({
                "authenticated": true,
                "audiences": audiences,
                "user": {
                    "username": format!("system:serviceaccount:{}:{}", vouched.namespace, vouched.service_account),
                    "groups": ["system:serviceaccounts", format!("system:serviceaccounts:{}", vouched.namespace), "system:authenticated"],
                    "extra": {
                        "authentication.kubernetes.io/pod-name": [vouched.pod],
                        "authentication.kubernetes.io/pod-uid": [vouched.pod_uid],
                    },
                },
            }),
            Err(why) => json!({"authenticated": false, "error": why, "user": {}}),
        };
        sent["apiVersion"] = json!("authentication.k8s.io/v1");
        sent["kind"] = json!("TokenReview");
        sent["status"] = status;
        sent
    }

    /// Who the token vouches for, and the audiences of `wanted` it is good for.
    fn authenticate(
        &self,
        state: &State,
        token: &str,
        wanted: &[String],
    ) -> Result<(Vouched, Vec<String>), String> {
        let issued = self.issued.lock().unwrap_or_else(PoisonError::into_inner);
        let Some(found) = issued.get(token) else {
            return Err("invalid bearer token".into());
        };
        let now = Timestamp::now();
        if now >= found.expires {
            return Err("service account token has expired".into());
        }
        let audiences: Vec<String> = found
            .audiences
            .iter()
            .filter(|audience| wanted.contains(audience))
            .cloned()
            .collect();
        if audiences.is_empty() {
            return Err("token audiences is invalid for the target audiences".into());
        }
        let pods = kinds::kind_of(Special::Pod);
        let pod = state.get(pods, &found.namespace, &found.pod);
        let current = pod
            .as_ref()
            .filter(|pod| pod["metadata"]["uid"].as_str() == Some(found.pod_uid.as_str()));
        let Some(pod) = current else {
            return Err("service account token has been invalidated".into());
        };
        let marked = pod["metadata"]["deletionTimestamp"]
            .as_str()
            .and_then(|at| at.parse::<Timestamp>().ok());
        if marked.is_some_and(|at| at + DELETION_LEEWAY < now) {
            return Err("service account token has been invalidated".into());
        }
        let vouched = Vouched {
            namespace: found.namespace.clone(),
            service_account: found.service_account.clone(),
            pod: found.pod.clone(),
            pod_uid: found.pod_uid.clone(),
        };
        Ok((vouched, audiences))
    }
}

/// A JWT of `claims` as the API server's looks, signed with random bytes (nothing here checks a signature).
fn jwt(claims: &Value) -> String {
    let signature: [u8; 32] = rand::random();
    format!(
        "{}.{}.{}",
        URL_SAFE_NO_PAD.encode(json!({"alg": "RS256", "kid": "test-api-server"}).to_string()),
        URL_SAFE_NO_PAD.encode(claims.to_string()),
        URL_SAFE_NO_PAD.encode(signature)
    )
}
