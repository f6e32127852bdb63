//! Tenant rate limits: requests per minute, tokens per minute and concurrency, enforced
//! after admission (it reserves admission's count: prompt + max new tokens) and before
//! routing. The permit rides in the response body: its concurrency slot is held until the
//! stream ends or the client goes away, and its tokens are settled then with the engine's
//! reported usage (refund or charge). Refusals are 429 with `Retry-After` and OpenAI's
//! `x-ratelimit-*` headers; admitted responses carry the same headers.
//!
//! Reads: `AuthContext`, `TokenCount`. Writes: [`UsageCell`] (filled by the guard).

pub mod limiter;

use bytes::Bytes;
use http::{HeaderMap, HeaderValue, Request, Response};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::body::{self, GuardBody};
use crate::error::GatewayError;
use crate::stack::admission::TokenCount;
use crate::stack::auth::AuthContext;
use crate::stack::rate_limit::limiter::{
    Admission, Decision, Denied, Limiter, TenantLimits, TenantPermit,
};
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};

/// Where the guard reports the engine's usage (prompt + completion tokens) for settlement.
#[derive(Debug, Clone, Default)]
pub struct UsageCell(pub Arc<Mutex<Option<u64>>>);

impl UsageCell {
    /// Record the engine's total usage.
    pub fn set(&self, tokens: u64) {
        if let Ok(mut cell) = self.0.lock() {
            *cell = Some(tokens);
        }
    }

    fn get(&self) -> Option<u64> {
        self.0.lock().ok().and_then(|c| *c)
    }
}

/// Held in the response body: settles with the reported usage, then releases the slot.
struct Settle {
    permit: TenantPermit,
    usage: UsageCell,
}

impl Drop for Settle {
    fn drop(&mut self) {
        if let Some(actual) = self.usage.get() {
            self.permit.settle_with(actual);
        }
    }
}

fn duration_header(d: Duration) -> String {
    if d < Duration::from_secs(1) {
        format!("{}ms", d.as_millis())
    } else {
        format!("{}s", d.as_secs_f64().ceil() as u64)
    }
}

/// OpenAI's `x-ratelimit-{limit,remaining,reset}-{requests,tokens}` from a decision.
pub fn insert_headers(headers: &mut HeaderMap, d: &Decision) {
    let mut put = |name: &'static str, value: String| {
        if let Ok(v) = HeaderValue::from_str(&value) {
            headers.insert(name, v);
        }
    };
    if let Some(limit) = d.limit_requests {
        put("x-ratelimit-limit-requests", limit.to_string());
        put(
            "x-ratelimit-remaining-requests",
            d.remaining_requests.unwrap_or(0).to_string(),
        );
        put(
            "x-ratelimit-reset-requests",
            duration_header(d.reset_requests),
        );
    }
    if let Some(limit) = d.limit_tokens {
        put("x-ratelimit-limit-tokens", limit.to_string());
        put(
            "x-ratelimit-remaining-tokens",
            d.remaining_tokens.unwrap_or(0).to_string(),
        );
        put("x-ratelimit-reset-tokens", duration_header(d.reset_tokens));
    }
}

/// A denied reservation as the client sees it: 429 (or 400 when it can never fit) with
/// `Retry-After` and the `x-ratelimit-*` headers.
pub fn refusal(decision: &Decision) -> GatewayError {
    let mut headers = HeaderMap::new();
    insert_headers(&mut headers, decision);
    let secs = decision.retry_after.as_secs_f64().ceil().max(1.0) as u64;
    headers.insert(http::header::RETRY_AFTER, HeaderValue::from(secs));
    GatewayError::RateLimited {
        kind: decision.denied_by.unwrap_or(Denied::StoreUnavailable),
        headers: Box::new(headers),
    }
}

/// The rate-limit stage.
#[derive(Clone)]
pub struct RateLimit {
    limiter: Limiter,
}

/// The rate-limit stage as a layer.
pub type RateLimitLayer = StageLayer<RateLimit>;

impl RateLimit {
    /// Enforce limits through `limiter`.
    pub fn layer(limiter: Limiter) -> RateLimitLayer {
        StageLayer::new(RateLimit { limiter })
    }
}

// === impl RateLimit ===

impl Stage for RateLimit {
    fn handle(&self, mut request: Request<Bytes>, next: Next) -> StageFuture {
        let limiter = self.limiter.clone();
        Box::pin(async move {
            let Some(auth) = request.extensions().get::<AuthContext>().cloned() else {
                return next.oneshot(request).await;
            };
            let limits = auth.policy.limits;
            if limits == TenantLimits::UNLIMITED {
                return next.oneshot(request).await;
            }
            // Tokens per minute reserve the exact count (computing in the background since
            // admission), never the byte bound admission may have settled on.
            let count = request.extensions().get::<TokenCount>().cloned();
            let tokens = match (&count, limits.tokens_per_minute) {
                (Some(c), Some(_)) => c.exact_total().await,
                (Some(c), None) => c.prompt_total() + c.max_new_tokens.iter().sum::<u64>(),
                (None, _) => 0,
            };
            let permit = match limiter.admit(auth.tenant.clone(), &limits, tokens).await {
                Ok(Admission::Admitted(permit)) => permit,
                Ok(Admission::Denied(decision)) => {
                    return Err(refusal(&decision).into());
                }
                Err(e) => {
                    return Err(GatewayError::Internal(format!("rate limit store: {e}")).into())
                }
            };
            let usage = UsageCell::default();
            request.extensions_mut().insert(usage.clone());
            let response = next.oneshot(request).await?;
            let (mut parts, body) = response.into_parts();
            insert_headers(&mut parts.headers, permit.decision());
            let settle = Settle { permit, usage };
            Ok(Response::from_parts(
                parts,
                body::boxed(GuardBody::new(body, settle)),
            ))
        })
    }
}
