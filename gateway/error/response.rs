//! A gateway error as the HTTP response the client reads, in its API's error shape: the
//! only place errors become responses (status, headers and body from `GatewayError`'s one
//! table).

use bytes::Bytes;
use http::{header, HeaderValue, Response};

use super::GatewayError;
use crate::body::{self, BoxBody};

/// Whose error shape a client reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ErrorDialect {
    /// `{"error": {"message", "type", "param", "code"}}` (OpenAI, SGLang, vLLM clients).
    #[default]
    OpenAi,
    /// `{"type": "error", "error": {"type", "message"}}` (the Anthropic SDK).
    Anthropic,
}

impl GatewayError {
    /// The error body in Anthropic's shape (`/v1/messages` clients): `{"type": "error",
    /// "error": {"type", "message"}, "request_id"}`, its type from the status
    /// (`anthropic::error_type`).
    pub fn to_anthropic_json(&self, request_id: Option<&str>) -> serde_json::Value {
        let mut body = crate::anthropic::error_body(self.status(), &self.client_message());
        if let (Some(id), Some(map)) = (request_id, body.as_object_mut()) {
            map.insert("request_id".into(), id.into());
        }
        body
    }

    /// The only place a gateway error becomes an HTTP response (OpenAI's error shape).
    pub fn into_response(self, request_id: Option<&str>) -> Response<BoxBody> {
        self.into_response_as(request_id, ErrorDialect::OpenAi)
    }

    /// [`Self::into_response`] in the error shape of the client's API.
    pub fn into_response_as(
        self,
        request_id: Option<&str>,
        dialect: ErrorDialect,
    ) -> Response<BoxBody> {
        let status = self.status();
        let json = match dialect {
            ErrorDialect::OpenAi => self.to_json(request_id),
            ErrorDialect::Anthropic => self.to_anthropic_json(request_id),
        };
        let body = Bytes::from(json.to_string());
        let mut response = Response::new(body::full(body));
        *response.status_mut() = status;
        let headers = response.headers_mut();
        headers.insert(
            header::CONTENT_TYPE,
            HeaderValue::from_static("application/json"),
        );
        match self {
            GatewayError::RateLimited { headers: extra, .. } => headers.extend(*extra),
            GatewayError::Unauthenticated => {
                headers.insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            }
            GatewayError::Overloaded { .. } => {
                headers.insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
            }
            // Refused before its body was read: the client is told the connection ends, so
            // its next request opens a new one instead of failing on this one.
            GatewayError::RouteNotFound {
                body_unread: true, ..
            }
            | GatewayError::MethodNotAllowed {
                body_unread: true, ..
            } => {
                headers.insert(header::CONNECTION, HeaderValue::from_static("close"));
            }
            GatewayError::NoEligibleWorker { retry_after, .. }
            | GatewayError::QueueRefused { retry_after, .. } => {
                // Whole seconds, rounded up, at least 1 and at most 5 minutes.
                let secs = retry_after.as_secs_f64().ceil().clamp(1.0, 300.0) as u64;
                headers.insert(header::RETRY_AFTER, HeaderValue::from(secs));
            }
            _ => {}
        }
        response
    }
}
