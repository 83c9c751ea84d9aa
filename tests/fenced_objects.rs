//! End-to-end: fenced objects. The chart's ValidatingAdmissionPolicy (`templates/fenced-objects-policy.yaml`,
//! rendered by `helm template`) installed on the API — the in-process test API server, which evaluates it as the
//! real one does, or a real cluster when `REDLOCK_E2E_KUBECONFIG` names a kubeconfig — and the real operator
//! holding a lock: an object labelled `redlock.io/fenced-by` takes an update only with a fencing token not lower
//! than the lock's and the object's own.

use std::path::{Path, PathBuf};

use crate::e2e::*;
use crate::support::fenced_policy::{example_binary, install_policy, remove_policy};
use crate::support::redis_server::RedisCluster;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::core::ObjectMeta;
use redlock_operator::api::LockPhase;
use redlock_operator::controller::run::Running;
use tokio_util::sync::CancellationToken;

const TTL: &str = "2s";
const MAX_TTL: &str = "2s";
const FENCED_BY: &str = "redlock.io/fenced-by";
const TOKEN: &str = "redlock.io/fencing-token";

fn config_map(name: &str, fenced_by: Option<&str>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            labels: fenced_by.map(|lock| [(FENCED_BY.to_owned(), lock.to_owned())].into()),
            ..ObjectMeta::default()
        },
        data: Some([("step".to_owned(), "0".to_owned())].into()),
        ..ConfigMap::default()
    }
}

/// What the tests write to a ConfigMap: its `step`.
fn step(config_map: &ConfigMap) -> Option<&str> {
    config_map.data.as_ref()?.get("step").map(String::as_str)
}

/// The fencing token the object carries.
fn carried_token(config_map: &ConfigMap) -> Option<&str> {
    config_map
        .metadata
        .annotations
        .as_ref()?
        .get(TOKEN)
        .map(String::as_str)
}

/// A holder's write: the change and its token in one merge patch (`None`: the change alone).
async fn write(
    api: &Api<ConfigMap>,
    name: &str,
    step: &str,
    token: Option<i64>,
) -> Result<ConfigMap, kube::Error> {
    let mut patch = serde_json::json!({ "data": { "step": step } });
    if let Some(token) = token {
        patch["metadata"] = serde_json::json!({ "annotations": { TOKEN: token.to_string() } });
    }
    api.patch(name, &PatchParams::default(), &Patch::Merge(patch))
        .await
}

/// The refusal's message, asserting it is the fenced-objects policy's (403 Forbidden).
fn refusal(result: Result<ConfigMap, kube::Error>) -> String {
    match result {
        Err(kube::Error::Api(status)) if status.code == 403 && status.message.contains("fenced-objects") => {
            status.message
        }
        other => panic!("expected the fenced-objects policy's refusal, got {other:?}"),
    }
}

/// What the fenced-object tests start from: the chart's policy installed, the real operator holding lock `work` for
/// team-a, and ConfigMap `fenced` labelled with that lock, on which the policy is seen in force.
struct Fenced {
    env: Env,
    quorum: String,
    policy: Vec<serde_json::Value>,
    operator: (Running, CancellationToken),
    config_maps: Api<ConfigMap>,
    /// team-a's token.
    first: i64,
    /// The policy's answer to an update without the annotation.
    unannotated_refusal: String,
    _masters: RedisCluster,
}

impl Fenced {
    async fn start() -> Self {
        let masters = RedisCluster::start(3).expect("masters");
        let env = Env::new().await;
        let quorum = env.unique("q");
        env.create_quorum(&quorum, &masters.urls(), MAX_TTL).await;
        let policy = install_policy(&env.client, &env.namespace).await;
        let operator = operator(&env, &installation_secret(40), None).await;
        quorum_available(&env, &quorum).await;
        env.create_lock("work", &quorum, "team-a", TTL).await;
        let held = lock_where(&env, "work", "held by team-a", |lock| {
            phase(lock) == Some(LockPhase::Held)
        })
        .await;
        let first = token(&held).expect("a token");

        let config_maps: Api<ConfigMap> = Api::namespaced(env.client.clone(), &env.namespace);
        config_maps
            .create(&PostParams::default(), &config_map("fenced", Some("work")))
            .await
            .expect("a labelled ConfigMap is created: creates are not fenced");
        // A real API server takes a moment to enforce a new policy.
        let unannotated_refusal = eventually("the policy to be in force", || async {
            let mut unannotated = config_maps.get("fenced").await.ok()?;
            unannotated.data = Some([("step".to_owned(), "unannotated".to_owned())].into());
            match config_maps
                .replace("fenced", &PostParams::default(), &unannotated)
                .await
            {
                Err(kube::Error::Api(status)) if status.code == 403 => Some(status.message),
                _ => None,
            }
        })
        .await;
        Self {
            env,
            quorum,
            policy,
            operator,
            config_maps,
            first,
            unannotated_refusal,
            _masters: masters,
        }
    }

    /// The holder changes to team-b: returns its token, higher than team-a's.
    async fn hand_over(&self) -> i64 {
        self.env
            .locks()
            .patch(
                "work",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "holder": { "identity": "team-b" } } })),
            )
            .await
            .expect("change the holder");
        let moved = lock_where(&self.env, "work", "held by team-b", |lock| {
            phase(lock) == Some(LockPhase::Held)
                && lock.status.as_ref().and_then(|s| s.holder.as_deref()) == Some("team-b")
        })
        .await;
        let second = token(&moved).expect("a token");
        assert!(
            second > self.first,
            "a new holder, a higher token: {second} after {}",
            self.first
        );
        second
    }

    /// ConfigMap `fenced` as stored.
    async fn stored(&self) -> ConfigMap {
        self.config_maps.get("fenced").await.expect("get")
    }

    async fn stop(self) {
        let (running, shutdown) = self.operator;
        stop(running, shutdown).await;
        remove_policy(&self.env.client, &self.policy).await;
        self.env.cleanup(&[&self.quorum]).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_object_refuses_writes_with_a_stale_or_missing_fencing_token() {
    let fenced = Fenced::start().await;
    let (env, config_maps, first) = (&fenced.env, &fenced.config_maps, fenced.first);
    let refused = &fenced.unannotated_refusal;
    assert!(
        refused.contains("fenced by lock work") && refused.contains("redlock.io/fencing-token"),
        "without the annotation: {refused}"
    );
    assert!(refused.contains(&format!("the lock shows {first}")), "{refused}");

    let accepted = write(config_maps, "fenced", "1", Some(first))
        .await
        .expect("the holder's token is accepted");
    assert_eq!(step(&accepted), Some("1"));

    let lower = refusal(write(config_maps, "fenced", "lower", Some(first - 1)).await);
    assert!(
        lower.contains("fenced by lock work")
            && lower.contains(&format!("fencing token {} is stale", first - 1))
            && lower.contains(&format!("the lock shows {first}")),
        "a lower token: {lower}"
    );

    // The holder changes: a new token, and the old holder's writes are refused.
    let second = fenced.hand_over().await;
    let stale = refusal(write(config_maps, "fenced", "stale", Some(first)).await);
    assert!(
        stale.contains(&format!("fencing token {first} is stale"))
            && stale.contains(&format!("the lock shows {second}"))
            && stale.contains(&format!("the object carries {first}"))
            && stale.contains("a holder paused past its validity"),
        "the old holder: {stale}"
    );
    write(config_maps, "fenced", "2", Some(second))
        .await
        .expect("the new holder's token is accepted");
    // Now the object carries the new token: the old one is refused for that reason too.
    let behind = refusal(write(config_maps, "fenced", "stale again", Some(first)).await);
    assert!(
        behind.contains(&format!("the object carries {second}")),
        "{behind}"
    );
    // Removing the label is a write like any other.
    let unlabel = serde_json::json!({ "metadata": { "labels": { FENCED_BY: null }, "annotations": { TOKEN: first.to_string() } } });
    refusal(
        config_maps
            .patch("fenced", &PatchParams::default(), &Patch::Merge(unlabel))
            .await,
    );
    assert_eq!(step(&fenced.stored().await), Some("2"));

    // An unlabelled object is not looked at.
    config_maps
        .create(&PostParams::default(), &config_map("plain", None))
        .await
        .expect("create");
    write(config_maps, "plain", "1", None)
        .await
        .expect("an unlabelled object takes any write");
    write(config_maps, "plain", "2", Some(0))
        .await
        .expect("an unlabelled object takes any write");

    // A labelled object in a namespace with no lock at all: refused (parameterNotFoundAction: Deny).
    let lockless = format!("{}-nolock", env.namespace);
    env.made_namespace(&lockless);
    let namespaces: Api<Namespace> = Api::all(env.client.clone());
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some(lockless.clone()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    namespaces
        .create(&PostParams::default(), &namespace)
        .await
        .expect("namespace");
    let elsewhere: Api<ConfigMap> = Api::namespaced(env.client.clone(), &lockless);
    elsewhere
        .create(&PostParams::default(), &config_map("fenced", Some("work")))
        .await
        .expect("create");
    match write(&elsewhere, "fenced", "1", Some(second)).await {
        Err(kube::Error::Api(status)) => assert!(
            status.message.contains("no params found"),
            "no lock: {}",
            status.message
        ),
        other => panic!("a labelled object with no lock in its namespace: {other:?}"),
    }

    if !env.is_test_server() {
        let _ = namespaces.delete(&lockless, &DeleteParams::default()).await;
    }
    fenced.stop().await;
}

/// A Python with the official Kubernetes client, in a venv that scripts/install-tools.sh makes under target/tools
/// when missing (from PyPI, as scripts/chart-check.sh makes its own).
fn python_with_kubernetes_client(root: &Path) -> PathBuf {
    let output = std::process::Command::new(root.join("scripts/install-tools.sh"))
        .arg("python-kubernetes")
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("scripts/install-tools.sh runs");
    assert!(
        output.status.success(),
        "scripts/install-tools.sh python-kubernetes failed"
    );
    let line = String::from_utf8(output.stdout).expect("UTF-8");
    PathBuf::from(line.split_whitespace().next().expect("the venv's python"))
}

/// One holder's write through an example client: `--namespace <the test's> fenced step=<step>`, with the test's
/// kubeconfig and only the token variables `vars` in its environment.
async fn example_write(
    client: &[std::ffi::OsString],
    env: &Env,
    step: &str,
    vars: &[(&str, &std::ffi::OsStr)],
) -> std::process::Output {
    tokio::process::Command::new(&client[0])
        .args(&client[1..])
        .args(["--namespace", &env.namespace, "fenced", &format!("step={step}")])
        .env("KUBECONFIG", &env.kubeconfig)
        .env_remove("REDLOCK_FENCING_TOKEN")
        .env_remove("REDLOCK_FENCING_TOKEN_FILE")
        .envs(vars.iter().map(|(key, value)| (*key, *value)))
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("the example runs")
}

/// The holder's side, in the clients the docs show (kube-rs: examples/fenced_write.rs; the Python client:
/// examples/fenced-write.py), run as shipped: the current holder's write, its token read from the token file, is
/// accepted in the same request as the change; an old holder's, with its token from `REDLOCK_FENCING_TOKEN`, is
/// refused with the policy's message and exit status 1, and the object is left as it was; with the token file set
/// but gone (no grant now), the client does not write at all, whatever the variable holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_example_clients_write_with_the_current_token_and_are_refused_with_a_stale_one() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let clients: [(&str, Vec<std::ffi::OsString>); 2] = [
        ("kube-rs", vec![example_binary("fenced_write").into()]),
        (
            "python",
            vec![
                python_with_kubernetes_client(root).into(),
                root.join("examples/fenced-write.py").into(),
            ],
        ),
    ];
    let fenced = Fenced::start().await;
    let first = fenced.first.to_string();
    let second = fenced.hand_over().await.to_string();
    let dir = tempfile::tempdir().expect("tempdir");
    let token_file = dir.path().join("token");
    std::fs::write(&token_file, &second).expect("write the token file");
    let gone = dir.path().join("gone");

    for (name, client) in &clients {
        // The file wins over the variable: it is kept current across grants, the variable is the first grant's.
        let current = example_write(
            client,
            &fenced.env,
            name,
            &[
                ("REDLOCK_FENCING_TOKEN_FILE", token_file.as_os_str()),
                ("REDLOCK_FENCING_TOKEN", first.as_ref()),
            ],
        )
        .await;
        assert!(
            current.status.success(),
            "{name}: the current token is accepted: {}",
            String::from_utf8_lossy(&current.stderr)
        );
        let stored = fenced.stored().await;
        assert_eq!(
            (step(&stored), carried_token(&stored)),
            (Some(*name), Some(second.as_str())),
            "{name}: the change and the token in one write"
        );

        let stale = example_write(
            client,
            &fenced.env,
            "stale",
            &[("REDLOCK_FENCING_TOKEN", first.as_ref())],
        )
        .await;
        let message = String::from_utf8_lossy(&stale.stderr);
        assert_eq!(
            stale.status.code(),
            Some(1),
            "{name}: a stale token is refused: {message}"
        );
        assert!(
            message.contains("fenced by lock work")
                && message.contains(&format!("fencing token {first} is stale")),
            "{name}: the API server's message: {message}"
        );

        let no_grant = example_write(
            client,
            &fenced.env,
            "no grant",
            &[
                ("REDLOCK_FENCING_TOKEN_FILE", gone.as_os_str()),
                ("REDLOCK_FENCING_TOKEN", second.as_ref()),
            ],
        )
        .await;
        let message = String::from_utf8_lossy(&no_grant.stderr);
        assert_eq!(
            no_grant.status.code(),
            Some(2),
            "{name}: no token file: {message}"
        );
        assert!(message.contains("no current grant"), "{name}: {message}");
        assert_eq!(
            step(&fenced.stored().await),
            Some(*name),
            "{name}: the refused writes changed nothing"
        );
    }
    fenced.stop().await;
}

/// The holder's side: `lock` keeps its grant's token in the file `REDLOCK_FENCING_TOKEN_FILE` names while its
/// command runs (the same token as `REDLOCK_FENCING_TOKEN`), and removes it once the command has ended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_lock_command_keeps_its_token_in_the_token_file_while_its_command_runs() {
    let masters = RedisCluster::start(3).expect("masters");
    // Fresh masters sit in quarantine for max-ttl (1 s here); their reported uptime can be a second ahead.
    tokio::time::sleep(std::time::Duration::from_millis(3_100)).await;
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("token");
    let check = r#"test "$(cat "$REDLOCK_FENCING_TOKEN_FILE")" = "$REDLOCK_FENCING_TOKEN" && printf %s "$REDLOCK_FENCING_TOKEN""#;
    let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_redlock-operator"))
        .args([
            "lock",
            "--ttl",
            "1s",
            "--max-ttl",
            "1s",
            "fenced-file",
            "--",
            "sh",
            "-c",
            check,
        ])
        .env("REDLOCK_REDIS", masters.urls().join(","))
        .env("REDLOCK_FENCING_TOKEN_FILE", &file)
        .env_remove("RUST_LOG")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .expect("run redlock-operator lock");
    assert!(
        output.status.success(),
        "the file holds the token: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let token: i64 = String::from_utf8_lossy(&output.stdout)
        .parse()
        .expect("the command printed the token");
    assert!(token >= 1, "{token}");
    assert!(!file.exists(), "the file is removed once the command has ended");
}
