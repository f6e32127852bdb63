//! SGLang's error bodies on the routes served through its OpenAI serving classes
//! (`/v1/embeddings`, `/v1/rerank`, `/v1/score`, `/tokenize`, `/detokenize`,
//! `/v1/responses`), and the checks its HTTP layer runs before any of them.
//!
//! Three shapes, as sglang 0.5.23 builds them:
//! - `ErrorResponse` (`protocol.py`), from `OpenAIServingBase.create_error_response`
//!   (`serving_base.py`): `{"object": "error", "message", "type", "param", "code"}`, with
//!   `type` "BadRequestError" for a refused input, the status as text for an
//!   `HTTPException` (`handle_request`), "InternalServerError" for anything else;
//! - the same object with `type: "Bad Request"` for a body the request model rejects
//!   (`http_server.py` `validation_exception_handler` for `RequestValidationError`, which
//!   FastAPI raises for a wrong type, a missing field or a bad content type);
//! - `/v1/responses`' nested `{"error": {"message", "type", "param", "code"}}`
//!   (`serving_responses.py` `create_error_response`, and the same handlers' branch for
//!   paths under `/v1/responses`).
//!
//! The text of a validation error opens as FastAPI's does (`1 validation error:`), then the
//! sim's own short account (`field: reason`) rather than pydantic's error dicts; its shape
//! and status are SGLang's.

use hyper::header::{HeaderMap, CONTENT_TYPE};
use hyper::{Response, StatusCode};
use serde_json::json;

use super::listen::{json_response, Body};
use super::schedule::Finish;

/// `ErrorResponse` of `create_error_response(message, err_type, status_code)`.
pub(crate) fn serving_error(message: &str, err_type: &str, status: u16) -> Response<Body> {
    let body = json!({
        "object": "error", "message": message, "type": err_type, "param": null, "code": status,
    });
    json_response(code(status), &body)
}

/// The `error-event` fault on a prefill-only route (embeddings, rerank, score): the
/// engine's error object sent with HTTP 200, as a broken engine or a proxy in front of one
/// would, so the gateway's guard must tell it from a result.
pub(crate) fn error_in_success(engine: &super::engine::SimEngine) -> Option<Response<Body>> {
    (engine.config.fault == super::config::SimFault::ErrorEvent).then(|| {
        let body = json!({
            "object": "error", "message": "simulated engine error inside a 200",
            "type": "InternalServerError", "param": null, "code": 500,
        });
        json_response(StatusCode::OK, &body)
    })
}

/// A refused input: `create_error_response(message)` (400, "BadRequestError").
pub(crate) fn bad_request(message: &str) -> Response<Body> {
    serving_error(message, "BadRequestError", 400)
}

/// A body the request model rejects (`validation_exception_handler`: 400, "Bad Request",
/// the message opening as FastAPI's `RequestValidationError` text does).
pub(crate) fn validation(message: &str) -> Response<Body> {
    serving_error(&validation_text(message), "Bad Request", 400)
}

fn validation_text(message: &str) -> String {
    format!("1 validation error:\n  {message}")
}

/// `/v1/responses`' nested error body.
pub(crate) fn responses_error(
    message: &str,
    err_type: &str,
    param: Option<&str>,
    status: u16,
) -> Response<Body> {
    let body = json!({"error": {
        "message": message, "type": err_type, "param": param, "code": status,
    }});
    json_response(code(status), &body)
}

/// A body `/v1/responses`' request model rejects (the handlers' `/v1/responses` branch).
pub(crate) fn responses_validation(message: &str) -> Response<Body> {
    responses_error(&validation_text(message), "Bad Request", None, 400)
}

/// `validate_json_request` (`http_server.py`): the media type must be `application/json`;
/// the error names the header as FastAPI's validation error does.
pub(crate) fn json_content_type(headers: &HeaderMap) -> Result<(), String> {
    let media = headers
        .get(CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default()
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    if media == "application/json" {
        Ok(())
    } else {
        Err(
            "header.content-type: Unsupported Media Type: Only 'application/json' is allowed"
                .to_string(),
        )
    }
}

/// How a failed prefill-only request (embeddings, rerank, score) answers, as
/// `handle_request` (`serving_base.py`) turns the tokenizer manager's exceptions into
/// errors: an abort with status 400 (and the tokenizer manager's own checks) raise
/// `ValueError` (400, "BadRequestError"); another status raises `HTTPException` (that
/// status, its number as the type); anything else is a 500 "InternalServerError". An
/// abort without a status is no designed path in SGLang for these routes; the sim answers
/// it as an internal error.
pub(crate) fn prefill_failure(finish: &Finish) -> Option<Response<Body>> {
    match finish {
        Finish::Stop { .. } | Finish::Length { .. } => None,
        Finish::Rejected { message, status } => Some(status_failure(message, *status)),
        Finish::Abort(info) => Some(match info.status_code {
            Some(status) => status_failure(&info.message, status),
            None => internal(&info.message),
        }),
        Finish::Error { message } => Some(internal(message)),
    }
}

fn status_failure(message: &str, status: u16) -> Response<Body> {
    if status == 400 {
        bad_request(message)
    } else {
        serving_error(message, &status.to_string(), status)
    }
}

fn internal(message: &str) -> Response<Body> {
    serving_error(
        &format!("Internal server error: {message}"),
        "InternalServerError",
        500,
    )
}

fn code(status: u16) -> StatusCode {
    StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR)
}

pub(crate) use kvgate_tokenize::prepare::fields::kind;
