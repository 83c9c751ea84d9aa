//! A CRD's validation rules (`x-kubernetes-validations`), evaluated with the `cel` crate the way the custom
//! resource registry evaluates them with cel-go (apiextensions-apiserver's schema/cel/validation.go):
//!
//! - Every schema node with rules, for each non-null value at it: `self` is the value, typed by its schema
//!   (integers as int, numbers as double, objects as maps of their declared fields).
//! - Transition rules (those that read `oldSelf`) apply only on update, and only where the old object has a
//!   value at the same place: object fields are matched by name; items of lists are never matched (lists are
//!   atomic here: `x-kubernetes-list-type: map` is not modelled), so a rule inside a list item never sees
//!   `oldSelf`.
//! - Ratcheting (CRDValidationRatcheting, on by default since 1.30): on update, a rule without `oldSelf` that
//!   fails on a value equal to the old one (or, inside a list, whose list is unchanged) is not an error, so an
//!   object admitted before a rule existed can still be written as long as that part of it is left alone. A
//!   rule that cannot be evaluated (an error, such as a duration out of range) is an error whatever changed.
//! - Errors as field.Invalid on the node's path (`spec.ttl`), as a current API server (1.36) words them, with no
//!   value: `Invalid value: <message>` (older ones put the schema's type first: `Invalid value: "string":
//!   <message>`; tests compare through `e2e::rule_wording`); `reason`, `fieldPath` and `messageExpression` are
//!   honoured.
//!
//! Not modelled: the cost budget, and Kubernetes' CEL libraries beyond the standard one (`isSorted`, `url`,
//! `quantity`, `format`, …): a rule using them fails to compile here and is reported as a compile error.
//! Strings with a `format` stay strings (cel-go turns `date-time` and `duration` formats into timestamps and
//! durations).

use std::collections::HashMap;
use std::sync::{Arc, LazyLock, Mutex, PoisonError};

use cel::objects::{Key, Map as CelMap};
use cel::{Context, Env, ExecutionError, Program, Value as Cel};
use serde_json::Value;

use super::errors::FieldError;

/// The standard CEL environment, with `duration()`, `matches()` and the macros.
pub(super) static ENV: LazyLock<Arc<Env>> = LazyLock::new(|| Arc::new(Env::stdlib()));

/// Compiled rules by their text: every write evaluates the same few rules.
static COMPILED: LazyLock<Mutex<HashMap<String, Arc<Compiled>>>> = LazyLock::new(Mutex::default);

pub(super) struct Compiled {
    pub program: Result<Program, String>,
    reads_old_self: bool,
}

pub(super) fn compiled(rule: &str) -> Arc<Compiled> {
    let mut cache = COMPILED.lock().unwrap_or_else(PoisonError::into_inner);
    cache
        .entry(rule.to_owned())
        .or_insert_with(|| {
            let program = ENV.compile(rule).map_err(|e| e.to_string());
            let reads_old_self = program
                .as_ref()
                .is_ok_and(|p| p.references().has_variable("oldSelf"));
            Arc::new(Compiled {
                program,
                reads_old_self,
            })
        })
        .clone()
}

/// The errors of every rule `object` breaks (`old`: the stored object, on an update).
pub(super) fn validate(schema: &Value, object: &Value, old: Option<&Value>) -> Vec<FieldError> {
    let mut errors = Vec::new();
    let at = Place {
        path: String::new(),
        old,
        unchanged: old == Some(object),
        root: true,
    };
    walk(schema, object, &at, &mut errors);
    errors
}

/// Where a value is: its field path, the old value matched to it, and whether a failing rule there is ratcheted
/// (the value, or its nearest matched ancestor, equals the old one).
struct Place<'a> {
    path: String,
    old: Option<&'a Value>,
    unchanged: bool,
    root: bool,
}

impl<'a> Place<'a> {
    /// A field of an object; matched to the old object's field of the same name.
    fn field(&self, name: &str, value: &Value, key: bool) -> Place<'a> {
        let path = match (key, self.path.is_empty()) {
            (true, _) => format!("{}[{name}]", self.path),
            (false, true) => name.to_owned(),
            (false, false) => format!("{}.{name}", self.path),
        };
        let (old, unchanged) = match self.old {
            Some(old) => match old.get(name) {
                Some(old) => (Some(old), old == value),
                None => (None, false),
            },
            None => (None, self.unchanged),
        };
        Place {
            path,
            old,
            unchanged,
            root: false,
        }
    }

    /// An item of a list: never matched to an old item; ratcheted with its list.
    fn item(&self, index: usize) -> Place<'a> {
        Place {
            path: format!("{}[{index}]", self.path),
            old: None,
            unchanged: self.unchanged,
            root: false,
        }
    }
}

fn walk(schema: &Value, value: &Value, at: &Place<'_>, errors: &mut Vec<FieldError>) {
    if value.is_null() {
        // Rules check non-null values only; a rule on the parent can check for null.
        return;
    }
    if let Some(rules) = schema.get("x-kubernetes-validations").and_then(Value::as_array) {
        check_rules(schema, rules, value, at, errors);
    }
    match value {
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|s| s.is_object());
            for (name, field) in map {
                if let Some(property) = properties.and_then(|p| p.get(name)) {
                    walk(property, field, &at.field(name, field, false), errors);
                } else if let Some(additional) = additional {
                    walk(additional, field, &at.field(name, field, true), errors);
                }
            }
        }
        Value::Array(items) => {
            if let Some(items_schema) = schema.get("items") {
                for (index, item) in items.iter().enumerate() {
                    walk(items_schema, item, &at.item(index), errors);
                }
            }
        }
        _ => {}
    }
}

fn check_rules(schema: &Value, rules: &[Value], value: &Value, at: &Place<'_>, errors: &mut Vec<FieldError>) {
    let type_name = schema.get("type").and_then(Value::as_str).unwrap_or("");
    let this = to_cel(value, schema, at.root);
    let old_self = at.old.map(|old| to_cel(old, schema, at.root));
    for rule in rules {
        let text = rule.get("rule").and_then(Value::as_str).unwrap_or("");
        let message = rule
            .get("message")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty());
        // ruleErrorString: the message when there is one, else the rule.
        let named = message.unwrap_or(text.trim());
        let invalid = |detail: String| FieldError {
            field: at.path.clone(),
            cause: "FieldValueInvalid",
            detail: format!("Invalid value: \"{type_name}\": {detail}"),
        };
        let compiled = compiled(text);
        let program = match &compiled.program {
            Ok(program) => program,
            Err(error) => {
                errors.push(invalid(format!("rule compile error: {error}")));
                continue;
            }
        };
        if compiled.reads_old_self && old_self.is_none() {
            continue;
        }
        let mut context = Context::with_env(ENV.clone());
        context.add_variable_from_value("self", this.clone());
        if let Some(old_self) = &old_self {
            context.add_variable_from_value("oldSelf", old_self.clone());
        }
        match program.execute(&context) {
            Ok(Cel::Bool(true)) => {}
            Ok(_) if !compiled.reads_old_self && at.unchanged => {}
            Ok(_) => {
                let detail = rule
                    .get("messageExpression")
                    .and_then(Value::as_str)
                    .and_then(|expression| message_from(expression, &context))
                    .or_else(|| message.map(str::to_owned))
                    .unwrap_or_else(|| format!("failed rule: {named}"));
                errors.push(rule_error(rule, at, type_name, detail));
            }
            Err(ExecutionError::NoSuchOverload(error)) => errors.push(invalid(format!(
                "'{error}': call arguments did not match a supported operator, function or macro signature \
                 for rule: {named}"
            ))),
            Err(error) => errors.push(invalid(format!("{error} evaluating rule: {named}"))),
        }
    }
}

/// A messageExpression's message, when it evaluates to a one-line non-empty string.
pub(super) fn message_from(expression: &str, context: &Context<'_, '_>) -> Option<String> {
    let program = compiled(expression);
    match program.program.as_ref().ok()?.execute(context) {
        Ok(Cel::String(text)) => {
            let text = text.trim();
            (!text.is_empty() && !text.contains('\n')).then(|| text.to_owned())
        }
        _ => None,
    }
}

/// The field error of a rule that does not hold: on the node, or on its `fieldPath`, of the rule's `reason`.
fn rule_error(rule: &Value, at: &Place<'_>, type_name: &str, detail: String) -> FieldError {
    let mut field = at.path.clone();
    if let Some(extra) = rule.get("fieldPath").and_then(Value::as_str) {
        let extra = extra.trim_start_matches('.');
        if !extra.is_empty() {
            if !field.is_empty() && !extra.starts_with('[') {
                field.push('.');
            }
            field.push_str(extra);
        }
    }
    let (cause, detail) = match rule.get("reason").and_then(Value::as_str) {
        Some("FieldValueForbidden") => ("FieldValueForbidden", format!("Forbidden: {detail}")),
        Some("FieldValueRequired") => ("FieldValueRequired", format!("Required value: {detail}")),
        Some("FieldValueDuplicate") => ("FieldValueDuplicate", format!("Duplicate value: \"{type_name}\"")),
        _ => ("FieldValueInvalid", format!("Invalid value: {detail}")),
    };
    FieldError { field, cause, detail }
}

/// A JSON value as CEL sees it through its schema (UnstructuredToVal): objects with declared properties show
/// only those (the root also its apiVersion, kind, and metadata name and generateName), integers are int
/// and numbers double whatever their JSON spelling.
pub(super) fn to_cel(value: &Value, schema: &Value, root: bool) -> Cel {
    let type_name = schema.get("type").and_then(Value::as_str);
    match value {
        Value::Null => Cel::Null,
        Value::Bool(b) => Cel::Bool(*b),
        Value::String(s) => Cel::String(Arc::new(s.clone())),
        Value::Number(n) => match (type_name, n.as_i64(), n.as_u64()) {
            (Some("number"), _, _) => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
            (_, Some(i), _) => Cel::Int(i),
            (_, None, Some(u)) => Cel::UInt(u),
            _ => Cel::Float(n.as_f64().unwrap_or(f64::NAN)),
        },
        Value::Array(items) => {
            let items_schema = schema.get("items").unwrap_or(&Value::Null);
            Cel::List(Arc::new(
                items
                    .iter()
                    .map(|item| to_cel(item, items_schema, false))
                    .collect(),
            ))
        }
        Value::Object(map) => {
            let properties = schema.get("properties").and_then(Value::as_object);
            let additional = schema.get("additionalProperties").filter(|s| s.is_object());
            let mut fields = HashMap::new();
            for (name, field) in map {
                let field_schema = match (properties, additional) {
                    (Some(properties), _) => properties.get(name),
                    (None, Some(additional)) => Some(additional),
                    // Neither: an object whose unknown fields are preserved, seen as it is.
                    (None, None) => Some(&Value::Null),
                };
                let field_schema = match (root, name.as_str()) {
                    (true, "apiVersion" | "kind") => Some(&Value::Null),
                    (true, "metadata") => {
                        fields.insert(Key::from(name.as_str()), root_metadata(field));
                        continue;
                    }
                    _ => field_schema,
                };
                if let Some(field_schema) = field_schema {
                    fields.insert(Key::from(name.as_str()), to_cel(field, field_schema, false));
                }
            }
            Cel::Map(CelMap {
                map: Arc::new(fields),
            })
        }
    }
}

/// Of the metadata, rules at the root see only the name and generateName.
fn root_metadata(metadata: &Value) -> Cel {
    let mut fields = HashMap::new();
    for field in ["name", "generateName"] {
        if let Some(Value::String(text)) = metadata.get(field) {
            fields.insert(Key::from(field), Cel::String(Arc::new(text.clone())));
        }
    }
    Cel::Map(CelMap {
        map: Arc::new(fields),
    })
}
