//! The repository's examples as a user applies them: read from `examples/`, with the placeholder application
//! (its image and the program it runs under `elect`, the guard or `lock`) replaced by the suite's app image and a
//! shell command, everything else as written. More Jobs of a queue are copies of the example's Job under other
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

    /// Every workload's containers run `image`, and `work` (a shell command) as the program after `--`.
    pub fn with_app(mut self, image: &str, work: &str) -> Self {
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
                container["image"] = Value::from(image);
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

/// A leader's work: says which token it runs under, then runs until stopped.
pub const LEADER_WORK: &str =
    r#"echo "leader work started under fencing token $REDLOCK_FENCING_TOKEN"; exec sleep 3600"#;

/// A Job's work of `seconds`: says which grant it runs under, works, says it is done.
pub fn job_work(seconds: u32) -> String {
    format!(
        r#"echo "work started: job $REDLOCK_JOB permit ${{REDLOCK_PERMIT:-0}} token $REDLOCK_FENCING_TOKEN"; sleep {seconds}; echo "work done""#
    )
}
