//! A faithful simulated SGLang engine: HTTP API, paged KV pool, prefill/decode roles, and
//! switchable faults, among them the incident's bug.
//!
//! No GPU runs here, so tests, the demo and benchmarks use this engine in place of SGLang.
//! It speaks SGLang's native `/generate` and the OpenAI-compatible endpoints with the shapes
//! of `engine-api.md`, counts prompts with the model's real tokenizer (so `prompt_tokens` is
//! what the real engine reports) and keeps KV in a pool whose freed pages are not cleared.
//!
//! Generated text is deterministic: the last `min(max_new_tokens, content_len)` tokens of
//! the request's KV content. A correct engine therefore echoes the end of the prompt, and an
//! engine that reads stale pages echoes someone else's prompt, which is what the incident
//! looked like from outside. On the OpenAI APIs a request's options reshape that answer as
//! a model would (`answer.rs`): `n` choices, stop strings, logprobs, a forced tool call, a
//! JSON `response_format` document, a thought before the answer (Qwen3's thinking), each
//! with `completion_tokens` equal to the tokens it shows.
//!
//! In PD mode a prefill publishes each request's KV under its `bootstrap_room` on a
//! bootstrap listener (protocol in `bootstrap.rs`), and the decode named by the same request
//! collects it from `bootstrap_host:bootstrap_port`.
//!
//! Saturation shows as it does on a real engine: a request enters the running batch only
//! when its KV fits the pool (and the batch is under `max_running_requests`); the others wait
//! in a first-come-first-served queue, which `/v1/loads`, `/get_load` and `/metrics` report.
//! A prompt's prefill takes time in proportion to its uncached length
//! (`prefill_token_latency`).
//!
//! Prompts share KV through a prefix cache, as SGLang's radix cache does: full pages of
//! earlier prompts, kept per cache partition (`cache_salt`, `extra_key`) within the pool's
//! size and evicted least recently used first, are found again by later prompts that start
//! the same way, reported as `cached_tokens` and not computed again. `--fault
//! shared-lower-tier` adds a second level below it keyed by the tokens alone (as SGLang's
//! HiCache storage and LMCache are), so prompts are found there across cache salts; its
//! `-silent` form reuses them without reporting them, as llama.cpp's RAM cache has.
//!
//! Beyond generation it serves SGLang's `/v1/embeddings`, `/v1/rerank` and `/v1/score`
//! (prompts that only prefill, through the same scheduler and pool, with made-up but
//! deterministic vectors and scores), `/tokenize` and `/detokenize`, and the Responses API
//! (`/v1/responses`, converted to a chat and answered as one; kept in this process with
//! `--enable-response-store`), each in SGLang's request, response and error shapes.
//!
//! Files: `config` (settings, roles, faults), `kv_pool` (pages), `scheduler` (running batch
//! and waiting queue), `rooms` + `bootstrap` (the KV hand-off), `request` (parsing),
//! `schedule` (checks, roles, faults), `limits` (the length limits each fault mode applies),
//! `prefix_cache` (the cache itself), `prefill` (a prefill's lookup, charge and insert), `native` / `openai` / `reply` (response shapes),
//! `stream` (SSE body), `options` (the OpenAI fields that shape an answer: `n`, `stop`,
//! logprobs, tools, `response_format`, thinking), `answer` (each choice's tokens, text or
//! tool call, and stream pieces) with `stop`, `reasoning`, `tool_call`, `json_value` and
//! `logprobs`, `openai_stream` (the streamed OpenAI shapes), `server` (routes), `load`
//! (`/v1/loads`, `/get_load`), `metrics` (`/metrics`), `listen` (accept loop), `cli` (`kvgate sim-engine` and the `kvgate-sim`
//! binary), `mock` (`kvgate mock-engine`: no pool, no faults, answers prepared once per body,
//! optionally paced; `mock_answer`: its answer kinds — the load harness's engine), `loadgen`
//! (`kvgate load-gen`: fixed-rate arrivals, latency percentiles, for the harness), `run`
//! (scheduling a parsed request and sending its reply), `routes` (the routes beyond
//! generation) with `errors` (SGLang's error bodies), `fields` (request fields as its
//! models read them), `pooling` (prefill-only prompts), `embeddings`, `rerank`, `score`,
//! `tokenize_routes`, and `responses` with `responses_request` (its model; the chat it
//! becomes is `kvgate_tokenize::prepare::responses`), `responses_output` (the response
//! object and items), `responses_stream` (its events) and `responses_store`; `vision` (a
//! vision model's image processor: the tokens of each image, `--vision`), `vision_load`
//! (loading a chat's images: `data:` and `http://` URLs, sizes from their headers) and
//! `vision_prompt` (the chat's render with each image placeholder expanded).

mod answer;
mod anthropic;
mod anthropic_stream;
mod bare_proxy;
mod bootstrap;
mod cli;
mod config;
mod embeddings;
mod engine;
mod errors;
mod fields;
mod json_value;
mod kv_pool;
mod limits;
mod listen;
mod load;
mod loadgen;
mod logprobs;
mod metrics;
mod mock;
mod mock_answer;
mod native;
mod openai;
mod openai_stream;
mod options;
mod pooling;
mod prefill;
mod prefix_cache;
mod reasoning;
mod reply;
mod request;
mod rerank;
mod responses;
mod responses_output;
mod responses_request;
mod responses_store;
mod responses_stream;
mod rooms;
mod routes;
mod run;
mod schedule;
mod scheduler;
mod score;
mod server;
mod stats;
mod stop;
mod stream;
mod tokenize_routes;
mod tool_call;
mod vision;
mod vision_load;
mod vision_prompt;

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::TcpListener;
use tokio::sync::{watch, Notify};
use tokio::task::JoinHandle;

pub use bare_proxy::{run_bare_proxy_cli, spawn_bare_proxy, BareProxyArgs};
pub use cli::{run_cli, EngineArgs, SimArgs, SimError};
pub use config::{ReasoningParser, SimConfig, SimFault, SimRole, DEFAULT_BOOTSTRAP_PORT};
pub use engine::SimEngine;
pub use loadgen::{run_load, run_load_cli, LoadArgs, LoadReport};
pub use mock::{run_mock_cli, spawn_mock, spawn_mock_with, MockArgs, RunningMock};
pub use stats::{ReceivedRequest, SimStatsSnapshot};
pub use vision::{VisionConfig, VisionFamily};

use kv_pool::KvPool;
use kvgate_tokenize::ModelTokenizer;
use prefix_cache::PrefixCache;
use rooms::Rooms;
use scheduler::Scheduler;
use stats::SimStats;

/// A running engine: its addresses and shared state.
#[derive(Debug)]
pub struct RunningSim {
    /// Address of the HTTP API.
    pub http_addr: SocketAddr,
    /// Address of the bootstrap listener (prefill role).
    pub bootstrap_addr: Option<SocketAddr>,
    /// Shared state, for assertions.
    pub engine: Arc<SimEngine>,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
}

/// Serves on already-bound listeners (tests bind 127.0.0.1:0 and keep the listener — never
/// bind/drop/rebind, never sleep for readiness). The prefill role needs `bootstrap`.
pub async fn spawn(
    config: SimConfig,
    tokenizer: Arc<ModelTokenizer>,
    http: TcpListener,
    bootstrap: Option<TcpListener>,
) -> std::io::Result<RunningSim> {
    if config.role == SimRole::Prefill && bootstrap.is_none() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "the prefill role needs a bootstrap listener",
        ));
    }
    let http_addr = http.local_addr()?;
    let bootstrap_addr = bootstrap
        .as_ref()
        .map(TcpListener::local_addr)
        .transpose()?;
    let (shutdown, stop) = watch::channel(false);
    // One wake-up for the scheduler's waiters: pages freed, seats released, queue changes.
    let wake = Arc::new(Notify::new());
    let changed = Arc::new(Notify::new());
    let stats = Arc::new(SimStats::default());
    let pool = KvPool::new(config.kv_tokens, config.page_size, Arc::clone(&wake));
    let scheduler = Scheduler::new(
        pool,
        wake,
        Arc::clone(&changed),
        Arc::clone(&stats),
        config.max_running_requests,
        config.bootstrap_timeout,
    );
    let prefix_cache = config
        .prefix_cache_capacity()
        .map(|tokens| Arc::new(PrefixCache::new(config.page_size, tokens)));
    // Issue 40's fault: a second, token-keyed level beside the prefix cache, as large.
    let lower_tier = config
        .prefix_cache_capacity()
        .filter(|_| config.fault.shared_lower_tier())
        .map(|tokens| Arc::new(PrefixCache::new(config.page_size, tokens)));
    let thinking = reasoning::ThinkingTemplate::of(&tokenizer);
    let engine = Arc::new(SimEngine {
        config,
        thinking,
        tokenizer,
        scheduler,
        prefix_cache,
        lower_tier,
        rooms: Arc::new(Rooms::default()),
        stats,
        client: bootstrap::client(),
        shutdown: stop.clone(),
        bootstrap_port: bootstrap_addr.map(|a| a.port()),
        changed,
        responses: responses_store::ResponseStore::default(),
    });
    let mut tasks = Vec::new();
    if let Some(listener) = bootstrap {
        let rooms = Arc::clone(&engine.rooms);
        let stats = Arc::clone(&engine.stats);
        tasks.push(listen::serve(listener, stop.clone(), move |req| {
            bootstrap::handle(Arc::clone(&rooms), Arc::clone(&stats), req)
        }));
    }
    let api = Arc::clone(&engine);
    tasks.push(listen::serve(http, stop, move |req| {
        server::handle(Arc::clone(&api), req)
    }));
    Ok(RunningSim {
        http_addr,
        bootstrap_addr,
        engine,
        shutdown,
        tasks,
    })
}

impl RunningSim {
    /// Stops accepting, drops open connections (also hanging ones) and ends all tasks.
    pub async fn shutdown(self) {
        self.shutdown.send_replace(true);
        for task in self.tasks {
            let _ = task.await;
        }
    }
}
