//! A pod's projected service-account token, asked for as the kubelet asks for one (TokenRequest bound to the
//! pod): what `elect` and the Job guard present with their reports, for the tests and benchmarks that play the
//! kubelet.

use k8s_openapi::api::authentication::v1::{BoundObjectReference, TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Pod, ServiceAccount};
use kube::Api;
use kube::api::PostParams;

/// A token of `pod` (running as `default`) in `namespace` for `audience`, bound to the pod.
pub async fn pod_token(
    client: &kube::Client,
    namespace: &str,
    pod: &str,
    audience: &str,
) -> kube::Result<String> {
    let uid = Api::<Pod>::namespaced(client.clone(), namespace)
        .get(pod)
        .await?
        .metadata
        .uid;
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![audience.to_owned()],
            bound_object_ref: Some(BoundObjectReference {
                api_version: Some("v1".into()),
                kind: Some("Pod".into()),
                name: Some(pod.to_owned()),
                uid,
            }),
            expiration_seconds: Some(3600),
        },
        ..TokenRequest::default()
    };
    let answer = Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request("default", &PostParams::default(), &request)
        .await?;
    Ok(answer.status.map(|status| status.token).unwrap_or_default())
}
