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

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    fn with_details(mut self, details: Value) -> Self {
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
    pub fn invalid(kind: &Kind, name: &str, field: &str, cause: &str, detail: &str) -> Self {
        let message = format!(
            "{} \"{name}\" is invalid: {field}: {detail}",
            kind.qualified_kind()
        );
        let mut details = Self::details(kind, name, kind.kind);
        details.insert(
            "causes".into(),
            json!([{"reason": cause, "message": detail, "field": field}]),
        );
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
