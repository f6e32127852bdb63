//! The gateway's error type and the one place where an error becomes an HTTP response.
//!
//! Every stage returns a [`GatewayError`] (directly or boxed through a tower combinator);
//! the rescue layer at the top of the stack calls [`GatewayError::into_response`], so the
//! status code and the OpenAI-style body `{"error":{"message","type","param","code"}}` are
//! chosen here and nowhere else.

use http::{HeaderMap, StatusCode};
use serde_json::json;
use std::time::Duration;

use crate::body::BoxError;

/// Which tenant limit refused a request (the rate-limit stage's `Denied`).
/// The data-port routes, for the 404 and 405 answers.
pub const SERVED_ROUTES: &str = "POST /v1/chat/completions, POST /v1/completions, POST /generate, POST /v1/embeddings, POST /v1/rerank, POST /v1/score, POST /v1/messages, POST /v1/messages/count_tokens, POST /v1/responses, GET /v1/responses/{id}, POST /v1/responses/{id}/cancel, POST /tokenize, POST /detokenize, GET /v1/models and GET /v1/models/{id}";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RateLimitKind {
    /// Requests per minute exhausted; `retry_after` says when one more fits.
    Requests,
    /// Tokens per minute exhausted; `retry_after` says when this request's tokens fit.
    Tokens,
    /// The request alone needs more tokens than a whole minute holds: it can never pass,
    /// so retrying is pointless (the request path should answer 4xx, not 429).
    TokensOverBudget,
    /// All concurrency slots are taken; `retry_after` is a hint, not a promise.
    Concurrency,
    /// The limit store failed and the policy is fail-closed.
    StoreUnavailable,
}

/// Everything that can end a request early. Stages keep their own refusal types and
/// convert them into this one (admission's `PromptTooLong`, the rate limiter's `Decision`),
/// so this module depends on no stage.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GatewayError {
    #[error("{message}")]
    InvalidRequest {
        message: String,
        param: Option<String>,
    },
    #[error("Unknown route {method} {path}. kvgate serves {}", SERVED_ROUTES)]
    RouteNotFound {
        method: String,
        path: String,
        /// The request's body was not read: the connection closes after the answer.
        body_unread: bool,
    },
    #[error(
        "Method {method} is not allowed on {path}. kvgate serves {}",
        SERVED_ROUTES
    )]
    MethodNotAllowed {
        method: String,
        path: String,
        body_unread: bool,
    },
    #[error("The model `{model}` does not exist or you do not have access to it.")]
    ModelNotFound { model: String },
    /// A stored response that does not exist, or that another tenant created (the caller
    /// must not learn which).
    #[error("No response found with id '{id}'.")]
    ResponseNotFound { id: String },
    /// The map of stored responses' owners cannot answer (Redis down): a request naming a
    /// stored response cannot be checked, so it is refused.
    #[error("The owner of response '{id}' cannot be checked right now: {detail}")]
    ResponseOwnersUnavailable { id: String, detail: String },
    /// Admission refused the prompt (I2): no pool could hold it.
    #[error("{message}")]
    ContextLengthExceeded {
        message: String,
        /// The request field holding the prompt.
        param: &'static str,
    },
    /// A tenant limit refused the request (429, or 400 when it can never fit).
    #[error("{}", rate_limit_message(*kind))]
    RateLimited {
        kind: RateLimitKind,
        /// `Retry-After` and the `x-ratelimit-*` headers the client gets.
        headers: Box<HeaderMap>,
    },
    #[error("Tenant `{tenant}` may not use model `{model}`.")]
    ModelNotAllowed { tenant: String, model: String },
    /// A client field the gateway does not pass to engines (`api::fields`).
    #[error("Unsupported parameter `{param}`: {reason}.")]
    UnsupportedParameter { param: String, reason: &'static str },
    #[error("Tenant `{tenant}` may not use the LoRA adapter `{adapter}`.")]
    LoraNotAllowed { tenant: String, adapter: String },
    /// A `chat_template_kwargs` key on the tenant's `denied_chat_template_kwargs` list.
    #[error(
        "Tenant `{tenant}` may not set the chat template variable `{key}` (chat_template_kwargs)."
    )]
    TemplateKwargNotAllowed { tenant: String, key: String },
    /// `x-kvgate-pool` from a tenant without `choose_pool`.
    #[error("Tenant `{tenant}` may not choose a pool (x-kvgate-pool).")]
    PoolChoiceNotAllowed { tenant: String },
    /// `x-kvgate-priority` above the tenant's `max_priority`.
    #[error("Tenant `{tenant}` may not ask for priority `{asked}` (x-kvgate-priority); its maximum is `{max}`.")]
    PriorityNotAllowed {
        tenant: String,
        asked: &'static str,
        max: &'static str,
    },
    /// `x-kvgate-pool` naming no pool of the request's model.
    #[error("x-kvgate-pool: `{pool}` is not a pool of model `{model}`.")]
    UnknownPool { pool: String, model: String },
    /// The client was too slow sending its request (body idle or total deadline).
    #[error("The request body was not received within {timeout:?} ({what}).")]
    RequestTimeout {
        what: &'static str,
        timeout: Duration,
    },
    /// A header line or the header block is over its limit.
    #[error("Request header {what} is larger than the limit of {limit} bytes.")]
    HeaderTooLarge { what: String, limit: usize },
    /// A load ceiling is reached (global or pool in-flight cap, buffer budget): retry soon.
    #[error("kvgate is at its {ceiling} limit; retry shortly.")]
    Overloaded { ceiling: &'static str },
    /// The pool's gateway queue did not give the request a turn (`[scheduling]`): full,
    /// shed by a higher class, or past its deadline. 503 with `Retry-After` from the
    /// queue's drain rate.
    #[error("Pool `{pool}` is full: {reason}. Retry after the Retry-After delay.")]
    QueueRefused {
        pool: String,
        reason: &'static str,
        retry_after: Duration,
    },
    #[error("Request body is larger than the limit of {limit} bytes")]
    BodyTooLarge { limit: usize },
    #[error(
        "Incorrect or missing API key. Send it as `Authorization: Bearer <key>` or `x-api-key`."
    )]
    Unauthenticated,
    /// No worker of the model may serve now: 503 at once (no queue), with `Retry-After`
    /// saying when one may again (the soonest end of an ejection or recovery).
    #[error("No eligible worker for model `{model}`: {reason}")]
    NoEligibleWorker {
        model: String,
        reason: String,
        retry_after: std::time::Duration,
    },
    #[error("Upstream {role} worker {worker} of pool `{pool}` is unreachable: {detail}")]
    UpstreamUnavailable {
        pool: String,
        role: &'static str,
        worker: String,
        detail: String,
        /// The connection was never made: nothing was sent, so another worker may be tried.
        connect: bool,
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
    /// The engine's `prompt_tokens` differs from kvgate's count (I1): the answer was not
    /// delivered. Besides a broken engine, the usual cause is text not in Unicode NFC: the
    /// model's tokenizer (as kvgate applies it) normalizes it, engines such as llama.cpp
    /// do not, so they count other tokens.
    #[error(
        "The engine's answer failed kvgate's integrity check (the engine reported {engine} prompt tokens for sample {sample} where kvgate counted {gateway}) and was not delivered."
    )]
    PromptCountMismatch {
        pool: String,
        sample: usize,
        gateway: u64,
        engine: u64,
    },
    #[error("Internal error: {0}")]
    Internal(String),
}

fn rate_limit_message(kind: RateLimitKind) -> &'static str {
    match kind {
        RateLimitKind::Requests => "Rate limit reached for requests per minute; retry after the Retry-After delay.",
        RateLimitKind::Tokens => "Rate limit reached for tokens per minute; retry after the Retry-After delay.",
        RateLimitKind::TokensOverBudget => "This request needs more tokens than this tenant's whole per-minute budget; lower max_tokens or shorten the prompt.",
        RateLimitKind::Concurrency => "Too many concurrent requests for this tenant; retry when one finishes.",
        RateLimitKind::StoreUnavailable => "Rate limits cannot be checked right now; retry shortly.",
    }
}

/// What a client sees of an error: HTTP status, OpenAI `error.type` and `error.code` (the
/// code is also the low-cardinality `code` metric label).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErrorClass {
    pub status: StatusCode,
    pub error_type: &'static str,
    pub code: &'static str,
}

const INVALID: &str = "invalid_request_error";
const UPSTREAM: &str = "upstream_error";
const UNAVAILABLE: &str = "service_unavailable";

const fn class(status: StatusCode, error_type: &'static str, code: &'static str) -> ErrorClass {
    ErrorClass {
        status,
        error_type,
        code,
    }
}

/// An engine status the client may see as is: its 4xx (the client's fault) and 503.
fn kept(status: StatusCode) -> Option<StatusCode> {
    (status.is_client_error() || status == StatusCode::SERVICE_UNAVAILABLE).then_some(status)
}

impl GatewayError {
    /// A 400 for a request the gateway cannot read.
    pub fn invalid(message: impl Into<String>, param: Option<&str>) -> Self {
        GatewayError::InvalidRequest {
            message: message.into(),
            param: param.map(str::to_owned),
        }
    }

    /// The one table: status, type and code of every variant.
    pub fn class(&self) -> ErrorClass {
        use GatewayError::*;
        use StatusCode as S;
        match self {
            InvalidRequest { .. } => class(S::BAD_REQUEST, INVALID, "invalid_request"),
            RouteNotFound { .. } => class(S::NOT_FOUND, INVALID, "not_found"),
            MethodNotAllowed { .. } => class(S::METHOD_NOT_ALLOWED, INVALID, "method_not_allowed"),
            ModelNotFound { .. } => class(S::NOT_FOUND, INVALID, "model_not_found"),
            ResponseNotFound { .. } => class(S::NOT_FOUND, INVALID, "response_not_found"),
            ResponseOwnersUnavailable { .. } => class(
                S::SERVICE_UNAVAILABLE,
                UNAVAILABLE,
                "response_owners_unavailable",
            ),
            ContextLengthExceeded { .. } => {
                class(S::BAD_REQUEST, INVALID, "context_length_exceeded")
            }
            BodyTooLarge { .. } => class(S::PAYLOAD_TOO_LARGE, INVALID, "request_too_large"),
            Unauthenticated => class(S::UNAUTHORIZED, "authentication_error", "invalid_api_key"),
            ModelNotAllowed { .. } => class(S::FORBIDDEN, "permission_error", "model_not_allowed"),
            UnsupportedParameter { .. } => class(S::BAD_REQUEST, INVALID, "unsupported_parameter"),
            LoraNotAllowed { .. } => class(S::FORBIDDEN, "permission_error", "lora_not_allowed"),
            TemplateKwargNotAllowed { .. } => class(
                S::FORBIDDEN,
                "permission_error",
                "template_kwarg_not_allowed",
            ),
            PoolChoiceNotAllowed { .. } => {
                class(S::FORBIDDEN, "permission_error", "pool_choice_not_allowed")
            }
            PriorityNotAllowed { .. } => {
                class(S::FORBIDDEN, "permission_error", "priority_not_allowed")
            }
            UnknownPool { .. } => class(S::BAD_REQUEST, INVALID, "unknown_pool"),
            RequestTimeout { .. } => class(S::REQUEST_TIMEOUT, INVALID, "request_timeout"),
            HeaderTooLarge { .. } => class(
                S::REQUEST_HEADER_FIELDS_TOO_LARGE,
                INVALID,
                "request_header_too_large",
            ),
            Overloaded { .. } | QueueRefused { .. } => {
                class(S::SERVICE_UNAVAILABLE, UNAVAILABLE, "overloaded")
            }
            RateLimited { kind, .. } => match kind {
                // It can never fit: retrying is pointless, so not a 429.
                RateLimitKind::TokensOverBudget => {
                    class(S::BAD_REQUEST, INVALID, "tokens_exceed_rate_limit")
                }
                RateLimitKind::Concurrency => class(
                    S::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "concurrency_limit_exceeded",
                ),
                RateLimitKind::StoreUnavailable => class(
                    S::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "rate_limit_unavailable",
                ),
                RateLimitKind::Requests | RateLimitKind::Tokens => class(
                    S::TOO_MANY_REQUESTS,
                    "rate_limit_error",
                    "rate_limit_exceeded",
                ),
            },
            NoEligibleWorker { .. } => {
                class(S::SERVICE_UNAVAILABLE, UNAVAILABLE, "no_eligible_worker")
            }
            UpstreamUnavailable { .. } => class(S::BAD_GATEWAY, UPSTREAM, "upstream_unavailable"),
            UpstreamTimeout { .. } => class(S::GATEWAY_TIMEOUT, UPSTREAM, "upstream_timeout"),
            UpstreamStatus { status, .. } => match kept(*status) {
                Some(s) if s.is_client_error() => class(s, INVALID, "upstream_status"),
                Some(s) => class(s, UPSTREAM, "upstream_status"),
                None => class(S::BAD_GATEWAY, UPSTREAM, "upstream_status"),
            },
            UpstreamProtocol { .. } => class(S::BAD_GATEWAY, UPSTREAM, "upstream_protocol_error"),
            // An abort keeps the engine's error status; one that claims success never does.
            UpstreamAborted { status, .. } => match status {
                Some(s) if s.is_client_error() => class(*s, INVALID, "upstream_aborted"),
                Some(s) if s.is_server_error() => class(*s, UPSTREAM, "upstream_aborted"),
                _ => class(S::BAD_GATEWAY, UPSTREAM, "upstream_aborted"),
            },
            UpstreamIntegrity { .. } | PromptCountMismatch { .. } => {
                class(S::BAD_GATEWAY, UPSTREAM, "upstream_integrity_error")
            }
            Internal(_) => class(S::INTERNAL_SERVER_ERROR, "internal_error", "internal_error"),
        }
    }

    /// The HTTP status the client sees.
    pub fn status(&self) -> StatusCode {
        self.class().status
    }

    /// The OpenAI `error.type` field.
    pub fn error_type(&self) -> &'static str {
        self.class().error_type
    }

    /// The OpenAI `error.code` field; also the low-cardinality `code` metric label.
    pub fn code(&self) -> &'static str {
        self.class().code
    }

    fn param(&self) -> Option<&str> {
        match self {
            GatewayError::InvalidRequest { param, .. } => param.as_deref(),
            GatewayError::ModelNotFound { .. } | GatewayError::ModelNotAllowed { .. } => {
                Some("model")
            }
            GatewayError::ContextLengthExceeded { param, .. } => Some(param),
            GatewayError::UnsupportedParameter { param, .. } => Some(param),
            GatewayError::LoraNotAllowed { .. } => Some("lora_path"),
            GatewayError::TemplateKwargNotAllowed { .. } => Some("chat_template_kwargs"),
            _ => None,
        }
    }

    /// What the client is told. Errors of the client's own request say what to fix; errors
    /// of the engines and the gateway say only what happened: worker addresses, engine
    /// messages and causes go to the log (the `Display` text), never to clients.
    pub fn client_message(&self) -> String {
        use GatewayError::*;
        match self {
            NoEligibleWorker { model, .. } => {
                format!("No engine can serve model `{model}` right now; retry shortly.")
            }
            UpstreamUnavailable { .. } => "The engine could not be reached.".into(),
            UpstreamTimeout { .. } => "The engine did not answer in time.".into(),
            UpstreamStatus { status, .. } if status.is_client_error() => {
                format!("The engine refused the request (HTTP {}).", status.as_u16())
            }
            UpstreamStatus { status, .. } => {
                format!("The engine failed (HTTP {}).", status.as_u16())
            }
            UpstreamProtocol { .. } => "The engine sent an unreadable response.".into(),
            UpstreamAborted { .. } => "The engine aborted the request.".into(),
            UpstreamIntegrity { .. } => {
                "The engine's answer failed kvgate's integrity check and was not delivered.".into()
            }
            PromptCountMismatch {
                gateway, engine, ..
            } => format!(
                "The engine's answer failed kvgate's integrity check and was not delivered: the \
                 engine counted {engine} prompt tokens where kvgate counted {gateway}. A likely \
                 cause is prompt text not in Unicode NFC (the model's tokenizer normalizes it, \
                 engines such as llama.cpp do not); sending NFC text avoids it."
            ),
            ResponseOwnersUnavailable { id, .. } => {
                format!("The owner of response '{id}' cannot be checked right now; retry shortly.")
            }
            Internal(_) => "The gateway hit an internal error.".into(),
            other => other.to_string(),
        }
    }

    /// The JSON error object (without the HTTP wrapping), also used for SSE error events;
    /// `request_id` lets the client quote what the logs hold.
    pub fn to_json(&self, request_id: Option<&str>) -> serde_json::Value {
        let class = self.class();
        let mut error = json!({
            "message": self.client_message(),
            "type": class.error_type,
            "param": self.param(),
            "code": class.code,
        });
        if let (Some(id), Some(map)) = (request_id, error.as_object_mut()) {
            map.insert("request_id".into(), id.into());
        }
        json!({ "error": error })
    }

    /// Recover a `GatewayError` from a boxed error raised through a tower combinator,
    /// walking its cause chain (a layer may wrap ours). Anything unknown is an internal
    /// error (never a silently dropped connection).
    pub fn from_boxed(error: BoxError) -> Self {
        let error = match error.downcast::<GatewayError>() {
            Ok(e) => return *e,
            Err(other) => other,
        };
        let mut cause: Option<&(dyn std::error::Error + 'static)> = error.source();
        while let Some(e) = cause {
            if let Some(ours) = e.downcast_ref::<GatewayError>() {
                return ours.clone();
            }
            cause = e.source();
        }
        GatewayError::Internal(error.to_string())
    }
}

/// `e: cause: cause` — hyper-util's top-level message alone ("client error (Connect)") hides
/// the reason.
pub(crate) fn error_chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

mod response;

pub use response::ErrorDialect;

#[cfg(test)]
mod tests;
