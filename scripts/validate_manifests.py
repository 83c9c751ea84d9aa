#!/usr/bin/env python3
"""Validates Kubernetes manifests offline, for scripts/chart-check.sh.

- Built-in kinds: against the Kubernetes OpenAPI schemas of one version (PyPI's kubernetes-validate, strict: an
  unknown field is an error), and a kind or apiVersion that version does not know is an error too.
- Our custom resources (group redlock.io): against the openAPIV3Schema of the CRDs in --crds, the way the API
  server checks them: defaults applied, unknown fields rejected, `nullable`, and the CEL rules
  (x-kubernetes-validations) evaluated with cel-python. Transition rules (those reading oldSelf) only apply to
  updates and are compiled, not evaluated.
- With --cel-cases FILE (tests/cel-cases.yaml): the rules against the cases shared with the test API server's
  test (tests/cel_cases.rs), creates and updates (transition rules and ratcheting), each with its verdict.
- ServiceMonitor (prometheus-operator): no schema is available offline; the fields the chart renders are checked
  against a hand-written subset of its CRD.
- PrometheusRule (prometheus-operator): likewise against a hand-written subset of its CRD; group names unique.
- Grafana dashboards (a ConfigMap key ending in .json holding `panels`): JSON, a uid and title, unique panel
  ids, every query target with an expression, a unique refId and the dashboard's `datasource` variable.
  With --promql-out DIR, every rule group and every dashboard query is written to DIR as a Prometheus rules file
  (dashboard queries as recording rules, Grafana's variables replaced), for `promtool check rules`.
- ValidatingAdmissionPolicy: every CEL expression is compiled; the Job policy is run against sample Jobs.
- With --render (a `helm template` output), cross-object checks: selectors match the pods they are meant to,
  named ports exist, namespaced objects carry a namespace, RedisQuorum endpoints name real StatefulSet pods,
  Secret keys that are referenced exist, NetworkPolicy peers of their own namespace match pods of the render, and
  the `helm test` Pod runs `lock` on the RedisQuorum's masters with its Secrets, maxTtl and nodeTimeout.

Prints one line per problem and a summary per file; exits 1 when anything failed.
"""

import argparse
import copy
import datetime
import glob
import json
import os
import re
import sys

import celpy
import jsonschema
import yaml
from kubernetes_validate import utils as kv

CLUSTER_SCOPED = {
    "Namespace", "Node", "PersistentVolume", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition",
    "ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding", "ValidatingWebhookConfiguration",
    "MutatingWebhookConfiguration", "PriorityClass", "StorageClass", "IngressClass", "RuntimeClass", "FlowSchema",
    "PriorityLevelConfiguration", "MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding",
}
WORKLOADS = {"Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"}
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")

# The ServiceMonitor fields this chart may render, as in prometheus-operator's monitoring.coreos.com/v1 CRD.
PROM_DURATION = r"^(0|(([0-9]+)y)?(([0-9]+)w)?(([0-9]+)d)?(([0-9]+)h)?(([0-9]+)m)?(([0-9]+)s)?(([0-9]+)ms)?)$"
LABEL_SELECTOR = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "matchLabels": {"type": "object", "additionalProperties": {"type": "string"}},
        "matchExpressions": {"type": "array", "items": {"type": "object"}},
    },
}
SERVICE_MONITOR = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "required": ["selector"],
            "additionalProperties": False,
            "properties": {
                "jobLabel": {"type": "string"},
                "namespaceSelector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "any": {"type": "boolean"},
                        "matchNames": {"type": "array", "items": {"type": "string"}},
                    },
                },
                "selector": LABEL_SELECTOR,
                "endpoints": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "properties": {
                            "port": {"type": "string"},
                            "targetPort": {"type": ["string", "integer"]},
                            "path": {"type": "string"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": PROM_DURATION},
                            "scrapeTimeout": {"type": "string", "pattern": PROM_DURATION},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array", "items": {"type": "object"}},
                            "metricRelabelings": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
            },
        },
    },
}

PROMETHEUS_RULE = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "additionalProperties": False,
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                "groups": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "required": ["name"],
                        "additionalProperties": False,
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "interval": {"type": "string", "pattern": PROM_DURATION},
                            "query_offset": {"type": "string", "pattern": PROM_DURATION},
                            "limit": {"type": "integer"},
                            "partial_response_strategy": {"type": "string"},
                            "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                            "rules": {
                                "type": "array",
                                "items": {
                                    "type": "object",
                                    "required": ["expr"],
                                    "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                                    "additionalProperties": False,
                                    "properties": {
                                        "alert": {"type": "string", "minLength": 1},
                                        "record": {"type": "string", "minLength": 1},
                                        "expr": {"type": ["string", "integer"]},
                                        "for": {"type": "string", "pattern": PROM_DURATION},
                                        "keep_firing_for": {"type": "string", "pattern": PROM_DURATION},
                                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}},
                                    },
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}
# prometheus-operator kinds validated against the hand-written subsets above.
PROMETHEUS_OPERATOR_KINDS = {"ServiceMonitor": SERVICE_MONITOR, "PrometheusRule": PROMETHEUS_RULE}


class UniqueKeyLoader(yaml.SafeLoader):
    """A YAML loader that rejects a key given twice in one mapping (PyYAML would keep the last silently)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)


def load_documents(path):
    with open(path, encoding="utf-8") as handle:
        return [doc for doc in yaml.load_all(handle, Loader=UniqueKeyLoader) if doc]


def describe(obj):
    meta = obj.get("metadata") or {}
    return f"{obj.get('kind')}/{meta.get('name')}"


# --- custom resources ----------------------------------------------------------------------------------------


def openapi_to_jsonschema(schema, root=False):
    """A structural openAPIV3Schema as a JSON Schema that rejects unknown fields, as the API server's
    strict field validation does."""
    if not isinstance(schema, dict):
        return schema
    out = {}
    for key, value in schema.items():
        if key == "properties":
            out[key] = {name: openapi_to_jsonschema(sub) for name, sub in value.items()}
        elif key in ("items", "additionalProperties", "not"):
            out[key] = openapi_to_jsonschema(value) if isinstance(value, dict) else value
        elif key in ("allOf", "anyOf", "oneOf"):
            out[key] = [openapi_to_jsonschema(sub) for sub in value]
        elif key.startswith("x-kubernetes-") or key in ("nullable", "default", "format"):
            continue
        else:
            out[key] = value
    if schema.get("x-kubernetes-int-or-string"):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if schema.get("nullable") and "type" in out:
        out["type"] = [out["type"], "null"]
    if root:
        out.setdefault("properties", {})
        out["properties"].update({
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"}})
    if (out.get("type") == "object" or "properties" in out) and "properties" in out \
            and "additionalProperties" not in out and not schema.get("x-kubernetes-preserve-unknown-fields"):
        out["additionalProperties"] = False
    return out


def apply_defaults(schema, value):
    """The API server's structural defaulting: nulls in fields neither nullable nor defaulted are dropped, then
    missing fields, and nulls in fields that are not nullable, get their `default`, inside every object present."""
    prune_nulls(schema, value)
    fill_defaults(schema, value)


def field_schema(schema, name):
    if not isinstance(schema, dict):
        return None
    if name in (schema.get("properties") or {}):
        return schema["properties"][name]
    additional = schema.get("additionalProperties")
    return additional if isinstance(additional, dict) else None


def prune_nulls(schema, value):
    if isinstance(value, dict):
        for name in list(value):
            sub = field_schema(schema, name)
            if value[name] is None and sub is not None and not sub.get("nullable") and "default" not in sub:
                del value[name]
            else:
                prune_nulls(sub, value[name])
    elif isinstance(value, list):
        for item in value:
            prune_nulls(schema.get("items") if isinstance(schema, dict) else None, item)


def fill_defaults(schema, value):
    def non_nullable_null(item, sub):
        return item is None and not sub.get("nullable")

    if isinstance(value, dict):
        for name, sub in (schema.get("properties") or {}).items():
            if "default" in sub and (name not in value or non_nullable_null(value[name], sub)):
                value[name] = copy.deepcopy(sub["default"])
        additional = schema.get("additionalProperties")
        for name in list(value):
            if name in (schema.get("properties") or {}):
                fill_defaults(schema["properties"][name], value[name])
            elif isinstance(additional, dict):
                if "default" in additional and non_nullable_null(value[name], additional):
                    value[name] = copy.deepcopy(additional["default"])
                fill_defaults(additional, value[name])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        items = schema["items"]
        for index, item in enumerate(value):
            if "default" in items and non_nullable_null(item, items):
                value[index] = copy.deepcopy(items["default"])
            fill_defaults(items, value[index])


# The API server evaluates CEL with cel-go, whose durations are Go's time.Duration: int64 nanoseconds, about
# ±2562047h. cel-python allows the CEL specification's ±10000 years, so a duration() between the two would be
# an evaluation error on the API server and a value here.
GO_MAX_DURATION = datetime.timedelta(microseconds=(2**63 - 1) // 1000)


def go_duration(value):
    result = celpy.celtypes.DurationType(value)
    if abs(result) > GO_MAX_DURATION:
        raise ValueError(f"range error: {value} is past what a Go time.Duration holds")
    return result


CEL = celpy.Environment()
# The API server's `authorizer` in admission CEL, for the chart's check that a request comes from an operator
# (`redlock-operator.byAnOperator`): the users below are allowed the verb `grant` on redlock.io's distributedlocks
# (two releases' operators and a human cluster admin, who has `*`); nobody else is allowed anything.
THIS_OPERATOR = "system:serviceaccount:redlock:redlock-redlock-operator"
OTHER_OPERATOR = "system:serviceaccount:team2:team2-redlock-operator"
STAR_ADMIN = "kubernetes-admin"
NO_GRANT_SA = "system:serviceaccount:shop:default"
GRANT_HOLDERS = {THIS_OPERATOR, OTHER_OPERATOR, STAR_ADMIN}


def _authorizer_step(field):
    def step(target, value):
        result = celpy.celtypes.MapType(target)
        result[celpy.celtypes.StringType(field)] = value
        return result
    return step


def _authorizer_allowed(check):
    get = lambda key: str(check.get(celpy.celtypes.StringType(key), ""))  # noqa: E731
    return celpy.celtypes.BoolType(get("user") in GRANT_HOLDERS and get("verb") == "grant"
                                   and get("group") == "redlock.io" and get("resource") == "distributedlocks")


CEL_FUNCTIONS = {"duration": go_duration, "group": _authorizer_step("group"),
                 "resource": _authorizer_step("resource"), "namespace": _authorizer_step("namespace"),
                 "check": _authorizer_step("verb"), "allowed": _authorizer_allowed}


def cel_eval(expression, activation):
    program = CEL.program(CEL.compile(expression), functions=CEL_FUNCTIONS)
    # Values already evaluated (a policy's variables) keep their CEL types; JSON is converted.
    result = program.evaluate({name: value if isinstance(value, celpy.celtypes.MapType) else celpy.json_to_cel(value)
                               for name, value in activation.items()})
    if isinstance(result, celpy.CELEvalError):
        raise ValueError(f"evaluation error: {result}")
    return result


OLD_SELF = re.compile(r"\boldSelf\b")
NO_OLD = object()


def check_cel_rules(schema, value, errors, path="", old=NO_OLD, unchanged=False):
    """The x-kubernetes-validations rules as the API server evaluates them, appending (field path, message) to
    errors. `old`: the value at the same place in the stored object, on an update. Transition rules (those
    reading oldSelf) apply only where there is one; a rule without oldSelf that fails on a value equal to the
    old one (or inside a list that is unchanged) is forgiven (ratcheting), but not one that cannot be
    evaluated. Rules check non-null values only. Lists are atomic: their items have no old value."""
    if value is None:
        return
    for rule in schema.get("x-kubernetes-validations", []):
        expression = rule["rule"]
        named = (rule.get("message") or "").strip() or expression.strip()
        reads_old = bool(OLD_SELF.search(expression))
        try:
            CEL.compile(expression)
            if reads_old and old is NO_OLD:
                continue
            activation = {"self": value} if old is NO_OLD else {"self": value, "oldSelf": old}
            holds = cel_eval(expression, activation) == celpy.celtypes.BoolType(True)
        except Exception as err:  # noqa: BLE001 - any CEL failure is a finding
            errors.append((path, f"{err} evaluating rule: {named}"))
            continue
        if holds or (unchanged and not reads_old):
            continue
        errors.append((path, (rule.get("message") or "").strip() or f"failed rule: {named}"))
    if isinstance(value, dict):
        properties = schema.get("properties") or {}
        additional = schema.get("additionalProperties")
        for name, item in value.items():
            if name in properties:
                sub, where = properties[name], f"{path}.{name}" if path else name
            elif isinstance(additional, dict):
                sub, where = additional, f"{path}[{name}]"
            else:
                continue
            if old is NO_OLD or not isinstance(old, dict):
                check_cel_rules(sub, item, errors, where, NO_OLD, unchanged)
            elif name in old:
                check_cel_rules(sub, item, errors, where, old[name], old[name] == item)
            else:
                check_cel_rules(sub, item, errors, where, NO_OLD, False)
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for index, item in enumerate(value):
            check_cel_rules(schema["items"], item, errors, f"{path}[{index}]", NO_OLD, unchanged)


def load_crds(directory):
    crds = {}
    for path in sorted(glob.glob(os.path.join(directory, "*.yaml"))):
        for crd in load_documents(path):
            spec = crd["spec"]
            for version in spec["versions"]:
                key = (f"{spec['group']}/{version['name']}", spec["names"]["kind"])
                crds[key] = (spec["scope"], version["schema"]["openAPIV3Schema"])
    return crds


def validate_custom_resource(obj, crds):
    key = (obj.get("apiVersion"), obj.get("kind"))
    if key not in crds:
        return [f"no CRD in crds/ defines {key[1]} in {key[0]}"]
    scope, schema = crds[key]
    errors = []
    meta = obj.get("metadata") or {}
    if not DNS_SUBDOMAIN.match(str(meta.get("name", ""))) or len(meta.get("name", "")) > 253:
        errors.append(f"metadata.name {meta.get('name')!r} is not a DNS subdomain")
    if scope == "Cluster" and "namespace" in meta:
        errors.append("metadata.namespace set on a cluster-scoped resource")
    body = copy.deepcopy(obj)
    apply_defaults(schema, body)
    validator = jsonschema.Draft202012Validator(openapi_to_jsonschema(schema, root=True))
    for err in sorted(validator.iter_errors(body), key=lambda e: list(e.absolute_path)):
        where = ".".join(str(p) for p in err.absolute_path) or "(root)"
        errors.append(f"{where}: {err.message}")
    if not errors:
        rule_errors = []
        check_cel_rules(schema, body, rule_errors)
        errors += [f"{field}: {message}" for field, message in rule_errors]
    return errors


def check_cel_cases(path, crds):
    """The shared cases of tests/cel-cases.yaml, which the test API server (tests/cel_cases.rs) runs too: each
    evaluated as the API server would (defaults, then the rules; an update against its old object), with the
    verdict the case expects. Every object must also be valid for the rest of its schema, so that the rules'
    errors are all that a real API server reports. Returns the number of cases and a line per failure."""
    with open(path, encoding="utf-8") as handle:
        cases = yaml.load(handle, Loader=UniqueKeyLoader)["cases"]
    failures = []
    for case in cases:
        api_version = "redlock.io/v1beta1"
        _, schema = crds[(api_version, case["kind"])]
        validator = jsonschema.Draft202012Validator(openapi_to_jsonschema(schema, root=True))

        def stored(spec):
            obj = {"apiVersion": api_version, "kind": case["kind"], "metadata": {"name": "case"},
                   "spec": copy.deepcopy(spec)}
            apply_defaults(schema, obj)
            return obj

        new = stored(case["spec"])
        old = stored(case["old"]) if "old" in case else None
        problems = [f"breaks its schema besides the rules: {'.'.join(map(str, err.absolute_path))}: {err.message}"
                    for obj in filter(None, (old, new)) for err in validator.iter_errors(obj)]
        errors = []
        check_cel_rules(schema, new, errors, "", NO_OLD if old is None else old, old == new)
        expected = case.get("refused") or []
        if len(errors) != len(expected) or not all(
                any(field == e["field"] and e["message"] in message for field, message in errors) for e in expected):
            got = [f"{field}: {message}" for field, message in errors] or "admitted"
            problems.append(f"got {got}, expected {expected or 'admitted'}")
        failures += [f"case {case['name']!r}: {problem}" for problem in problems]
    return len(cases), failures


# --- built-in kinds ------------------------------------------------------------------------------------------


def validate_builtin(obj, version):
    try:
        kv.validate(obj, version, strict=True)
    except kv.ValidationError as err:
        where = ".".join(str(p) for p in err.path) or "(root)"
        return [f"{where}: {err.message} (Kubernetes {err.version} schema)"]
    except kv.SchemaNotFoundError as err:
        return [err.message]
    errors = []
    if obj["kind"] == "ValidatingAdmissionPolicy":
        errors += check_admission_policy(obj)
    return errors


def selector_matches(selector, labels):
    if selector is None:
        return False
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
    return True


def admission_decision(policy, obj, old=None, username="system:admin", params=None):
    """None when the policy does not apply to obj (a CREATE, or an UPDATE from old); otherwise (allowed, message).
    `params`: the param object the policy is evaluated with (one of a paramRef's), None without paramKind."""
    spec = policy["spec"]
    constraints = spec.get("matchConstraints") or {}
    operation = "CREATE" if old is None else "UPDATE"
    if not any(operation in rule.get("operations", []) for rule in constraints.get("resourceRules") or []):
        return None
    # On UPDATE the API server matches the selector against the old and the new object.
    if "objectSelector" in constraints and not any(
            selector_matches(constraints["objectSelector"], o["metadata"].get("labels") or {})
            for o in filter(None, (obj, old))):
        return None
    activation = {"object": obj, "oldObject": old, "params": params, "authorizer": {"user": username},
                  "request": {"operation": operation, "namespace": "shop", "userInfo": {"username": username}}}
    variables = celpy.celtypes.MapType()
    for variable in spec.get("variables") or []:
        activation["variables"] = variables
        variables[celpy.celtypes.StringType(variable["name"])] = cel_eval(variable["expression"], activation)
    activation["variables"] = variables
    for condition in spec.get("matchConditions") or []:
        if not cel_eval(condition["expression"], activation):
            return None
    for validation in spec.get("validations") or []:
        if not cel_eval(validation["expression"], activation):
            message = validation.get("message", "")
            if "messageExpression" in validation:
                message = str(cel_eval(validation["messageExpression"], activation))
            return False, message
    return True, ""


def check_admission_policy(policy):
    errors = []
    spec = policy["spec"]
    expressions = [c["expression"] for c in (spec.get("matchConditions") or []) + (spec.get("variables") or [])]
    for validation in spec.get("validations") or []:
        expressions += [validation["expression"], validation.get("messageExpression")]
    for expression in filter(None, expressions):
        try:
            CEL.compile(expression)
        except Exception as err:  # noqa: BLE001
            errors.append(f"CEL expression {expression!r} does not compile: {err}")
    rules = (spec.get("matchConstraints") or {}).get("resourceRules") or []
    if not errors and (spec.get("paramKind") or {}).get("kind") == "DistributedLock":
        return check_fenced_objects_policy(policy)
    if errors or not any("jobs" in rule.get("resources", []) for rule in rules):
        return errors
    # The sample Jobs are the suspended-Jobs policy's (objects labelled redlock.io/lock); the holder-injection
    # policies' refusals are checked on the real node (tests/in_cluster/injected.rs).
    keys = [e.get("key") for e in ((spec.get("matchConstraints") or {}).get("objectSelector") or {}).get("matchExpressions") or []]
    if keys != ["redlock.io/lock"]:
        return errors

    def job(labels, suspend):
        body = {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": "sample", "labels": labels},
                "spec": {"template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "c"}]}}}}
        if suspend is not None:
            body["spec"]["suspend"] = suspend
        return body

    operator = THIS_OPERATOR
    lock = {"redlock.io/lock": "nightly-report"}
    other = {"redlock.io/lock": "other-lock"}
    plain = {"app": "x"}
    # (name, new Job, old Job or None for CREATE, user, expected)
    cases = [
        ("create labelled, suspend: true", job(lock, True), None, "user", "allow"),
        ("create labelled, suspend: false", job(lock, False), None, "user", "deny"),
        ("create labelled, no spec.suspend", job(lock, None), None, "user", "deny"),
        ("create unlabelled, suspend: false", job(plain, False), None, "user", "skip"),
        ("a user unsuspends a labelled Job", job(lock, False), job(lock, True), "user", "deny"),
        ("a user drops spec.suspend of a labelled Job", job(lock, None), job(lock, True), "user", "deny"),
        ("the operator unsuspends a labelled Job", job(lock, False), job(lock, True), operator, "allow"),
        ("a user labels a running Job", job(lock, False), job(plain, False), "user", "deny"),
        ("a user moves a running Job to another lock", job(other, False), job(lock, False), "user", "deny"),
        ("a user labels a suspended Job", job(lock, True), job(plain, True), "user", "allow"),
        ("a user labels and unsuspends a Job at once", job(lock, False), job(plain, True), "user", "deny"),
        ("a user suspends a running labelled Job", job(lock, True), job(lock, False), "user", "allow"),
        ("a user edits a running labelled Job", job(lock, False), job(lock, False), "user", "allow"),
        ("the operator labels a running Job", job(lock, False), job(plain, False), operator, "allow"),
        ("a user unsuspends an unlabelled Job", job(plain, False), job(plain, True), "user", "skip"),
        # Two releases in one cluster: the other's operator lets the Jobs of its locks run past this policy.
        ("another installation's operator unsuspends a labelled Job", job(lock, False), job(lock, True),
         OTHER_OPERATOR, "allow"),
        ("a ServiceAccount without the verb grant unsuspends a labelled Job", job(lock, False), job(lock, True),
         NO_GRANT_SA, "deny"),
        ("a cluster admin (verbs *) unsuspends a labelled Job", job(lock, False), job(lock, True), STAR_ADMIN,
         "deny"),
    ]
    for name, sample, old, user, expected in cases:
        try:
            decision = admission_decision(policy, sample, old, user)
        except Exception as err:  # noqa: BLE001
            errors.append(f"sample Job ({name}): evaluation failed: {err}")
            continue
        got = "skip" if decision is None else ("allow" if decision[0] else "deny")
        if got != expected:
            errors.append(f"sample Job ({name}): expected {expected}, got {got}")
        elif got == "deny" and ("suspend" not in decision[1] or "redlock.io/lock=" not in decision[1]):
            errors.append(f"sample Job ({name}): the message does not say what to do: {decision[1]!r}")
    return errors


def check_fenced_objects_policy(policy):
    """The fenced-objects policy against sample ConfigMap updates, evaluated once per lock of the namespace as the
    API server does with a paramRef selector: refused when any lock's evaluation refuses."""
    errors = []
    operator = THIS_OPERATOR

    def cm(lock=None, token=None):
        meta = {"name": "sample", "labels": {"redlock.io/fenced-by": lock} if lock else {"app": "x"}}
        if token is not None:
            meta["annotations"] = {"redlock.io/fencing-token": token}
        return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"k": "v"}}

    work = {"apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": {"name": "work"},
            "status": {"fencingToken": 5}}
    never_held = {"apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": {"name": "work"}}
    other = {"apiVersion": "redlock.io/v1beta1", "kind": "DistributedLock", "metadata": {"name": "other"},
             "status": {"fencingToken": 99}}
    locks = [work, other]
    # (name, new ConfigMap, old ConfigMap, the namespace's locks, user, expected)
    cases = [
        ("the holder's token", cm("work", "5"), cm("work", "5"), locks, "user", "allow"),
        ("a token above the lock's (status not caught up)", cm("work", "6"), cm("work", "5"), locks, "user", "allow"),
        ("a token below the lock's", cm("work", "4"), cm("work", "4"), locks, "user", "deny"),
        ("a token below the object's", cm("work", "6"), cm("work", "7"), locks, "user", "deny"),
        ("no annotation", cm("work"), cm("work", "5"), locks, "user", "deny"),
        ("not a token", cm("work", "5x"), cm("work", "5"), locks, "user", "deny"),
        ("a lock never held, with a token", cm("work", "0"), cm("work"), [never_held], "user", "allow"),
        ("a lock never held, no annotation", cm("work"), cm("work"), [never_held], "user", "deny"),
        ("the label removed without a token", cm(), cm("work", "5"), locks, "user", "deny"),
        ("the label removed with the token", cm(None, "5"), cm("work", "5"), locks, "user", "allow"),
        ("the label put on with a token below the lock's", cm("work", "1"), cm(), locks, "user", "deny"),
        ("another lock's higher token does not matter", cm("work", "5"), cm("work", "5"), [other, work], "user",
         "allow"),
        ("the operator's write", cm("work"), cm("work", "5"), locks, operator, "skip"),
        ("another installation's operator's write", cm("work"), cm("work", "5"), locks, OTHER_OPERATOR, "skip"),
        ("a ServiceAccount without the verb grant", cm("work"), cm("work", "5"), locks, NO_GRANT_SA, "deny"),
        ("a cluster admin (verbs *) without a token", cm("work"), cm("work", "5"), locks, STAR_ADMIN, "deny"),
        ("an unlabelled object", cm(), cm(), locks, "user", "skip"),
    ]
    for name, sample, old, params, user, expected in cases:
        try:
            decisions = [admission_decision(policy, sample, old, user, lock) for lock in params]
        except Exception as err:  # noqa: BLE001
            errors.append(f"sample ConfigMap ({name}): evaluation failed: {err}")
            continue
        denied = [d for d in decisions if d is not None and not d[0]]
        got = "deny" if denied else ("skip" if all(d is None for d in decisions) else "allow")
        if got != expected:
            errors.append(f"sample ConfigMap ({name}): expected {expected}, got {got}")
        elif got == "deny" and ("lock work" not in denied[0][1] or "fencing" not in denied[0][1]):
            errors.append(f"sample ConfigMap ({name}): the message does not name the lock: {denied[0][1]!r}")
    return errors


# --- monitoring ----------------------------------------------------------------------------------------------

# Grafana's range variables, replaced by a duration so that a query parses as PromQL.
GRAFANA_RANGES = ("$__rate_interval", "$__interval", "$__range")


def dashboards(obj):
    """The Grafana dashboards a ConfigMap carries: (key, parsed JSON or the error)."""
    if obj.get("kind") != "ConfigMap":
        return
    for key, text in (obj.get("data") or {}).items():
        if not key.endswith(".json"):
            continue
        try:
            board = json.loads(text)
        except ValueError as err:
            yield key, f"not JSON: {err}"
            continue
        if isinstance(board, dict) and "panels" in board:
            yield key, board


def all_panels(panels):
    for panel in panels or []:
        yield panel
        yield from all_panels(panel.get("panels"))


def dashboard_queries(board):
    """(where, PromQL) of every panel target and query variable, Grafana's variables replaced."""
    variables = [v for v in (board.get("templating") or {}).get("list") or [] if v.get("type") == "query"]
    found = [(f"panel {p.get('id')} target {t.get('refId')}", t.get("expr", ""))
             for p in all_panels(board.get("panels")) for t in p.get("targets") or []]
    for variable in variables:
        query = variable.get("query")
        query = query.get("query", "") if isinstance(query, dict) else query or ""
        match = re.fullmatch(r"label_values\((.*),\s*[a-zA-Z_][a-zA-Z0-9_]*\)", query.strip())
        found.append((f"variable {variable.get('name')}", match.group(1) if match else query))
    names = [v.get("name") for v in variables]
    queries = []
    for where, expr in found:
        for range_variable in GRAFANA_RANGES:
            expr = expr.replace(range_variable, "5m")
        for name in names:
            expr = expr.replace("${%s}" % name, ".*").replace("$" + name, ".*")
        queries.append((where, expr))
    return queries


def check_dashboard(board):
    errors = []
    if not isinstance(board.get("uid"), str) or not 0 < len(board["uid"]) <= 40:
        errors.append("uid must be a string of 1 to 40 characters")
    if not board.get("title"):
        errors.append("no title")
    variables = {v.get("name") for v in (board.get("templating") or {}).get("list") or []}
    if "datasource" not in variables:
        errors.append("no `datasource` variable: the dashboard would be tied to one Prometheus")
    ids = [p.get("id") for p in all_panels(board.get("panels"))]
    if len(ids) != len(set(ids)) or None in ids:
        errors.append(f"panel ids are not unique: {ids}")
    for panel in all_panels(board.get("panels")):
        if "gridPos" not in panel:
            errors.append(f"panel {panel.get('id')}: no gridPos")
        targets = panel.get("targets") or []
        refs = [t.get("refId") for t in targets]
        if len(refs) != len(set(refs)) or None in refs:
            errors.append(f"panel {panel.get('id')}: refIds are not unique: {refs}")
        for target in targets:
            if not target.get("expr"):
                errors.append(f"panel {panel.get('id')} target {target.get('refId')}: no expr")
            for source in (target.get("datasource"), panel.get("datasource")):
                if source and source.get("uid") != "${datasource}":
                    errors.append(f"panel {panel.get('id')}: datasource {source} is not the `datasource` variable")
    for where, expr in dashboard_queries(board):
        if "$" in expr:
            errors.append(f"{where}: a variable the dashboard does not define: {expr}")
    return errors


def write_promql(objects, directory, stem):
    """Every PrometheusRule's groups, and every dashboard's queries as recording rules, as rules files."""
    os.makedirs(directory, exist_ok=True)
    written = []
    for obj in objects:
        if obj.get("kind") == "PrometheusRule":
            path = os.path.join(directory, f"{stem}.{obj['metadata']['name']}.rules.yaml")
            with open(path, "w", encoding="utf-8") as handle:
                yaml.safe_dump({"groups": obj["spec"].get("groups") or []}, handle, sort_keys=False)
            written.append(path)
        for key, board in dashboards(obj):
            if not isinstance(board, dict):
                continue
            rules = [{"record": f"dashboard:query_{i}", "expr": expr}
                     for i, (_, expr) in enumerate(dashboard_queries(board))]
            path = os.path.join(directory, f"{stem}.{obj['metadata']['name']}.{key}.rules.yaml")
            with open(path, "w", encoding="utf-8") as handle:
                yaml.safe_dump({"groups": [{"name": key, "rules": rules}]}, handle, sort_keys=False)
            written.append(path)
    return written


# --- a whole render ------------------------------------------------------------------------------------------


def pod_templates(objects):
    """Every pod the render makes: workloads' templates and bare Pods (the `helm test` hook)."""
    for obj in objects:
        if obj.get("kind") in WORKLOADS:
            template = obj["spec"]["template"]
            yield obj, (template.get("metadata") or {}).get("labels") or {}, template["spec"]
        elif obj.get("kind") == "Pod":
            yield obj, obj["metadata"].get("labels") or {}, obj["spec"]


def check_render(objects, crds):
    errors = []
    cluster_scoped = CLUSTER_SCOPED | {kind for (_, kind), (scope, _) in crds.items() if scope == "Cluster"}
    pods = list(pod_templates(objects))
    secrets = {(o["metadata"].get("namespace"), o["metadata"]["name"]): o for o in objects if o["kind"] == "Secret"}
    services = [o for o in objects if o["kind"] == "Service"]

    def add(obj, message):
        errors.append(f"{describe(obj)}: {message}")

    for obj in objects:
        meta = obj.get("metadata") or {}
        namespaced = obj["kind"] not in cluster_scoped
        if namespaced and not meta.get("namespace"):
            add(obj, "namespaced object rendered without metadata.namespace")
        if not namespaced and meta.get("namespace"):
            add(obj, "cluster-scoped object rendered with metadata.namespace")

    for workload, labels, spec in pods:
        if workload["kind"] not in ("Job", "Pod") and not selector_matches(workload["spec"].get("selector"), labels):
            add(workload, "spec.selector does not match the pod template's labels")
        port_names = {p["name"] for c in spec["containers"] for p in c.get("ports") or [] if "name" in p}
        for container in spec["containers"]:
            for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
                handler = container.get(probe) or {}
                for kind in ("httpGet", "tcpSocket", "grpc"):
                    port = (handler.get(kind) or {}).get("port")
                    if isinstance(port, str) and port not in port_names:
                        add(workload, f"{container['name']}.{probe} uses port {port!r}, which no container names")
        for volume in spec.get("volumes") or []:
            ref = volume.get("secret")
            if ref and (workload["metadata"].get("namespace"), ref["secretName"]) in secrets:
                data = secrets[(workload["metadata"].get("namespace"), ref["secretName"])].get("data") or {}
                for item in ref.get("items") or []:
                    if item["key"] not in data:
                        add(workload, f"volume {volume['name']} wants key {item['key']!r} of Secret {ref['secretName']}")
        if workload["kind"] == "StatefulSet":
            name = workload["spec"].get("serviceName")
            if not any(s["metadata"]["name"] == name and s["spec"].get("clusterIP") == "None" for s in services):
                add(workload, f"serviceName {name!r} is not a headless Service of this render")

    for obj in objects:
        kind, spec = obj["kind"], obj.get("spec") or {}
        if kind == "Service" and spec.get("selector"):
            selected = [(w, s) for w, labels, s in pods
                        if all(labels.get(k) == v for k, v in spec["selector"].items())]
            if not selected:
                add(obj, "its selector matches no pod template of this render")
            names = {p["name"] for _, s in selected for c in s["containers"] for p in c.get("ports") or []
                     if "name" in p}
            for port in spec.get("ports") or []:
                if isinstance(port.get("targetPort"), str) and selected and port["targetPort"] not in names:
                    add(obj, f"targetPort {port['targetPort']!r} is not a container port name")
        elif kind in ("PodDisruptionBudget", "NetworkPolicy"):
            selector = spec.get("selector") if kind == "PodDisruptionBudget" else spec.get("podSelector")
            if selector and not any(selector_matches(selector, labels) for _, labels, _ in pods):
                add(obj, "its pod selector matches no pod template of this render")
            # Peers of the policy's own namespace are pods of this render (the operator, the test hook).
            for rule in spec.get("ingress") or []:
                for peer in rule.get("from") or []:
                    if "podSelector" in peer and "namespaceSelector" not in peer and not any(
                            selector_matches(peer["podSelector"], labels) for _, labels, _ in pods):
                        add(obj, f"ingress peer {peer['podSelector']} matches no pod of this render")
        elif kind == "ServiceMonitor":
            matched = [s for s in services if selector_matches(spec.get("selector"), s["metadata"].get("labels") or {})]
            if not matched:
                add(obj, "its selector matches no Service of this render")
            ports = {p.get("name") for s in matched for p in s["spec"].get("ports") or []}
            for endpoint in spec.get("endpoints") or []:
                if "port" in endpoint and endpoint["port"] not in ports:
                    add(obj, f"endpoint port {endpoint['port']!r} is not a port of the selected Service")
        elif kind == "PrometheusRule":
            names = [group.get("name") for group in spec.get("groups") or []]
            if len(names) != len(set(names)):
                add(obj, f"rule group names are not unique: {names}")
            if not spec.get("groups"):
                add(obj, "no rule groups")
        elif kind == "ConfigMap":
            for key, board in dashboards(obj):
                problems = [board] if isinstance(board, str) else check_dashboard(board)
                errors += [f"{describe(obj)}: dashboard {key}: {p}" for p in problems]
        elif kind == "ValidatingAdmissionPolicyBinding":
            if not any(o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == spec.get("policyName")
                       for o in objects):
                add(obj, f"policyName {spec.get('policyName')!r} is not rendered")
        elif kind == "RedisQuorum":
            errors += [f"{describe(obj)}: {e}" for e in check_quorum_endpoints(spec, objects, secrets)]
            for pod in objects:
                if pod["kind"] == "Pod" and (pod["metadata"].get("annotations") or {}).get("helm.sh/hook") == "test":
                    errors += [f"{describe(pod)}: {e}" for e in check_test_hook(pod, spec)]
    return errors


def check_test_hook(pod, quorum):
    """The `helm test` Pod runs `lock` on the quorum's masters with its credentials and settings."""
    container = pod["spec"]["containers"][0]
    args = container.get("args") or []
    if args[:1] != ["lock"] or "--" not in args:
        return [f"expected `lock … -- COMMAND`, got {args}"]
    flags = args[1:args.index("--")]
    values = lambda name: [a.split("=", 1)[1] for a in flags if a.startswith(f"--{name}=")]
    errors = []
    if values("redis") != quorum.get("endpoints"):
        errors.append(f"--redis {values('redis')} are not the RedisQuorum's endpoints {quorum.get('endpoints')}")
    for flag, field in (("max-ttl", "maxTtl"), ("node-timeout", "nodeTimeout")):
        if values(flag) != [quorum.get(field)]:
            errors.append(f"--{flag} {values(flag)} is not the RedisQuorum's {field} {quorum.get(field)!r}")
    if ("--assume-durable" in flags) != bool(quorum.get("assumeDurable")):
        errors.append("--assume-durable differs from the RedisQuorum's assumeDurable")
    mounts = {m["mountPath"]: m["name"] for m in container.get("volumeMounts") or []}
    volumes = {v["name"]: v.get("secret") or {} for v in pod["spec"].get("volumes") or []}

    def secret_file(flag):
        """(Secret name, key) behind the file a flag names, or None."""
        paths = values(flag)
        if not paths:
            return None
        directory, _, file = paths[0].rpartition("/")
        secret = volumes.get(mounts.get(directory), {})
        key = next((i["key"] for i in secret.get("items") or [] if i["path"] == file), None)
        return (secret.get("secretName"), key)

    auth, tls = quorum.get("auth") or {}, quorum.get("tls") or {}
    expected = {
        "redis-password-file": auth and (auth["secretName"], auth.get("passwordKey", "password")),
        "redis-username-file": auth.get("usernameKey") and (auth["secretName"], auth["usernameKey"]),
        "redis-ca": tls.get("caSecretName") and (tls["caSecretName"], tls.get("caKey", "ca.crt")),
    }
    for flag, want in expected.items():
        if (secret_file(flag) or None) != (want or None):
            errors.append(f"--{flag} reads {secret_file(flag)}, the RedisQuorum uses {want or None}")
    return errors


def check_quorum_endpoints(spec, objects, secrets):
    """Endpoints of the form <pod>.<service>.<namespace>.svc.<domain> must be pods of a rendered StatefulSet."""
    errors = []
    sets = [o for o in objects if o["kind"] == "StatefulSet"]
    in_cluster = 0
    for url in spec.get("endpoints") or []:
        host = re.sub(r"^rediss?://", "", url).rsplit(":", 1)[0]
        parts = host.split(".")
        if len(parts) < 5 or parts[3] != "svc":
            continue
        in_cluster += 1
        pod, service, namespace = parts[0], parts[1], parts[2]
        if not any(s["spec"]["serviceName"] == service and s["metadata"].get("namespace") == namespace
                   and any(pod == f"{s['metadata']['name']}-{i}" for i in range(int(s["spec"]["replicas"])))
                   for s in sets):
            errors.append(f"endpoint {url} is not a pod of a StatefulSet of this render")
    for s in sets:
        if in_cluster and int(s["spec"]["replicas"]) != in_cluster:
            errors.append(f"{in_cluster} in-cluster endpoints for {s['spec']['replicas']} StatefulSet replicas")
    auth = spec.get("auth")
    # Quorum Secrets are read from the operator's namespace only (the chart's release namespace by default).
    operator_namespace = next((o["metadata"].get("namespace") for o in objects if o["kind"] == "Deployment"), None)
    if auth and auth.get("secretNamespace", operator_namespace) != operator_namespace:
        errors.append(f"auth.secretNamespace {auth['secretNamespace']!r} is not the operator's namespace")
    auth_ref = auth and (auth.get("secretNamespace", operator_namespace), auth["secretName"])
    if auth and auth_ref in secrets:
        data = secrets[auth_ref].get("data") or {}
        for key in ("passwordKey", "usernameKey"):
            if auth.get(key) and auth[key] not in data:
                errors.append(f"auth.{key} {auth[key]!r} is not a key of Secret {auth['secretName']}")
    return errors


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--crds", required=True, help="directory of our CRDs")
    parser.add_argument("--kube-version", default="1.33.0")
    parser.add_argument("--render", action="store_true", help="the files are helm renders: cross-check them")
    parser.add_argument("--promql-out", metavar="DIR",
                        help="write the rules and dashboard queries of valid files to DIR, for promtool")
    parser.add_argument("--cel-cases", metavar="FILE",
                        help="evaluate the shared CEL cases of FILE (tests/cel-cases.yaml) instead of manifests")
    parser.add_argument("files", nargs="*")
    args = parser.parse_args()
    if not args.files and not args.cel_cases:
        parser.error("give manifests to validate, or --cel-cases")

    crds = load_crds(args.crds)
    if args.cel_cases:
        count, failures = check_cel_cases(args.cel_cases, crds)
        for failure in failures:
            print(f"FAIL {args.cel_cases}: {failure}")
        print(f"{'FAIL' if failures else 'ok  '} {args.cel_cases}: {count - len(failures)} of {count} cases "
              "given their verdict by cel-python")
        return 1 if failures else 0
    failed_files = 0
    for path in args.files:
        errors = []
        try:
            objects = load_documents(path)
        except yaml.YAMLError as err:
            print(f"FAIL {path}: not valid YAML: {err}")
            failed_files += 1
            continue
        for obj in objects:
            if not isinstance(obj, dict) or "apiVersion" not in obj or "kind" not in obj:
                errors.append(f"a document without apiVersion/kind: {str(obj)[:80]}")
                continue
            group = obj["apiVersion"].split("/")[0] if "/" in obj["apiVersion"] else ""
            if group == "redlock.io":
                found = validate_custom_resource(obj, crds)
            elif group == "monitoring.coreos.com":
                schema = PROMETHEUS_OPERATOR_KINDS.get(obj["kind"])
                found = [f"no schema for {obj['kind']}"] if schema is None else [
                    f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
                    for e in jsonschema.Draft202012Validator(schema).iter_errors(obj)]
            else:
                found = validate_builtin(obj, args.kube_version)
            errors += [f"{describe(obj)}: {e}" for e in found]
        if args.render and not errors:
            errors += check_render(objects, crds)
        kinds = sorted({o.get("kind") for o in objects if isinstance(o, dict)})
        if errors:
            failed_files += 1
            for error in errors:
                print(f"FAIL {path}: {error}")
        else:
            print(f"ok   {path}: {len(objects)} objects valid for Kubernetes {args.kube_version} "
                  f"({', '.join(kinds)})")
            if args.promql_out:
                stem = os.path.splitext(os.path.basename(path))[0]
                for written in write_promql(objects, args.promql_out, stem):
                    print(f"     PromQL for promtool: {written}")
    return 1 if failed_files else 0


if __name__ == "__main__":
    sys.exit(main())
