//! `kvgate mock-engine`: the cheapest engine that still answers like one, for load tests.
//!
//! A load harness measures the proxy, so the engine behind it must cost next to nothing
//! and still pass every check the gateway makes: SGLang's and OpenAI's exact shapes (the
//! simulated engine's own reply builders), `prompt_tokens` equal to the real tokenizer's
//! count, `completion_tokens` within `max_tokens`, SSE streams ending in `[DONE]`. It has no
//! KV pool, no scheduler and no faults. A fixed answer (the first `max_tokens` tokens of a
//! fixed text) is built once per distinct request body and kept, so a repeated body costs a
//! hash and a copy; a body seen for the first time is counted (the fast count-only path, no
//! ids), on the blocking pool when it is large.

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::cli::{io, wait_for_signal, EngineArgs, SimError};
use super::config::SimConfig;
use super::listen::{full, json_response, Body, ResetConnection};
use super::reply::{Event, Reply};
use super::request::{self, Api, GenRequest};
use super::schedule::{Finish, SampleResult};
use super::{native, openai};
use kvgate_tokenize::ModelTokenizer;

/// The answer every request gets, cut to its `max_tokens`.
const ANSWER: &str = "Pages of KV are admitted before they are used, and never shared. ";
/// Tokens of the longest answer (the fixed text repeated).
const ANSWER_TOKENS: usize = 1024;
/// Prepared answers kept; past it the cache starts over (a load test repeats few bodies).
const CACHE_ENTRIES: usize = 4096;
/// Bodies up to this size are counted on the request's own thread.
const INLINE_BYTES: usize = 16 * 1024;
/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 64 << 20;

/// Command-line arguments of the mock engine.
#[derive(clap::Args, Clone, Debug)]
pub struct MockArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
}

/// One request's answer, ready to write again.
#[derive(Clone)]
enum Prepared {
    Json { status: StatusCode, body: Bytes },
    Sse(Bytes),
}

/// The mock's state: its tokenizer, the fixed answer's ids and the prepared answers.
struct Mock {
    config: SimConfig,
    tokenizer: Arc<ModelTokenizer>,
    answer_ids: Vec<u32>,
    prepared: Mutex<HashMap<u64, Prepared>>,
    hasher: std::collections::hash_map::RandomState,
}

/// A running mock engine.
#[derive(Debug)]
pub struct RunningMock {
    /// Address of the HTTP API.
    pub http_addr: SocketAddr,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RunningMock {
    /// Stops accepting and drops open connections.
    pub async fn shutdown(self) {
        self.shutdown.send_replace(true);
        let _ = self.task.await;
    }
}

/// Serves the mock on an already-bound listener.
pub fn spawn_mock(
    model: &str,
    tokenizer: Arc<ModelTokenizer>,
    http: TcpListener,
) -> std::io::Result<RunningMock> {
    let http_addr = http.local_addr()?;
    let text = ANSWER.repeat(ANSWER_TOKENS / 8);
    let mut answer_ids = tokenizer
        .encode(&text, false)
        .map_err(|e| std::io::Error::other(e.to_string()))?;
    answer_ids.truncate(ANSWER_TOKENS);
    let mock = Arc::new(Mock {
        config: SimConfig {
            model: model.to_string(),
            ..SimConfig::default()
        },
        tokenizer,
        answer_ids,
        prepared: Mutex::new(HashMap::new()),
        hasher: std::collections::hash_map::RandomState::new(),
    });
    let (shutdown, stop) = watch::channel(false);
    let task = super::listen::serve(http, stop, move |req| handle(Arc::clone(&mock), req));
    Ok(RunningMock {
        http_addr,
        shutdown,
        task,
    })
}

/// Runs the mock engine described by `args` until Ctrl-C or SIGTERM.
pub async fn run_mock_cli(args: MockArgs) -> Result<(), SimError> {
    let tokenizer = args.engine.load_tokenizer().await?;
    let http = args.engine.bind().await?;
    let running = spawn_mock(&args.engine.model, Arc::new(tokenizer), http)
        .map_err(io("starting the mock engine"))?;
    println!("mock-engine http=http://{}", running.http_addr);
    wait_for_signal().await?;
    running.shutdown().await;
    Ok(())
}

async fn handle(
    mock: Arc<Mock>,
    req: Request<Incoming>,
) -> Result<Response<Body>, ResetConnection> {
    let api = match (req.method(), req.uri().path()) {
        (&Method::POST, "/generate") => Api::Generate,
        (&Method::POST, "/v1/chat/completions") => Api::Chat,
        (&Method::POST, "/v1/completions") => Api::Completions,
        (&Method::GET, "/health") => return Ok(Response::new(full(""))),
        (&Method::GET, "/v1/models") => {
            let models = json!({"object": "list", "data": [
                {"id": mock.config.model, "object": "model", "owned_by": "kvgate-mock"}]});
            return Ok(json_response(StatusCode::OK, &models));
        }
        _ => {
            let body = json!({"detail": "Not Found"});
            return Ok(json_response(StatusCode::NOT_FOUND, &body));
        }
    };
    let Ok(body) = Limited::new(req.into_body(), MAX_BODY_BYTES)
        .collect()
        .await
    else {
        let body = native::error_body("request body too large or unreadable");
        return Ok(json_response(StatusCode::PAYLOAD_TOO_LARGE, &body));
    };
    let body = body.to_bytes();
    let key = {
        let mut h = mock.hasher.build_hasher();
        h.write_u8(api as u8);
        h.write(&body);
        h.finish()
    };
    let cached = mock
        .prepared
        .lock()
        .ok()
        .and_then(|map| map.get(&key).cloned());
    let prepared = match cached {
        Some(prepared) => prepared,
        None => {
            // Small bodies are counted right here (tens of µs); large ones off the workers.
            let prepared = if body.len() <= INLINE_BYTES {
                mock.prepare(api, &body)
            } else {
                let worker = Arc::clone(&mock);
                tokio::task::spawn_blocking(move || worker.prepare(api, &body))
                    .await
                    .unwrap_or_else(|_| error(api, 500, "the mock's tokenizer task failed"))
            };
            if let Ok(mut map) = mock.prepared.lock() {
                if map.len() >= CACHE_ENTRIES {
                    map.clear();
                }
                map.insert(key, prepared.clone());
            }
            prepared
        }
    };
    Ok(respond(prepared))
}

impl Mock {
    /// The answer to `body`, with usage counted by the real tokenizer.
    fn prepare(&self, api: Api, body: &[u8]) -> Prepared {
        let parsed: Value = match serde_json::from_slice(body) {
            Ok(v) => v,
            Err(e) => return error(api, 400, &format!("Invalid JSON body: {e}")),
        };
        let tokenize = request::Tokenize(&self.tokenizer, request::Tokens::CountOnly);
        let req = match request::parse_with(api, &parsed, &self.config, &tokenize) {
            Ok(req) => req,
            Err(e) => return error(api, 400, &e.to_string()),
        };
        let results = self.results(&req);
        let reply = match api {
            Api::Generate => native::reply(&req, &results, &self.tokenizer, 0.0),
            Api::Chat | Api::Completions => {
                openai::reply(&req, &self.config.model, &results, &self.tokenizer)
            }
        };
        match reply {
            Reply::Full { status, body } => Prepared::Json {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                body: Bytes::from(body.to_string()),
            },
            Reply::Stream(events) => Prepared::Sse(concat(&events)),
        }
    }

    /// Every sample answers the fixed text, cut to `max_new_tokens`.
    fn results(&self, req: &GenRequest) -> Vec<SampleResult> {
        let n = req.max_new_tokens.min(self.answer_ids.len());
        req.samples
            .iter()
            .map(|s| SampleResult {
                rid: s.rid.clone(),
                prompt_tokens: s.input_ids.len(),
                output_ids: self.answer_ids.get(..n).unwrap_or_default().to_vec(),
                finish: Finish::Length { length: n },
            })
            .collect()
    }
}

fn concat(events: &[Event]) -> Bytes {
    let mut out = Vec::with_capacity(events.iter().map(|e| e.data.len()).sum());
    for event in events {
        out.extend_from_slice(&event.data);
    }
    Bytes::from(out)
}

fn error(api: Api, status: u16, message: &str) -> Prepared {
    let body = match api {
        Api::Generate => native::error_body(message),
        Api::Chat | Api::Completions => openai::error_object(message, status),
    };
    Prepared::Json {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        body: Bytes::from(body.to_string()),
    }
}

fn respond(prepared: Prepared) -> Response<Body> {
    let (status, body, content_type) = match prepared {
        Prepared::Json { status, body } => (status, body, "application/json"),
        Prepared::Sse(body) => (StatusCode::OK, body, "text/event-stream"),
    };
    let mut response = Response::new(full(body));
    *response.status_mut() = status;
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static(content_type),
    );
    response
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tokenizer() -> Arc<ModelTokenizer> {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/tokenizers/qwen3");
        Arc::new(
            ModelTokenizer::from_files(
                &dir.join("tokenizer.json"),
                Some(&dir.join("tokenizer_config.json")),
            )
            .unwrap(),
        )
    }

    async fn post(addr: SocketAddr, path: &str, body: &Value) -> (u16, String) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let body = body.to_string();
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "POST {path} HTTP/1.1\r\nhost: mock\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
            body.len()
        );
        stream.write_all(head.as_bytes()).await.unwrap();
        stream.write_all(body.as_bytes()).await.unwrap();
        let mut out = String::new();
        stream.read_to_string(&mut out).await.unwrap();
        let status = out[9..12].parse().unwrap();
        let body = out.split_once("\r\n\r\n").unwrap().1.to_string();
        (status, body)
    }

    #[tokio::test]
    async fn answers_carry_the_real_prompt_count_and_repeat_from_the_cache() {
        let tok = tokenizer();
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mock = spawn_mock("qwen3", Arc::clone(&tok), listener).unwrap();
        let messages = json!([{"role": "user", "content": "How big is a KV page?"}]);
        let rendered = tok.apply_chat_template(&messages, None, true).unwrap();
        let want = tok.count_rendered_chat(&rendered).unwrap();
        let chat = json!({"model": "qwen3", "max_tokens": 5, "messages": messages});
        let (status, first) = post(mock.http_addr, "/v1/chat/completions", &chat).await;
        assert_eq!(status, 200, "{first}");
        let first: Value = serde_json::from_str(&first).unwrap();
        assert_eq!(first["usage"]["prompt_tokens"], json!(want));
        assert_eq!(first["usage"]["completion_tokens"], json!(5));
        let (_, again) = post(mock.http_addr, "/v1/chat/completions", &chat).await;
        assert_eq!(serde_json::from_str::<Value>(&again).unwrap(), first);

        let gen = json!({"text": "hello there", "sampling_params": {"max_new_tokens": 3}, "stream": true});
        let (status, sse) = post(mock.http_addr, "/generate", &gen).await;
        assert_eq!(status, 200);
        assert!(sse.trim_end().ends_with("data: [DONE]"), "{sse}");
        assert!(sse.contains("\"prompt_tokens\":"), "{sse}");

        let (status, bad) = post(
            mock.http_addr,
            "/v1/chat/completions",
            &json!({"messages": []}),
        )
        .await;
        assert_eq!(status, 400, "{bad}");
        mock.shutdown().await;
    }
}
