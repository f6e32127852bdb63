//! `kvgate demo`: the gateway plus a simulated SGLang engine for every worker of the demo
//! config (one prefill/decode pool, one unified pool), all in one process on loopback.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

use crate::config::{Config, ConfigError, PoolConfig, WorkerConfig};
use crate::runtime::{Gateway, RunningGateway, StartError};
use kvgate_sim::{RunningSim, SimConfig, SimFault, SimRole};
use kvgate_tokenize::ModelTokenizer;

/// The demo tenant's API key (its SHA-256 is in `config/demo.toml`).
pub const DEMO_API_KEY: &str = "kvgate-demo-key";

/// The demo deployment.
pub const DEFAULT_CONFIG: &str = "config/demo.toml";
/// The canary demo: a stable and a canary pool with a rollout (`--canary`).
pub const CANARY_CONFIG: &str = "config/demo-canary.toml";

/// `kvgate demo` options.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// The demo deployment [default: config/demo.toml, or config/demo-canary.toml with
    /// --canary].
    #[arg(long, short)]
    pub config: Option<PathBuf>,
    /// Make the simulated engines misbehave, e.g. `incident` to replay the incident's engine bug.
    #[arg(long, value_enum, default_value = "none")]
    pub fault: SimFault,
    /// A canary rollout: config/demo-canary.toml, whose canary pool's engines are faulty
    /// (`--canary-fault`), so the gateway rolls it back by itself.
    #[arg(long)]
    pub canary: bool,
    /// The fault of the rollouts' canary pools [default: wrong-prompt-tokens with --canary,
    /// else --fault].
    #[arg(long, value_enum)]
    pub canary_fault: Option<SimFault>,
    /// Delay between generated tokens, to watch streams arrive.
    #[arg(long, default_value_t = 20)]
    pub token_latency_ms: u64,
    /// Bind every port on 127.0.0.1:0 instead of the addresses in the config (tests, or when
    /// the config's ports are taken).
    #[arg(long)]
    pub ephemeral: bool,
}

/// Why the demo could not start.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("demo engine for {url}: {reason}")]
    Engine { url: String, reason: String },
    #[error("cannot listen on {addr}: {source} (try --ephemeral)")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("loading tokenizer for model `{model}`: {reason}")]
    Tokenizer { model: String, reason: String },
    #[error(transparent)]
    Start(#[from] StartError),
}

/// A running demo.
#[derive(Debug)]
pub struct RunningDemo {
    pub gateway: RunningGateway,
    pub engines: Vec<RunningSim>,
    /// The canary rollout demo (`--canary`).
    pub canary: bool,
}

impl RunningDemo {
    /// Stop the gateway (draining), then the engines.
    pub async fn shutdown(self) {
        self.gateway.shutdown().await;
        for engine in self.engines {
            engine.shutdown().await;
        }
    }
}

async fn bind(addr: SocketAddr) -> Result<TcpListener, DemoError> {
    TcpListener::bind(addr)
        .await
        .map_err(|source| DemoError::Bind { addr, source })
}

fn loopback(ephemeral: bool, configured: SocketAddr) -> SocketAddr {
    if ephemeral {
        SocketAddr::from(([127, 0, 0, 1], 0))
    } else {
        configured
    }
}

/// Start engines and gateway.
pub async fn start(args: &DemoArgs) -> Result<RunningDemo, DemoError> {
    let path = match (&args.config, args.canary) {
        (Some(path), _) => path.clone(),
        (None, true) => PathBuf::from(CANARY_CONFIG),
        (None, false) => PathBuf::from(DEFAULT_CONFIG),
    };
    let mut config = Config::load(&path)?;
    // With --canary, the canary pools of the config's rollouts run the faulty engine.
    let canary_fault = match (args.canary, args.canary_fault) {
        (_, Some(fault)) => fault,
        (true, None) => SimFault::WrongPromptTokens,
        (false, None) => args.fault,
    };
    let canary_pools: Vec<String> = config.rollouts.iter().map(|r| r.canary.clone()).collect();
    let mut engines = Vec::new();
    let mut tokenizers: Vec<(String, Arc<ModelTokenizer>)> = Vec::new();
    for model in &config.models {
        let tokenizer =
            crate::runtime::load_tokenizer(&model.tokenizer, model.chat_template.as_deref())
                .map_err(|e| DemoError::Tokenizer {
                    model: model.name.clone(),
                    reason: e.to_string(),
                })?;
        tokenizers.push((model.name.clone(), tokenizer));
    }
    let windows: Vec<(String, u64)> = config
        .models
        .iter()
        .map(|m| (m.name.clone(), m.context_window))
        .collect();
    let visions: std::collections::HashMap<String, Option<kvgate_sim::VisionConfig>> = config
        .pools
        .iter()
        .map(|p| (p.name.clone(), sim_vision(&config, p)))
        .collect();
    for pool in &mut config.pools {
        let window = windows
            .iter()
            .find(|(n, _)| *n == pool.model)
            .map_or(32_768, |(_, w)| *w);
        let Some(tokenizer) = tokenizers
            .iter()
            .find(|(n, _)| *n == pool.model)
            .map(|(_, t)| t.clone())
        else {
            continue;
        };
        let served = pool_model(pool);
        let faulty = canary_pools.contains(&pool.name);
        let engine_args = EngineSetup {
            fault: if faulty { canary_fault } else { args.fault },
            // The demo's engines report the version their pool says it runs.
            version: pool.version.clone(),
            vision: visions.get(&pool.name).cloned().flatten(),
        };
        for (role, worker) in workers_mut(pool) {
            let engine = start_engine(
                args,
                &engine_args,
                role,
                worker,
                window,
                &served,
                tokenizer.clone(),
            )
            .await?;
            engines.push(engine);
        }
    }
    if args.ephemeral {
        config.server.listen = SocketAddr::from(([127, 0, 0, 1], 0));
        config.server.admin_listen = SocketAddr::from(([127, 0, 0, 1], 0));
    }
    let data = bind(config.server.listen).await?;
    let admin = bind(config.server.admin_listen).await?;
    let gateway = Gateway::new(config)?.start(data, admin).await?;
    Ok(RunningDemo {
        gateway,
        engines,
        canary: args.canary,
    })
}

fn pool_model(pool: &PoolConfig) -> String {
    pool.served_model
        .clone()
        .unwrap_or_else(|| pool.model.clone())
}

fn workers_mut(pool: &mut PoolConfig) -> Vec<(SimRole, &mut WorkerConfig)> {
    let mut out: Vec<(SimRole, &mut WorkerConfig)> = Vec::new();
    out.extend(pool.workers.iter_mut().map(|w| (SimRole::Unified, w)));
    out.extend(pool.prefill.iter_mut().map(|w| (SimRole::Prefill, w)));
    out.extend(pool.decode.iter_mut().map(|w| (SimRole::Decode, w)));
    out
}

/// What one pool's simulated engines are told.
struct EngineSetup {
    fault: SimFault,
    version: Option<String>,
    /// A vision model's engines size images as its processor does (and as the pool's
    /// engines pre-resize them).
    vision: Option<kvgate_sim::VisionConfig>,
}

/// The sim's vision configuration for a pool of a model that takes images.
fn sim_vision(config: &Config, pool: &PoolConfig) -> Option<kvgate_sim::VisionConfig> {
    use crate::config::VisionFamilyName;
    let vision = config
        .models
        .iter()
        .find(|m| m.name == pool.model)?
        .vision
        .as_ref()?;
    let family = match vision.family {
        VisionFamilyName::Qwen2Vl => kvgate_sim::VisionFamily::Qwen25Vl,
        VisionFamilyName::Qwen3Vl => kvgate_sim::VisionFamily::Qwen3Vl,
        VisionFamilyName::Gemma3 => kvgate_sim::VisionFamily::Gemma3,
    };
    Some(kvgate_sim::VisionConfig {
        max_pixels_cap: pool.images.pre_resize_max_pixels,
        ..kvgate_sim::VisionConfig::new(family)
    })
}

async fn start_engine(
    args: &DemoArgs,
    setup: &EngineSetup,
    role: SimRole,
    worker: &mut WorkerConfig,
    window: u64,
    model: &str,
    tokenizer: Arc<ModelTokenizer>,
) -> Result<RunningSim, DemoError> {
    let url = worker.url.to_string();
    let engine_error = |reason: String| DemoError::Engine {
        url: url.clone(),
        reason,
    };
    let host = worker.url.host().unwrap_or_default();
    let ip: std::net::IpAddr = host.trim_matches(['[', ']']).parse().map_err(|_| {
        engine_error("demo engines run on loopback: use an IP address such as 127.0.0.1".into())
    })?;
    if !ip.is_loopback() {
        return Err(engine_error("demo engines run on loopback only".into()));
    }
    let port = worker.url.port_u16().unwrap_or(80);
    let http = bind(loopback(args.ephemeral, SocketAddr::new(ip, port))).await?;
    let bootstrap = if role == SimRole::Prefill {
        let port = worker.bootstrap_port.unwrap_or(0);
        Some(bind(loopback(args.ephemeral, SocketAddr::new(ip, port))).await?)
    } else {
        None
    };
    let kv_tokens = worker.kv_tokens.unwrap_or(window);
    let sim_config = SimConfig {
        role,
        model: model.to_owned(),
        kv_tokens: usize::try_from(kv_tokens).unwrap_or(usize::MAX),
        context_length: usize::try_from(window).unwrap_or(usize::MAX),
        fault: setup.fault,
        token_latency: Duration::from_millis(args.token_latency_ms),
        // Stored responses (`previous_response_id`), as `--enable-response-store` gives
        // SGLang: a unified server only.
        enable_response_store: role == SimRole::Unified,
        vision: setup.vision.clone(),
        version: setup
            .version
            .clone()
            .unwrap_or_else(|| SimConfig::default().version),
        ..SimConfig::default()
    };
    let running = kvgate_sim::spawn(sim_config, tokenizer, http, bootstrap)
        .await
        .map_err(|e| engine_error(e.to_string()))?;
    // Point the gateway at where the engine really listens (ports may be ephemeral).
    worker.url = format!("http://{}", running.http_addr)
        .parse()
        .map_err(|e| engine_error(format!("{e}")))?;
    if let Some(b) = running.bootstrap_addr {
        worker.bootstrap_port = Some(b.port());
    }
    Ok(running)
}

/// Wait for Ctrl-C or SIGTERM.
pub async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match signal(SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = tokio::signal::ctrl_c() => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The canary demo's admin token (`config/demo-admin-token`).
pub const DEMO_ADMIN_TOKEN: &str = "kvgate-demo-admin";

/// What `kvgate demo --canary` prints once everything listens.
fn canary_banner(demo: &RunningDemo) -> String {
    let base = format!("http://{}", demo.gateway.data_addr());
    let admin = format!("http://{}", demo.gateway.admin_addr());
    let auth = format!("-H 'Authorization: Bearer {DEMO_ADMIN_TOKEN}'");
    format!(
        r#"kvgate canary demo is ready.
  gateway:  {base}   (admin: {admin}/ready, /metrics, /rollouts, /pools)
  status:   {admin}/status in a browser (the status page, refreshes itself)
  pools:    "stable" (engine 0.5.22-sim, weight 75) and "canary" (engine 0.5.23-sim, weight
            25, faulty: it misreports prompt_tokens, so the guard stops every answer it gives)
  tenants:  demo (key {DEMO_API_KEY}) lands on stable, demo-2 (key {DEMO_API_KEY}-2) on the
            canary: the split is sticky per tenant
  admin:    token {DEMO_ADMIN_TOKEN}

Send traffic as both tenants; demo-2 gets 502s from the canary until it is rolled back
(after 20 canary requests), then 200s from stable. No client ever gets a false 200:
  for i in $(seq 1 30); do for key in {DEMO_API_KEY} {DEMO_API_KEY}-2; do
    curl -s -o /dev/null -w "$key %{{http_code}} %header{{x-kvgate-pool}}
" {base}/v1/chat/completions       -H "Authorization: Bearer $key" -H 'Content-Type: application/json'       -d '{{"model":"qwen3","messages":[{{"role":"user","content":"Hello canary"}}],"max_tokens":8}}'
  done; done

Watch it roll back (phase, the signal, both pools' rates):
  curl -s {admin}/rollouts {auth}
Try the canary by hand (tenant demo may choose a pool):
  curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {DEMO_API_KEY}' -H 'x-kvgate-pool: canary'     -H 'Content-Type: application/json' -d '{{"model":"qwen3","messages":[{{"role":"user","content":"Hi"}}],"max_tokens":8}}'
Clear the rollback (the canary was fixed) or promote it:
  curl -s -X POST {admin}/rollouts/qwen3/clear {auth}
  curl -s -X POST {admin}/rollouts/qwen3/promote {auth}

Ctrl-C stops everything."#
    )
}

/// What `kvgate demo` prints once everything listens.
pub fn banner(demo: &RunningDemo) -> String {
    if demo.canary {
        return canary_banner(demo);
    }
    let addr = demo.gateway.data_addr();
    let admin = demo.gateway.admin_addr();
    let base = format!("http://{addr}");
    format!(
        r#"kvgate demo is ready.
  gateway:  {base}   (admin: http://{admin}/ready, /metrics)
  status:   http://{admin}/status in a browser (the status page, refreshes itself)
  engines:  {engines} simulated SGLang engines (prefill/decode pool "pd", unified pool "unified",
            and pool "vision" of the vision-language model "qwen2.5-vl")
  API key:  {DEMO_API_KEY}

Try:
  curl -s {base}/v1/models -H 'Authorization: Bearer {DEMO_API_KEY}'

  curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {DEMO_API_KEY}' \
    -H 'Content-Type: application/json' \
    -d '{{"model":"qwen3","messages":[{{"role":"user","content":"Hello from the demo"}}],"max_tokens":16}}'

  curl -sN {base}/v1/chat/completions -H 'Authorization: Bearer {DEMO_API_KEY}' \
    -H 'Content-Type: application/json' \
    -d '{{"model":"qwen3","stream":true,"messages":[{{"role":"user","content":"Stream this, please"}}],"max_tokens":16}}'

  curl -s {base}/generate -H 'Authorization: Bearer {DEMO_API_KEY}' \
    -H 'Content-Type: application/json' \
    -d '{{"text":"The quick brown fox","sampling_params":{{"max_new_tokens":8}}}}'

  # a tool call (tool_choice names the function; send the answer back as a "tool" message)
  curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {DEMO_API_KEY}' \
    -H 'Content-Type: application/json' \
    -d '{{"model":"qwen3","max_tokens":64,"messages":[{{"role":"user","content":"Weather in Paris?"}}],"tools":[{{"type":"function","function":{{"name":"get_weather","parameters":{{"type":"object","properties":{{"city":{{"type":"string"}}}},"required":["city"]}}}}}}],"tool_choice":{{"type":"function","function":{{"name":"get_weather"}}}}}}'

  # an image (a data: URL; remote URLs only where a pool sets [pools.images] remote = true),
  # counted as the engine's image processor sizes it: 1x1 PNG here, 4 image tokens
  curl -s {base}/v1/chat/completions -H 'Authorization: Bearer {DEMO_API_KEY}' \
    -H 'Content-Type: application/json' \
    -d '{{"model":"qwen2.5-vl","max_tokens":8,"messages":[{{"role":"user","content":[{{"type":"text","text":"What is this?"}},{{"type":"image_url","image_url":{{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAIAAACQd1PeAAAADElEQVR4nGNgYGAAAAAEAAH2FzhVAAAAAElFTkSuQmCC"}}}}]}}]}}'

  # the OpenAI SDK: models.retrieve, content parts, enable_thinking, the tool loop, embeddings,
  # responses (plain, streamed, continued by previous_response_id), an image chat
  python3 tests/sdk/openai_client.py --base-url {base}/v1 --api-key {DEMO_API_KEY} --embeddings --responses --image-model qwen2.5-vl

  # the Anthropic SDK (pip install anthropic): messages plain and streamed, count_tokens
  python3 -c "import anthropic; c = anthropic.Anthropic(base_url='{base}', api_key='{DEMO_API_KEY}'); \
    print(c.messages.create(model='qwen3', max_tokens=16, messages=[{{'role': 'user', 'content': 'Hi'}}]).content); \
    print(c.messages.count_tokens(model='qwen3', messages=[{{'role': 'user', 'content': 'Hi'}}]))"
  python3 tests/sdk/anthropic_client.py {base} {DEMO_API_KEY} qwen3

  # embeddings, and kvgate's own tokenizer routes
  curl -s {base}/v1/embeddings -H 'Authorization: Bearer {DEMO_API_KEY}' \
    -H 'Content-Type: application/json' -d '{{"model":"qwen3","input":["a KV cache","holds pages"]}}'
  curl -s {base}/tokenize -H 'Authorization: Bearer {DEMO_API_KEY}' \
    -H 'Content-Type: application/json' -d '{{"prompt":"How many tokens is this?"}}'

  curl -s http://{admin}/ready

Ctrl-C stops everything."#,
        engines = demo.engines.len(),
    )
}

/// `kvgate demo`: start, print the banner, run until a signal, stop cleanly.
pub async fn run(args: DemoArgs) -> Result<(), DemoError> {
    let demo = start(&args).await?;
    println!("{}", banner(&demo));
    wait_for_signal().await;
    println!("stopping: draining the gateway, then the engines");
    demo.shutdown().await;
    Ok(())
}
