//! API errors and their `meta/v1 Status` bodies.

use super::Kind;
use serde_json::{json, Value};

/// An API error as kube-apiserver reports it: HTTP `code`, `reason` (`NotFound`,
/// `AlreadyExists`, `Conflict`, `Invalid`, `Expired`, `Gone`, `BadRequest`,
/// `MethodNotAllowed`, `Forbidden`, `UnsupportedMediaType`, `InternalError`,
/// `ServiceUnavailable`), `message` (printed by kubectl as
/// `Error from server (<reason>): <message>`) and optional `details`.
///
/// Message texts follow k8s.io/apimachinery `pkg/api/errors/errors.go`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code} {reason}: {message}")]
pub struct ApiError {
    /// HTTP status code.
    pub code: u16,
    /// `Status.reason`.
    pub reason: String,
    /// `Status.message`.
    pub message: String,
    /// `Status.details` (`{name, group?, kind, causes?}`).
    pub details: Option<Value>,
}

fn details(kind: Kind, name: &str) -> Value {
    let mut d = json!({"name": name, "kind": kind.plural()});
    if !kind.group().is_empty() {
        d["group"] = json!(kind.group());
    }
    d
}

impl ApiError {
    /// A bare error with no details.
    pub fn new(code: u16, reason: &str, message: impl Into<String>) -> ApiError {
        ApiError {
            code,
            reason: reason.to_string(),
            message: message.into(),
            details: None,
        }
    }

    /// 404 `pods "x" not found` (errors.NewNotFound).
    pub fn not_found(kind: Kind, name: &str) -> ApiError {
        ApiError {
            code: 404,
            reason: "NotFound".into(),
            message: format!("{} \"{}\" not found", kind.qualified_resource(), name),
            details: Some(details(kind, name)),
        }
    }

    /// 404 for an unknown path: `the server could not find the requested resource`.
    pub fn no_route() -> ApiError {
        ApiError {
            code: 404,
            reason: "NotFound".into(),
            message: "the server could not find the requested resource".into(),
            details: Some(json!({})),
        }
    }

    /// 409 `pods "x" already exists` (errors.NewAlreadyExists).
    pub fn already_exists(kind: Kind, name: &str) -> ApiError {
        ApiError {
            code: 409,
            reason: "AlreadyExists".into(),
            message: format!("{} \"{}\" already exists", kind.qualified_resource(), name),
            details: Some(details(kind, name)),
        }
    }

    /// 409 `Operation cannot be fulfilled on pods "x": <why>` (errors.NewConflict).
    pub fn conflict(kind: Kind, name: &str, why: &str) -> ApiError {
        ApiError {
            code: 409,
            reason: "Conflict".into(),
            message: format!(
                "Operation cannot be fulfilled on {} \"{}\": {}",
                kind.qualified_resource(),
                name,
                why
            ),
            details: Some(details(kind, name)),
        }
    }

    /// 422 `Pod "x" is invalid: <field>: <msg>` (errors.NewInvalid; the kind is
    /// group-qualified as `schema.GroupKind.String()` prints it, e.g.
    /// `NetworkPolicy.networking.k8s.io "x" is invalid: …`); `causes` are
    /// `(reason, field, message)`, e.g. `("FieldValueRequired", "spec.containers",
    /// "Required value")`.
    pub fn invalid(kind: Kind, name: &str, causes: &[(String, String, String)]) -> ApiError {
        let texts: Vec<String> = causes
            .iter()
            .map(|(_, field, msg)| format!("{field}: {msg}"))
            .collect();
        let joined = if texts.len() == 1 {
            texts[0].clone()
        } else {
            format!("[{}]", texts.join(", "))
        };
        let mut d = json!({"name": name, "kind": kind.kind_name()});
        let qualified = if kind.group().is_empty() {
            kind.kind_name().to_string()
        } else {
            d["group"] = json!(kind.group());
            format!("{}.{}", kind.kind_name(), kind.group())
        };
        d["causes"] = Value::Array(
            causes
                .iter()
                .map(|(reason, field, msg)| json!({"reason": reason, "message": msg, "field": field}))
                .collect(),
        );
        ApiError {
            code: 422,
            reason: "Invalid".into(),
            message: format!("{qualified} \"{name}\" is invalid: {joined}"),
            details: Some(d),
        }
    }

    /// 403 `pods "x" is forbidden: <why>` (errors.NewForbidden).
    pub fn forbidden(kind: Kind, name: &str, why: &str) -> ApiError {
        let message = if name.is_empty() {
            format!("{} is forbidden: {}", kind.qualified_resource(), why)
        } else {
            format!(
                "{} \"{}\" is forbidden: {}",
                kind.qualified_resource(),
                name,
                why
            )
        };
        ApiError {
            code: 403,
            reason: "Forbidden".into(),
            message,
            details: Some(details(kind, name)),
        }
    }

    /// 410 `Expired` as sent in a watch ERROR event
    /// (`prober/tests/fixtures/k8s-watch-error-410.jsonl`): `too old resource version: N (M)`.
    pub fn expired(requested: u64, oldest: u64) -> ApiError {
        ApiError::new(
            410,
            "Expired",
            format!("too old resource version: {requested} ({oldest})"),
        )
    }

    /// 400 BadRequest.
    pub fn bad_request(message: impl Into<String>) -> ApiError {
        ApiError::new(400, "BadRequest", message)
    }

    /// 405 MethodNotAllowed (`the server does not allow this method on the requested resource`).
    pub fn method_not_allowed() -> ApiError {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    /// 500 InternalError.
    pub fn internal(message: impl Into<String>) -> ApiError {
        ApiError::new(500, "InternalError", message)
    }

    /// The `meta/v1 Status` body exactly as kube-apiserver sends it (field order and
    /// shape of `prober/tests/fixtures/k8s-status-409-alreadyexists.json`).
    pub fn status_json(&self) -> Value {
        let mut v = serde_json::Map::new();
        v.insert("kind".into(), json!("Status"));
        v.insert("apiVersion".into(), json!("v1"));
        v.insert("metadata".into(), json!({}));
        v.insert("status".into(), json!("Failure"));
        v.insert("message".into(), json!(self.message));
        v.insert("reason".into(), json!(self.reason));
        if let Some(d) = &self.details {
            v.insert("details".into(), d.clone());
        }
        v.insert("code".into(), json!(self.code));
        Value::Object(v)
    }
}
