//! Observe: each routed request's outcome, counted against its pool's signal window (what
//! canary rollouts compare, and what the admin port shows).
//!
//! Sits right below routing, so it sees every request that reached a pool and nothing that
//! was refused before (a refusal by admission is not the pool's doing). It notes the time to
//! the answer's first byte (a stream's headers leave after its first event was checked) and
//! engine failures; the guard adds trips and leak suspicions on the same
//! [`RequestSignals`], which count once when the request is over (see `signals`).
//!
//! What looks at a window after a request counted in it (a canary's rollout) is behind
//! the fleet's [`OutcomeWatch`], so the stage does not know rollouts exist.
//!
//! Reads: `RoutePlan`. Writes: `Arc<RequestSignals>`.

mod signals;

pub use signals::RequestSignals;

use std::sync::Arc;
use std::time::Instant;

use crate::error::GatewayError;
use crate::fleet::OutcomeWatch;
use crate::stack::routing::RoutePlan;
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};

/// The observe stage.
#[derive(Debug, Clone)]
pub struct Observe {
    watch: Arc<dyn OutcomeWatch>,
}

/// The observe stage as a layer.
pub type ObserveLayer = StageLayer<Observe>;

impl Observe {
    /// Observe for `watch` (the canary pools' rollouts look again after each request).
    pub fn layer(watch: Arc<dyn OutcomeWatch>) -> ObserveLayer {
        StageLayer::new(Observe { watch })
    }
}

/// Whether `error` says the engine failed (not the client, not a guard trip).
fn engine_failed(error: &GatewayError) -> bool {
    match error {
        GatewayError::UpstreamStatus { status, .. } => status.is_server_error(),
        GatewayError::UpstreamUnavailable { .. }
        | GatewayError::UpstreamTimeout { .. }
        | GatewayError::UpstreamProtocol { .. } => true,
        _ => false,
    }
}

impl Stage for Observe {
    fn handle(&self, mut request: http::Request<bytes::Bytes>, next: Next) -> StageFuture {
        let Some(pool) = request
            .extensions()
            .get::<RoutePlan>()
            .map(|p| p.pool.clone())
        else {
            return next.oneshot(request);
        };
        let signals = Arc::new(RequestSignals::new(pool, self.watch.clone()));
        request.extensions_mut().insert(signals.clone());
        Box::pin(async move {
            let started = Instant::now();
            let result = next.oneshot(request).await;
            match &result {
                Ok(response) if response.status().is_success() => {
                    signals.first_byte(started.elapsed());
                }
                Ok(_) => {}
                Err(e) => {
                    if e.downcast_ref::<GatewayError>().is_some_and(engine_failed) {
                        signals.engine_error();
                    }
                }
            }
            result
        })
    }
}
