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
//!
//! Answer kinds (`mock_answer.rs`): a request whose body contains `[answer:KIND]` (in a
//! message, a prompt, anywhere) is answered with that kind's text — `prose` (the default,
//! also without a marker), `code` (Rust and Python), `digits` (order numbers, amounts,
//! dates, IP addresses), `cjk` (Chinese and Japanese prose) — so one mock serves a bench
//! that compares them. The cache stays keyed by the whole body, marker included.
//!
//! Pace (`--first-token-ms`, `--token-latency-ms`; both 0 by default): unpaced, a stream is
//! written as one prepared body at once, as it always was. Paced, the same prepared events
//! are sent one by one (the simulated engine's SSE body): the first token event after the
//! first-token wait (one token latency when that is 0), each later one a token latency
//! after the one before; a JSON answer waits as long as its tokens would. Paced streams are
//! counted in [`RunningMock::stats`] (`token_events_sent` among them).

use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use serde_json::{json, Value};
use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

use super::answer::Style;
use super::cli::{io, wait_for_signal, EngineArgs, SimError};
use super::config::SimConfig;
use super::listen::{full, json_response, Body, ResetConnection};
use super::mock_answer::AnswerKind;
use super::reasoning::ThinkingTemplate;
use super::reply::{Event, Reply};
use super::request::{self, Api, GenRequest};
use super::schedule::{Finish, SampleResult};
use super::stats::{SimStats, SimStatsSnapshot};
use super::stream::{Pace, SseBody};
use super::{native, openai};
use kvgate_tokenize::ModelTokenizer;

/// Prepared answers kept; past it the cache starts over (a load test repeats few bodies).
const CACHE_ENTRIES: usize = 4096;
/// Bodies up to this size are counted on the request's own thread.
const INLINE_BYTES: usize = 16 * 1024;
/// Largest request body accepted.
const MAX_BODY_BYTES: usize = 64 << 20;

/// Command-line arguments of the mock engine.
///
/// The answer's kind is chosen per request: put `[answer:prose]`, `[answer:code]`,
/// `[answer:digits]` or `[answer:cjk]` anywhere in the request (e.g. the user message);
/// without a marker the answer is prose.
#[derive(clap::Args, Clone, Debug)]
#[command(
    after_help = "Answer kinds: a request containing [answer:prose], [answer:code], \
[answer:digits] or [answer:cjk] (anywhere, e.g. in the user message) is answered with that \
kind's text (prose: English sentences; code: Rust and Python; digits: order numbers, amounts, \
dates, IP addresses; cjk: Chinese and Japanese prose); without a marker, prose.\n\
Pace: with --first-token-ms or --token-latency-ms above 0, a stream's events are sent one per \
token after the first-token wait; with both 0, the whole stream at once."
)]
pub struct MockArgs {
    #[command(flatten)]
    pub engine: EngineArgs,
    /// Milliseconds between generated tokens (0: a stream is written at once).
    #[arg(long, default_value_t = 0)]
    pub token_latency_ms: u64,
    /// Milliseconds before the first generated token of a stream (time to first token);
    /// 0: one --token-latency-ms.
    #[arg(long, default_value_t = 0)]
    pub first_token_ms: u64,
}

/// One request's answer, ready to write again.
#[derive(Clone)]
enum Prepared {
    /// `tokens`: generated tokens, for a paced mock's wait.
    Json {
        status: StatusCode,
        body: Bytes,
        tokens: usize,
    },
    /// The whole stream, and its events as slices of it (for a paced mock).
    Sse { whole: Bytes, events: Arc<[Event]> },
}

/// The mock's state: its tokenizer, each answer kind's ids and the prepared answers.
struct Mock {
    config: SimConfig,
    pace: Pace,
    tokenizer: Arc<ModelTokenizer>,
    /// Indexed by [`AnswerKind::index`].
    answers: Vec<Vec<u32>>,
    prepared: Mutex<HashMap<u64, Prepared>>,
    hasher: std::collections::hash_map::RandomState,
    stats: Arc<SimStats>,
    changed: Arc<Notify>,
}

/// A running mock engine.
#[derive(Debug)]
pub struct RunningMock {
    /// Address of the HTTP API.
    pub http_addr: SocketAddr,
    stats: Arc<SimStats>,
    shutdown: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl RunningMock {
    /// Counters of paced streams (an unpaced mock counts nothing, to stay cheapest).
    pub fn stats(&self) -> SimStatsSnapshot {
        self.stats.snapshot()
    }

    /// Stops accepting and drops open connections.
    pub async fn shutdown(self) {
        self.shutdown.send_replace(true);
        let _ = self.task.await;
    }
}

/// Serves an unpaced mock on an already-bound listener.
pub fn spawn_mock(
    model: &str,
    tokenizer: Arc<ModelTokenizer>,
    http: TcpListener,
) -> std::io::Result<RunningMock> {
    let config = SimConfig {
        model: model.to_string(),
        ..SimConfig::default()
    };
    spawn_mock_with(config, tokenizer, http)
}

/// Serves a mock on an already-bound listener; of `config` it uses the model name and the
/// pace (`token_latency`, `first_token_latency`).
pub fn spawn_mock_with(
    config: SimConfig,
    tokenizer: Arc<ModelTokenizer>,
    http: TcpListener,
) -> std::io::Result<RunningMock> {
    let http_addr = http.local_addr()?;
    let answers = AnswerKind::ALL
        .into_iter()
        .map(|kind| kind.ids(&tokenizer))
        .collect::<Result<Vec<_>, _>>()?;
    let stats = Arc::new(SimStats::default());
    let mock = Arc::new(Mock {
        pace: Pace::of(&config),
        config,
        tokenizer,
        answers,
        prepared: Mutex::new(HashMap::new()),
        hasher: std::collections::hash_map::RandomState::new(),
        stats: Arc::clone(&stats),
        changed: Arc::new(Notify::new()),
    });
    let (shutdown, stop) = watch::channel(false);
    let task = super::listen::serve(http, stop, move |req| handle(Arc::clone(&mock), req));
    Ok(RunningMock {
        http_addr,
        stats,
        shutdown,
        task,
    })
}

/// Runs the mock engine described by `args` until Ctrl-C or SIGTERM.
pub async fn run_mock_cli(args: MockArgs) -> Result<(), SimError> {
    let tokenizer = args.engine.load_tokenizer().await?;
    let http = args.engine.bind().await?;
    let config = SimConfig {
        model: args.engine.model.clone(),
        token_latency: Duration::from_millis(args.token_latency_ms),
        first_token_latency: Duration::from_millis(args.first_token_ms),
        ..SimConfig::default()
    };
    let running = spawn_mock_with(config, Arc::new(tokenizer), http)
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
    Ok(mock.respond(prepared).await)
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
        let results = self.results(&req, AnswerKind::of_body(body));
        let reply = match api {
            Api::Generate => native::reply(&req, &results, &self.tokenizer, 0.0),
            Api::Chat | Api::Completions => {
                // The mock's fixed texts come as they are: no thought before them.
                let style = Style {
                    tokenizer: &self.tokenizer,
                    template: ThinkingTemplate::default(),
                    reasoning_parser: false,
                    plain: false,
                };
                openai::reply(&req, &self.config, &results, &style).0
            }
        };
        match reply {
            Reply::Full { status, body } => Prepared::Json {
                status: StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR),
                body: Bytes::from(body.to_string()),
                tokens: results.iter().map(|r| r.output_ids.len()).sum(),
            },
            Reply::Stream(events) => {
                let (whole, events) = concat(&events);
                Prepared::Sse { whole, events }
            }
        }
    }

    /// Every sample answers the fixed text of `kind`, cut to `max_new_tokens`.
    fn results(&self, req: &GenRequest, kind: AnswerKind) -> Vec<SampleResult> {
        let ids = self
            .answers
            .get(kind.index())
            .map(Vec::as_slice)
            .unwrap_or_default();
        let n = req.max_new_tokens.min(ids.len());
        req.samples
            .iter()
            .map(|s| SampleResult {
                rid: s.rid.clone(),
                prompt_tokens: s.input_ids.len(),
                // No pool, no prefix cache: nothing is ever cached.
                cached_tokens: 0,
                silent_cached_tokens: 0,
                output_ids: ids.get(..n).unwrap_or_default().to_vec(),
                finish: Finish::Length { length: n },
                cache_insert: None,
            })
            .collect()
    }

    /// The response for `prepared`: at once when unpaced, else event by event.
    async fn respond(&self, prepared: Prepared) -> Response<Body> {
        if self.pace.is_zero() {
            return respond(prepared);
        }
        match prepared {
            Prepared::Json { tokens, .. } => {
                if tokens > 0 {
                    let later = u32::try_from(tokens - 1).unwrap_or(u32::MAX);
                    tokio::time::sleep(self.pace.first + self.pace.every.saturating_mul(later))
                        .await;
                }
                respond(prepared)
            }
            Prepared::Sse { events, .. } => {
                let body = SseBody::new(
                    events
                        .iter()
                        .cloned()
                        .collect::<std::collections::VecDeque<_>>(),
                    self.pace,
                    Vec::new(),
                    Arc::clone(&self.stats),
                    Arc::clone(&self.changed),
                );
                with_type(Response::new(body.boxed_unsync()), "text/event-stream")
            }
        }
    }
}

/// The events written back to back, and each event as a slice of that one buffer.
fn concat(events: &[Event]) -> (Bytes, Arc<[Event]>) {
    let mut out = Vec::with_capacity(events.iter().map(|e| e.data.len()).sum());
    let mut spans = Vec::with_capacity(events.len());
    for event in events {
        let start = out.len();
        out.extend_from_slice(&event.data);
        spans.push((event.token, start..out.len()));
    }
    let whole = Bytes::from(out);
    let events = spans
        .into_iter()
        .map(|(token, span)| Event {
            token,
            data: whole.slice(span),
        })
        .collect();
    (whole, events)
}

fn error(api: Api, status: u16, message: &str) -> Prepared {
    let body = match api {
        Api::Generate => native::error_body(message),
        Api::Chat | Api::Completions => openai::error_object(message, status),
    };
    Prepared::Json {
        status: StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_REQUEST),
        body: Bytes::from(body.to_string()),
        tokens: 0,
    }
}

fn respond(prepared: Prepared) -> Response<Body> {
    let (status, body, content_type) = match prepared {
        Prepared::Json { status, body, .. } => (status, body, "application/json"),
        Prepared::Sse { whole, .. } => (StatusCode::OK, whole, "text/event-stream"),
    };
    let mut response = with_type(Response::new(full(body)), content_type);
    *response.status_mut() = status;
    response
}

fn with_type(mut response: Response<Body>, content_type: &'static str) -> Response<Body> {
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

    #[test]
    fn help_names_the_answer_kinds_and_the_pace() {
        use clap::Args;
        let help = MockArgs::augment_args(clap::Command::new("mock-engine"))
            .render_long_help()
            .to_string();
        for want in [
            "[answer:code]",
            "[answer:cjk]",
            "--first-token-ms",
            "--token-latency-ms",
        ] {
            assert!(help.contains(want), "{want} in {help}");
        }
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
