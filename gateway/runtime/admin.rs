//! The admin port: `GET /health` (the process is up; 503 while draining), `GET /ready`
//! (every model has an eligible worker; says why not), `GET /metrics` (Prometheus text) and
//! `POST /reload` (re-read tenants and API keys from the config file).

use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use std::convert::Infallible;
use std::future::{ready, Ready};
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

use crate::body::{self, BoxBody};
use crate::runtime::reload::Reloader;
use crate::runtime::server::Shutdown;
use crate::stack::routing::{Discovery, Router};

/// The admin service.
#[derive(Clone, Debug)]
pub struct Admin {
    router: Arc<Router>,
    shutdown: Shutdown,
    reloader: Option<Reloader>,
}

impl Admin {
    /// Report on `router`; `/health` turns 503 once `shutdown` fires; `POST /reload` reloads
    /// tenants and keys through `reloader`.
    pub fn new(router: Arc<Router>, shutdown: Shutdown, reloader: Option<Reloader>) -> Self {
        Self {
            router,
            shutdown,
            reloader,
        }
    }
}

/// Readiness of every model, as `/ready` reports it.
pub fn readiness(router: &Router) -> (bool, Value) {
    let mut models: Vec<&str> = router.pools().iter().map(|p| p.model.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    let mut all_ready = true;
    let report: Vec<Value> = models
        .iter()
        .map(|model| {
            let pools = router.pools_of(model);
            let reasons: Vec<String> = pools.iter().filter_map(|p| p.ineligibility()).collect();
            let ready = reasons.len() < pools.len();
            all_ready &= ready;
            let workers: Vec<Value> = pools
                .iter()
                .flat_map(|p| p.all_workers())
                .map(|w| {
                    json!({
                        "pool": &*w.pool,
                        "role": w.role.as_str(),
                        "worker": w.authority,
                        "eligible": w.is_eligible(),
                        "reason": w.ineligibility(),
                        "kv_tokens": w.kv_tokens(),
                        "outstanding": w.outstanding(),
                        "discovery": match w.discovery() {
                            Discovery::Pending => "pending".to_owned(),
                            Discovery::Found(_) => "ok".to_owned(),
                            Discovery::Failed(e) => e,
                        },
                    })
                })
                .collect();
            json!({"model": model, "ready": ready, "reasons": reasons, "workers": workers})
        })
        .collect();
    (all_ready, json!({"ready": all_ready, "models": report}))
}

fn json_response(status: StatusCode, value: Value) -> Response<BoxBody> {
    let mut r = Response::new(body::full(value.to_string()));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

// === impl Admin ===

impl<B> Service<Request<B>> for Admin {
    type Response = Response<BoxBody>;
    type Error = Infallible;
    type Future = Ready<Result<Response<BoxBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let response = match (request.method(), request.uri().path()) {
            (&Method::GET, "/health") => {
                if self.shutdown.is_triggered() {
                    json_response(
                        StatusCode::SERVICE_UNAVAILABLE,
                        json!({"status": "draining"}),
                    )
                } else {
                    json_response(StatusCode::OK, json!({"status": "ok"}))
                }
            }
            (&Method::GET, "/ready") => {
                let (ok, report) = readiness(&self.router);
                let status = if ok && !self.shutdown.is_triggered() {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                json_response(status, report)
            }
            (&Method::POST, "/reload") => match self.reloader.as_ref().map(Reloader::reload) {
                Some(Ok(report)) => json_response(StatusCode::OK, report),
                Some(Err(e)) => json_response(
                    StatusCode::BAD_REQUEST,
                    json!({"error": {"message": format!("reload refused, running config kept: {e}"), "type": "invalid_request_error", "param": null, "code": "invalid_config"}}),
                ),
                None => json_response(
                    StatusCode::NOT_FOUND,
                    json!({"error": {"message": "reload is not available", "type": "invalid_request_error", "param": null, "code": "not_found"}}),
                ),
            },
            (&Method::GET, "/metrics") => {
                let mut r = Response::new(body::full(crate::metrics::handle().render()));
                r.headers_mut().insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/plain; version=0.0.4"),
                );
                r
            }
            (_, path) => json_response(
                StatusCode::NOT_FOUND,
                json!({"error": {"message": format!("unknown admin path {path}; try /health, /ready or /metrics"), "type": "invalid_request_error", "param": null, "code": "not_found"}}),
            ),
        };
        ready(Ok(response))
    }
}
