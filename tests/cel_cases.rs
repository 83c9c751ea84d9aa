//! The CRDs' validation rules (CEL) through the API's own HTTP path: the shared cases of `tests/cel-cases.yaml`
//! against the in-process test API server, or a real cluster when `REDLOCK_E2E_KUBECONFIG` is set. The chart
//! check evaluates the same cases with cel-python (`scripts/validate_manifests.py --cel-cases`), so the two
//! evaluators, and the API server they stand for, must give every rule the same verdict.

use crate::e2e::*;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::core::{ApiResource, DynamicObject};
use kube::{CustomResourceExt, ResourceExt};
use redlock_operator::api::{DistributedLock, RedisQuorum};
use serde::Deserialize;
use serde_json::{Value, json};

const CASES: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/cel-cases.yaml");

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct CaseFile {
    cases: Vec<Case>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Case {
    name: String,
    kind: String,
    spec: Value,
    #[serde(default)]
    old: Option<Value>,
    #[serde(default)]
    refused: Vec<Expected>,
}

#[derive(Deserialize, Debug)]
#[serde(deny_unknown_fields)]
struct Expected {
    field: String,
    message: String,
}

fn cases() -> Vec<Case> {
    let text = std::fs::read_to_string(CASES).expect("tests/cel-cases.yaml");
    let file: CaseFile = serde_yaml_ng::from_str(&text).expect("the case file parses");
    file.cases
}

/// One kind's API, untyped: objects are sent as written, so the server's defaulting is what fills them in.
struct Kind {
    name: &'static str,
    crd: CustomResourceDefinition,
    api: Api<DynamicObject>,
}

impl Kind {
    fn of(env: &Env, name: &str) -> Kind {
        match name {
            "DistributedLock" => Kind {
                name: "DistributedLock",
                crd: DistributedLock::crd(),
                api: Api::namespaced_with(
                    env.client.clone(),
                    &env.namespace,
                    &ApiResource::erase::<DistributedLock>(&()),
                ),
            },
            "RedisQuorum" => Kind {
                name: "RedisQuorum",
                crd: RedisQuorum::crd(),
                api: Api::all_with(env.client.clone(), &ApiResource::erase::<RedisQuorum>(&())),
            },
            other => panic!("no kind {other} in the case file"),
        }
    }

    fn object(&self, name: &str, spec: &Value) -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "redlock.io/v1beta1", "kind": self.name,
            "metadata": { "name": name }, "spec": spec,
        }))
        .expect("object")
    }
}

/// What differs between the API's answer to a case's write and the verdict the case expects.
fn mismatch(case: &Case, name: &str, answer: Result<DynamicObject, kube::Error>) -> Option<String> {
    let status = match answer {
        Ok(_) if case.refused.is_empty() => return None,
        Ok(_) => return Some(format!("admitted; expected refused with {:?}", case.refused)),
        Err(kube::Error::Api(status)) if status.code == 422 => status,
        Err(other) => return Some(format!("failed otherwise: {other}")),
    };
    if case.refused.is_empty() {
        return Some(format!("refused; expected admitted: {}", status.message));
    }
    let Some(details) = status.details.as_ref() else {
        return Some(format!("a 422 without details: {status:?}"));
    };
    let prefix = format!("{}.redlock.io \"{name}\" is invalid: ", case.kind);
    let shaped = status.reason == "Invalid"
        && status.message.starts_with(&prefix)
        && (
            details.kind.as_str(),
            details.group.as_str(),
            details.name.as_str(),
        ) == (case.kind.as_str(), "redlock.io", name)
        && details
            .causes
            .iter()
            .all(|cause| cause.reason == "FieldValueInvalid" && cause.message.starts_with("Invalid value: "));
    let matched = details.causes.len() == case.refused.len()
        && case.refused.iter().all(|expected| {
            details
                .causes
                .iter()
                .any(|cause| cause.field == expected.field && cause.message.contains(&expected.message))
        });
    (!shaped || !matched).then(|| {
        format!(
            "refused with {:?}; expected {:?}",
            details
                .causes
                .iter()
                .map(|cause| format!("{}: {}", cause.field, cause.message))
                .collect::<Vec<_>>(),
            case.refused
        )
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_server_gives_every_shared_case_its_verdict() {
    let env = Env::new().await;
    let cases = cases();
    assert!(cases.len() >= 40, "{} cases", cases.len());
    let mut failures = Vec::new();
    let mut quorums = Vec::new();
    for kind_name in ["DistributedLock", "RedisQuorum"] {
        let kind = Kind::of(&env, kind_name);
        let of_kind: Vec<(String, &Case)> = cases
            .iter()
            .enumerate()
            .filter(|(_, case)| case.kind == kind_name)
            .map(|(index, case)| (env.unique(&format!("case-{index}")), case))
            .collect();
        if kind_name == "RedisQuorum" {
            quorums.extend(of_kind.iter().map(|(name, _)| name.clone()));
        }
        // The old objects: as any object when the rules admit it, else as if admitted before the rules existed.
        let mut refused_olds = Vec::new();
        for (name, case) in &of_kind {
            let Some(old) = &case.old else { continue };
            let object = kind.object(name, old);
            let created = kind.api.create(&PostParams::default(), &object).await;
            if invalid(&created).is_some() {
                refused_olds.push(object);
            } else {
                created.expect("create the old object");
            }
        }
        if !refused_olds.is_empty() {
            create_admitted_before_rules_of(&env, &kind.crd, &kind.api, &refused_olds).await;
        }
        for (name, case) in &of_kind {
            let mut object = kind.object(name, &case.spec);
            let answer = if case.old.is_some() {
                let stored = kind.api.get(name).await.expect("the old object");
                object.metadata.resource_version = stored.resource_version();
                kind.api.replace(name, &PostParams::default(), &object).await
            } else {
                kind.api.create(&PostParams::default(), &object).await
            };
            if let Some(why) = mismatch(case, name, answer) {
                failures.push(format!("{kind_name} case `{}`: {why}", case.name));
            }
        }
    }
    let quorums: Vec<&str> = quorums.iter().map(String::as_str).collect();
    env.cleanup(&quorums).await;
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_schema_defaults_are_stored_and_a_refusal_reads_as_the_api_servers() {
    let env = Env::new().await;
    let quorums = Kind::of(&env, "RedisQuorum");
    let name = env.unique("defaults");
    let stored = quorums
        .api
        .create(
            &PostParams::default(),
            &quorums.object(&name, &json!({ "endpoints": ["redis://a:6379"], "retry": {} })),
        )
        .await
        .expect("a quorum with its defaults");
    let spec = &stored.data["spec"];
    assert_eq!(
        (
            &spec["maxTtl"],
            &spec["nodeTimeout"],
            &spec["driftFactor"],
            &spec["assumeDurable"]
        ),
        (&json!("60s"), &json!("50ms"), &json!(0.01), &json!(false))
    );
    assert_eq!(spec["retry"], json!({}), "no defaults inside retry");

    let locks = Kind::of(&env, "DistributedLock");
    let refused = locks
        .api
        .create(
            &PostParams::default(),
            &locks.object(
                "tight",
                &json!({ "ttl": "1s", "holder": { "jobs": { "fenceMargin": "1s" } } }),
            ),
        )
        .await;
    let status = invalid(&refused).expect("refused");
    assert_eq!(
        rule_wording(&status.message),
        "DistributedLock.redlock.io \"tight\" is invalid: spec: Invalid value: holder.jobs.fenceMargin must be \
         shorter than ttl"
    );
    env.cleanup(&[&name]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_older_than_a_rule_takes_status_writes_unless_the_rule_cannot_be_evaluated() {
    let env = Env::new().await;
    // Broken by a rule that evaluates to false: ratcheting lets writes through while the spec stays.
    let tight: DistributedLock = serde_json::from_value(json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": { "name": "tight" },
        "spec": { "ttl": "1s", "holder": { "jobs": { "fenceMargin": "2s" } } }
    }))
    .expect("lock");
    let mut stored = create_admitted_before_rules(&env, &env.locks(), &[tight])
        .await
        .remove(0);
    stored.status = Some(Default::default());
    env.locks()
        .replace_status("tight", &PostParams::default(), &stored)
        .await
        .expect("a status write to a lock older than its rule");
    let mut labelled = env.locks().get("tight").await.expect("lock");
    labelled.labels_mut().insert("team".into(), "payments".into());
    env.locks()
        .replace("tight", &PostParams::default(), &labelled)
        .await
        .expect("a metadata write to a lock older than its rule");

    // Broken by a rule that cannot be evaluated (a duration past Go's ±2562047h): no write goes through, not
    // even the operator's status.
    let name = env.unique("huge");
    let huge: RedisQuorum = serde_json::from_value(env.own_quorum(json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": { "name": name },
        "spec": { "endpoints": ["redis://a:6379"], "maxTtl": "100000000h" }
    })))
    .expect("quorum");
    let mut stored = create_admitted_before_rules(&env, &env.quorums(), &[huge])
        .await
        .remove(0);
    stored.status = Some(Default::default());
    let refused = env
        .quorums()
        .replace_status(&name, &PostParams::default(), &stored)
        .await;
    let status = invalid(&refused).expect("the status write is refused");
    assert!(
        status
            .message
            .contains("evaluating rule: maxTtl must be between 100ms and 24h"),
        "{status:?}"
    );
    env.cleanup(&[&name]).await;
}

/// What the shared cases cannot reach, since the CRDs do not use it: a rule's `messageExpression`, `reason`
/// and `fieldPath`, rules on map values and list items, and a transition rule inside a list item, which never
/// applies (list items have no old value). Always on the in-process server: it changes the CRD's rules.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rule_options_and_nested_rules_follow_the_api_server() {
    let env = Env::test_server().await;
    let mut crd = serde_json::to_value(DistributedLock::crd()).expect("CRD");
    let spec = crd
        .pointer_mut("/spec/versions/0/schema/openAPIV3Schema/properties/spec")
        .expect("spec schema");
    spec["x-kubernetes-validations"]
        .as_array_mut()
        .expect("spec rules")
        .push(json!({
            "rule": "self.ttl != '7s'", "messageExpression": "'ttl ' + self.ttl + ' is unlucky'",
            "reason": "FieldValueForbidden", "fieldPath": ".ttl"
        }));
    let election = &mut spec["properties"]["holder"]["properties"]["leaderElection"]["properties"];
    election["selector"]["properties"]["matchLabels"]["additionalProperties"]["x-kubernetes-validations"] =
        json!([{ "rule": "self.size() <= 3", "message": "label values are short here" }]);
    election["preference"]["items"]["x-kubernetes-validations"] = json!([
        { "rule": "self != 'bad'" },
        { "rule": "self == oldSelf", "message": "never evaluated" }
    ]);
    let crds: Api<CustomResourceDefinition> = Api::all(env.client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(crd).expect("CRD");
    crds.patch(
        &crd.name_any(),
        &kube::api::PatchParams::apply("redlock-e2e").force(),
        &kube::api::Patch::Apply(&crd),
    )
    .await
    .expect("apply the CRD with more rules");

    let locks = Kind::of(&env, "DistributedLock");
    let causes = |answer: Result<DynamicObject, kube::Error>| -> Vec<(String, String, String)> {
        let status = invalid(&answer).expect("refused").clone();
        status
            .details
            .expect("details")
            .causes
            .into_iter()
            .map(|cause| (cause.field, cause.reason, rule_wording(&cause.message)))
            .collect()
    };
    let unlucky = json!({ "ttl": "7s", "holder": { "identity": "me" } });
    let answer = locks
        .api
        .create(&PostParams::default(), &locks.object("unlucky", &unlucky))
        .await;
    assert_eq!(
        causes(answer),
        [(
            "spec.ttl".to_owned(),
            "FieldValueForbidden".to_owned(),
            "Forbidden: ttl 7s is unlucky".to_owned()
        )]
    );
    let elect = |app: &str, preference: Value| {
        json!({ "ttl": "10s", "holder": { "leaderElection": {
            "selector": { "matchLabels": { "app": app } }, "preference": preference } } })
    };
    let answer = locks
        .api
        .create(
            &PostParams::default(),
            &locks.object("nested", &elect("webserver", json!(["good", "bad"]))),
        )
        .await;
    let mut got = causes(answer);
    got.sort();
    assert_eq!(
        got,
        [
            (
                "spec.holder.leaderElection.preference[1]".to_owned(),
                "FieldValueInvalid".to_owned(),
                "Invalid value: failed rule: self != 'bad'".to_owned()
            ),
            (
                "spec.holder.leaderElection.selector.matchLabels[app]".to_owned(),
                "FieldValueInvalid".to_owned(),
                "Invalid value: label values are short here".to_owned()
            ),
        ]
    );
    let created = locks
        .api
        .create(
            &PostParams::default(),
            &locks.object("nested", &elect("web", json!(["a"]))),
        )
        .await
        .expect("admitted");
    let mut changed = created.clone();
    changed.data["spec"]["holder"]["leaderElection"]["preference"] = json!(["b", "c"]);
    locks
        .api
        .replace("nested", &PostParams::default(), &changed)
        .await
        .expect("list items have no oldSelf: their transition rule does not apply");
}
