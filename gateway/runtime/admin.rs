//! The admin port: `GET /health` (the process is up; 503 while draining), `GET /ready`
//! (every model has an eligible worker; says why not), `GET /metrics` (Prometheus text) and
//! `POST /reload` (re-read tenants and API keys from the config file). Every mutating route
//! needs the admin token (`server.admin_token_env`) as `Authorization: Bearer <token>`:
//! 401 without it, 403 when no token is configured.

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
    /// SHA-256 of the admin token (compared digest to digest, in constant time).
    token_sha256: Option<[u8; 32]>,
}

impl Admin {
    /// Report on `router`; `/health` turns 503 once `shutdown` fires; `POST /reload` reloads
    /// tenants and keys through `reloader`.
    pub fn new(router: Arc<Router>, shutdown: Shutdown, reloader: Option<Reloader>) -> Self {
        Self {
            router,
            shutdown,
            reloader,
            token_sha256: None,
        }
    }

    /// Require `token` for mutating routes (None: they are refused).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token_sha256 = token.map(|t| digest(&t));
        self
    }

    /// Whether `request` may mutate: 401/403 response when not.
    fn authorize<B>(&self, request: &Request<B>) -> Result<(), Box<Response<BoxBody>>> {
        let Some(expected) = &self.token_sha256 else {
            return Err(Box::new(admin_error(
                StatusCode::FORBIDDEN,
                "no admin token is configured (server.admin_token_env), so mutating admin routes are off",
                "admin_token_not_configured",
            )));
        };
        let given = request
            .headers()
            .get(header::AUTHORIZATION)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "))
            .map(|t| digest(t.trim()));
        let matches = given.is_some_and(|g| {
            g.iter()
                .zip(expected.iter())
                .fold(0u8, |acc, (a, b)| acc | (a ^ b))
                == 0
        });
        if matches {
            Ok(())
        } else {
            Err(Box::new(admin_error(
                StatusCode::UNAUTHORIZED,
                "this admin route needs `Authorization: Bearer <admin token>`",
                "invalid_admin_token",
            )))
        }
    }
}

fn digest(token: &str) -> [u8; 32] {
    use sha2::Digest;
    sha2::Sha256::digest(token.as_bytes()).into()
}

fn admin_error(status: StatusCode, message: &str, code: &str) -> Response<BoxBody> {
    json_response(
        status,
        json!({"error": {"message": message, "type": "invalid_request_error", "param": null, "code": code}}),
    )
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
            (&Method::POST, "/reload") => match self.authorize(&request) {
                Err(refused) => *refused,
                Ok(()) => match self.reloader.as_ref().map(Reloader::reload) {
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
