//! One Kubernetes cluster of a run: the test API server in its realistic mode, or a real cluster named by a
//! kubeconfig; a namespace of the run's own; and clients of it behind TCP fault proxies, so that the nemesis can
//! cut one operator replica, or the whole cluster's traffic, off the API server (as the outage tests do).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use redlock_operator::api::{DistributedLock, RedisQuorum};

use crate::support::apiserver::TestApiServer;
use crate::support::apiserver::realism::Realism;
use crate::support::fault_proxy::FaultProxy;
use crate::support::node::FakeNode;

pub struct Cluster {
    /// A short name for the reports ("east", "west").
    pub name: String,
    /// The harness's own client, never cut: it plays the kubelet and the nemesis, and cleans up.
    pub client: Client,
    pub namespace: String,
    pub server: Option<TestApiServer>,
    kubeconfig: Kubeconfig,
    upstream: SocketAddr,
    /// The node the harness binds its pods to, registered and kept Ready as a kubelet would (on a real cluster
    /// removed at the end): pods bound to a node that does not exist are collected by the pod garbage collector.
    node: FakeNode,
    dir: tempfile::TempDir,
}

impl Cluster {
    /// The real cluster of `kubeconfig` when given, the test API server in its realistic mode (seeded by
    /// `seed`) otherwise.
    pub async fn start(name: &str, kubeconfig: Option<&Path>, seed: u64) -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        let (server, path) = match kubeconfig {
            Some(path) => (None, path.to_owned()),
            None => {
                let server = TestApiServer::start_with(Realism::typical(seed)).await;
                let path = dir.path().join("kubeconfig");
                server.write_kubeconfig(&path).expect("kubeconfig");
                (Some(server), path)
            }
        };
        let kubeconfig = Kubeconfig::read_from(&path).expect("a readable kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig.clone(), &KubeConfigOptions::default())
            .await
            .expect("kubeconfig");
        let upstream = resolve(&config).await;
        let removal = config.clone();
        let client = match &server {
            // The cluster's own controllers' view: no late first lists (those model the operator starting).
            Some(server) => server.controller_client(),
            None => Client::try_from(config).expect("client"),
        };
        let mut suffix = [0u8; 4];
        getrandom::fill(&mut suffix).expect("random");
        let namespace = format!("redlock-safety-{name}-{}", hex::encode(suffix));
        let node = FakeNode::register(client.clone(), &format!("{namespace}-node"))
            .await
            .expect("register the run's node");
        let node = if server.is_none() {
            node.removed_on_drop(removal)
        } else {
            node
        };
        let cluster = Self {
            name: name.to_owned(),
            client,
            namespace,
            server,
            kubeconfig,
            upstream,
            node,
            dir,
        };
        cluster.apply_crds().await;
        cluster.create_namespace().await;
        cluster
    }

    /// The node the harness binds its pods to, playing their kubelet.
    pub fn pod_node(&self) -> &str {
        self.node.name()
    }

    pub fn is_test_server(&self) -> bool {
        self.server.is_some()
    }

    /// A kubeconfig file (for a process) and a client (for in-process holders) of this cluster whose traffic
    /// goes through a fault proxy of its own.
    pub async fn behind_proxy(&self, label: &str) -> (PathBuf, Client, FaultProxy) {
        let proxy = FaultProxy::start(self.upstream).await.expect("fault proxy");
        let mut kubeconfig = self.kubeconfig.clone();
        for named in &mut kubeconfig.clusters {
            let Some(cluster) = named.cluster.as_mut() else {
                continue;
            };
            let Some(server) = cluster.server.clone() else {
                continue;
            };
            let url: url::Url = server.parse().expect("server URL");
            let host = url.host_str().expect("server host").to_owned();
            let mut proxied = url.clone();
            proxied.set_host(Some("127.0.0.1")).expect("host");
            proxied.set_port(Some(proxy.addr().port())).expect("port");
            cluster.server = Some(proxied.to_string().trim_end_matches('/').to_owned());
            if url.scheme() == "https" && cluster.tls_server_name.is_none() {
                // The certificate names the API server, not the proxy on loopback.
                cluster.tls_server_name = Some(host);
            }
        }
        let path = self.dir.path().join(format!("kubeconfig-{label}"));
        std::fs::write(
            &path,
            serde_yaml_ng::to_string(&kubeconfig).expect("kubeconfig YAML"),
        )
        .expect("write kubeconfig");
        let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
            .await
            .expect("proxied kubeconfig");
        (path, Client::try_from(config).expect("proxied client"), proxy)
    }

    /// A kubeconfig file of this cluster, straight to its API server (for a process), named after `label`.
    pub fn kubeconfig_file(&self, label: &str) -> PathBuf {
        let path = self.dir.path().join(format!("kubeconfig-{label}"));
        std::fs::write(
            &path,
            serde_yaml_ng::to_string(&self.kubeconfig).expect("kubeconfig YAML"),
        )
        .expect("write kubeconfig");
        path
    }

    pub fn locks(&self) -> Api<DistributedLock> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    pub fn quorums(&self) -> Api<RedisQuorum> {
        Api::all(self.client.clone())
    }

    async fn apply_crds(&self) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client.clone());
        let params = PatchParams::apply("redlock-safety").force();
        for crd in [
            redlock_operator::api::served_crd::<RedisQuorum>(),
            redlock_operator::api::served_crd::<DistributedLock>(),
        ] {
            api.patch(&crd.name_any(), &params, &Patch::Apply(&crd))
                .await
                .expect("apply CRD");
        }
        crate::e2e::eventually("CRDs established", || async {
            let mut established = 0;
            for name in ["redisquorums.redlock.io", "distributedlocks.redlock.io"] {
                let crd = api.get(name).await.ok()?;
                let conditions = crd
                    .status
                    .and_then(|status| status.conditions)
                    .unwrap_or_default();
                established += usize::from(
                    conditions
                        .iter()
                        .any(|c| c.type_ == "Established" && c.status == "True"),
                );
            }
            (established == 2).then_some(())
        })
        .await;
    }

    async fn create_namespace(&self) {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(self.namespace.clone()),
                ..ObjectMeta::default()
            },
            ..Namespace::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .expect("namespace");
    }

    /// Removes what the run created on a real cluster, once its operators are stopped (the test server goes
    /// away by itself).
    pub async fn cleanup(&self, quorum: &str) {
        if self.is_test_server() {
            return;
        }
        if let Ok(locks) = self.locks().list(&Default::default()).await {
            let unfinalize = Patch::Merge(serde_json::json!({ "metadata": { "finalizers": null } }));
            for lock in locks.items {
                let name = lock.name_any();
                let _ = self
                    .locks()
                    .patch(&name, &PatchParams::default(), &unfinalize)
                    .await;
                let _ = self.locks().delete(&name, &DeleteParams::default()).await;
            }
        }
        let _ = self.quorums().delete(quorum, &DeleteParams::default()).await;
        let _ = Api::<Namespace>::all(self.client.clone())
            .delete(&self.namespace, &DeleteParams::default())
            .await;
    }
}

async fn resolve(config: &Config) -> SocketAddr {
    let url = &config.cluster_url;
    let host = url.host().expect("API server host").to_owned();
    let https = url.scheme_str() == Some("https");
    let port = url.port_u16().unwrap_or(if https { 443 } else { 80 });
    tokio::net::lookup_host((host.as_str(), port))
        .await
        .expect("resolve the API server")
        .next()
        .expect("an API server address")
}
