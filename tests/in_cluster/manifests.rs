//! The repository's examples as a user applies them: read from `examples/` and applied as written (busybox and
//! their own commands), or, for Jobs whose work must be short for the suite's time, with the work replaced by a
//! shell command of the suite's (`with_work`). More Jobs of a queue are copies of the example's Job under other
//! names, as the tutorials say ("create more the same way").

use std::path::Path;

use redlock_operator::api::holder_contract::INSTALLATION_ANNOTATION;
use serde_yaml_ng::Value;

pub struct Manifest {
    pub docs: Vec<Value>,
}

impl Manifest {
    pub fn example(root: &Path, name: &str) -> Self {
        let path = root.join("examples").join(name);
        let text =
            std::fs::read_to_string(&path).unwrap_or_else(|err| panic!("reading {}: {err}", path.display()));
        let docs = serde_yaml_ng::Deserializer::from_str(&text)
            .map(|doc| {
                serde::Deserialize::deserialize(doc)
                    .unwrap_or_else(|err| panic!("{}: not YAML: {err}", path.display()))
            })
            .filter(|doc: &Value| !doc.is_null())
            .collect();
        Self { docs }
    }

    pub fn yaml(&self) -> String {
        self.docs
            .iter()
            .map(|doc| serde_yaml_ng::to_string(doc).expect("YAML"))
            .collect::<Vec<_>>()
            .join("---\n")
    }

    /// The first document of `kind`.
    pub fn find(&self, kind: &str) -> &Value {
        self.docs
            .iter()
            .find(|doc| doc["kind"].as_str() == Some(kind))
            .unwrap_or_else(|| panic!("the example has no {kind}"))
    }

    /// Every workload's containers run `work` (a shell command) as the program after `--`, in the image the
    /// example names: as written but for how long the work takes.
    pub fn with_work(mut self, work: &str) -> Self {
        for doc in &mut self.docs {
            if !matches!(doc["kind"].as_str(), Some("Deployment" | "StatefulSet" | "Job")) {
                continue;
            }
            let Some(containers) =
                path_mut(doc, &["spec", "template", "spec", "containers"]).and_then(Value::as_sequence_mut)
            else {
                continue;
            };
            for container in containers {
                if let Some(command) = container.get_mut("command").and_then(Value::as_sequence_mut) {
                    let end = command
                        .iter()
                        .position(|arg| arg.as_str() == Some("--"))
                        .map_or(0, |at| at + 1);
                    command.truncate(end);
                    command.extend(["sh", "-c", work].map(Value::from));
                }
            }
        }
        self
    }

    /// The operator's image in the long forms' init containers (`localhost/redlock-operator:<version>`, the
    /// release archive's name, as the examples say) replaced by `reference` where the cluster has it under another
    /// name (`REDLOCK_E2E_OPERATOR_IMAGE`); on the project's node the two are the same and nothing changes.
    pub fn with_operator_image(mut self, reference: &str) -> Self {
        let shipped = format!("localhost/redlock-operator:{}", env!("CARGO_PKG_VERSION"));
        for doc in &mut self.docs {
            let Some(init) = path_mut(doc, &["spec", "template", "spec", "initContainers"])
                .and_then(Value::as_sequence_mut)
            else {
                continue;
            };
            for container in init {
                if container["image"].as_str() == Some(shipped.as_str()) {
                    container["image"] = Value::from(reference);
                }
            }
        }
        self
    }

    /// `from` replaced by `to` in every container's environment values: the part of an example the user is told to
    /// change for another release name or namespace (examples/job-semaphore.yaml's masters).
    pub fn with_env_replaced(mut self, from: &str, to: &str) -> Self {
        for doc in &mut self.docs {
            let Some(containers) =
                path_mut(doc, &["spec", "template", "spec", "containers"]).and_then(Value::as_sequence_mut)
            else {
                continue;
            };
            for container in containers {
                let Some(env) = container.get_mut("env").and_then(Value::as_sequence_mut) else {
                    continue;
                };
                for variable in env {
                    if let Some(value) = variable.get("value").and_then(Value::as_str) {
                        let replaced = value.replace(from, to);
                        variable["value"] = Value::from(replaced);
                    }
                }
            }
        }
        self
    }

    /// Every DistributedLock annotated as kept by `installation` (`redlock.io/installation`), as the operator
    /// itself annotates a lock it claims: on a cluster where other operators watch every namespace (other tests'),
    /// the first installation to look at a new lock keeps it, and this one would lose the race now and then.
    pub fn kept_by(mut self, installation: &str) -> Self {
        for doc in &mut self.docs {
            if doc["kind"].as_str() == Some("DistributedLock") {
                doc["metadata"]["annotations"][INSTALLATION_ANNOTATION] = Value::from(installation);
            }
        }
        self
    }

    /// Every DistributedLock on the RedisQuorum `quorum`: a second release's, whose quorum has another name.
    pub fn on_quorum(mut self, quorum: &str) -> Self {
        for doc in &mut self.docs {
            if doc["kind"].as_str() == Some("DistributedLock") {
                doc["spec"]["quorum"] = Value::from(quorum);
            }
        }
        self
    }

    /// Adds copies of the example's Job named `names`.
    pub fn with_job_copies(mut self, names: &[&str]) -> Self {
        let job = self.find("Job").clone();
        for name in names {
            let mut copy = job.clone();
            copy["metadata"]["name"] = Value::from(*name);
            self.docs.push(copy);
        }
        self
    }

    /// Only the Jobs, renamed: another Job for a lock already declared.
    pub fn only_job_named(mut self, name: &str) -> Self {
        let mut job = self.find("Job").clone();
        job["metadata"]["name"] = Value::from(name);
        self.docs = vec![job];
        self
    }

    pub fn names_of(&self, kind: &str) -> Vec<String> {
        self.docs
            .iter()
            .filter(|doc| doc["kind"].as_str() == Some(kind))
            .filter_map(|doc| doc["metadata"]["name"].as_str().map(str::to_owned))
            .collect()
    }
}

fn path_mut<'a>(value: &'a mut Value, path: &[&str]) -> Option<&'a mut Value> {
    path.iter().try_fold(value, |value, key| value.get_mut(*key))
}

/// A Job's work of `seconds`: says which grant it runs under, works, says it is done.
/// [`job_work`] whose lines end with `at <seconds since boot>` (from /proc/uptime, to the hundredth), read by the
/// work itself just after its lock was granted and just before it exits (so before the lock goes): one clock for
/// every pod of the node, at the moment of writing, which the kubelet's log timestamps are not (they are taken
/// when the runtime reads each container's output, late by as much as it lags).
pub fn job_work_stamped(seconds: u32) -> String {
    format!(
        r#"echo "work started: job $REDLOCK_JOB permit ${{REDLOCK_PERMIT:-0}} token $REDLOCK_FENCING_TOKEN at $(cut -d' ' -f1 /proc/uptime)"; sleep {seconds}; echo "work done at $(cut -d' ' -f1 /proc/uptime)""#
    )
}

pub fn job_work(seconds: u32) -> String {
    format!(
        r#"echo "work started: job $REDLOCK_JOB permit ${{REDLOCK_PERMIT:-0}} token $REDLOCK_FENCING_TOKEN"; sleep {seconds}; echo "work done""#
    )
}
