//! The whole-answer path: a non-streamed answer is read once and checked whole (the I1
//! checks, then the leak scan) before its status line goes out; the engine's usage is
//! passed on for rate-limit settlement and the tenant's account.

use http::response::Parts;
use http::Response;
use http_body_util::BodyExt;

use super::anthropic::{check_message, message_texts, message_usage};
use super::extensions::BufferedAnswer;
use super::inspect::{check_pooling, pooling_usage, Answer, Expectation, Trip};
use super::leak::LeakScan;
use super::plan::GuardPlan;
use super::report::TripReport;
use super::responses::{check_response, output_texts, response_usage};
use crate::accounting::TokenUsage;
use crate::body::{self, BoxBody};
use crate::error::GatewayError;

/// Check the whole answer (`parts` and `body`): the response to send, or the trip's error.
pub(super) async fn check_whole_answer(
    mut parts: Parts,
    body: BoxBody,
    plan: &GuardPlan<'_>,
    expect: &Expectation,
    leak: Option<LeakScan>,
    report: &TripReport,
) -> Result<Response<BoxBody>, GatewayError> {
    // Dispatch hands the bytes over beside the body, which keeps what it holds (worker
    // loads, the buffer budget's reservation) until the client has it.
    let (bytes, body) = match parts.extensions.remove::<BufferedAnswer>() {
        Some(BufferedAnswer(bytes)) => (bytes, body),
        None => {
            let bytes = body
                .collect()
                .await
                .map_err(|e| GatewayError::Internal(format!("reading a buffered answer: {e}")))?
                .to_bytes();
            (bytes.clone(), body::full(bytes))
        }
    };
    if let Some(continuation) = plan.responses {
        let v = serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default();
        if plan.checks {
            if let Err(trip) = check_response(&v, expect, continuation) {
                return Err(report.record(&trip));
            }
        }
        if let Err(trip) = scan(leak, output_texts(&v)) {
            return Err(report.record(&trip));
        }
        if let (Some(cell), Some(total)) = (&plan.usage, response_usage(&v)) {
            cell.set(total);
        }
        if let Some(used) = v.get("usage").and_then(TokenUsage::from_usage) {
            report.usage(used);
        }
        return Ok(Response::from_parts(parts, body));
    }
    if plan.anthropic {
        let v = serde_json::from_slice::<serde_json::Value>(&bytes).unwrap_or_default();
        if plan.checks {
            if let Err(trip) = check_message(&v, expect) {
                return Err(report.record(&trip));
            }
        }
        if let Err(trip) = scan(leak, message_texts(&v)) {
            return Err(report.record(&trip));
        }
        if let (Some(cell), Some(total)) = (&plan.usage, message_usage(&v)) {
            cell.set(total);
        }
        if let Some(used) = v.get("usage").and_then(TokenUsage::from_usage) {
            report.usage(used);
        }
        return Ok(Response::from_parts(parts, body));
    }
    if let Some(shape) = plan.pooling {
        // Embeddings, rerank and score: nothing generated, so no text to scan for leaks.
        if plan.checks {
            if let Err(trip) = check_pooling(shape, &bytes, plan.batch, expect) {
                return Err(report.record(&trip));
            }
        }
        // Parsed only when someone takes the count (embeddings are one more parse).
        if plan.usage.is_some() || report.accounts() {
            if let Some(total) = pooling_usage(shape, &bytes) {
                if let Some(cell) = &plan.usage {
                    cell.set(total);
                }
                // Nothing is generated: the whole count is prompt.
                report.usage(TokenUsage {
                    prompt: total,
                    completion: 0,
                    cached: 0,
                });
            }
        }
        return Ok(Response::from_parts(parts, body));
    }
    // Parsed once: the checks, the leak scan and the usage all read this.
    let answer = Answer::parse(&bytes, plan.shape);
    if plan.checks {
        if let Err(trip) = answer.check(plan.shape, &plan.rules.markers, expect) {
            return Err(report.record(&trip));
        }
    }
    if let Some(mut leak) = leak {
        for text in answer.texts(plan.shape) {
            if let Err(trip) = leak.push(text, true) {
                return Err(report.record(&trip));
            }
        }
    }
    if let (Some(cell), Some(total)) = (&plan.usage, answer.usage(plan.shape)) {
        cell.set(total);
    }
    if let Some(used) = answer.token_usage(plan.shape) {
        report.usage(used);
    }
    Ok(Response::from_parts(parts, body))
}

/// The leak scan of an answer's generated texts, the last one ending it.
fn scan(leak: Option<LeakScan>, texts: Vec<&str>) -> Result<(), Trip> {
    let Some(mut leak) = leak else {
        return Ok(());
    };
    let last = texts.len().saturating_sub(1);
    for (i, text) in texts.into_iter().enumerate() {
        leak.push(text, i == last)?;
    }
    Ok(())
}
