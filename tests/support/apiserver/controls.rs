//! Test controls: injected faults and request counts, per verb and resource; and the record of what the
//! operator asked for, for the RBAC check.

use std::collections::{HashMap, HashSet};
use std::io::Write;
use std::time::Duration;

use super::Shared;
use super::errors::ApiError;
use super::routes::Route;

struct Fault {
    verb: String,
    resource: String,
    code: u16,
    remaining: usize,
}

#[derive(Default)]
pub(super) struct Control {
    faults: Vec<Fault>,
    counts: HashMap<(&'static str, String), u64>,
    /// The operator's own lists, by (plural, label selector): its direct reads, apart from its caches' relists.
    operator_lists: HashMap<(String, String), u64>,
    /// (API group, resource[/status], verb) the operator's client asked for.
    operator_requests: HashSet<(&'static str, String, &'static str)>,
    /// Lists of these resources (plural) answered this much later, from now on (besides the realistic mode's).
    slow_lists: HashMap<String, Duration>,
}

/// Marks the operator's own client in the end-to-end tests: its requests are recorded.
pub const OPERATOR_HEADER: &str = "x-redlock-test-operator";

/// With this variable naming a directory, each test process appends there (`requests-PID.txt`, one line per new
/// `group resource verb`) what the operator asked for; `scripts/rbac_check.py` compares it with the chart's
/// roles.
const RECORD_DIR: &str = "REDLOCK_RBAC_RECORD_DIR";

/// `pattern` is "*", a plural (which includes its status subresource) or `plural/status`.
fn resource_matches(pattern: &str, resource: &str) -> bool {
    pattern == "*" || pattern == resource || resource.strip_suffix("/status") == Some(pattern)
}

impl Control {
    pub fn add_fault(&mut self, verb: &str, resource: &str, code: u16, count: usize) {
        self.faults.push(Fault {
            verb: verb.to_owned(),
            resource: resource.to_owned(),
            code,
            remaining: count,
        });
    }

    pub fn slow_lists(&mut self, plural: &str, delay: Duration) {
        self.slow_lists.insert(plural.to_owned(), delay);
    }

    pub fn list_delay(&self, plural: &str) -> Duration {
        self.slow_lists.get(plural).copied().unwrap_or_default()
    }

    pub fn count_of(&self, verb: &str, resource: &str) -> u64 {
        self.counts
            .iter()
            .filter(|((v, counted), _)| (verb == "*" || verb == *v) && resource_matches(resource, counted))
            .map(|(_, count)| count)
            .sum()
    }

    /// The operator's own lists of `plural` whose label selector starts with `selector`.
    pub fn operator_lists_selecting(&self, plural: &str, selector: &str) -> u64 {
        self.operator_lists
            .iter()
            .filter(|((counted, asked), _)| counted == plural && asked.starts_with(selector))
            .map(|(_, count)| count)
            .sum()
    }
}

impl Shared {
    pub(super) fn count(&self, verb: &'static str, route: &Route) {
        let mut control = self.control();
        let count = control.counts.entry((verb, route.resource())).or_default();
        *count = count.saturating_add(1);
    }

    /// Records a request of the operator's client, once per (group, resource, verb); a list is counted with its
    /// label selector (`None`: none).
    pub(super) fn record_operator_request(&self, verb: &'static str, route: &Route, selector: Option<&str>) {
        if verb == "list" {
            let mut control = self.control();
            let key = (
                route.kind.plural.to_owned(),
                selector.unwrap_or_default().to_owned(),
            );
            let count = control.operator_lists.entry(key).or_default();
            *count = count.saturating_add(1);
        }
        self.record_operator_entry(route.kind.group, route.resource(), verb);
    }

    /// [`Self::record_operator_request`] for what is not a stored resource (token reviews).
    pub(super) fn record_operator_entry(&self, group: &'static str, resource: String, verb: &'static str) {
        let entry = (group, resource, verb);
        if !self.control().operator_requests.insert(entry.clone()) {
            return;
        }
        let Some(dir) = std::env::var_os(RECORD_DIR) else {
            return;
        };
        let path = std::path::Path::new(&dir).join(format!("requests-{}.txt", std::process::id()));
        let group = if entry.0.is_empty() { "core" } else { entry.0 };
        let written = std::fs::create_dir_all(&dir).and_then(|()| {
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&path)
                // One write per line: appends from the several servers of a test process stay whole.
                .and_then(|mut file| file.write_all(format!("{group} {} {verb}\n", entry.1).as_bytes()))
        });
        if let Err(error) = written {
            eprintln!(
                "cannot record the operator's request in {}: {error}",
                path.display()
            );
        }
    }

    /// Takes the first injected fault matching the request.
    pub(super) fn take_fault(&self, verb: &'static str, route: &Route) -> Option<ApiError> {
        let resource = route.resource();
        let mut control = self.control();
        let fault = control.faults.iter_mut().find(|fault| {
            fault.remaining > 0
                && (fault.verb == "*" || fault.verb == verb)
                && resource_matches(&fault.resource, &resource)
        })?;
        fault.remaining -= 1;
        let code = fault.code;
        control.faults.retain(|fault| fault.remaining > 0);
        Some(ApiError::injected(code, verb, &resource))
    }
}
