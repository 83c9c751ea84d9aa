//! Test controls: injected faults and request counts, per verb and resource.

use std::collections::HashMap;

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
}

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

    pub fn count_of(&self, verb: &str, resource: &str) -> u64 {
        self.counts
            .iter()
            .filter(|((v, counted), _)| (verb == "*" || verb == *v) && resource_matches(resource, counted))
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
