//! Errors as the real server reports them: a metav1.Status with the HTTP code, reason and details.

use serde_json::{Map, Value, json};

use super::kinds::Kind;

#[derive(Debug)]
pub(super) struct ApiError {
    pub code: u16,
    /// Empty for StatusReasonUnknown.
    reason: &'static str,
    message: String,
    details: Option<Value>,
}

pub(super) type ApiResult<T> = Result<T, ApiError>;

/// One field's error (field.Error): `cause` is the metav1.CauseType, `detail` what follows the field path,
/// such as `Invalid value: "string": must be …`.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct FieldError {
    pub field: String,
    pub cause: &'static str,
    pub detail: String,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    /// The details naming one object; `kind_field` is what the real server puts in `kind` (the resource or the
    /// kind, depending on the error).
    pub fn details(kind: &Kind, name: &str, kind_field: &str) -> Map<String, Value> {
        let mut details = Map::new();
        details.insert("name".into(), name.into());
        if !kind.group.is_empty() {
            details.insert("group".into(), kind.group.into());
        }
        details.insert("kind".into(), kind_field.into());
        details
    }

    pub fn not_found(kind: &Kind, name: &str) -> Self {
        let message = format!("{} \"{name}\" not found", kind.qualified());
        Self::new(404, "NotFound", message).with_details(Self::details(kind, name, kind.plural).into())
    }

    pub fn already_exists(kind: &Kind, name: &str) -> Self {
        let message = format!("{} \"{name}\" already exists", kind.qualified());
        Self::new(409, "AlreadyExists", message).with_details(Self::details(kind, name, kind.plural).into())
    }

    pub fn conflict(kind: &Kind, name: &str, why: &str) -> Self {
        let message = format!(
            "Operation cannot be fulfilled on {} \"{name}\": {why}",
            kind.qualified()
        );
        Self::new(409, "Conflict", message).with_details(Self::details(kind, name, kind.plural).into())
    }

    /// A field error: `cause` is the metav1.CauseType (FieldValueInvalid, FieldValueForbidden, …).
    pub fn invalid(kind: &Kind, name: &str, field: &str, cause: &'static str, detail: &str) -> Self {
        Self::invalid_fields(
            kind,
            name,
            &[FieldError {
                field: field.to_owned(),
                cause,
                detail: detail.to_owned(),
            }],
        )
    }

    /// Several field errors in one 422, one cause each, as apierrors.NewInvalid aggregates them: the message
    /// lists them in brackets when there is more than one.
    pub fn invalid_fields(kind: &Kind, name: &str, errors: &[FieldError]) -> Self {
        let shown: Vec<String> = errors
            .iter()
            .map(|error| format!("{}: {}", error.field, error.detail))
            .collect();
        let listed = match shown.as_slice() {
            [one] => one.clone(),
            many => format!("[{}]", many.join(", ")),
        };
        let message = format!("{} \"{name}\" is invalid: {listed}", kind.qualified_kind());
        let causes: Vec<Value> = errors
            .iter()
            .map(|error| json!({"reason": error.cause, "message": error.detail, "field": error.field}))
            .collect();
        let mut details = Self::details(kind, name, kind.kind);
        details.insert("causes".into(), causes.into());
        Self::new(422, "Invalid", message).with_details(details.into())
    }

    /// A 422 the way the patch handler reports a patch it cannot apply.
    pub fn unprocessable(detail: impl Into<String>) -> Self {
        let message = "the server rejected our request due to an error in our request";
        Self::new(422, "Invalid", message).with_details(json!({"causes": [{"message": detail.into()}]}))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// What the test server refuses rather than ignore, so that no test silently depends on it.
    pub fn unsupported(what: &str) -> Self {
        Self::bad_request(format!("{what} is not supported by the test API server"))
    }

    pub fn method_not_allowed(message: impl Into<String>) -> Self {
        Self::new(405, "MethodNotAllowed", message)
    }

    pub fn no_such_resource() -> Self {
        Self::new(
            404,
            "NotFound",
            "the server could not find the requested resource",
        )
        .with_details(json!({}))
    }

    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    pub fn unavailable(why: &str) -> Self {
        Self::new(
            503,
            "ServiceUnavailable",
            format!("the API server is down ({why})"),
        )
    }

    /// A fault injected by a test, with the reason the real server gives that code.
    pub fn injected(code: u16, verb: &str, resource: &str) -> Self {
        let reason = match code {
            400 => "BadRequest",
            401 => "Unauthorized",
            403 => "Forbidden",
            404 => "NotFound",
            405 => "MethodNotAllowed",
            409 => "Conflict",
            410 => "Expired",
            415 => "UnsupportedMediaType",
            422 => "Invalid",
            429 => "TooManyRequests",
            500 => "InternalError",
            503 => "ServiceUnavailable",
            504 => "Timeout",
            _ => "",
        };
        let message = format!("injected fault: {verb} {resource} answers {code}");
        Self::new(code, reason, message)
    }

    pub fn status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "code": self.code,
        });
        if !self.reason.is_empty() {
            status["reason"] = self.reason.into();
        }
        if let Some(details) = &self.details {
            status["details"] = details.clone();
        }
        status
    }
}

pub(super) fn bad_json(error: serde_json::Error) -> ApiError {
    ApiError::bad_request(format!("the request body is not valid JSON: {error}"))
}
