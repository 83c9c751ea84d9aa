//! The cluster, the images and the tools the suite drives it with: `helm` and `kubectl` from `target/tools/bin`
//! (installed by `scripts/install-tools.sh` when missing), run as a user would run them; a kube client for the
//! watches.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use kube::Client;
use kube::config::{KubeConfigOptions, Kubeconfig};
use tokio::io::AsyncWriteExt;

/// The Helm release, as the docs name it.
pub const RELEASE: &str = "redlock";
/// `<release>-<chart>`: the prefix of the chart's objects.
pub const FULLNAME: &str = "redlock-redlock-operator";
/// The suite's namespaces start with this; a run removes what an earlier, crashed run left.
pub const NAMESPACE_PREFIX: &str = "redlock-incluster-";

/// An image reference split as the chart's values want it.
pub struct Image {
    pub reference: String,
    repository: String,
    tag: Option<String>,
    digest: Option<String>,
    /// The chart's own default: installed without `--set` for it, as a user installs a release.
    chart_default: bool,
}

impl Image {
    pub fn parse(reference: &str) -> Self {
        let (repository, tag, digest) = match reference.split_once('@') {
            Some((repository, digest)) => (repository.to_owned(), None, Some(digest.to_owned())),
            None => match reference.rsplit_once(':') {
                // A colon after the last slash is a tag; before it, a registry's port.
                Some((repository, tag)) if !tag.contains('/') => {
                    (repository.to_owned(), Some(tag.to_owned()), None)
                }
                _ => (reference.to_owned(), None, None),
            },
        };
        Self {
            reference: reference.to_owned(),
            repository,
            tag,
            digest,
            chart_default: false,
        }
    }

    /// The operator image `chart` (a folder or a packaged .tgz) runs when no value names one: its
    /// `image.repository` tagged with its appVersion (or `image.tag`), read with `helm show`.
    fn chart_default(helm: &Path, chart: &str) -> Self {
        let show = |what: &str| -> serde_json::Value {
            let output = std::process::Command::new(helm)
                .args(["show", what, chart])
                .output()
                .expect("helm runs");
            assert!(
                output.status.success(),
                "helm show {what} {chart}: {}",
                String::from_utf8_lossy(&output.stderr)
            );
            serde_yaml_ng::from_slice(&output.stdout)
                .unwrap_or_else(|err| panic!("helm show {what} {chart}: {err}"))
        };
        let (values, metadata) = (show("values"), show("chart"));
        let repository = values["image"]["repository"].as_str().unwrap_or_default();
        let tag = match values["image"]["tag"].as_str() {
            Some(tag) if !tag.is_empty() => tag.to_owned(),
            _ => metadata["appVersion"].as_str().unwrap_or_default().to_owned(),
        };
        Self {
            chart_default: true,
            ..Self::parse(&format!("{repository}:{tag}"))
        }
    }

    /// `--set` flags for the chart's image value `key` (`image`, `redis.image`).
    fn set_flags(&self, key: &str) -> Vec<String> {
        if self.chart_default {
            return Vec::new();
        }
        let mut flags = vec![format!("{key}.repository={}", self.repository)];
        if let Some(tag) = &self.tag {
            flags.push(format!("{key}.tag={tag}"));
        }
        if let Some(digest) = &self.digest {
            flags.push(format!("{key}.digest={digest}"));
        }
        flags
    }
}

/// What a command printed, and whether it succeeded.
pub struct Output {
    pub ok: bool,
    pub stdout: String,
    pub stderr: String,
}

impl Output {
    /// stdout and stderr together, for a report.
    pub fn text(&self) -> String {
        format!("{}{}", self.stdout, self.stderr).trim_end().to_owned()
    }

    /// [`Output::text`] when the command failed; its first lines when it succeeded (Helm's notes are long).
    pub fn brief(&self) -> String {
        let text = self.text();
        if self.ok {
            text.lines().take(6).collect::<Vec<_>>().join("\n")
        } else {
            text
        }
    }
}

pub struct Cluster {
    pub kubeconfig: PathBuf,
    pub client: Client,
    pub root: PathBuf,
    pub operator_image: Image,
    /// The masters' image when `REDLOCK_E2E_REDIS_IMAGE` names one; the chart's default otherwise.
    pub redis_image: Option<Image>,
    helm: PathBuf,
    kubectl: PathBuf,
    /// The release's namespace (the docs' `redlock-system`).
    pub release_ns: String,
    /// The namespace of the tutorials' objects (the docs' `shop`, `data`, `reports`): the one the installation's
    /// `operator.lockNamespaces` names.
    pub app_ns: String,
    /// The namespace of the injected holders' phase (`injected`), also in `operator.lockNamespaces`: its pods'
    /// leader labels are watched apart from the tutorials'.
    pub holders_ns: String,
}

fn chart_from_env() -> Option<String> {
    std::env::var("REDLOCK_E2E_CHART")
        .ok()
        .filter(|chart| !chart.is_empty())
}

impl Cluster {
    pub async fn from_env() -> Self {
        let kubeconfig = PathBuf::from(std::env::var_os("REDLOCK_E2E_KUBECONFIG").expect(
            "REDLOCK_E2E_KUBECONFIG is not set: this suite installs the chart on a real cluster; name its \
             kubeconfig there (see docs/contributing/testing.md, \"The in-cluster suite\")",
        ));
        let config = Kubeconfig::read_from(&kubeconfig)
            .unwrap_or_else(|err| panic!("REDLOCK_E2E_KUBECONFIG={}: {err}", kubeconfig.display()));
        let config = kube::Config::from_custom_kubeconfig(config, &KubeConfigOptions::default())
            .await
            .expect("a client configuration from REDLOCK_E2E_KUBECONFIG");
        let client = Client::try_from(config).expect("a Kubernetes client");
        let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
        let (helm, kubectl) = tools(&root);
        let suffix = {
            let mut bytes = [0u8; 3];
            getrandom::fill(&mut bytes).expect("random bytes");
            hex::encode(bytes)
        };
        Self {
            kubeconfig,
            client,
            // A chart named by REDLOCK_E2E_CHART (the test command's: the .tgz of scripts/release.sh) runs the
            // image its defaults name (loaded from the release's image archive), unless one is named here.
            operator_image: match std::env::var("REDLOCK_E2E_OPERATOR_IMAGE") {
                Ok(image) if !image.is_empty() => Image::parse(&image),
                _ if chart_from_env().is_some() => {
                    Image::chart_default(&helm, &chart_from_env().unwrap_or_default())
                }
                _ => Image::parse("localhost/redlock-operator:e2e"),
            },
            // The chart's default (`redis:7.4`, which scripts/build-images.sh also names the kit's image) unless one
            // is named here.
            redis_image: std::env::var("REDLOCK_E2E_REDIS_IMAGE")
                .ok()
                .filter(|image| !image.is_empty())
                .map(|image| Image::parse(&image)),
            root,
            helm,
            kubectl,
            release_ns: format!("{NAMESPACE_PREFIX}{suffix}"),
            app_ns: format!("{NAMESPACE_PREFIX}{suffix}-apps"),
            holders_ns: format!("{NAMESPACE_PREFIX}{suffix}-holders"),
        }
    }

    /// The chart installed: `REDLOCK_E2E_CHART` (a packaged .tgz, or a folder), else the repository's folder.
    pub fn chart(&self) -> String {
        chart_from_env().unwrap_or_else(|| self.root.join("charts/redlock-operator").display().to_string())
    }

    /// The values this suite sets: the images (the only override the docs need here), a 30 s `maxTtl` (the
    /// examples' Job locks use a TTL of 30 s; the restart quarantine is as long) and the installation scoped to
    /// the suite's namespace, since other tests share the cluster.
    pub fn values(&self) -> Vec<String> {
        let mut sets = self.operator_image.set_flags("image");
        if let Some(redis) = &self.redis_image {
            sets.extend(redis.set_flags("redis.image"));
        }
        // Shortens every master restart's quarantine in the drills (64 s by default); not a value holders need.
        sets.push("quorum.maxTtl=30s".into());
        sets.into_iter()
            .flat_map(|set| ["--set".to_owned(), set])
            .collect()
    }

    pub fn kubectl_path(&self) -> &Path {
        &self.kubectl
    }

    pub async fn kubectl(&self, args: &[&str]) -> Output {
        self.run(&self.kubectl, args, None, Duration::from_secs(120))
            .await
    }

    /// [`Cluster::kubectl`] for a command that may take longer than two minutes (a rollout's status).
    pub async fn kubectl_within(&self, args: &[&str], patience: Duration) -> Output {
        self.run(&self.kubectl, args, None, patience).await
    }

    pub async fn kubectl_stdin(&self, args: &[&str], stdin: &str) -> Output {
        self.run(&self.kubectl, args, Some(stdin), Duration::from_secs(120))
            .await
    }

    /// `helm VERB redlock <chart> -n <release namespace> <the suite's values> EXTRA…` (install, upgrade).
    pub async fn helm_release(&self, verb: &str, extra: &[&str]) -> Output {
        let chart = self.chart();
        let values = self.values();
        let mut args = vec![verb, RELEASE, chart.as_str(), "-n", self.release_ns.as_str()];
        args.extend(values.iter().map(String::as_str));
        args.extend(extra);
        self.helm(&args, Duration::from_secs(180)).await
    }

    /// [`Cluster::helm_release`] with another chart (a .tgz of another version, say).
    pub async fn helm_release_of(&self, verb: &str, chart: &str, extra: &[&str]) -> Output {
        let values = self.values();
        let mut args = vec![verb, RELEASE, chart, "-n", self.release_ns.as_str()];
        args.extend(values.iter().map(String::as_str));
        args.extend(extra);
        self.helm(&args, Duration::from_secs(180)).await
    }

    /// Runs each kubectl command in turn: together, whether all succeeded and what they printed.
    pub async fn kubectl_each(&self, commands: &[Vec<&str>]) -> Output {
        let mut all = Output {
            ok: true,
            stdout: String::new(),
            stderr: String::new(),
        };
        for command in commands {
            let output = self.kubectl(command).await;
            all.ok &= output.ok;
            all.stdout.push_str(&output.text());
            all.stdout.push('\n');
        }
        all
    }

    pub async fn helm(&self, args: &[&str], patience: Duration) -> Output {
        self.run(&self.helm, args, None, patience).await
    }

    /// `bash -euo pipefail -c script` in `dir`, with this cluster's kubeconfig and the suite's `kubectl` first on
    /// PATH: commands as a page or a file's header gives them, run as written.
    pub async fn shell_in(&self, dir: &Path, script: &str) -> Output {
        let mut command = tokio::process::Command::new("bash");
        command.args(["-euo", "pipefail", "-c", script]).current_dir(dir);
        if let Some(bin) = self.kubectl.parent() {
            let path = std::env::var_os("PATH").unwrap_or_default();
            let mut paths = vec![bin.to_path_buf()];
            paths.extend(std::env::split_paths(&path));
            if let Ok(joined) = std::env::join_paths(paths) {
                command.env("PATH", joined);
            }
        }
        let first = script.lines().next().unwrap_or_default();
        self.finish(
            command,
            &format!("bash -c '{first} …'"),
            None,
            Duration::from_secs(120),
        )
        .await
    }

    async fn run(&self, program: &Path, args: &[&str], stdin: Option<&str>, patience: Duration) -> Output {
        let name = program
            .file_name()
            .map(|name| name.to_string_lossy().into_owned());
        let shown = format!("{} {}", name.unwrap_or_default(), args.join(" "));
        let mut command = tokio::process::Command::new(program);
        command.args(args);
        self.finish(command, &shown, stdin, patience).await
    }

    /// Runs `command` (shown as `shown`) with this cluster's kubeconfig, `stdin` written to it, for at most
    /// `patience`.
    async fn finish(
        &self,
        mut command: tokio::process::Command,
        shown: &str,
        stdin: Option<&str>,
        patience: Duration,
    ) -> Output {
        let started = Instant::now();
        command
            .env("KUBECONFIG", &self.kubeconfig)
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(err) => return failed(format!("`{shown}` did not start: {err}")),
        };
        if let (Some(text), Some(mut pipe)) = (stdin, child.stdin.take()) {
            let _ = pipe.write_all(text.as_bytes()).await;
        }
        let output = match tokio::time::timeout(patience, child.wait_with_output()).await {
            Ok(Ok(output)) => output,
            Ok(Err(err)) => return failed(format!("`{shown}`: {err}")),
            Err(_) => {
                return failed(format!(
                    "`{shown}` did not finish within {} s",
                    patience.as_secs()
                ));
            }
        };
        let result = Output {
            ok: output.status.success(),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        if !result.ok || started.elapsed() > Duration::from_secs(5) {
            eprintln!(
                "    $ {shown}  ({:.1} s, {})",
                started.elapsed().as_secs_f64(),
                if result.ok { "ok" } else { "failed" }
            );
        }
        result
    }

    /// Removes what an earlier run of this suite left (a crashed or killed run): its release and namespaces,
    /// with the finalizers its locks still carry (no operator is left to remove them).
    pub async fn remove_leftovers(&self) {
        let namespaces = self
            .kubectl(&["get", "namespaces", "-o", "jsonpath={.items[*].metadata.name}"])
            .await;
        for namespace in namespaces.stdout.split_whitespace() {
            if namespace.starts_with(NAMESPACE_PREFIX) {
                eprintln!("    removing {namespace}, left by an earlier run");
                self.remove_namespace_now(namespace).await;
            }
        }
    }

    /// Uninstalls a release in `namespace` if there is one, clears its locks' finalizers and deletes it, without
    /// waiting: what the suite does after itself.
    pub async fn remove_namespace_now(&self, namespace: &str) {
        // The suite's release, or the second release beside it (phase 3d), whichever the namespace has.
        for release in [RELEASE, super::second_release::RELEASE] {
            let _ = self
                .helm(
                    &[
                        "uninstall",
                        release,
                        "-n",
                        namespace,
                        "--wait=false",
                        "--ignore-not-found",
                    ],
                    Duration::from_secs(60),
                )
                .await;
        }
        self.clear_lock_finalizers(namespace);
        let _ = self
            .kubectl(&[
                "delete",
                "namespace",
                namespace,
                "--wait=false",
                "--ignore-not-found",
            ])
            .await;
    }

    /// Removes the finalizers of every DistributedLock in `namespace`, as docs/how-to/install.md tells a user to
    /// once the operator is gone. Returns the locks it cleared.
    pub fn clear_lock_finalizers(&self, namespace: &str) -> Vec<String> {
        tokio::task::block_in_place(|| clear_lock_finalizers(&self.kubectl, &self.kubeconfig, namespace))
    }
}

/// [`Cluster::clear_lock_finalizers`], blocking (also for the cleanup when the test ends).
fn clear_lock_finalizers(kubectl: &Path, kubeconfig: &Path, namespace: &str) -> Vec<String> {
    let run = |args: &[&str]| {
        std::process::Command::new(kubectl)
            .args(args)
            .env("KUBECONFIG", kubeconfig)
            .stderr(Stdio::null())
            .output()
            .ok()
            .filter(|output| output.status.success())
            .map(|output| String::from_utf8_lossy(&output.stdout).into_owned())
    };
    let kind = "distributedlocks.redlock.io";
    let names = run(&[
        "get",
        kind,
        "-n",
        namespace,
        "-o",
        "jsonpath={.items[*].metadata.name}",
    ])
    .unwrap_or_default();
    names
        .split_whitespace()
        .filter(|name| {
            let unfinalize = r#"{"metadata":{"finalizers":null}}"#;
            run(&[
                "patch",
                kind,
                name,
                "-n",
                namespace,
                "--type=merge",
                "-p",
                unfinalize,
            ])
            .is_some()
        })
        .map(str::to_owned)
        .collect()
}

fn failed(message: String) -> Output {
    Output {
        ok: false,
        stdout: String::new(),
        stderr: message,
    }
}

/// helm and kubectl under target/tools/bin, installed there by scripts/install-tools.sh when missing.
fn tools(root: &Path) -> (PathBuf, PathBuf) {
    let bin = root.join("target/tools/bin");
    let (helm, kubectl) = (bin.join("helm"), bin.join("kubectl"));
    if !helm.exists() || !kubectl.exists() {
        let status = std::process::Command::new(root.join("scripts/install-tools.sh"))
            .args(["helm", "kubectl"])
            .status()
            .expect("scripts/install-tools.sh runs");
        assert!(status.success(), "scripts/install-tools.sh helm kubectl failed");
    }
    (helm, kubectl)
}

/// Removes the suite's namespaces (and release) when the test ends, a failed one included, unless
/// `REDLOCK_E2E_KEEP=1` asks to keep them for a look.
pub struct Cleanup {
    pub namespaces: Vec<String>,
    pub kubeconfig: PathBuf,
    pub kubectl: PathBuf,
    pub helm: PathBuf,
    pub done: bool,
}

impl Cluster {
    pub fn cleanup_guard(&self) -> Cleanup {
        Cleanup {
            namespaces: vec![
                self.release_ns.clone(),
                self.app_ns.clone(),
                self.holders_ns.clone(),
            ],
            kubeconfig: self.kubeconfig.clone(),
            kubectl: self.kubectl.clone(),
            helm: self.helm.clone(),
            done: false,
        }
    }
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        if self.done {
            return;
        }
        if std::env::var_os("REDLOCK_E2E_KEEP").is_some_and(|keep| keep == "1") {
            eprintln!("REDLOCK_E2E_KEEP=1: keeping the namespaces {:?}", self.namespaces);
            return;
        }
        let run = |program: &Path, args: &[&str]| {
            let _ = std::process::Command::new(program)
                .args(args)
                .env("KUBECONFIG", &self.kubeconfig)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status();
        };
        for namespace in &self.namespaces {
            run(
                &self.helm,
                &["uninstall", RELEASE, "-n", namespace, "--wait=false"],
            );
            clear_lock_finalizers(&self.kubectl, &self.kubeconfig, namespace);
            run(
                &self.kubectl,
                &[
                    "delete",
                    "namespace",
                    namespace,
                    "--wait=false",
                    "--ignore-not-found",
                ],
            );
        }
    }
}

/// `kubectl rollout status WHAT -n NAMESPACE --timeout=…`: waits until a Deployment's rollout is complete.
pub async fn rolled_out(cluster: &Cluster, what: &str, namespace: &str, timeout_seconds: u64) -> Output {
    let timeout = format!("--timeout={timeout_seconds}s");
    // kubectl's own timeout first, with room for it to say so.
    let patience = Duration::from_secs(timeout_seconds.saturating_add(30));
    cluster
        .kubectl_within(&["rollout", "status", what, "-n", namespace, &timeout], patience)
        .await
}
