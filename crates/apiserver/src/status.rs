//! API errors rendered as Kubernetes `Status` objects.
//!
//! Every failure a client can see goes through [`ApiError`], so the HTTP
//! code, the `reason` and the `Status` body always agree, exactly as
//! kube-apiserver reports them (clients such as kubectl and kube-rs branch
//! on `reason` and `code`, not on the message).

use cozyplane_api::kinds::FieldError;
use cozyplane_errors::Chain;
use cozyplane_store::StoreError;
use serde_json::{json, Value};

/// One `details.causes[]` entry of a `Status`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cause {
    pub reason: String,
    pub message: String,
    pub field: String,
}

impl From<&FieldError> for Cause {
    fn from(e: &FieldError) -> Self {
        Cause {
            reason: e.kind.reason().to_string(),
            message: e.message.clone(),
            field: e.field.clone(),
        }
    }
}

/// `Status.details`: what the error is about.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Details {
    pub name: Option<String>,
    pub group: Option<String>,
    pub kind: Option<String>,
    pub causes: Vec<Cause>,
    /// `retryAfterSeconds`, also sent as the `Retry-After` header.
    pub retry_after_seconds: Option<u32>,
}

/// A failed API request: HTTP code + kube `reason` + message (+ details).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    /// Boxed: errors travel through every `Result` of the request path.
    pub details: Box<Details>,
}

impl ApiError {
    /// An error with an explicit code and reason.
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: Box::default(),
        }
    }

    pub fn with_details(mut self, group: &str, kind: &str, name: &str) -> Self {
        self.details.group = Some(group.to_string());
        self.details.kind = Some(kind.to_string());
        self.details.name = Some(name.to_string());
        self
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> Self {
        Self::new(400, "BadRequest", message)
    }

    /// 404 NotFound for an object: `vpcs.sdn.cozystack.io "x" not found`.
    pub fn not_found(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("{} \"{name}\" not found", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// 404 NotFound for an unknown path or resource.
    pub fn no_route(path: &str) -> Self {
        Self::new(
            404,
            "NotFound",
            format!("the server could not find the requested resource ({path})"),
        )
    }

    /// 409 AlreadyExists.
    pub fn already_exists(group: &str, plural: &str, name: &str) -> Self {
        Self::new(
            409,
            "AlreadyExists",
            format!("{} \"{name}\" already exists", qualified(group, plural)),
        )
        .with_details(group, plural, name)
    }

    /// 409 Conflict on a stale resourceVersion (optimistic concurrency).
    pub fn conflict(group: &str, plural: &str, name: &str, why: &str) -> Self {
        Self::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {} \"{name}\": {why}",
                qualified(group, plural)
            ),
        )
        .with_details(group, plural, name)
    }

    /// 409 Conflict with the standard "object has been modified" text.
    pub fn modified(group: &str, plural: &str, name: &str) -> Self {
        Self::conflict(
            group,
            plural,
            name,
            "the object has been modified; please apply your changes to the latest version and try again",
        )
    }

    /// 422 Invalid with one cause per field error.
    pub fn invalid(group: &str, kind: &str, name: &str, errors: &[FieldError]) -> Self {
        let summary: Vec<String> = errors
            .iter()
            .map(|e| format!("{}: {}", e.field, e.message))
            .collect();
        let mut err = Self::new(
            422,
            "Invalid",
            format!(
                "{kind}.{group} \"{name}\" is invalid: {}",
                summary.join(", ")
            ),
        )
        .with_details(group, kind, name);
        err.details.causes = errors.iter().map(Cause::from).collect();
        err
    }

    /// 410 Expired (a compacted resourceVersion or continue token).
    pub fn expired(message: impl Into<String>) -> Self {
        Self::new(410, "Expired", message)
    }

    /// 413 RequestEntityTooLarge.
    pub fn too_large(limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!("the request body exceeds the limit of {limit} bytes"),
        )
    }

    /// 413 RequestEntityTooLarge for a write whose result would be larger
    /// than the server stores.
    pub fn object_too_large(size: usize, limit: usize) -> Self {
        Self::new(
            413,
            "RequestEntityTooLarge",
            format!(
                "the object would be {size} bytes encoded, more than the limit of {limit} bytes"
            ),
        )
    }

    /// 422 Invalid for a write whose result would be nested deeper than
    /// the server stores.
    pub fn too_deep(limit: usize) -> Self {
        Self::new(
            422,
            "Invalid",
            format!("the object would be nested more than the limit of {limit} levels deep"),
        )
    }

    /// 415 UnsupportedMediaType.
    pub fn unsupported_media_type(ct: &str) -> Self {
        Self::new(415, "UnsupportedMediaType", format!("the body of the request was in an unknown format - accepted media types include: application/json, application/yaml, application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json, application/apply-patch+yaml (got {ct:?})"))
    }

    /// 406 NotAcceptable.
    pub fn not_acceptable(message: impl Into<String>) -> Self {
        Self::new(406, "NotAcceptable", message)
    }

    /// 405 MethodNotAllowed.
    pub fn method_not_allowed(method: &str) -> Self {
        Self::new(
            405,
            "MethodNotAllowed",
            format!("the server does not allow this method on the requested resource ({method})"),
        )
    }

    /// 403 Forbidden from the authorizer.
    pub fn forbidden(message: impl Into<String>) -> Self {
        Self::new(403, "Forbidden", message)
    }

    /// 401 Unauthorized from the authenticator.
    pub fn unauthorized() -> Self {
        Self::new(401, "Unauthorized", "Unauthorized")
    }

    /// 504 Timeout for a resourceVersion the store has not reached.
    pub fn too_large_resource_version(requested: u64, current: u64) -> Self {
        let mut e = Self::new(
            504,
            "Timeout",
            format!("Too large resource version: {requested}, current: {current}"),
        );
        e.details.causes.push(Cause {
            reason: "ResourceVersionTooLarge".into(),
            message: "Too large resource version".into(),
            field: String::new(),
        });
        e
    }

    /// 429 TooManyRequests with `retryAfterSeconds` (and a `Retry-After`
    /// header), as kube-apiserver's max-in-flight filter answers.
    pub fn too_many_requests(message: impl Into<String>, retry_after_seconds: u32) -> Self {
        let mut e = Self::new(429, "TooManyRequests", message);
        e.details.retry_after_seconds = Some(retry_after_seconds);
        e
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(500, "InternalError", message)
    }

    /// 503 ServiceUnavailable (storage unreachable).
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(503, "ServiceUnavailable", message)
    }

    /// Map a storage error that has no request-specific meaning.
    pub fn from_store(e: StoreError) -> Self {
        match e {
            StoreError::Compacted {
                requested,
                compacted,
            } => Self::expired(format!(
                "too old resource version: {requested} ({compacted})"
            )),
            StoreError::FutureRevision { requested, current } => {
                Self::too_large_resource_version(requested, current)
            }
            StoreError::Backend(m) => Self::unavailable(format!("storage backend: {m}")),
            StoreError::Unavailable(fault) => {
                Self::unavailable(format!("storage backend: {fault}"))
            }
            other => Self::internal(Chain(&other).to_string()),
        }
    }

    /// The `Status` object for this error.
    pub fn to_status(&self) -> Value {
        let mut status = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        let mut details = serde_json::Map::new();
        let d = &self.details;
        if let Some(n) = &d.name {
            details.insert("name".into(), json!(n));
        }
        if let Some(g) = &d.group {
            details.insert("group".into(), json!(g));
        }
        if let Some(k) = &d.kind {
            details.insert("kind".into(), json!(k));
        }
        if let Some(s) = d.retry_after_seconds {
            details.insert("retryAfterSeconds".into(), json!(s));
        }
        if !d.causes.is_empty() {
            let causes: Vec<Value> = d
                .causes
                .iter()
                .map(|c| json!({"reason": c.reason, "message": c.message, "field": c.field}))
                .collect();
            details.insert("causes".into(), Value::Array(causes));
        }
        if !details.is_empty() {
            status["details"] = Value::Object(details);
        }
        status
    }
}

/// A `Status` object reporting success (deleteCollection, some deletes).
pub fn success_status(group: &str, plural: &str, name: Option<&str>) -> Value {
    let mut details = json!({"group": group, "kind": plural});
    if let Some(n) = name {
        details["name"] = json!(n);
    }
    json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Success", "details": details})
}

/// `vpcs.sdn.cozystack.io`, or just `pods` for the core group.
pub fn qualified(group: &str, plural: &str) -> String {
    if group.is_empty() {
        plural.to_string()
    } else {
        format!("{plural}.{group}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cozyplane_api::kinds::FieldErrorType;

    #[test]
    fn invalid_status_carries_causes() {
        let errs = vec![FieldError::new(
            FieldErrorType::Invalid,
            "spec.mtu",
            "must be between 576 and 9000",
        )];
        let s = ApiError::invalid("sdn.cozystack.io", "VPC", "a", &errs).to_status();
        assert_eq!(s["code"], 422);
        assert_eq!(s["reason"], "Invalid");
        assert_eq!(s["details"]["causes"][0]["field"], "spec.mtu");
        assert_eq!(s["details"]["causes"][0]["reason"], "FieldValueInvalid");
        assert!(s["message"]
            .as_str()
            .is_some_and(|m| m.contains("VPC.sdn.cozystack.io \"a\" is invalid")));
    }

    #[test]
    fn not_found_message_is_kube_style() {
        let s = ApiError::not_found("", "pods", "p").to_status();
        assert_eq!(s["message"], "pods \"p\" not found");
        assert_eq!(s["status"], "Failure");
        assert_eq!(s["apiVersion"], "v1");
    }

    #[test]
    fn too_many_requests_says_when_to_retry() {
        let s = ApiError::too_many_requests("slow down", 1).to_status();
        assert_eq!(
            (s["code"].as_u64(), s["reason"].as_str()),
            (Some(429), Some("TooManyRequests"))
        );
        assert_eq!(s["details"]["retryAfterSeconds"], 1);
    }

    #[test]
    fn compacted_maps_to_410_expired() {
        let e = ApiError::from_store(StoreError::Compacted {
            requested: 3,
            compacted: 9,
        });
        assert_eq!((e.code, e.reason), (410, "Expired"));
    }
}
