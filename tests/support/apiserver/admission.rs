//! ValidatingAdmissionPolicies, evaluated with the `cel` crate the way the API server's validating policy plugin
//! evaluates them with cel-go (k8s.io/apiserver's admission/plugin/policy/validating), on every CREATE and UPDATE
//! once strategy validation (a CRD's rules included) has passed:
//!
//! - Each ValidatingAdmissionPolicyBinding stored, with its policy (a binding whose policy is missing is
//!   skipped). A request is matched by the policy's `matchConstraints` and the binding's `matchResources`:
//!   `resourceRules` (groups, versions, operations, `resources` with `*` for every main resource and `*/*`,
//!   `plural/*`, `*/status` for subresources, `scope`), `excludeResourceRules`, `objectSelector` (on UPDATE the
//!   old or the new object's labels) and `namespaceSelector` (the stored Namespace's labels; none for
//!   cluster-scoped objects).
//! - Params: with `paramKind`, the binding's `paramRef` names one object or selects several (`selector`), in its
//!   `namespace` or, unset, the request's namespace (a cluster-scoped request then is a configuration error);
//!   none found is allowed, or with `parameterNotFoundAction: Deny` refused with the real server's message. The
//!   policy is evaluated once per param.
//! - Per param: `variables` in order (one that fails is left out, so an expression reading it fails), then
//!   `matchConditions` (one false: the policy does not apply), then `validations`: the first that does not hold
//!   refuses the request when the binding's `validationActions` include `Deny` (`Warn` and `Audit` are not
//!   modelled), with its `messageExpression` (a one-line non-empty string), else its `message`, else `failed
//!   expression: <expression>`, and its `reason` (default `Invalid`) and that reason's code (Forbidden 403,
//!   Unauthorized 401, RequestEntityTooLarge 413, otherwise 422). An expression that fails to compile or
//!   evaluate refuses the request under `failurePolicy: Fail` (the default) and is ignored under `Ignore`.
//! - The refusal: `<resource> "<name>" is forbidden: ValidatingAdmissionPolicy '<policy>' with binding
//!   '<binding>' denied request: <message>`, as admission.NewForbidden words it.
//! - CEL sees `object`, `oldObject` (null on CREATE), `params` (null without `paramKind`), `namespaceObject`,
//!   `request` (operation, name, namespace, kind, resource, `userInfo.username`: the test server authenticates
//!   nobody, so every request is the user `test-apiserver`, the name its kubeconfig gives) and `variables`,
//!   untyped (JSON integers as int).
//!
//! Not modelled: DELETE and CONNECT, `matchPolicy: Equivalent` (other versions of a resource), `authorizer`,
//! Kubernetes' CEL libraries beyond the standard one, the cost budget, the policy's type checking and status,
//! MutatingAdmissionPolicies and webhooks; a changed policy is in force at once (a real server's informers take a
//! moment).

use std::collections::HashMap;
use std::sync::Arc;

use cel::objects::{Key, Map as CelMap};
use cel::{Context, Value as Cel};
use serde_json::{Value, json};

use super::errors::{ApiError, ApiResult};
use super::kinds::{KINDS, Kind, Special, kind_of};
use super::meta::{meta, name_of, namespace_of};
use super::selectors::Filter;
use super::store::State;
use super::validation_rules::{ENV, compiled, message_from, to_cel};

/// Who every request is, to the policies.
const USER: &str = "test-apiserver";

/// The operations modelled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Operation {
    Create,
    Update,
}

impl Operation {
    fn name(self) -> &'static str {
        match self {
            Operation::Create => "CREATE",
            Operation::Update => "UPDATE",
        }
    }
}

/// A request as the policies see it.
pub(super) struct Request<'a> {
    pub kind: &'static Kind,
    pub operation: Operation,
    /// The status subresource.
    pub status: bool,
    pub object: &'a Value,
    pub old: Option<&'a Value>,
}

impl Request<'_> {
    fn resource(&self) -> String {
        if self.status {
            format!("{}/status", self.kind.plural)
        } else {
            self.kind.plural.to_owned()
        }
    }

    fn namespace(&self) -> &str {
        namespace_of(self.old.unwrap_or(self.object))
    }

    fn name(&self) -> &str {
        name_of(self.old.unwrap_or(self.object))
    }
}

/// Refused by a policy's binding: the decision's message and reason.
struct Denied {
    policy: String,
    binding: String,
    message: String,
    reason: &'static str,
}

/// Every binding's verdict on `request`: the first refusal, if any.
pub(super) fn admit(state: &State, request: &Request<'_>) -> ApiResult<()> {
    let policies = kind_of_plural("validatingadmissionpolicies");
    let bindings = kind_of_plural("validatingadmissionpolicybindings");
    for binding in state.select(bindings, None, &Filter::default()) {
        let Some(policy_name) = binding.pointer("/spec/policyName").and_then(Value::as_str) else {
            continue;
        };
        let Some(policy) = state.get(policies, "", policy_name) else {
            continue;
        };
        if let Some(denied) = decide(state, &policy, &binding, request) {
            return Err(refusal(request, &denied));
        }
    }
    Ok(())
}

fn kind_of_plural(plural: &str) -> &'static Kind {
    KINDS
        .iter()
        .find(|kind| kind.plural == plural)
        .expect("kind in the table")
}

fn refusal(request: &Request<'_>, denied: &Denied) -> ApiError {
    let message = format!(
        "ValidatingAdmissionPolicy '{}' with binding '{}' denied request: {}",
        denied.policy, denied.binding, denied.message
    );
    let kind = request.kind;
    let name = request.name();
    let code = match denied.reason {
        "Forbidden" => 403,
        "Unauthorized" => 401,
        "RequestEntityTooLarge" => 413,
        _ => 422,
    };
    let mut details = ApiError::details(kind, name, kind.plural);
    details.insert("causes".into(), json!([{ "message": message }]));
    let full = format!("{} \"{name}\" is forbidden: {message}", kind.qualified());
    ApiError::new(code, denied.reason, full).with_details(Value::Object(details))
}

/// The binding's refusal of `request`, if it refuses it.
fn decide(state: &State, policy: &Value, binding: &Value, request: &Request<'_>) -> Option<Denied> {
    let spec = policy.get("spec")?;
    if !matches(state, spec.get("matchConstraints"), request) {
        return None;
    }
    if let Some(resources) = binding.pointer("/spec/matchResources")
        && !matches(state, Some(resources), request)
    {
        return None;
    }
    let deny = binding
        .pointer("/spec/validationActions")
        .and_then(Value::as_array)
        .is_some_and(|actions| actions.iter().any(|a| a == "Deny"));
    if !deny {
        return None;
    }
    let fail = spec.get("failurePolicy").and_then(Value::as_str) != Some("Ignore");
    let denied = |message: String, reason: &'static str| Denied {
        policy: name_of(policy).to_owned(),
        binding: name_of(binding).to_owned(),
        message,
        reason,
    };
    let params = match params(state, spec, binding, request) {
        Ok(params) => params,
        Err(error) if fail => {
            return Some(denied(format!("failed to configure binding: {error}"), "Invalid"));
        }
        Err(_) => return None,
    };
    for param in params {
        match evaluate(state, spec, &param, request) {
            Verdict::Allowed => {}
            Verdict::Refused(message, reason) => return Some(denied(message, reason)),
            Verdict::Failed(message) if fail => return Some(denied(message, "Invalid")),
            Verdict::Failed(_) => {}
        }
    }
    None
}

/// The params to evaluate the policy with: `[Null]` without `paramKind`.
fn params(state: &State, spec: &Value, binding: &Value, request: &Request<'_>) -> Result<Vec<Value>, String> {
    let Some(param_kind) = spec.get("paramKind") else {
        return Ok(vec![Value::Null]);
    };
    let api_version = param_kind.get("apiVersion").and_then(Value::as_str).unwrap_or("");
    let kind_name = param_kind.get("kind").and_then(Value::as_str).unwrap_or("");
    let Some(kind) = KINDS
        .iter()
        .find(|k| k.api_version() == api_version && k.kind == kind_name)
    else {
        return Err(format!(
            "failed to find resource referenced by paramKind: '{api_version}, Kind={kind_name}'"
        ));
    };
    let Some(param_ref) = binding.pointer("/spec/paramRef") else {
        return Err("paramRef is required when paramKind is set".to_owned());
    };
    let namespace = match param_ref.get("namespace").and_then(Value::as_str) {
        Some(namespace) if !namespace.is_empty() => namespace.to_owned(),
        _ if !kind.namespaced => String::new(),
        _ if request.kind.namespaced => request.namespace().to_owned(),
        _ => {
            return Err(
                "cannot use namespaced paramRef in policy binding that matches cluster-scoped resources"
                    .to_owned(),
            );
        }
    };
    let found: Vec<Value> = match param_ref.get("name").and_then(Value::as_str) {
        Some(name) if !name.is_empty() => state
            .get(kind, &namespace, name)
            .map(|param| (*param).clone())
            .into_iter()
            .collect(),
        _ => state
            .select(kind, Some(&namespace), &Filter::default())
            .into_iter()
            .filter(|param| selector_matches(param_ref.get("selector"), labels(param)))
            .map(|param| (*param).clone())
            .collect(),
    };
    let deny = param_ref.get("parameterNotFoundAction").and_then(Value::as_str) == Some("Deny");
    if found.is_empty() && deny {
        return Err("no params found for policy binding with `Deny` parameterNotFoundAction".to_owned());
    }
    Ok(found)
}

enum Verdict {
    Allowed,
    Refused(String, &'static str),
    Failed(String),
}

/// The policy's variables, match conditions and validations, with one param.
fn evaluate(state: &State, spec: &Value, param: &Value, request: &Request<'_>) -> Verdict {
    let plain = |value: &Value| to_cel(value, &Value::Null, false);
    let mut context = Context::with_env(ENV.clone());
    context.add_variable_from_value("object", plain(request.object));
    context.add_variable_from_value("oldObject", request.old.map_or(Cel::Null, plain));
    context.add_variable_from_value("params", plain(param));
    let namespace = state
        .get(kind_of(Special::Namespace), "", request.namespace())
        .map_or(Cel::Null, |namespace| plain(&namespace));
    context.add_variable_from_value("namespaceObject", namespace);
    let kind = request.kind;
    let described = json!({
        "operation": request.operation.name(),
        "name": request.name(),
        "namespace": request.namespace(),
        "kind": {"group": kind.group, "version": kind.version, "kind": kind.kind},
        "resource": {"group": kind.group, "version": kind.version, "resource": kind.plural},
        "subResource": if request.status { "status" } else { "" },
        "userInfo": {"username": USER},
        "dryRun": false,
    });
    context.add_variable_from_value("request", plain(&described));
    let mut variables = HashMap::new();
    for variable in list(spec, "variables") {
        let name = variable.get("name").and_then(Value::as_str).unwrap_or("");
        let expression = variable.get("expression").and_then(Value::as_str).unwrap_or("");
        context.add_variable_from_value("variables", map_of(&variables));
        if let Ok(value) = run(expression, &context) {
            variables.insert(Key::from(name), value);
        }
    }
    context.add_variable_from_value("variables", map_of(&variables));
    for condition in list(spec, "matchConditions") {
        let expression = condition.get("expression").and_then(Value::as_str).unwrap_or("");
        match run(expression, &context) {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => return Verdict::Allowed,
            Ok(other) => {
                return Verdict::Failed(format!(
                    "matchCondition '{expression}' returned {other:?}, not a bool"
                ));
            }
            Err(error) => {
                return Verdict::Failed(format!(
                    "failed to evaluate match condition '{expression}': {error}"
                ));
            }
        }
    }
    for validation in list(spec, "validations") {
        let expression = validation.get("expression").and_then(Value::as_str).unwrap_or("");
        match run(expression, &context) {
            Ok(Cel::Bool(true)) => {}
            Ok(Cel::Bool(false)) => {
                let message = validation
                    .get("messageExpression")
                    .and_then(Value::as_str)
                    .and_then(|expression| message_from(expression, &context))
                    .or_else(|| {
                        validation
                            .get("message")
                            .and_then(Value::as_str)
                            .map(str::to_owned)
                    })
                    .unwrap_or_else(|| format!("failed expression: {}", expression.trim()));
                return Verdict::Refused(message, reason_of(validation));
            }
            Ok(other) => {
                return Verdict::Failed(format!(
                    "expression '{expression}' resulted in {other:?}, not a bool"
                ));
            }
            Err(error) => {
                return Verdict::Failed(format!("expression '{expression}' resulted in error: {error}"));
            }
        }
    }
    Verdict::Allowed
}

fn reason_of(validation: &Value) -> &'static str {
    match validation.get("reason").and_then(Value::as_str) {
        Some("Forbidden") => "Forbidden",
        Some("Unauthorized") => "Unauthorized",
        Some("RequestEntityTooLarge") => "RequestEntityTooLarge",
        _ => "Invalid",
    }
}

fn run(expression: &str, context: &Context<'_, '_>) -> Result<Cel, String> {
    let compiled = compiled(expression);
    let program = compiled
        .program
        .as_ref()
        .map_err(|error| format!("compilation failed: {error}"))?;
    program.execute(context).map_err(|error| error.to_string())
}

fn map_of(variables: &HashMap<Key, Cel>) -> Cel {
    Cel::Map(CelMap {
        map: Arc::new(variables.clone()),
    })
}

fn list<'a>(spec: &'a Value, field: &str) -> &'a [Value] {
    spec.get(field)
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn labels(object: &Value) -> Option<&serde_json::Map<String, Value>> {
    meta(object)?.get("labels")?.as_object()
}

/// `matchConstraints` or `matchResources`: absent matches nothing for a policy (the API requires it) and
/// everything for a binding; the caller passes the binding's only when it is set.
fn matches(state: &State, resources: Option<&Value>, request: &Request<'_>) -> bool {
    let Some(resources) = resources else {
        return false;
    };
    // Unset (a binding's), it does not constrain.
    if let Some(rules) = resources.get("resourceRules").and_then(Value::as_array)
        && !rules.iter().any(|rule| rule_matches(rule, request))
    {
        return false;
    }
    if list(resources, "excludeResourceRules")
        .iter()
        .any(|rule| rule_matches(rule, request))
    {
        return false;
    }
    let object_selector = resources.get("objectSelector");
    let by_object = [Some(request.object), request.old]
        .into_iter()
        .flatten()
        .any(|object| selector_matches(object_selector, labels(object)));
    if !by_object {
        return false;
    }
    if request.kind.namespaced {
        let namespace = state.get(kind_of(Special::Namespace), "", request.namespace());
        let namespace_labels = namespace.as_deref().and_then(labels);
        if !selector_matches(resources.get("namespaceSelector"), namespace_labels) {
            return false;
        }
    }
    true
}

fn rule_matches(rule: &Value, request: &Request<'_>) -> bool {
    let any_of = |field: &str, wanted: &str| {
        list(rule, field)
            .iter()
            .filter_map(Value::as_str)
            .any(|item| item == "*" || item == wanted)
    };
    let scope_ok = match rule.get("scope").and_then(Value::as_str) {
        Some("Namespaced") => request.kind.namespaced,
        Some("Cluster") => !request.kind.namespaced,
        _ => true,
    };
    let resource = request.resource();
    let resource_ok = list(rule, "resources")
        .iter()
        .filter_map(Value::as_str)
        .any(|pattern| resource_matches(pattern, &resource));
    scope_ok
        && resource_ok
        && any_of("apiGroups", request.kind.group)
        && any_of("apiVersions", request.kind.version)
        && any_of("operations", request.operation.name())
}

/// `*` is every main resource, `*/*` everything, `x/*` and `*/y` by part.
fn resource_matches(pattern: &str, resource: &str) -> bool {
    match (pattern.split_once('/'), resource.split_once('/')) {
        (None, None) => pattern == "*" || pattern == resource,
        (Some((p, ps)), Some((r, rs))) => (p == "*" || p == r) && (ps == "*" || ps == rs),
        _ => false,
    }
}

/// A metav1.LabelSelector; absent or empty selects everything.
fn selector_matches(selector: Option<&Value>, labels: Option<&serde_json::Map<String, Value>>) -> bool {
    let Some(selector) = selector else {
        return true;
    };
    let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
    let by_labels = selector
        .get("matchLabels")
        .and_then(Value::as_object)
        .is_none_or(|wanted| wanted.iter().all(|(key, value)| label(key) == value.as_str()));
    by_labels
        && list(selector, "matchExpressions").iter().all(|expression| {
            let key = expression.get("key").and_then(Value::as_str).unwrap_or("");
            let values: Vec<&str> = list(expression, "values")
                .iter()
                .filter_map(Value::as_str)
                .collect();
            let value = label(key);
            match expression.get("operator").and_then(Value::as_str) {
                Some("Exists") => value.is_some(),
                Some("DoesNotExist") => value.is_none(),
                Some("In") => value.is_some_and(|v| values.contains(&v)),
                Some("NotIn") => value.is_none_or(|v| !values.contains(&v)),
                _ => false,
            }
        })
}
