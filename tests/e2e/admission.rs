//! Objects the CRDs' validation rules refuse, stored as an object admitted before a rule existed would be: the
//! CRD is applied without its rules, the object created, and the CRD applied again. The same on the test API
//! server and on a real cluster, where the operator then meets the object as it would after an upgrade that
//! added a rule; with ratcheting, writes that leave the offending part alone still go through.

use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::Status;
use kube::{CustomResourceExt, Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;

use super::{Env, eventually};

/// A validation rule's refusal as any API server version words it: before 1.36 the schema's type came first
/// (`Invalid value: "object": <message>`), since then the message alone (`Invalid value: <message>`). Tests
/// assert on what the rule says, not on the wording of one version.
pub fn rule_wording(message: &str) -> String {
    static TYPED: std::sync::LazyLock<regex::Regex> = std::sync::LazyLock::new(|| {
        regex::Regex::new(r#"Invalid value: "(object|string|integer|number|boolean|array)": "#)
            .expect("regex")
    });
    TYPED.replace_all(message, "Invalid value: ").into_owned()
}

/// The API's refusal of a write, when it was one (HTTP 422 `Invalid`).
pub fn invalid(result: &Result<impl std::fmt::Debug, kube::Error>) -> Option<&Status> {
    match result {
        Err(kube::Error::Api(status)) if status.code == 422 => Some(status),
        _ => None,
    }
}

/// `crd` with every `x-kubernetes-validations` removed.
fn without_rules(crd: &CustomResourceDefinition) -> CustomResourceDefinition {
    fn strip(value: &mut serde_json::Value) {
        match value {
            serde_json::Value::Object(map) => {
                map.remove("x-kubernetes-validations");
                map.values_mut().for_each(strip);
            }
            serde_json::Value::Array(items) => items.iter_mut().for_each(strip),
            _ => {}
        }
    }
    let mut value = serde_json::to_value(crd).expect("CRD as JSON");
    strip(&mut value);
    serde_json::from_value(value).expect("CRD from JSON")
}

/// Creates each of `objects` (which the CRD's rules refuse) as if admitted before those rules existed, and
/// returns them as stored; the CRD has its rules again on return.
pub async fn create_admitted_before_rules<K>(env: &Env, api: &Api<K>, objects: &[K]) -> Vec<K>
where
    K: Resource + CustomResourceExt + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    create_admitted_before_rules_of(env, &redlock_operator::api::served_crd::<K>(), api, objects).await
}

/// [`create_admitted_before_rules`] for objects of `crd` of any type (a `DynamicObject`, say).
pub async fn create_admitted_before_rules_of<K>(
    env: &Env,
    crd: &CustomResourceDefinition,
    api: &Api<K>,
    objects: &[K],
) -> Vec<K>
where
    K: Resource + Clone + Serialize + DeserializeOwned + std::fmt::Debug,
{
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let params = PatchParams::apply("redlock-e2e").force();
    crds.patch(&crd.name_any(), &params, &Patch::Apply(&without_rules(crd)))
        .await
        .expect("apply the CRD without its rules");
    let mut stored = Vec::new();
    for object in objects {
        // A real API server takes a moment to serve a changed CRD: until then, the rules still refuse it.
        stored.push(
            eventually("the CRD without its rules to admit the object", || async {
                let created = api.create(&PostParams::default(), object).await;
                if invalid(&created).is_some() {
                    return None;
                }
                Some(created.expect("create"))
            })
            .await,
        );
    }
    env.apply_crds().await;
    if let Some(first) = objects.first() {
        // Each attempt under a name of its own: an admitted probe may take a moment to go (a finalizer).
        let mut attempt = 0;
        eventually("the CRD's rules to be in force again", || {
            attempt += 1;
            let mut probe = first.clone();
            probe.meta_mut().name = Some(format!("{}-probe-{attempt}", first.name_any()));
            async move {
                let created = api.create(&PostParams::default(), &probe).await;
                if invalid(&created).is_some() {
                    return Some(());
                }
                created.expect("create the probe");
                let _ = api.delete(&probe.name_any(), &DeleteParams::default()).await;
                None
            }
        })
        .await;
    }
    stored
}
