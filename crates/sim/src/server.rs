//! The engine's HTTP API: routing, request recording, info endpoints and generation.
//!
//! Load and metrics bodies are built in `load.rs` and `metrics.rs`; this file only routes.

use std::sync::Arc;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::answer::Style;
use super::config::{SimFault, SimRole, DEFAULT_BOOTSTRAP_PORT};
use super::engine::SimEngine;
use super::errors;
use super::fields::RouteBody;
use super::listen::{full, json_response, Body, ResetConnection};
use super::native;
use super::openai;
use super::reply::unix_now;
use super::request::{Api, ParseError};
use super::routes;
use super::run;
use super::scheduler::Demand;
use super::stats::ReceivedRequest;
use super::{load, metrics};

/// Largest request body accepted (a 1M-token prompt is a few MB of text).
const MAX_BODY_BYTES: usize = 64 << 20;

/// Paths the engine serves, for 405 vs 404.
const KNOWN_PATHS: &[&str] = &[
    "/generate",
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/models",
    "/get_server_info",
    "/server_info",
    "/version",
    "/get_model_info",
    "/model_info",
    "/health",
    "/health_generate",
    "/v1/loads",
    "/get_load",
    "/metrics",
];

/// Handles one HTTP request.
pub(crate) async fn handle(
    engine: Arc<SimEngine>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ResetConnection> {
    let method = req.method().clone();
    let path = req.uri().path().to_string();
    let (parts, body) = req.into_parts();
    let headers = parts.headers;
    let json_type = errors::json_content_type(&headers);
    let bytes = match Limited::new(body, MAX_BODY_BYTES).collect().await {
        Ok(collected) => collected.to_bytes(),
        Err(_) => {
            engine.stats.record(ReceivedRequest {
                path,
                headers,
                body: Value::Null,
                bytes: 0,
            });
            return Ok(json_response(
                StatusCode::PAYLOAD_TOO_LARGE,
                &native::error_body("request body too large or unreadable"),
            ));
        }
    };
    let parsed: Result<Value, String> = if bytes.is_empty() {
        Ok(Value::Null)
    } else {
        serde_json::from_slice(&bytes).map_err(|e| e.to_string())
    };
    // Record first, so tests see every request whatever happens next.
    engine.stats.record(ReceivedRequest {
        path: path.clone(),
        headers,
        body: parsed.clone().unwrap_or(Value::Null),
        bytes: bytes.len(),
    });
    match routes::Route::of(&method, &path) {
        Some(Ok(route)) => {
            return routes::serve(&engine, route, RouteBody { json_type, parsed }).await
        }
        Some(Err(())) => return Ok(routes::method_not_allowed()),
        None => {}
    }
    let response = match (&method, path.as_str()) {
        (&Method::POST, "/generate") => generation(&engine, Api::Generate, parsed).await?,
        (&Method::POST, "/v1/chat/completions") => generation(&engine, Api::Chat, parsed).await?,
        (&Method::POST, "/v1/completions") => generation(&engine, Api::Completions, parsed).await?,
        (&Method::GET, "/v1/models") => json_response(StatusCode::OK, &models(&engine)),
        (&Method::GET, "/get_server_info" | "/server_info") if engine.config.server_info => {
            json_response(StatusCode::OK, &server_info(&engine))
        }
        // SGLang and vLLM both answer this, even where the server-info routes are missing.
        (&Method::GET, "/version") => {
            json_response(StatusCode::OK, &json!({"version": engine.config.version}))
        }
        (&Method::GET, "/get_model_info" | "/model_info") => {
            json_response(StatusCode::OK, &model_info(&engine))
        }
        (&Method::GET, "/health") => Response::new(full("")),
        (&Method::GET, "/health_generate") => health_generate(&engine).await,
        (&Method::GET, "/v1/loads") => json_response(StatusCode::OK, &load::loads(&engine)),
        (&Method::GET, "/get_load") => json_response(StatusCode::OK, &load::get_load(&engine)),
        (&Method::GET, "/metrics") => {
            let mut response = Response::new(full(metrics::render(&engine)));
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/plain; version=0.0.4; charset=utf-8"),
            );
            response
        }
        (_, p) if KNOWN_PATHS.contains(&p) => routes::method_not_allowed(),
        _ => json_response(StatusCode::NOT_FOUND, &json!({"detail": "Not Found"})),
    };
    Ok(response)
}

fn error_response(api: Api, status: u16, message: &str) -> Response<Body> {
    let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    let body = match api {
        Api::Generate => native::error_body(message),
        Api::Chat | Api::Completions => openai::error_object(message, status),
    };
    json_response(code, &body)
}

async fn generation(
    engine: &Arc<SimEngine>,
    api: Api,
    parsed: Result<Value, String>,
) -> Result<Response<Body>, ResetConnection> {
    run::connection_faults(engine).await?;
    let body = match parsed {
        Ok(body) => body,
        Err(e) => return Ok(error_response(api, 400, &format!("Invalid JSON body: {e}"))),
    };
    let req = match run::parse(engine, api, body).await {
        Some(Ok(req)) => req,
        Some(Err(ParseError::BadRequest(msg))) => return Ok(error_response(api, 400, &msg)),
        Some(Err(err @ ParseError::ModelNotFound(_))) => {
            let mut body = openai::error_object(&err.to_string(), 404);
            if let Some(map) = body.as_object_mut() {
                map.insert("param".into(), json!("model"));
                map.insert("code".into(), json!("model_not_found"));
            }
            return Ok(json_response(StatusCode::NOT_FOUND, &body));
        }
        None => return Ok(error_response(api, 500, "tokenizer task failed")),
    };
    let ran = run::schedule(engine, &req).await;
    let tokenizer = &engine.tokenizer;
    let (reply, tokens) = match api {
        Api::Generate => (
            native::reply(&req, &ran.results, tokenizer, ran.e2e),
            ran.results.iter().map(|r| r.output_ids.len()).sum(),
        ),
        Api::Chat | Api::Completions => {
            let style = Style {
                tokenizer,
                template: engine.thinking,
                reasoning_parser: engine.config.reasoning_parser.is_some(),
                // The router discards a prefill's answer: it stays plain.
                plain: engine.config.role == SimRole::Prefill,
            };
            openai::reply(&req, &engine.config, &ran.results, &style)
        }
    };
    run::send(engine, reply, tokens, ran).await
}

/// `/health_generate`: a one-token generation through the scheduler (PD roles use a local
/// fake room, as SGLang uses a fake bootstrap host). Like SGLang, which answers 200 as soon
/// as any output arrived during the check, a busy engine (requests running) is healthy at
/// once instead of queueing its probe behind them.
async fn health_generate(engine: &Arc<SimEngine>) -> Response<Body> {
    if engine.scheduler.load().running > 0 {
        return Response::new(full(""));
    }
    let token = engine.tokenizer.eos_token_id().unwrap_or(0);
    let demand = Demand {
        rid: "health_generate",
        kv_tokens: 2,
        prompt_tokens: 1,
    };
    match engine.scheduler.admit(demand).await {
        Ok(pages) => {
            pages.write(&[token]);
            let ok = pages.content() == [token];
            drop(pages);
            if ok {
                Response::new(full(""))
            } else {
                json_response(
                    StatusCode::SERVICE_UNAVAILABLE,
                    &native::error_body("health generate failed"),
                )
            }
        }
        Err(err) => json_response(
            StatusCode::SERVICE_UNAVAILABLE,
            &native::error_body(&err.to_string()),
        ),
    }
}

fn models(engine: &SimEngine) -> Value {
    let c = &engine.config;
    json!({"object": "list", "data": [{
        "id": c.model, "object": "model", "created": unix_now(), "owned_by": "sglang",
        "root": c.model, "parent": null, "max_model_len": c.context_length,
    }]})
}

fn server_info(engine: &SimEngine) -> Value {
    let c = &engine.config;
    let scheduler = json!({
        "status": "ok",
        "max_total_num_tokens": c.reported_kv_tokens(),
        "max_req_input_len": c.reported_max_req_input_len(),
    });
    // `Scheduler.get_internal_state` adds the running slots its scheduler computed
    // (`effective_max_running_requests_per_dp`; sgl-project/sglang 025177e4). The sim's
    // batch is bounded only when `--max-running-requests` is given: without it, no key
    // (a real engine would report its computed limit).
    let mut internal = scheduler.clone();
    if let (Some(map), Some(n)) = (internal.as_object_mut(), c.max_running_requests) {
        map.insert(
            "effective_max_running_requests_per_dp".into(),
            json!(n.get()),
        );
    }
    json!({
        "model_path": c.model,
        "tokenizer_path": c.model,
        "served_model_name": c.model,
        "context_length": c.context_length,
        "page_size": c.page_size,
        "max_total_tokens": c.reported_kv_tokens(),
        "disaggregation_mode": c.role.disaggregation_mode(),
        "disaggregation_bootstrap_port": engine.bootstrap_port.unwrap_or(DEFAULT_BOOTSTRAP_PORT),
        "disaggregation_transfer_backend": "sim",
        "allow_auto_truncate": false,
        "disable_radix_cache": c.disable_radix_cache,
        // SGLang's HiCache and LMCache switches (`ServerArgs`): the shared lower level of
        // `SimFault::SharedLowerTier` shows as a storage backend; the silent variant, like
        // llama.cpp, says nothing of it.
        "enable_hierarchical_cache": c.fault == SimFault::SharedLowerTier,
        "hicache_storage_backend": (c.fault == SimFault::SharedLowerTier).then_some("file"),
        "enable_lmcache": false,
        "enable_cache_report": c.enable_cache_report,
        "reasoning_parser": c.reasoning_parser.map(|p| p.name()),
        "sim_fault": format!("{:?}", c.fault),
        // The flag as given (the server args' dump), `null` when unset.
        "max_running_requests": c.max_running_requests.map(|n| n.get()),
        "scheduler_info": scheduler,
        "internal_states": [internal],
        "version": c.version,
    })
}

fn model_info(engine: &SimEngine) -> Value {
    let c = &engine.config;
    json!({
        "model_path": c.model,
        "tokenizer_path": c.model,
        "is_generation": true,
        "preferred_sampling_params": null,
        "weight_version": "default",
        "has_image_understanding": false,
        "has_audio_understanding": false,
        "model_type": "sim",
        "architectures": ["SimForCausalLM"],
    })
}
