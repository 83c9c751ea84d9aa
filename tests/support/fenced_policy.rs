//! The chart's fenced-objects policy (`templates/fenced-objects-policy.yaml`) as `helm template` renders it,
//! installed on an API server and removed again; and the example clients built as `cargo` builds them. Used by
//! the fenced-object e2e tests and by the product safety checker's fenced mode.

use std::path::{Path, PathBuf};

use kube::Client;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, GroupVersionKind, PostParams};

/// `helm` from target/tools/bin, installed there by scripts/install-tools.sh when missing.
pub fn helm(root: &Path) -> PathBuf {
    let helm = root.join("target/tools/bin/helm");
    if !helm.exists() {
        let status = std::process::Command::new(root.join("scripts/install-tools.sh"))
            .arg("helm")
            .status()
            .expect("scripts/install-tools.sh runs");
        assert!(status.success(), "scripts/install-tools.sh helm failed");
    }
    helm
}

/// The chart's fenced-objects policy and binding as `helm template` renders them for `release`.
pub fn rendered_policy(release: &str) -> Vec<serde_json::Value> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let output = std::process::Command::new(helm(root))
        .args(["template", release])
        .arg(root.join("charts/redlock-operator"))
        .args([
            "--namespace",
            release,
            "--show-only",
            "templates/fenced-objects-policy.yaml",
        ])
        .output()
        .expect("helm template runs");
    assert!(
        output.status.success(),
        "helm template: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    let text = String::from_utf8(output.stdout).expect("UTF-8");
    text.split("\n---")
        .filter_map(|document| serde_yaml_ng::from_str::<serde_json::Value>(document).ok())
        .filter(serde_json::Value::is_object)
        .collect()
}

fn api_of(client: &Client, object: &serde_json::Value) -> (Api<DynamicObject>, String) {
    let kind = object["kind"].as_str().expect("kind");
    let plural = match kind {
        "ValidatingAdmissionPolicy" => "validatingadmissionpolicies",
        "ValidatingAdmissionPolicyBinding" => "validatingadmissionpolicybindings",
        other => panic!("unexpected {other} in the template"),
    };
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    let resource = ApiResource::from_gvk_with_plural(&gvk, plural);
    let name = object["metadata"]["name"].as_str().expect("name").to_owned();
    (Api::all_with(client.clone(), &resource), name)
}

/// Installs the policy and binding rendered for `release`; returns them, to remove them afterwards.
pub async fn install_policy(client: &Client, release: &str) -> Vec<serde_json::Value> {
    let objects = rendered_policy(release);
    assert_eq!(objects.len(), 2, "a policy and its binding: {objects:?}");
    for object in &objects {
        let (api, _) = api_of(client, object);
        let dynamic: DynamicObject = serde_json::from_value(object.clone()).expect("object");
        api.create(&PostParams::default(), &dynamic)
            .await
            .expect("create the policy or its binding");
    }
    objects
}

pub async fn remove_policy(client: &Client, objects: &[serde_json::Value]) {
    for object in objects {
        let (api, name) = api_of(client, object);
        let _ = api.delete(&name, &DeleteParams::default()).await;
    }
}

/// Installed policy objects, removed when dropped (they are cluster-wide, and a real cluster outlives the test
/// that installed them, also one that panics). Needs a multi-thread runtime.
pub struct PolicyGuard {
    client: Client,
    objects: Vec<serde_json::Value>,
}

impl PolicyGuard {
    /// Installs the policy rendered for `release` (see [`install_policy`]).
    pub async fn install(client: &Client, release: &str) -> Self {
        let objects = install_policy(client, release).await;
        Self {
            client: client.clone(),
            objects,
        }
    }
}

impl Drop for PolicyGuard {
    fn drop(&mut self) {
        let (client, objects) = (self.client.clone(), std::mem::take(&mut self.objects));
        if objects.is_empty() {
            return;
        }
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(remove_policy(&client, &objects));
        });
    }
}

/// The executable of example `name`. `CARGO_BIN_EXE_*` names `[[bin]]`s only, and `cargo test --test X` builds no
/// example (a whole `cargo test` does): the cargo running the test builds it (nothing to do when it is current) and
/// says where it is, whatever the target directory or profile.
pub fn example_binary(name: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let mut build = std::process::Command::new(cargo);
    without_the_tests_package_variables(&mut build);
    let output = build
        .args([
            "build",
            "--locked",
            "--quiet",
            "--message-format=json-render-diagnostics",
            "--example",
            name,
        ])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .stderr(std::process::Stdio::inherit())
        .output()
        .expect("cargo runs");
    assert!(output.status.success(), "cargo build --example {name} failed");
    String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<serde_json::Value>(line).ok())
        .find(|message| message["reason"] == "compiler-artifact" && message["target"]["name"] == name)
        .and_then(|artifact| artifact["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo named no executable for the example {name}"))
}

/// Leaves out of `command`'s environment what cargo (or nextest) sets for the test process about this package
/// (`CARGO_PKG_NAME`, `CARGO_MANIFEST_DIR`, `OUT_DIR`, ...): a build script that asks to run again when one of them
/// changes (ring's does) would see them set here and unset in the test command's own builds, so each build would
/// run it again and rebuild everything above it (rustls, kube, redis, this crate and every test binary: 26 s at the
/// start of the next phase, and as long again inside the run of tests that built it).
fn without_the_tests_package_variables(command: &mut std::process::Command) {
    const SET_FOR_A_CRATE: [&str; 9] = [
        "CARGO_MANIFEST_DIR",
        "CARGO_MANIFEST_PATH",
        "CARGO_MANIFEST_LINKS",
        "CARGO_CRATE_NAME",
        "CARGO_BIN_NAME",
        "CARGO_PRIMARY_PACKAGE",
        "CARGO_TARGET_TMPDIR",
        "CARGO_RUSTC_CURRENT_DIR",
        "OUT_DIR",
    ];
    for (key, _) in std::env::vars_os() {
        let Some(key) = key.to_str() else { continue };
        if SET_FOR_A_CRATE.contains(&key)
            || ["CARGO_PKG_", "CARGO_BIN_EXE_", "CARGO_CFG_"]
                .iter()
                .any(|prefix| key.starts_with(prefix))
        {
            command.env_remove(key);
        }
    }
}
