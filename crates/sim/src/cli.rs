//! `kvgate sim-engine ...`: run one simulated engine until Ctrl-C or SIGTERM.

use std::net::SocketAddr;
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use super::config::{ReasoningParser, SimConfig, SimFault, SimRole};
use super::vision::{VisionConfig, VisionFamily};
use kvgate_tokenize::{ModelTokenizer, TokenizeError};

/// What every engine command takes: where it listens, what it serves, its tokenizer.
#[derive(clap::Args, Clone, Debug)]
pub struct EngineArgs {
    /// Address of the HTTP API.
    #[arg(long, default_value = "127.0.0.1:30000")]
    pub listen: SocketAddr,
    /// Served model name.
    #[arg(long, default_value = "sim-model")]
    pub model: String,
    /// Path of tokenizer.json; tokenizer_config.json is looked up beside it.
    #[arg(long)]
    pub tokenizer: PathBuf,
}

impl EngineArgs {
    /// Load the tokenizer (and the chat template beside it), off the async threads.
    pub(crate) async fn load_tokenizer(&self) -> Result<ModelTokenizer, SimError> {
        let config_path = self.tokenizer.with_file_name("tokenizer_config.json");
        let config_path = config_path.exists().then_some(config_path);
        let tokenizer_path = self.tokenizer.clone();
        tokio::task::spawn_blocking(move || {
            ModelTokenizer::from_files(&tokenizer_path, config_path.as_deref())
        })
        .await
        .map_err(|e| io("loading the tokenizer")(std::io::Error::other(e)))?
        .map_err(SimError::from)
    }

    /// The tokenizer's `model_max_length` from `tokenizer_config.json` beside it, when it
    /// has a usable one (what `/tokenize` reports as `max_model_len`).
    pub(crate) fn model_max_length(&self) -> Option<usize> {
        let path = self.tokenizer.with_file_name("tokenizer_config.json");
        let text = std::fs::read_to_string(path).ok()?;
        let config: serde_json::Value = serde_json::from_str(&text).ok()?;
        config
            .get("model_max_length")?
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
    }

    /// Bind the HTTP listener.
    pub(crate) async fn bind(&self) -> Result<tokio::net::TcpListener, SimError> {
        tokio::net::TcpListener::bind(self.listen)
            .await
            .map_err(io(format!("binding {}", self.listen)))
    }
}

/// Command-line arguments of the simulated engine.
#[derive(clap::Args, Clone, Debug)]
pub struct SimArgs {
    /// Unified, prefill or decode worker.
    #[arg(long, value_enum, default_value_t = SimRole::Unified)]
    pub role: SimRole,
    #[command(flatten)]
    pub engine: EngineArgs,
    /// KV pool size in tokens (max_total_num_tokens).
    #[arg(long, default_value_t = 65_536)]
    pub kv_tokens: usize,
    /// The model's context length.
    #[arg(long, default_value_t = 32_768)]
    pub context_length: usize,
    /// Prefill: bootstrap port on the --listen host (0 = ephemeral).
    #[arg(long, default_value_t = super::config::DEFAULT_BOOTSTRAP_PORT)]
    pub bootstrap_port: u16,
    /// Injected fault.
    #[arg(long, value_enum, default_value_t = SimFault::None)]
    pub fault: SimFault,
    /// Tokens per KV page.
    #[arg(long, default_value_t = 16)]
    pub page_size: usize,
    /// Milliseconds between generated tokens.
    #[arg(long, default_value_t = 0)]
    pub token_latency_ms: u64,
    /// The KV pool `/get_server_info` reports, when not the real --kv-tokens (an engine
    /// that overstates its pool; see --fault stale-kv).
    #[arg(long)]
    pub reported_kv_tokens: Option<usize>,
    /// Milliseconds before the first generated token of a stream (time to first token);
    /// 0: one --token-latency-ms.
    #[arg(long, default_value_t = 0)]
    pub first_token_ms: u64,
    /// Microseconds of prefill per prompt token, spent before the first token (added to
    /// --first-token-ms), so a longer prompt has a longer time to first token; 0: none.
    #[arg(long, default_value_t = 0, value_name = "MICROS")]
    pub prefill_token_latency_us: u64,
    /// The most requests in the running batch at once (SGLang's --max-running-requests);
    /// more wait in the first-come-first-served queue. Unset: only the KV pool bounds it.
    #[arg(long, value_name = "N")]
    pub max_running_requests: Option<NonZeroUsize>,
    /// No prefix cache (SGLang's --disable-radix-cache): every prompt token is computed and
    /// cached_tokens is always 0. Without it, prompts reuse the full KV pages of earlier
    /// prompts of the same cache_salt / extra_key.
    #[arg(long)]
    pub disable_radix_cache: bool,
    /// Bound of the prefix cache in tokens, when smaller than --kv-tokens (its default).
    #[arg(long, value_name = "TOKENS")]
    pub prefix_cache_tokens: Option<usize>,
    /// Report cached tokens in OpenAI usage as prompt_tokens_details.cached_tokens
    /// (SGLang's --enable-cache-report); /generate reports meta_info.cached_tokens always.
    #[arg(long)]
    pub enable_cache_report: bool,
    /// Separate a thinking answer's thought into reasoning_content (SGLang's
    /// --reasoning-parser); without it the thought stays in content as <think>…</think>.
    #[arg(long, value_enum, value_name = "PARSER")]
    pub reasoning_parser: Option<ReasoningParser>,
    /// Prepare chats as this engine kind does before rendering them: sglang (default),
    /// vllm or llama_cpp (the prompt counts then match that engine's).
    #[arg(long, value_name = "RULES", default_value = "sglang")]
    pub chat_rules: kvgate_tokenize::ChatRules,
    /// Keep /v1/responses answers for previous_response_id, GET /v1/responses/{id},
    /// background and cancel (SGLang's --enable-response-store; unified role only).
    #[arg(long)]
    pub enable_response_store: bool,
    /// Serve a vision model of this family: chats may carry image_url parts (data: or
    /// http:// URLs), each taking the tokens the model's image processor gives it
    /// (qwen2_5_vl, qwen3_vl, gemma3). Unset: a text-only model, which refuses them.
    #[arg(long, value_enum, value_name = "FAMILY")]
    pub vision: Option<VisionFamily>,
    /// With --vision qwen2_5_vl or qwen3_vl: resize each image to at most this many pixels
    /// (factor 28) before the processor, as older SGLang releases did
    /// (SGLANG_IMAGE_MAX_PIXELS, default there 12845056). Unset: no such step (0.5.23).
    #[arg(long, value_name = "PIXELS", requires = "vision")]
    pub vision_max_pixels_cap: Option<u64>,
}

/// Why the simulated engine could not start.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The tokenizer files could not be loaded.
    #[error(transparent)]
    Tokenizer(#[from] TokenizeError),
    /// A listener could not be bound, or a signal handler installed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The underlying error.
        source: std::io::Error,
    },
}

pub(crate) fn io(context: impl Into<String>) -> impl FnOnce(std::io::Error) -> SimError {
    let context = context.into();
    move |source| SimError::Io { context, source }
}

/// Runs the engine described by `args`, printing its addresses, until Ctrl-C or SIGTERM.
pub async fn run_cli(args: SimArgs) -> Result<(), SimError> {
    let tokenizer = args.engine.load_tokenizer().await?;
    let http = args.engine.bind().await?;
    let bootstrap = match args.role {
        SimRole::Prefill => {
            let addr = SocketAddr::new(args.engine.listen.ip(), args.bootstrap_port);
            Some(
                tokio::net::TcpListener::bind(addr)
                    .await
                    .map_err(io(format!("binding bootstrap {addr}")))?,
            )
        }
        SimRole::Unified | SimRole::Decode => None,
    };
    let model_max_length = args.engine.model_max_length();
    let config = SimConfig {
        role: args.role,
        model: args.engine.model,
        kv_tokens: args.kv_tokens,
        context_length: args.context_length,
        page_size: args.page_size,
        fault: args.fault,
        token_latency: Duration::from_millis(args.token_latency_ms),
        reported_kv_tokens: args.reported_kv_tokens,
        first_token_latency: Duration::from_millis(args.first_token_ms),
        prefill_token_latency: Duration::from_micros(args.prefill_token_latency_us),
        max_running_requests: args.max_running_requests,
        disable_radix_cache: args.disable_radix_cache,
        prefix_cache_tokens: args.prefix_cache_tokens,
        enable_cache_report: args.enable_cache_report,
        reasoning_parser: args.reasoning_parser,
        chat_rules: args.chat_rules,
        model_max_length,
        enable_response_store: args.enable_response_store,
        vision: args.vision.map(|family| VisionConfig {
            family,
            max_pixels_cap: args.vision_max_pixels_cap,
        }),
        ..SimConfig::default()
    };
    let running = super::spawn(config, Arc::new(tokenizer), http, bootstrap)
        .await
        .map_err(io("starting the engine"))?;
    println!(
        "sim-engine role={:?} http=http://{}",
        args.role, running.http_addr
    );
    if let Some(addr) = running.bootstrap_addr {
        println!("sim-engine bootstrap={addr}");
    }
    wait_for_signal().await?;
    running.shutdown().await;
    Ok(())
}

pub(crate) async fn wait_for_signal() -> Result<(), SimError> {
    #[cfg(unix)]
    {
        let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            .map_err(io("installing the SIGTERM handler"))?;
        tokio::select! {
            r = tokio::signal::ctrl_c() => r.map_err(io("waiting for Ctrl-C")),
            _ = term.recv() => Ok(()),
        }
    }
    #[cfg(not(unix))]
    {
        tokio::signal::ctrl_c()
            .await
            .map_err(io("waiting for Ctrl-C"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimArgs,
    }

    #[test]
    fn flags_parse_with_kebab_case_values() {
        let cli = Cli::try_parse_from([
            "sim-engine",
            "--role",
            "prefill",
            "--listen",
            "127.0.0.1:0",
            "--tokenizer",
            "t.json",
            "--kv-tokens",
            "2048",
            "--context-length",
            "1048576",
            "--bootstrap-port",
            "0",
            "--fault",
            "abort-mid-stream",
            "--page-size",
            "32",
            "--token-latency-ms",
            "5",
            "--first-token-ms",
            "40",
            "--prefill-token-latency-us",
            "250",
            "--max-running-requests",
            "8",
            "--disable-radix-cache",
            "--prefix-cache-tokens",
            "1024",
            "--enable-cache-report",
            "--reasoning-parser",
            "qwen3",
        ])
        .unwrap();
        assert_eq!(cli.args.reasoning_parser, Some(ReasoningParser::Qwen3));
        assert!(cli.args.disable_radix_cache);
        assert_eq!(cli.args.prefix_cache_tokens, Some(1024));
        assert!(cli.args.enable_cache_report);
        assert_eq!(cli.args.prefill_token_latency_us, 250);
        assert_eq!(cli.args.max_running_requests, NonZeroUsize::new(8));
        assert_eq!(cli.args.token_latency_ms, 5);
        assert_eq!(cli.args.first_token_ms, 40);
        assert_eq!(cli.args.role, SimRole::Prefill);
        assert_eq!(cli.args.fault, SimFault::AbortMidStream);
        assert_eq!(cli.args.kv_tokens, 2048);
        assert_eq!(cli.args.bootstrap_port, 0);
        let defaults = Cli::try_parse_from(["sim-engine", "--tokenizer", "t.json"]).unwrap();
        assert_eq!(defaults.args.fault, SimFault::None);
        assert_eq!(defaults.args.role, SimRole::Unified);
        assert_eq!(defaults.args.first_token_ms, 0);
        assert_eq!(defaults.args.prefill_token_latency_us, 0);
        assert_eq!(defaults.args.max_running_requests, None);
        // The prefix cache is on by default, as SGLang's radix cache; the report is off.
        assert!(!defaults.args.disable_radix_cache);
        assert_eq!(defaults.args.prefix_cache_tokens, None);
        assert!(!defaults.args.enable_cache_report);
        assert_eq!(defaults.args.reasoning_parser, None);
        // Zero running requests would admit nothing: refused at parse time.
        assert!(Cli::try_parse_from([
            "sim-engine",
            "--tokenizer",
            "t.json",
            "--max-running-requests",
            "0"
        ])
        .is_err());
    }

    #[test]
    fn vision_flags_parse_and_the_cap_needs_a_family() {
        let parse = |extra: &[&str]| {
            let mut argv = vec!["sim-engine", "--tokenizer", "t.json"];
            argv.extend_from_slice(extra);
            Cli::try_parse_from(argv)
        };
        let cli = parse(&[
            "--vision",
            "qwen2_5_vl",
            "--vision-max-pixels-cap",
            "1003520",
        ])
        .unwrap();
        assert_eq!(cli.args.vision, Some(VisionFamily::Qwen25Vl));
        assert_eq!(cli.args.vision_max_pixels_cap, Some(1_003_520));
        for family in ["qwen3_vl", "gemma3"] {
            assert!(parse(&["--vision", family]).is_ok(), "{family}");
        }
        assert_eq!(parse(&[]).unwrap().args.vision, None);
        assert!(parse(&["--vision-max-pixels-cap", "1003520"]).is_err());
        assert!(parse(&["--vision", "llava"]).is_err());
    }
}
