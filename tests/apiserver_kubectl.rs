//! What `kubectl` needs from the in-process test API server, checked through kube's client and plain requests
//! (tests/readme_local_path.rs runs kubectl itself): discovery, the OpenAPI v3 documents kubectl reads before
//! `apply`, `fieldValidation=Strict` on custom resources, and the Table format of `kubectl get`.

use crate::support::apiserver::TestApiServer;
use crate::support::fixtures::{identity_lock as lock, install_crds};
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, Patch, PatchParams, PostParams, ValidationDirective};
use kube::core::GroupVersionKind;
use kube::{Client, CustomResourceExt, Discovery};
use redlock_operator::api::{DistributedLock, RedisQuorum};
use serde_json::{Value, json};

const TABLE: &str = "application/json;as=Table;v=v1;g=meta.k8s.io,application/json;as=Table;v=v1beta1;g=meta.k8s.io,application/json";

/// A GET with an Accept header, as kubectl sends it: status code and body.
async fn get(client: &Client, uri: &str, accept: &str) -> (u16, Value) {
    let request = axum::http::Request::get(uri)
        .header(axum::http::header::ACCEPT, accept)
        .body(Vec::new())
        .expect("request");
    match client.request::<Value>(request).await {
        Ok(body) => (200, body),
        Err(kube::Error::Api(status)) => (status.code, json!({"message": status.message})),
        Err(other) => panic!("{uri}: {other}"),
    }
}

#[tokio::test]
async fn discovery_lists_what_is_served() {
    let server = TestApiServer::start().await;
    let client = server.client();
    let discovery = Discovery::new(client.clone()).run().await.expect("discovery");
    assert!(discovery.get("redlock.io").is_none(), "no CRD, no group");
    let (pods, capabilities) = discovery
        .resolve_gvk(&GroupVersionKind::gvk("", "v1", "Pod"))
        .expect("pods");
    assert_eq!(pods.plural, "pods");
    assert!(
        capabilities
            .subresources
            .iter()
            .any(|(sub, _)| sub.plural == "status")
    );

    install_crds(&client).await;
    let discovery = Discovery::new(client.clone()).run().await.expect("discovery");
    let (locks, capabilities) = discovery
        .resolve_gvk(&GroupVersionKind::gvk("redlock.io", "v1beta1", "DistributedLock"))
        .expect("distributedlocks, once its CRD exists");
    assert_eq!(locks.plural, "distributedlocks");
    assert_eq!(capabilities.scope, kube::discovery::Scope::Namespaced);
    let (_, capabilities) = discovery
        .resolve_gvk(&GroupVersionKind::gvk("redlock.io", "v1beta1", "RedisQuorum"))
        .expect("redisquorums");
    assert_eq!(capabilities.scope, kube::discovery::Scope::Cluster);
    // Short names, which `kubectl get dlock` resolves, come from the CRD.
    let (_, list) = get(&client, "/apis/redlock.io/v1beta1", "application/json").await;
    let short: Vec<&Value> = list["resources"]
        .as_array()
        .expect("resources")
        .iter()
        .filter_map(|resource| resource.get("shortNames"))
        .collect();
    assert_eq!(short, [&json!(["dlock"]), &json!(["rq"])], "{list}");
}

#[tokio::test]
async fn openapi_v3_lists_field_validation_for_patch() {
    let server = TestApiServer::start().await;
    let client = server.client();
    install_crds(&client).await;
    let (code, index) = get(&client, "/openapi/v3", "application/json").await;
    assert_eq!(code, 200);
    let url = index["paths"]["apis/redlock.io/v1beta1"]["serverRelativeURL"]
        .as_str()
        .expect("the group version's document");
    assert!(
        url.starts_with("/openapi/v3/apis/redlock.io/v1beta1?hash="),
        "{url}"
    );
    let (_, document) = get(&client, url, "application/json").await;
    let item = &document["paths"]["/apis/redlock.io/v1beta1/namespaces/{namespace}/distributedlocks/{name}"];
    let patch = &item["patch"];
    assert_eq!(
        patch["x-kubernetes-group-version-kind"],
        json!({"group": "redlock.io", "version": "v1beta1", "kind": "DistributedLock"})
    );
    let parameters: Vec<&str> = patch["parameters"]
        .as_array()
        .expect("parameters")
        .iter()
        .filter(|p| p["in"] == "query")
        .filter_map(|p| p["name"].as_str())
        .collect();
    assert!(parameters.contains(&"fieldValidation"), "{parameters:?}");
    assert!(!parameters.contains(&"dryRun"), "refused here, so not offered");
    let schema = &document["components"]["schemas"]["io.redlock.v1beta1.DistributedLock"];
    assert_eq!(
        schema["properties"]["spec"],
        serde_json::to_value(DistributedLock::crd()).unwrap()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
            ["properties"]["spec"],
        "the CRD's own schema"
    );
}

#[tokio::test]
async fn strict_field_validation_refuses_unknown_fields_of_custom_resources() {
    let server = TestApiServer::start().await;
    let client = server.client();
    install_crds(&client).await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), "default");
    locks
        .create(&PostParams::default(), &lock("a"))
        .await
        .expect("create");
    let strict = PatchParams::default().validation(ValidationDirective::Strict);
    let typo = json!({"spec": {"holder": {"identiti": "x"}, "ttl": "5s"}, "extra": [1]});
    match locks.patch("a", &strict, &Patch::Merge(&typo)).await {
        Err(kube::Error::Api(status)) => {
            assert_eq!(status.code, 400);
            assert_eq!(
                status.message,
                "DistributedLock in version \"v1beta1\" cannot be handled as a DistributedLock: strict decoding \
                 error: unknown field \"extra\", unknown field \"spec.holder.identiti\""
            );
        }
        other => panic!("expected 400, got {other:?}"),
    }
    assert_eq!(locks.get("a").await.unwrap().spec.ttl, "10s", "nothing written");
    // Known fields, a null removing one, and the other directives pass.
    let fine = json!({"spec": {"ttl": "5s", "resourceKey": null}, "metadata": {"labels": {"a": "b"}}});
    locks
        .patch("a", &strict, &Patch::Merge(&fine))
        .await
        .expect("known fields");
    let ignore = PatchParams::default().validation(ValidationDirective::Ignore);
    locks
        .patch("a", &ignore, &Patch::Merge(&typo))
        .await
        .expect("Ignore");
    // Built-in kinds are not checked (their schemas are not modelled).
    let secrets: Api<Secret> = Api::namespaced(client, "default");
    let secret = json!({"apiVersion": "v1", "kind": "Secret", "metadata": {"name": "s"}, "unknown": 1});
    secrets
        .patch(
            "s",
            &PatchParams::apply("test").validation(ValidationDirective::Strict),
            &Patch::Apply(&secret),
        )
        .await
        .expect("built-in kinds are not checked");
}

#[tokio::test]
async fn tables_of_custom_resources_follow_their_printer_columns() {
    let server = TestApiServer::start().await;
    let client = server.client();
    install_crds(&client).await;
    let locks: Api<DistributedLock> = Api::namespaced(client.clone(), "default");
    locks
        .create(&PostParams::default(), &lock("held"))
        .await
        .expect("create");
    locks
        .create(&PostParams::default(), &lock("pending"))
        .await
        .expect("create");
    let status = json!({"status": {"phase": "Contended", "holder": "me", "queuePlace": 2, "held": "1/1",
                                   "fencingToken": 7, "quorum": "3/5", "validUntil": "2030-01-01T00:00:00Z"}});
    locks
        .patch_status("held", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status");

    let (code, table) = get(
        &client,
        "/apis/redlock.io/v1beta1/namespaces/default/distributedlocks",
        TABLE,
    )
    .await;
    assert_eq!(code, 200);
    assert_eq!(table["kind"], "Table");
    assert_eq!(table["apiVersion"], "meta.k8s.io/v1");
    let columns: Vec<&str> = table["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        columns,
        [
            "Name",
            "Holder",
            "Phase",
            "Place",
            "Held",
            "Token",
            "Valid-Until",
            "Quorum",
            "Age"
        ]
    );
    let rows = table["rows"].as_array().unwrap();
    let cells = |row: &Value| row["cells"].as_array().unwrap().clone();
    let held = cells(&rows[0]);
    assert_eq!(
        &held[..8],
        &[
            json!("held"),
            json!("me"),
            json!("Contended"),
            json!(2),
            json!("1/1"),
            json!(7),
            json!("2030-01-01T00:00:00Z"),
            json!("3/5")
        ]
    );
    let age = held[8].as_str().unwrap();
    assert!(
        age.ends_with('s') && age[..age.len() - 1].parse::<u64>().is_ok(),
        "an age in seconds: {age}"
    );
    assert_eq!(
        &cells(&rows[1])[1..7],
        &[
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null,
            Value::Null
        ]
    );
    assert_eq!(rows[0]["object"]["kind"], "PartialObjectMetadata");
    assert_eq!(rows[0]["object"]["metadata"]["name"], "held");
    assert!(table["metadata"]["resourceVersion"].is_string());

    // One object; a filter in a column's JSONPath; rows without their objects.
    let quorums: Api<RedisQuorum> = Api::all(client.clone());
    let quorum: RedisQuorum = serde_json::from_value(json!({
        "apiVersion": "redlock.io/v1beta1", "kind": "RedisQuorum", "metadata": {"name": "q"},
        "spec": {"endpoints": ["redis://127.0.0.1:1"]},
    }))
    .unwrap();
    quorums
        .create(&PostParams::default(), &quorum)
        .await
        .expect("quorum");
    let status = json!({"status": {"eligible": 0, "required": 1, "conditions": [
        {"type": "Progressing", "status": "True", "reason": "x", "message": "", "lastTransitionTime": "2030-01-01T00:00:00Z"},
        {"type": "Available", "status": "False", "reason": "y", "message": "", "lastTransitionTime": "2030-01-01T00:00:00Z"},
    ]}});
    quorums
        .patch_status("q", &PatchParams::default(), &Patch::Merge(&status))
        .await
        .expect("status");
    let (_, table) = get(
        &client,
        "/apis/redlock.io/v1beta1/redisquorums/q?includeObject=None",
        TABLE,
    )
    .await;
    let row = &table["rows"][0];
    assert_eq!(
        &row["cells"].as_array().unwrap()[..4],
        &[json!("q"), json!(0), json!(1), json!("False")]
    );
    assert!(row.get("object").is_none(), "{row}");

    // Built-in kinds: plain JSON when acceptable (kubectl prints them itself), 406 when only a Table is.
    let (code, list) = get(&client, "/api/v1/namespaces/default/secrets", TABLE).await;
    assert_eq!((code, list["kind"].as_str()), (200, Some("SecretList")));
    let (code, _) = get(
        &client,
        "/api/v1/namespaces/default/secrets",
        "application/json;as=Table;v=v1;g=meta.k8s.io",
    )
    .await;
    assert_eq!(code, 406);
}
