//! Label selectors (`=`, `==`, `!=`, `in`, `notin`, exists, `!key`) and field selectors (metadata.name, and
//! metadata.namespace for namespaced kinds: the field labels every kind supports).

use serde_json::Value;

use super::errors::{ApiError, ApiResult};
use super::kinds::Kind;
use super::meta::{meta, name_of, namespace_of};

#[derive(Debug)]
enum LabelReq {
    Eq(String, String),
    NotEq(String, String),
    In(String, Vec<String>),
    NotIn(String, Vec<String>),
    Exists(String),
    NotExists(String),
}

#[derive(Debug, Clone, Copy)]
enum Field {
    Name,
    Namespace,
}

#[derive(Debug)]
struct FieldReq {
    field: Field,
    value: String,
    negate: bool,
}

#[derive(Debug, Default)]
pub(super) struct Filter {
    labels: Vec<LabelReq>,
    fields: Vec<FieldReq>,
}

impl Filter {
    pub fn parse(kind: &Kind, labels: Option<&str>, fields: Option<&str>) -> ApiResult<Self> {
        let labels = match labels {
            Some(selector) => parse_label_selector(selector)
                .map_err(|e| ApiError::bad_request(format!("unable to parse requirement: {e}")))?,
            None => Vec::new(),
        };
        let fields = match fields {
            Some(selector) => parse_field_selector(kind, selector)?,
            None => Vec::new(),
        };
        Ok(Filter { labels, fields })
    }

    pub fn is_empty(&self) -> bool {
        self.labels.is_empty() && self.fields.is_empty()
    }

    pub fn matches(&self, object: &Value) -> bool {
        let labels = meta(object)
            .and_then(|m| m.get("labels"))
            .and_then(Value::as_object);
        let label = |key: &str| labels.and_then(|l| l.get(key)).and_then(Value::as_str);
        let labels_match = self.labels.iter().all(|req| match req {
            LabelReq::Eq(k, v) => label(k) == Some(v.as_str()),
            LabelReq::NotEq(k, v) => label(k) != Some(v.as_str()),
            LabelReq::In(k, values) => label(k).is_some_and(|l| values.iter().any(|v| v == l)),
            LabelReq::NotIn(k, values) => !label(k).is_some_and(|l| values.iter().any(|v| v == l)),
            LabelReq::Exists(k) => label(k).is_some(),
            LabelReq::NotExists(k) => label(k).is_none(),
        });
        let field = |field: Field| match field {
            Field::Name => name_of(object),
            Field::Namespace => namespace_of(object),
        };
        labels_match
            && self
                .fields
                .iter()
                .all(|req| (field(req.field) == req.value) != req.negate)
    }
}

/// Splits at commas outside parentheses (`a in (x,y),b` is two requirements).
fn split_requirements(selector: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0usize, 0);
    for (i, c) in selector.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                parts.push(&selector[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    parts.push(&selector[start..]);
    parts
}

fn label_key(key: &str) -> Result<String, String> {
    let valid = !key.is_empty()
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '/'));
    if valid {
        Ok(key.to_owned())
    } else {
        Err(format!("invalid label key {key:?}"))
    }
}

fn label_value(value: &str) -> Result<String, String> {
    let valid = value
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_'));
    if valid {
        Ok(value.to_owned())
    } else {
        Err(format!("invalid label value {value:?}"))
    }
}

fn parse_label_selector(selector: &str) -> Result<Vec<LabelReq>, String> {
    if selector.trim().is_empty() {
        return Ok(Vec::new());
    }
    split_requirements(selector)
        .into_iter()
        .map(|part| parse_requirement(part.trim()))
        .collect()
}

fn parse_requirement(part: &str) -> Result<LabelReq, String> {
    if let Some(key) = part.strip_prefix('!') {
        return Ok(LabelReq::NotExists(label_key(key.trim())?));
    }
    if let Some(open) = part.find('(') {
        let inner = part[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("{part:?}: missing closing parenthesis"))?;
        let values = inner
            .split(',')
            .map(|v| label_value(v.trim()))
            .collect::<Result<Vec<_>, _>>()?;
        let head: Vec<&str> = part[..open].split_whitespace().collect();
        return match head[..] {
            [key, "in"] => Ok(LabelReq::In(label_key(key)?, values)),
            [key, "notin"] => Ok(LabelReq::NotIn(label_key(key)?, values)),
            _ => Err(format!("{part:?}: expected `key in (…)` or `key notin (…)`")),
        };
    }
    let split = |op: &str| part.split_once(op).map(|(k, v)| (k.trim(), v.trim()));
    if let Some((key, value)) = split("!=") {
        Ok(LabelReq::NotEq(label_key(key)?, label_value(value)?))
    } else if let Some((key, value)) = split("==").or_else(|| split("=")) {
        Ok(LabelReq::Eq(label_key(key)?, label_value(value)?))
    } else {
        Ok(LabelReq::Exists(label_key(part)?))
    }
}

fn parse_field_selector(kind: &Kind, selector: &str) -> ApiResult<Vec<FieldReq>> {
    let mut requirements = Vec::new();
    for part in selector.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let (label, value, negate) = if let Some((l, v)) = part.split_once("!=") {
            (l, v, true)
        } else if let Some((l, v)) = part.split_once("==").or_else(|| part.split_once('=')) {
            (l, v, false)
        } else {
            return Err(ApiError::bad_request(format!(
                "invalid selector: '{part}'; can't understand '{part}'"
            )));
        };
        let field = match label.trim() {
            "metadata.name" => Field::Name,
            "metadata.namespace" if kind.namespaced => Field::Namespace,
            other => {
                return Err(ApiError::bad_request(format!(
                    "field label not supported: {other}"
                )));
            }
        };
        requirements.push(FieldReq {
            field,
            value: value.trim().to_owned(),
            negate,
        });
    }
    Ok(requirements)
}
