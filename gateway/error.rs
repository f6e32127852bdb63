//! The gateway's error type and the one place where an error becomes an HTTP response.
//!
//! Every stage returns a [`GatewayError`] (directly or boxed through a tower combinator);
//! the rescue layer at the top of the stack calls [`GatewayError::into_response`], so the
//! status code and the OpenAI-style body `{"error":{"message","type","param","code"}}` are
//! chosen here and nowhere else.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use serde_json::json;
use std::time::Duration;

use crate::body::{self, BoxBody, BoxError};

/// Where a failure came from; decides the status class (the pingora model).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorSource {
    /// The client sent something we refuse (4xx).
    Downstream,
    /// An engine failed or answered badly (5xx, or the engine's own 4xx kept).
    Upstream,
    /// A bug or resource problem inside the gateway (500).
    Internal,
}

/// Everything that can end a request early.
#[derive(Debug, thiserror::Error)]
pub enum GatewayError {
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    #[error("Unknown route {method} {path}")]
    RouteNotFound { method: String, path: String },
    #[error("Method {method} is not allowed on {path}")]
    MethodNotAllowed { method: String, path: String },
    #[error("The model `{model}` does not exist or you do not have access to it.")]
    ModelNotFound { model: String },
    /// Admission refused the prompt (I2): no pool could hold it.
    #[error(transparent)]
    ContextLengthExceeded(Box<crate::stack::admission::PromptTooLong>),
    /// A tenant limit refused the request (429, or 400 when it can never fit).
    #[error("{}", rate_limit_message(decision))]
    RateLimited {
        decision: Box<crate::stack::rate_limit::limiter::Decision>,
    },
    #[error("Tenant `{tenant}` may not use model `{model}`.")]
    ModelNotAllowed { tenant: String, model: String },
    #[error("Request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error(
        "Incorrect or missing API key. Send it as `Authorization: Bearer <key>` or `x-api-key`."
    )]
    Unauthenticated,
    #[error("No eligible worker for model `{model}`: {reason}")]
    NoEligibleWorker { model: String, reason: String },
    #[error("The gateway is shutting down")]
    Draining,
    #[error("Upstream {role} worker {worker} of pool `{pool}` is unreachable: {detail}")]
    UpstreamUnavailable {
        pool: String,
        role: &'static str,
        worker: String,
        detail: String,
    },
    #[error("Upstream {role} worker {worker} of pool `{pool}` did not answer within {timeout:?}")]
    UpstreamTimeout {
        pool: String,
        role: &'static str,
        worker: String,
        timeout: Duration,
    },
    /// The engine answered with a non-2xx status; its 4xx and 503 are kept, other codes become 502.
    #[error("Upstream {role} worker of pool `{pool}` answered {status}: {message}")]
    UpstreamStatus {
        pool: String,
        role: &'static str,
        status: StatusCode,
        message: String,
    },
    #[error("Upstream {role} worker of pool `{pool}` sent an unreadable response: {detail}")]
    UpstreamProtocol {
        pool: String,
        role: &'static str,
        detail: String,
    },
    /// The engine aborted the request (I1): its own status is kept when it gave one.
    #[error("The engine aborted the request: {message}")]
    UpstreamAborted {
        pool: String,
        status: Option<StatusCode>,
        message: String,
    },
    /// The answer failed a check (placeholder marker, prompt-count mismatch, empty or cut
    /// result) and was not delivered (I1).
    #[error(
        "The engine's answer failed kvgate's integrity check ({reason}) and was not delivered."
    )]
    UpstreamIntegrity { pool: String, reason: String },
    #[error("Internal error: {0}")]
    Internal(String),
}

fn rate_limit_message(decision: &crate::stack::rate_limit::limiter::Decision) -> String {
    use crate::stack::rate_limit::limiter::Denied;
    match decision.denied_by {
        Some(Denied::Requests) => "Rate limit reached for requests per minute; retry after the Retry-After delay.".into(),
        Some(Denied::Tokens) => "Rate limit reached for tokens per minute; retry after the Retry-After delay.".into(),
        Some(Denied::TokensOverBudget) => "This request needs more tokens than this tenant's whole per-minute budget; lower max_tokens or shorten the prompt.".into(),
        Some(Denied::Concurrency) => "Too many concurrent requests for this tenant; retry when one finishes.".into(),
        Some(Denied::StoreUnavailable) | None => "Rate limits cannot be checked right now; retry shortly.".into(),
    }
}

impl From<crate::stack::admission::PromptTooLong> for GatewayError {
    fn from(refusal: crate::stack::admission::PromptTooLong) -> Self {
        GatewayError::ContextLengthExceeded(Box::new(refusal))
    }
}

impl GatewayError {
    /// A 400 for a request the gateway cannot read.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        GatewayError::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// Which side of the proxy caused this.
    pub fn source_side(&self) -> ErrorSource {
        use GatewayError::*;
        match self {
            InvalidRequest { .. }
            | RouteNotFound { .. }
            | MethodNotAllowed { .. }
            | ModelNotFound { .. }
            | ContextLengthExceeded(_)
            | ModelNotAllowed { .. }
            | RateLimited { .. }
            | BodyTooLarge { .. }
            | Unauthenticated => ErrorSource::Downstream,
            NoEligibleWorker { .. }
            | UpstreamUnavailable { .. }
            | UpstreamTimeout { .. }
            | UpstreamStatus { .. }
            | UpstreamAborted { .. }
            | UpstreamIntegrity { .. }
            | UpstreamProtocol { .. } => ErrorSource::Upstream,
            Draining | Internal(_) => ErrorSource::Internal,
        }
    }

    /// The HTTP status the client sees.
    pub fn status(&self) -> StatusCode {
        use GatewayError::*;
        match self {
            InvalidRequest { .. } | ContextLengthExceeded(_) => StatusCode::BAD_REQUEST,
            RouteNotFound { .. } | ModelNotFound { .. } => StatusCode::NOT_FOUND,
            MethodNotAllowed { .. } => StatusCode::METHOD_NOT_ALLOWED,
            BodyTooLarge { .. } => StatusCode::PAYLOAD_TOO_LARGE,
            Unauthenticated => StatusCode::UNAUTHORIZED,
            ModelNotAllowed { .. } => StatusCode::FORBIDDEN,
            RateLimited { decision }
                if decision.denied_by
                    == Some(crate::stack::rate_limit::limiter::Denied::TokensOverBudget) =>
            {
                StatusCode::BAD_REQUEST
            }
            RateLimited { .. } => StatusCode::TOO_MANY_REQUESTS,
            NoEligibleWorker { .. } | Draining => StatusCode::SERVICE_UNAVAILABLE,
            UpstreamUnavailable { .. } | UpstreamProtocol { .. } => StatusCode::BAD_GATEWAY,
            UpstreamTimeout { .. } => StatusCode::GATEWAY_TIMEOUT,
            UpstreamStatus { status, .. } => {
                if status.is_client_error() || *status == StatusCode::SERVICE_UNAVAILABLE {
                    *status
                } else {
                    StatusCode::BAD_GATEWAY
                }
            }
            // An abort keeps the engine's error status; one that claims success never does.
            UpstreamAborted {
                status: Some(status),
                ..
            } if status.is_client_error() || status.is_server_error() => *status,
            UpstreamAborted { .. } | UpstreamIntegrity { .. } => StatusCode::BAD_GATEWAY,
            Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
        }
    }

    /// The OpenAI `error.type` field.
    pub fn error_type(&self) -> &'static str {
        use GatewayError::*;
        match self {
            InvalidRequest { .. }
            | RouteNotFound { .. }
            | MethodNotAllowed { .. }
            | ModelNotFound { .. }
            | ContextLengthExceeded(_)
            | BodyTooLarge { .. } => "invalid_request_error",
            Unauthenticated => "authentication_error",
            ModelNotAllowed { .. } => "permission_error",
            RateLimited { decision }
                if decision.denied_by
                    == Some(crate::stack::rate_limit::limiter::Denied::TokensOverBudget) =>
            {
                "invalid_request_error"
            }
            RateLimited { .. } => "rate_limit_error",
            UpstreamStatus { status, .. } if status.is_client_error() => "invalid_request_error",
            UpstreamAborted {
                status: Some(status),
                ..
            } if status.is_client_error() => "invalid_request_error",
            NoEligibleWorker { .. } | Draining => "service_unavailable",
            UpstreamUnavailable { .. }
            | UpstreamTimeout { .. }
            | UpstreamStatus { .. }
            | UpstreamAborted { .. }
            | UpstreamIntegrity { .. }
            | UpstreamProtocol { .. } => "upstream_error",
            Internal(_) => "internal_error",
        }
    }

    /// The OpenAI `error.code` field; also the low-cardinality `kind` metric label.
    pub fn code(&self) -> &'static str {
        use GatewayError::*;
        match self {
            InvalidRequest { .. } => "invalid_request",
            RouteNotFound { .. } => "not_found",
            MethodNotAllowed { .. } => "method_not_allowed",
            ModelNotFound { .. } => "model_not_found",
            ContextLengthExceeded(_) => "context_length_exceeded",
            BodyTooLarge { .. } => "request_too_large",
            Unauthenticated => "invalid_api_key",
            ModelNotAllowed { .. } => "model_not_allowed",
            RateLimited { decision } => match decision.denied_by {
                Some(crate::stack::rate_limit::limiter::Denied::TokensOverBudget) => {
                    "tokens_exceed_rate_limit"
                }
                Some(crate::stack::rate_limit::limiter::Denied::Concurrency) => {
                    "concurrency_limit_exceeded"
                }
                Some(crate::stack::rate_limit::limiter::Denied::StoreUnavailable) => {
                    "rate_limit_unavailable"
                }
                _ => "rate_limit_exceeded",
            },
            NoEligibleWorker { .. } => "no_eligible_worker",
            Draining => "draining",
            UpstreamUnavailable { .. } => "upstream_unavailable",
            UpstreamTimeout { .. } => "upstream_timeout",
            UpstreamStatus { .. } => "upstream_status",
            UpstreamProtocol { .. } => "upstream_protocol_error",
            UpstreamAborted { .. } => "upstream_aborted",
            UpstreamIntegrity { .. } => "upstream_integrity_error",
            Internal(_) => "internal_error",
        }
    }

    fn param(&self) -> Option<&str> {
        match self {
            GatewayError::InvalidRequest { param, .. } => param.as_deref(),
            GatewayError::ModelNotFound { .. } | GatewayError::ModelNotAllowed { .. } => {
                Some("model")
            }
            GatewayError::ContextLengthExceeded(p) => Some(p.param),
            _ => None,
        }
    }

    /// The JSON error object (without the HTTP wrapping), also used for SSE error events.
    pub fn to_json(&self) -> serde_json::Value {
        json!({
            "error": {
                "message": self.to_string(),
                "type": self.error_type(),
                "param": self.param(),
                "code": self.code(),
            }
        })
    }

    /// The only place a gateway error becomes an HTTP response.
    pub fn into_response(self) -> Response<BoxBody> {
        let status = self.status();
        let body = Bytes::from(self.to_json().to_string());
        let mut response = Response::new(body::full(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        if let GatewayError::RateLimited { decision } = &self {
            crate::stack::rate_limit::insert_headers(headers, decision);
            let secs = decision.retry_after.as_secs_f64().ceil().max(1.0) as u64;
            if let Ok(v) = HeaderValue::from_str(&secs.to_string()) {
                headers.insert(header::RETRY_AFTER, v);
            }
        }
        if matches!(self, GatewayError::Unauthenticated) {
            headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }

    /// Recover a `GatewayError` from a boxed error raised through a tower combinator.
    /// Anything unknown is an internal error (never a silently dropped connection).
    pub fn from_boxed(error: BoxError) -> Self {
        match error.downcast::<GatewayError>() {
            Ok(e) => *e,
            Err(other) => GatewayError::Internal(other.to_string()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn upstream_client_errors_keep_their_status_and_server_errors_become_502() {
        let e = |status| GatewayError::UpstreamStatus {
            pool: "p".into(),
            role: "decode",
            status,
            message: "m".into(),
        };
        assert_eq!(e(StatusCode::BAD_REQUEST).status(), StatusCode::BAD_REQUEST);
        assert_eq!(
            e(StatusCode::SERVICE_UNAVAILABLE).status(),
            StatusCode::SERVICE_UNAVAILABLE
        );
        assert_eq!(
            e(StatusCode::INTERNAL_SERVER_ERROR).status(),
            StatusCode::BAD_GATEWAY
        );
    }

    #[test]
    fn error_body_has_the_openai_shape() {
        let v = GatewayError::ModelNotFound { model: "x".into() }.to_json();
        assert_eq!(v["error"]["code"], "model_not_found");
        assert_eq!(v["error"]["param"], "model");
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert!(v["error"]["message"].as_str().is_some());
    }

    #[test]
    fn unknown_boxed_errors_are_internal() {
        let boxed: BoxError = "boom".into();
        assert!(matches!(
            GatewayError::from_boxed(boxed),
            GatewayError::Internal(_)
        ));
        let boxed: BoxError = Box::new(GatewayError::Unauthenticated);
        assert!(matches!(
            GatewayError::from_boxed(boxed),
            GatewayError::Unauthenticated
        ));
    }
}
