//! Anthropic's error shape and the mapping from HTTP status to its `error.type`.
//!
//! Anthropic answers every error as `{"type": "error", "error": {"type", "message"}}`; the
//! `type` follows the status (docs.claude.com/en/api/errors, "HTTP errors": 400
//! `invalid_request_error`, 401 `authentication_error`, 403 `permission_error`, 404
//! `not_found_error`, 413 `request_too_large`, 429 `rate_limit_error`, 500 `api_error`, 529
//! `overloaded_error`; "other 4XX status codes" use `invalid_request_error`). 402
//! `billing_error` and 504 `timeout_error` appear in newer versions of that page and in the
//! SDKs' error classes (unverified against the page itself); 502 maps to `api_error` and 503
//! to `overloaded_error` because Anthropic has no type of its own for them.

use http::StatusCode;
use serde_json::{json, Value};

/// Why a translation failed. Request problems are the client's (400, naming the field);
/// reply problems are the engine's (502): a reply the gateway cannot translate faithfully is
/// never passed on as a success.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AnthropicError {
    /// A field is missing, has the wrong type or an invalid value. `path` names it the way
    /// Anthropic's own errors do: `messages.1.content.0.type`.
    #[error("{path}: {message}")]
    InvalidRequest { path: String, message: String },
    /// A field Anthropic documents but the gateway cannot honour on an inference engine
    /// (fail-closed: silently ignoring it would change what the client asked for).
    #[error("{path}: {reason}")]
    Unsupported { path: String, reason: String },
    /// The engine's chat completion (or one stream chunk) could not be translated.
    #[error("the engine's reply could not be translated: {0}")]
    Upstream(String),
}

// === impl AnthropicError ===

impl AnthropicError {
    /// An invalid value at `path`, with the fix in `message`.
    pub fn invalid(path: impl Into<String>, message: impl Into<String>) -> Self {
        Self::InvalidRequest {
            path: path.into(),
            message: message.into(),
        }
    }

    /// A documented field the gateway refuses, with the reason.
    pub fn unsupported(path: impl Into<String>, reason: impl Into<String>) -> Self {
        Self::Unsupported {
            path: path.into(),
            reason: reason.into(),
        }
    }

    /// The HTTP status this error answers with.
    pub fn status(&self) -> StatusCode {
        match self {
            Self::InvalidRequest { .. } | Self::Unsupported { .. } => StatusCode::BAD_REQUEST,
            Self::Upstream(_) => StatusCode::BAD_GATEWAY,
        }
    }

    /// Anthropic's error body for this error.
    pub fn body(&self) -> Value {
        error_body(self.status(), &self.to_string())
    }
}

/// Anthropic's `error.type` for an HTTP status.
pub fn error_type(status: StatusCode) -> &'static str {
    match status.as_u16() {
        401 => "authentication_error",
        402 => "billing_error",
        403 => "permission_error",
        404 => "not_found_error",
        413 => "request_too_large",
        429 => "rate_limit_error",
        503 | 529 => "overloaded_error",
        504 => "timeout_error",
        400..=499 => "invalid_request_error",
        _ => "api_error",
    }
}

/// Anthropic's error body: `{"type": "error", "error": {"type": <t>, "message": <m>}}`.
pub fn error_body(status: StatusCode, message: &str) -> Value {
    json!({"type": "error", "error": {"type": error_type(status), "message": message}})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_map_to_anthropic_types() {
        let cases = [
            (400, "invalid_request_error"),
            (401, "authentication_error"),
            (403, "permission_error"),
            (404, "not_found_error"),
            (405, "invalid_request_error"),
            (413, "request_too_large"),
            (429, "rate_limit_error"),
            (500, "api_error"),
            (502, "api_error"),
            (503, "overloaded_error"),
            (504, "timeout_error"),
            (529, "overloaded_error"),
        ];
        for (code, t) in cases {
            let status = StatusCode::from_u16(code).unwrap();
            assert_eq!(error_type(status), t, "{code}");
        }
    }

    #[test]
    fn body_has_anthropic_shape() {
        let body = error_body(StatusCode::TOO_MANY_REQUESTS, "slow down");
        assert_eq!(
            body,
            json!({"type": "error", "error": {"type": "rate_limit_error", "message": "slow down"}})
        );
    }

    #[test]
    fn errors_name_their_field() {
        let e = AnthropicError::invalid("messages.1.content.0.type", "unknown block type `x`");
        assert_eq!(e.status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            e.body()["error"]["message"],
            "messages.1.content.0.type: unknown block type `x`"
        );
        let up = AnthropicError::Upstream("bad".into());
        assert_eq!(up.body()["error"]["type"], "api_error");
    }
}
