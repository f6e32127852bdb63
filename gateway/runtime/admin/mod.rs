//! The admin port: `GET /health` (the process is up; 503 while draining), `GET /ready`
//! (every model has an eligible worker; says why not), `GET /metrics` (Prometheus text),
//! `GET /status` (the HTML status page, `status_page`), `POST /reload` (read the config file
//! and the certificates again, `runtime::process::reload`) and the pools and rollouts API
//! (`api`). `/reload` and the API need the admin token (`server.admin_token_env` or
//! `server.admin_token_file`) as `Authorization: Bearer <token>`: 401 without it, 403 when
//! no token is configured.
//!
//! `GET /status` needs no token, like `/metrics` and `/ready`: it only reads, it shows what
//! those two already expose on this private port (pools, workers, capacity, health,
//! counts by code and reason; no tenant, key or prompt), and a person opens it in a
//! browser, which cannot send a Bearer header from the address bar. Keep the admin port
//! off public networks.

pub mod api;
pub mod status_page;

use futures_util::future::BoxFuture;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body::Body;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use std::convert::Infallible;
use std::sync::Arc;
use std::task::{Context, Poll};
use tower::Service;

use crate::accounting::Accounting;
use crate::activity::Activity;
use crate::body::{self, BoxBody, BoxError};
use crate::fleet::Fleet;
use crate::runtime::listener::server::Shutdown;
use crate::runtime::process::live::Live;
use crate::runtime::process::reload::Reloader;
use crate::runtime::StartError;
use status_page::StatusSources;

/// The admin service.
#[derive(Clone, Debug)]
pub struct Admin {
    /// The current config's pools and rollouts (a reload replaces them).
    live: Arc<Live>,
    shutdown: Shutdown,
    reloader: Option<Reloader>,
    /// Recent outcomes for `/status`.
    activity: Arc<Activity>,
    /// Per-tenant accounting for `/status`.
    accounting: Option<Arc<Accounting>>,
    /// SHA-256 of the admin token (compared digest to digest, in constant time).
    token_sha256: Option<[u8; 32]>,
}

impl Admin {
    /// Report on the live pools and rollouts; `/health` turns 503 once `shutdown` fires;
    /// `POST /reload` reloads the config through `reloader`.
    pub fn new(live: Arc<Live>, shutdown: Shutdown, reloader: Option<Reloader>) -> Self {
        Self {
            live,
            shutdown,
            reloader,
            activity: Arc::new(Activity::default()),
            accounting: None,
            token_sha256: None,
        }
    }

    /// Show `activity` on `/status`.
    pub fn with_status(mut self, activity: Arc<Activity>) -> Self {
        self.activity = activity;
        self
    }

    /// Show each tenant's last hour from `accounting` on `/status`.
    pub fn with_accounting(mut self, accounting: Arc<Accounting>) -> Self {
        self.accounting = Some(accounting);
        self
    }

    /// Require `token` for mutating routes (None: they are refused).
    pub fn with_token(mut self, token: Option<String>) -> Self {
        self.token_sha256 = token.map(|t| digest(&t));
        self
    }

    /// Whether `request` may use a route behind the admin token (the reads `GET /pools` and
    /// `GET /rollouts`, every mutation): 401/403 response when not.
    fn authorize<B>(&self, request: &Request<B>) -> Result<(), Box<Response<BoxBody>>> {
        let Some(expected) = &self.token_sha256 else {
            // Read routes behind the token (`GET /pools`, `GET /rollouts`) are off too: say
            // what was refused, not that something would have been changed.
            let message = if request.method() == http::Method::GET {
                "no admin token is configured (server.admin_token_env or admin_token_file), so the admin routes behind it are off, reads included"
            } else {
                "no admin token is configured (server.admin_token_env or admin_token_file), so mutating admin routes are off"
            };
            return Err(Box::new(admin_error(
                StatusCode::FORBIDDEN,
                message,
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
pub fn readiness(fleet: &Fleet) -> (bool, Value) {
    let mut models: Vec<&str> = fleet.pools().iter().map(|p| p.model.as_str()).collect();
    models.sort_unstable();
    models.dedup();
    let mut all_ready = true;
    let report: Vec<Value> = models
        .iter()
        .map(|model| {
            let pools = fleet.pools_of(model);
            let reasons: Vec<String> = pools.iter().filter_map(|p| p.ineligibility()).collect();
            let ready = reasons.len() < pools.len();
            all_ready &= ready;
            let workers: Vec<Value> = pools
                .iter()
                .flat_map(|p| p.all_workers())
                .map(|w| crate::runtime::admin::api::worker_json(w, fleet.kv_overcommit()))
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

/// Largest admin request body read (a weight, a reason).
const MAX_ADMIN_BODY: usize = 64 * 1024;

// === impl Admin ===

impl<B> Service<Request<B>> for Admin
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<BoxBody>;
    type Error = Infallible;
    type Future = BoxFuture<'static, Result<Response<BoxBody>, Infallible>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: Request<B>) -> Self::Future {
        let this = self.clone();
        Box::pin(async move { Ok(this.answer(request).await) })
    }
}

impl Admin {
    async fn answer<B>(&self, request: Request<B>) -> Response<BoxBody>
    where
        B: Body + Send + 'static,
        B::Error: Into<BoxError>,
    {
        let path = request.uri().path().to_owned();
        if api::is_api_path(&path) {
            if let Err(refused) = self.authorize(&request) {
                return *refused;
            }
            let method = request.method().clone();
            let limited = http_body_util::Limited::new(request.into_body(), MAX_ADMIN_BODY);
            let body =
                match tokio::time::timeout(std::time::Duration::from_secs(10), limited.collect())
                    .await
                {
                    Ok(Ok(b)) => b.to_bytes(),
                    _ => {
                        return admin_error(
                            StatusCode::BAD_REQUEST,
                            "the request body could not be read (at most 64 KiB, within 10 s)",
                            "invalid_request",
                        )
                    }
                };
            let live = self.live.current();
            let (status, value) = api::handle(&live.fleet, &live.rollouts, &method, &path, &body);
            return json_response(status, value);
        }
        match (request.method(), path.as_str()) {
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
                let (ok, report) = readiness(&self.live.current().fleet);
                let status = if ok && !self.shutdown.is_triggered() {
                    StatusCode::OK
                } else {
                    StatusCode::SERVICE_UNAVAILABLE
                };
                json_response(status, report)
            }
            (&Method::POST, "/reload") => match self.authorize(&request) {
                Err(refused) => *refused,
                Ok(()) => match self.reloader.as_ref() {
                    Some(reloader) => match reloader.reload().await {
                        Ok(report) => json_response(StatusCode::OK, report),
                        Err(e) => json_response(
                            e.status(),
                            json!({"error": {"message": format!("reload refused, running config kept: {e}"), "type": e.kind(), "param": null, "code": e.code()}}),
                        ),
                    },
                    None => json_response(
                        StatusCode::NOT_FOUND,
                        json!({"error": {"message": "reload is not available", "type": "invalid_request_error", "param": null, "code": "not_found"}}),
                    ),
                },
            },
            (&Method::GET, "/status") => {
                let live = self.live.current();
                let book = self.accounting.as_ref().map(|a| a.book());
                let page = status_page::render(
                    &StatusSources {
                        fleet: &live.fleet,
                        rollouts: &live.rollouts,
                        admission: Some(&live.admission),
                        activity: &self.activity,
                        accounting: book.as_deref(),
                        last_reload: self.reloader.as_ref().and_then(Reloader::last),
                        draining: self.shutdown.is_triggered(),
                    },
                    std::time::Instant::now(),
                    std::time::SystemTime::now(),
                );
                let mut r = Response::new(body::full(page));
                let headers = r.headers_mut();
                headers.insert(
                    header::CONTENT_TYPE,
                    HeaderValue::from_static("text/html; charset=utf-8"),
                );
                // A live view: never served from a cache. Nothing on it loads from elsewhere.
                headers.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
                headers.insert(
                    header::CONTENT_SECURITY_POLICY,
                    HeaderValue::from_static("default-src 'none'; style-src 'unsafe-inline'"),
                );
                r
            }
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
                json!({"error": {"message": format!("unknown admin path {path}; try /status, /health, /ready, /metrics, /pools or /rollouts"), "type": "invalid_request_error", "param": null, "code": "not_found"}}),
            ),
        }
    }
}

/// The admin token: from `server.admin_token_env` or `server.admin_token_file` (trimmed);
/// None (mutating admin routes refused) when unset or empty.
pub(crate) fn admin_token(
    server: &crate::config::ServerConfig,
) -> Result<Option<String>, StartError> {
    if let Some(path) = &server.admin_token_file {
        let text = std::fs::read_to_string(path).map_err(|source| StartError::AdminToken {
            path: path.clone(),
            source,
        })?;
        let token = text.trim().to_owned();
        if token.is_empty() {
            tracing::warn!("server.admin_token_file is empty: the admin API is refused");
        }
        return Ok(Some(token).filter(|t| !t.is_empty()));
    }
    let token = server
        .admin_token_env
        .as_deref()
        .and_then(|v| std::env::var(v).ok())
        .filter(|t| !t.trim().is_empty())
        .map(|t| t.trim().to_owned());
    if server.admin_token_env.is_some() && token.is_none() {
        tracing::warn!(
            "server.admin_token_env names an unset or empty variable: the admin API is refused"
        );
    }
    Ok(token)
}
