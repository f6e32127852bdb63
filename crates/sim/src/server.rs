//! The engine's HTTP API: routing, request recording, info endpoints and generation.
//!
//! Load and metrics bodies are built in `load.rs` and `metrics.rs`; this file only routes.

use std::sync::Arc;
use std::time::Instant;

use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};

use super::answer::Style;
use super::config::{SimFault, SimRole, DEFAULT_BOOTSTRAP_PORT};
use super::engine::SimEngine;
use super::listen::{full, json_response, Body, ResetConnection};
use super::native;
use super::openai;
use super::prefill::{self, CacheInsert};
use super::reply::{unix_now, Reply};
use super::request::{self, Api, ParseError};
use super::schedule::{self, SampleResult};
use super::scheduler::Demand;
use super::stats::ReceivedRequest;
use super::stream::{Pace, SseBody};
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
        (_, p) if KNOWN_PATHS.contains(&p) => json_response(
            StatusCode::METHOD_NOT_ALLOWED,
            &json!({"detail": "Method Not Allowed"}),
        ),
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
    match engine.config.fault {
        SimFault::Hang => std::future::pending::<()>().await,
        SimFault::Reset => return Err(ResetConnection),
        _ => {}
    }
    let body = match parsed {
        Ok(body) => body,
        Err(e) => return Ok(error_response(api, 400, &format!("Invalid JSON body: {e}"))),
    };
    // Tokenizing is CPU work; keep it off the async workers.
    let parse = {
        let engine = Arc::clone(engine);
        tokio::task::spawn_blocking(move || {
            request::parse(api, &body, &engine.config, &engine.tokenizer)
        })
    };
    let req = match parse.await {
        Ok(Ok(req)) => req,
        Ok(Err(ParseError::BadRequest(msg))) => return Ok(error_response(api, 400, &msg)),
        Ok(Err(err @ ParseError::ModelNotFound(_))) => {
            let mut body = openai::error_object(&err.to_string(), 404);
            if let Some(map) = body.as_object_mut() {
                map.insert("param".into(), json!("model"));
                map.insert("code".into(), json!("model_not_found"));
            }
            return Ok(json_response(StatusCode::NOT_FOUND, &body));
        }
        Err(_) => return Ok(error_response(api, 500, "tokenizer task failed")),
    };
    let started = Instant::now();
    let mut results = Vec::with_capacity(req.samples.len());
    let mut pages = Vec::new();
    for sample in &req.samples {
        let (result, hold) = schedule::run_sample(engine, req.max_new_tokens, sample).await;
        results.push(result);
        pages.extend(hold);
    }
    let e2e = started.elapsed().as_secs_f64();
    // A unified engine computes the prompts' uncached KV before the first token; a prefill
    // worker spent that time before publishing, and a decode received the KV ready-made.
    let prefill = match engine.config.role {
        SimRole::Unified => {
            let uncached = results.iter().map(SampleResult::uncached_tokens).sum();
            prefill::charge(engine, uncached)
        }
        SimRole::Prefill | SimRole::Decode => std::time::Duration::ZERO,
    };
    let pace = Pace::of(&engine.config).after_prefill(prefill);
    // Unified prompts enter the prefix cache when their prefill is over: at the first token.
    let inserts: Vec<CacheInsert> = results
        .iter_mut()
        .filter_map(|r| r.cache_insert.take())
        .collect();
    let tokenizer = &engine.tokenizer;
    let (reply, tokens) = match api {
        Api::Generate => (
            native::reply(&req, &results, tokenizer, e2e),
            results.iter().map(|r| r.output_ids.len()).sum(),
        ),
        Api::Chat | Api::Completions => {
            let style = Style {
                tokenizer,
                template: engine.thinking,
                reasoning_parser: engine.config.reasoning_parser.is_some(),
                // The router discards a prefill's answer: it stays plain.
                plain: engine.config.role == SimRole::Prefill,
            };
            openai::reply(&req, &engine.config, &results, &style)
        }
    };
    match reply {
        Reply::Full { status, body } => {
            // A non-streaming answer still takes as long as generating its tokens.
            if !pace.is_zero() && tokens > 0 {
                tokio::time::sleep(pace.first).await;
            }
            // The prefill is over by the first token: from now on the prompts are cache hits.
            inserts.into_iter().for_each(CacheInsert::commit);
            if !pace.is_zero() && tokens > 1 {
                let later = u32::try_from(tokens - 1).unwrap_or(u32::MAX);
                tokio::time::sleep(pace.every.saturating_mul(later)).await;
            }
            drop(pages);
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Ok(json_response(code, &body))
        }
        Reply::Stream(mut events) => {
            let mut stall = false;
            match engine.config.fault {
                // Keep the first three token events; the end never comes.
                SimFault::CutStream => {
                    let cut = nth_token_event(&events, 3).unwrap_or(events.len().saturating_sub(2));
                    events.truncate(cut);
                }
                // Two token events, then silence with the connection open.
                SimFault::StallStream => {
                    events.truncate(nth_token_event(&events, 2).unwrap_or(events.len()));
                    stall = true;
                }
                SimFault::GarbageEvent => events.insert(
                    0,
                    crate::reply::Event {
                        token: false,
                        data: bytes::Bytes::from_static(
                            b"data: <html><body>502 Bad Gateway</body></html>\n\n",
                        ),
                    },
                ),
                _ => {}
            }
            let body = SseBody::new(
                events,
                pace,
                pages,
                Arc::clone(&engine.stats),
                Arc::clone(&engine.changed),
            )
            .stalling(stall)
            .caching(inserts);
            let mut response = Response::new(body.boxed_unsync());
            response.headers_mut().insert(
                hyper::header::CONTENT_TYPE,
                hyper::header::HeaderValue::from_static("text/event-stream"),
            );
            response.headers_mut().insert(
                hyper::header::CACHE_CONTROL,
                hyper::header::HeaderValue::from_static("no-cache"),
            );
            Ok(response)
        }
    }
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
        "enable_cache_report": c.enable_cache_report,
        "reasoning_parser": c.reasoning_parser.map(|p| p.name()),
        "sim_fault": format!("{:?}", c.fault),
        "scheduler_info": scheduler.clone(),
        "internal_states": [scheduler],
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

/// The index of the event after the first `n` token events, if there are more.
fn nth_token_event(events: &[crate::reply::Event], n: usize) -> Option<usize> {
    let mut tokens = 0;
    events.iter().position(|e| {
        tokens += usize::from(e.token);
        tokens > n
    })
}
