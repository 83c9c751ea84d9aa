//! The in-process test API server, through kube's own client and runtime only: what the end-to-end tests
//! rely on must behave as on a real API server.
//!
//! The tests are in `tests/apiserver/`, one module a concern; this file holds what they share.

use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

use crate::support::apiserver::realism::{Jitter, Realism, seed_from};
use crate::support::apiserver::{PodGc, TestApiServer};
use crate::support::fixtures::{identity_lock as lock, install_crds};
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::ByteString;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod, PodSpec, Secret};
use k8s_openapi::api::events::v1::Event as EventsV1Event;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use kube::core::ObjectMeta;
use kube::core::{ApiResource, DynamicObject};
use kube::runtime::reflector;
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Client, CustomResourceExt, Resource, ResourceExt};
use redlock_operator::api::{DistributedLock, RedisQuorum};
use redlock_operator::telemetry::events::{Event as RecorderEvent, EventType, Recorder, Reporter};
use serde_json::json;
use tokio::time::Instant;

const UPPER_BOUND: Duration = Duration::from_secs(10);

/// A Secret: the plain built-in kind here (no status, no generation, unconditional PUT allowed).
fn secret(name: &str, labels: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_string()))
                    .collect(),
            ),
            ..ObjectMeta::default()
        },
        string_data: Some(BTreeMap::from([("key".to_string(), "value".to_string())])),
        ..Secret::default()
    }
}

async fn started() -> (TestApiServer, Client) {
    with_crds(TestApiServer::start().await).await
}

async fn started_with(realism: Realism) -> (TestApiServer, Client) {
    with_crds(TestApiServer::start_with(realism).await).await
}

async fn with_crds(server: TestApiServer) -> (TestApiServer, Client) {
    let client = server.client();
    install_crds(&client).await;
    (server, client)
}

/// A client that does not retry, to see what the server answers.
fn no_retry_client(server: &TestApiServer) -> Client {
    let mut config = kube::Config::new(server.url().parse().unwrap());
    config.default_retry = false;
    Client::try_from(config).unwrap()
}

fn api_error(result: Result<impl std::fmt::Debug, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.reason.clone()),
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// Polls `check` until it holds; the timeout is only an upper bound.
async fn eventually<F, Fut>(what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    crate::support::poll::until(UPPER_BOUND, Duration::from_millis(20), || {
        let checked = check();
        async move { checked.await.then_some(()) }
    })
    .await
    .unwrap_or_else(|waited| panic!("timed out waiting for {what} ({waited:?})"));
}

fn names<K: ResourceExt>(items: impl IntoIterator<Item = K>) -> Vec<String> {
    let mut names: Vec<String> = items.into_iter().map(|o| o.name_any()).collect();
    names.sort();
    names
}

/// The quick mode's settings with a fresh seed, for a test to change what it looks at.
fn realism() -> Realism {
    Realism {
        seed: seed_from(None),
        ..Realism::quick()
    }
}

/// A reflector over `secrets` running in the background, once its store is ready.
async fn reflect(secrets: &Api<Secret>) -> (reflector::Store<Secret>, tokio::task::JoinHandle<()>) {
    let (store, writer) = reflector::store();
    let stream = reflector::reflector(
        writer,
        watcher(secrets.clone(), watcher::Config::default()).default_backoff(),
    );
    let task = tokio::spawn(stream.for_each(|_| async {}));
    store.wait_until_ready().await.unwrap();
    (store, task)
}

fn stored(store: &reflector::Store<Secret>) -> Vec<String> {
    names(store.state().iter().map(|s| (**s).clone()))
}

async fn resource_version(secrets: &Api<Secret>) -> String {
    let list = secrets.list(&ListParams::default()).await.unwrap();
    list.metadata.resource_version.unwrap()
}

#[path = "apiserver/objects.rs"]
mod objects;
#[path = "apiserver/pods.rs"]
mod pods;
#[path = "apiserver/realism.rs"]
mod realism;
#[path = "apiserver/watches.rs"]
mod watches;
