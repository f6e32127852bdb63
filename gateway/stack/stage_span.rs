//! One span per stage (admission, rate limit, route, guard), wrapped around the stage in
//! `build_stack` instead of written into each stage.
//!
//! [`StageSpanLayer`] puts an `Enter` service above the stage and an `Exit` service below
//! it. `Enter` starts the span, a child of the request's server span; `Exit` runs when the
//! stage passes the request on, so the span measures the stage's own work on the request
//! (counting tokens, taking a permit, choosing workers) and records what the stage decided
//! (tenant, model and prompt tokens after admission; pool and workers after routing). A
//! stage that refuses the request never reaches `Exit`: its span ends with the error code
//! when `Enter`'s future completes. The guard's work is on the answer, so its span runs
//! until the answer has been checked (or its stream check has begun).
//!
//! Untraced requests (no `Arc<RequestTrace>` extension, or one not recorded) pass through
//! both services without any allocation.

use http::{Request, Response};
use pin_project_lite::pin_project;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tower::{Layer, Service};

use crate::body::BoxError;
use crate::error::GatewayError;
use crate::stack::admission::TokenCount;
use crate::stack::api::InferenceRequest;
use crate::stack::auth::AuthContext;
use crate::stack::routing::{RoutePlan, Target};
use crate::telemetry::span::SharedSpan;
use crate::telemetry::{AttrValue, RequestTrace, SpanKind};

/// The stages that get a span.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StageName {
    Admission,
    RateLimit,
    Route,
    Guard,
}

impl StageName {
    fn as_str(self) -> &'static str {
        match self {
            StageName::Admission => "admission",
            StageName::RateLimit => "rate_limit",
            StageName::Route => "route",
            StageName::Guard => "guard",
        }
    }

    /// Whether the span ends when the stage passes the request on (else with the answer).
    fn ends_at_next(self) -> bool {
        self != StageName::Guard
    }
}

/// Wraps the layer `inner` (a stage) in its span.
#[derive(Debug, Clone)]
pub struct StageSpanLayer<L> {
    stage: StageName,
    inner: L,
}

impl<L> StageSpanLayer<L> {
    /// `inner`'s span is named after `stage`.
    pub fn new(stage: StageName, inner: L) -> Self {
        Self { stage, inner }
    }
}

impl<L, S> Layer<S> for StageSpanLayer<L>
where
    L: Layer<Exit<S>>,
{
    type Service = Enter<L::Service>;

    fn layer(&self, inner: S) -> Self::Service {
        Enter {
            stage: self.stage,
            inner: self.inner.layer(Exit {
                stage: self.stage,
                inner,
            }),
        }
    }
}

/// The open stage span (a request extension between `Enter` and `Exit`).
#[derive(Clone)]
struct CurrentStage(SharedSpan);

/// Starts the stage's span.
#[derive(Debug, Clone)]
pub struct Enter<S> {
    stage: StageName,
    inner: S,
}

impl<S, B, RB> Service<Request<B>> for Enter<S>
where
    S: Service<Request<B>, Response = Response<RB>, Error = BoxError>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = EnterFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> Self::Future {
        let span = request
            .extensions()
            .get::<Arc<RequestTrace>>()
            .filter(|t| t.recording())
            .map(|t| {
                Arc::new(Mutex::new(Some(
                    t.child(self.stage.as_str(), SpanKind::Internal),
                )))
            });
        if let Some(span) = &span {
            request.extensions_mut().insert(CurrentStage(span.clone()));
        }
        EnterFuture {
            inner: self.inner.call(request),
            span,
        }
    }
}

pin_project! {
    /// Ends the span with the stage's result, if `Exit` did not end it first.
    pub struct EnterFuture<F> {
        #[pin]
        inner: F,
        span: Option<SharedSpan>,
    }
}

impl<F, RB> Future for EnterFuture<F>
where
    F: Future<Output = Result<Response<RB>, BoxError>>,
{
    type Output = F::Output;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<F::Output> {
        let this = self.project();
        let result = std::task::ready!(this.inner.poll(cx));
        if let Some(shared) = this.span.take() {
            let open = shared.lock().unwrap_or_else(|p| p.into_inner()).take();
            if let Some(mut span) = open {
                match &result {
                    Ok(response) => span.attr(
                        "http.response.status_code",
                        AttrValue::Int(i64::from(response.status().as_u16())),
                    ),
                    Err(error) => {
                        let code = error
                            .downcast_ref::<GatewayError>()
                            .map(GatewayError::code)
                            .unwrap_or("internal_error");
                        span.attr("error.type", AttrValue::Static(code));
                        span.fail(code);
                    }
                }
                span.end();
            }
        }
        Poll::Ready(result)
    }
}

/// Records what the stage decided, and ends its span when the stage passes the request on.
#[derive(Debug, Clone)]
pub struct Exit<S> {
    stage: StageName,
    inner: S,
}

impl<S, B> Service<Request<B>> for Exit<S>
where
    S: Service<Request<B>>,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = S::Future;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), S::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, mut request: Request<B>) -> S::Future {
        if let Some(CurrentStage(shared)) = request.extensions_mut().remove::<CurrentStage>() {
            let mut open = shared.lock().unwrap_or_else(|p| p.into_inner());
            if let Some(span) = open.as_mut() {
                let trace = request.extensions().get::<Arc<RequestTrace>>();
                for (key, value) in decisions(self.stage, &request) {
                    if let Some(trace) = trace {
                        trace.server_attr(key, value.clone());
                    }
                    span.attr(key, value);
                }
            }
            if self.stage.ends_at_next() {
                if let Some(span) = open.take() {
                    span.end();
                }
            }
        }
        self.inner.call(request)
    }
}

/// What `stage` decided, as span attributes (copied onto the server span too).
fn decisions<B>(stage: StageName, request: &Request<B>) -> Vec<(&'static str, AttrValue)> {
    let mut out = Vec::new();
    let extensions = request.extensions();
    match stage {
        StageName::Admission => {
            if let Some(auth) = extensions.get::<AuthContext>() {
                out.push(("kvgate.tenant", AttrValue::Str(auth.tenant.to_string())));
            }
            if let Some(parsed) = extensions.get::<InferenceRequest>() {
                out.push(("kvgate.model", AttrValue::Str(parsed.model.clone())));
            }
            if let Some(count) = extensions.get::<TokenCount>() {
                let tokens: u64 = count.prompt_tokens.iter().map(|t| t.value()).sum();
                out.push((
                    "kvgate.prompt_tokens",
                    AttrValue::Int(i64::try_from(tokens).unwrap_or(i64::MAX)),
                ));
            }
        }
        StageName::Route => {
            if let Some(plan) = extensions.get::<RoutePlan>() {
                out.push(("kvgate.pool", AttrValue::Str(plan.pool.name.to_string())));
                match plan.target.as_ref() {
                    Target::Unified(load) => out.push((
                        "kvgate.worker",
                        AttrValue::Str(load.worker().authority.clone()),
                    )),
                    Target::Disaggregated { prefill, decode } => {
                        out.push((
                            "kvgate.prefill_worker",
                            AttrValue::Str(prefill.worker().authority.clone()),
                        ));
                        out.push((
                            "kvgate.decode_worker",
                            AttrValue::Str(decode.worker().authority.clone()),
                        ));
                    }
                }
            }
        }
        StageName::RateLimit | StageName::Guard => {}
    }
    out
}
