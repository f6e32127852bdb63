//! Typed gateway configuration (TOML), validated at load.
//!
//! The file is parsed with `deny_unknown_fields` through `serde_path_to_error`, so a typo
//! or a wrong type is reported with its key path (`pools[1].prefill[0].kv_tokens`). Cross-field
//! rules live in [`validate`]; every error names the key and says how to fix it. Config is pure
//! data: it never builds clients or responses.
//!
//! The reference for every key is `config/example.toml` and `config/README.md`.

mod adapter_name;
mod engine_version;
mod health;
mod preflight;
mod rollout;
mod server;
mod tracing;
mod upstream;
mod validate;

use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::time::Duration;

pub use adapter_name::{AdapterName, AdapterNameError};
pub use engine_version::{EngineVersion, VersionError};
pub use health::{HealthConfig, OutlierConfig};
pub use preflight::PreflightConfig;
pub use rollout::{PromotionConfig, RollbackMargins, RolloutConfig};
pub use server::{ServerConfig, TlsConfig};
pub use tracing::TracingConfig;
pub use upstream::{UpstreamConfig, UpstreamTlsConfig};
pub use validate::validate;

/// A configuration error, naming the file, the key path and the fix.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read config file {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: key `{key}`: {message}")]
    Parse {
        path: PathBuf,
        key: String,
        message: String,
    },
    #[error("{path}: key `{key}`: {reason}")]
    Invalid {
        path: PathBuf,
        key: String,
        reason: String,
    },
}

/// The whole configuration document.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Listening sockets, TLS, limits, drain.
    #[serde(default)]
    pub server: ServerConfig,
    /// How the gateway talks to engines.
    #[serde(default)]
    pub upstream: UpstreamConfig,
    /// Active health checks and outlier ejection of workers.
    #[serde(default)]
    pub health: HealthConfig,
    /// Models the gateway serves, by the name clients send.
    #[serde(default)]
    pub models: Vec<ModelConfig>,
    /// Engine pools; several pools of one model share traffic by weight (canaries).
    #[serde(default)]
    pub pools: Vec<PoolConfig>,
    /// Tenants and their API keys.
    #[serde(default)]
    pub tenants: Vec<TenantConfig>,
    /// Token counting and capacity checks.
    #[serde(default)]
    pub admission: AdmissionConfig,
    /// Where audit lines go.
    #[serde(default)]
    pub audit: AuditConfig,
    /// Tenant isolation: cache salts and the leak detector.
    #[serde(default)]
    pub isolation: IsolationConfig,
    /// Tenant rate and concurrency counters.
    #[serde(default)]
    pub limits: LimitsConfig,
    /// Canary rollouts: a canary pool beside a stable one, with automatic rollback.
    #[serde(default)]
    pub rollouts: Vec<RolloutConfig>,
    /// What `kvgate preflight` may spend.
    #[serde(default)]
    pub preflight: PreflightConfig,
    /// OpenTelemetry trace export (off unless `otlp_endpoint` is set).
    #[serde(default)]
    pub tracing: TracingConfig,
    /// The file this was read from; relative paths inside were resolved against its folder.
    #[serde(skip)]
    pub source: PathBuf,
}

/// `[limits]`: where tenant rate and concurrency counters live.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// `memory` (this gateway alone) or `redis` (shared by every replica).
    pub backend: LimitsBackend,
    /// For `redis`: `redis://host:6379/0` or `unix:///path/redis.sock`.
    pub redis_url: Option<String>,
    /// Key prefix in Redis (several deployments can share one Redis).
    pub key_prefix: String,
    /// When Redis cannot be reached: `fail_open` (serve, unlimited) or `fail_closed` (429).
    pub failure_policy: LimitsFailurePolicy,
}

impl Default for LimitsConfig {
    fn default() -> Self {
        Self {
            backend: LimitsBackend::Memory,
            redis_url: None,
            key_prefix: "kvgate".into(),
            failure_policy: LimitsFailurePolicy::FailOpen,
        }
    }
}

/// Where limit counters live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitsBackend {
    Memory,
    Redis,
}

/// What to do when the limit store fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LimitsFailurePolicy {
    FailOpen,
    FailClosed,
}

/// `[audit]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AuditConfig {
    /// `stderr` (default), `file` (then `path`) or `none`.
    pub sink: AuditSink,
    /// The file for `sink = "file"` (appended to).
    pub path: Option<PathBuf>,
}

/// Where audit lines are written.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AuditSink {
    #[default]
    Stderr,
    File,
    None,
}

/// `[admission]`
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct AdmissionConfig {
    /// Refuse to start when a context window exceeds the smallest KV pool on its path (I4);
    /// `kvgate check --strict` applies the same rule.
    pub strict: bool,
    /// Exact token counts running at once on the blocking pool (default: CPU cores).
    pub max_concurrent_counts: Option<usize>,
}

/// `[[models]]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// What clients send as `model`.
    pub name: String,
    /// `tokenizer.json`, relative to the config file.
    pub tokenizer: PathBuf,
    /// `tokenizer_config.json` holding `chat_template`; relative to the config file.
    pub chat_template: Option<PathBuf>,
    /// The model's context window in tokens.
    pub context_window: u64,
    /// New tokens assumed (and sent to the engine) when a request names none; unset: the
    /// engines' defaults (`/generate` 128, completions 16, chat the rest of the window).
    #[serde(default)]
    pub default_max_new_tokens: Option<u64>,
    /// Workers whose engine reports an older version (or none) may not serve this model,
    /// e.g. "0.5.22" (the first SGLang release that refuses over-long prompts up front).
    #[serde(default)]
    pub min_engine_version: Option<String>,
}

/// Which HTTP API the engines of a pool speak.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineKind {
    /// SGLang: native `/generate` plus the OpenAI routes; supports PD disaggregation.
    Sglang,
    /// An OpenAI-compatible server (vLLM and others): chat and completions only.
    Openai,
}

/// How requests are served inside a pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PoolMode {
    /// Every request goes to one prefill and one decode worker (SGLang PD).
    Disaggregated,
    /// Every request goes to one worker that does both.
    Unified,
}

/// `[[pools]]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct PoolConfig {
    pub name: String,
    /// A `[[models]].name`.
    pub model: String,
    pub engine: EngineKind,
    pub mode: PoolMode,
    /// Share of the model's traffic (canary rollouts); 0 takes the pool out of rotation.
    #[serde(default = "default_weight")]
    pub weight: u32,
    /// The engine version the pool runs; what the engines report (`/get_server_info`,
    /// `/version`) takes precedence, and a disagreement is a warning in `kvgate check`.
    #[serde(default)]
    pub version: Option<String>,
    /// The `model` value the engines expect on OpenAI routes (default: the model's name).
    #[serde(default)]
    pub served_model: Option<String>,
    /// Unified pools: the workers.
    #[serde(default)]
    pub workers: Vec<WorkerConfig>,
    /// Disaggregated pools: prefill workers.
    #[serde(default)]
    pub prefill: Vec<WorkerConfig>,
    /// Disaggregated pools: decode workers.
    #[serde(default)]
    pub decode: Vec<WorkerConfig>,
    /// Only these tenants may use the pool (empty: every tenant).
    #[serde(default)]
    pub tenants: Vec<String>,
    /// Requests in flight at once on this pool (503 + Retry-After above it; unset: none).
    #[serde(default)]
    pub max_in_flight: Option<usize>,
    /// The active health check's path (default: `/health` on SGLang, `/v1/models` on
    /// OpenAI-style engines; `/health_generate` runs a one-token generation).
    #[serde(default)]
    pub health_path: Option<String>,
    /// Send each tenant's `cache_salt` (SGLang and vLLM keep prefix-cache entries of
    /// different salts apart). Client-sent cache keys are stripped either way.
    #[serde(default = "default_true")]
    pub cache_salt: bool,
    /// Scan answers for fragments of other tenants' recent prompts: off | detect | block
    /// (default) | strict.
    #[serde(default)]
    pub leak_detection: LeakMode,
    /// The response guard of this pool (`[pools.guard]`).
    #[serde(default)]
    pub guard: GuardConfig,
}

/// `[pools.guard]`: how the responses of a pool are checked (I1).
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct GuardConfig {
    /// Check responses at all. Off only to test other defences; never in production.
    pub enabled: bool,
    /// Literal strings whose presence in generated text marks a placeholder answer.
    pub markers: Vec<String>,
    /// Regular expressions (Rust `regex` syntax) that mark a placeholder answer.
    pub marker_patterns: Vec<String>,
    /// Allowed difference between the engine's `prompt_tokens` and kvgate's count for text
    /// and chat prompts (token-id prompts are always compared exactly).
    pub prompt_tokens_tolerance: u64,
    /// How long the status line may be held while the first stream event is awaited.
    #[serde(with = "humantime_serde")]
    pub first_event_timeout: Duration,
}

impl Default for GuardConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            markers: Vec::new(),
            marker_patterns: Vec::new(),
            prompt_tokens_tolerance: 0,
            first_event_timeout: Duration::from_secs(60),
        }
    }
}

fn default_weight() -> u32 {
    100
}

fn default_true() -> bool {
    true
}

/// What the leak detector does when an answer holds other tenants' prompt fragments.
/// Ordered from the least to the most protective: where a pool and a tenant both set one,
/// the stricter applies.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LeakMode {
    /// Do not fingerprint or scan.
    Off,
    /// Audit line and `kvgate_leak_suspected_total`; the answer is delivered.
    Detect,
    /// As detect, and the answer is stopped (502, or an error event in a stream). A stream's
    /// events leave as they are checked; output is held only while the answer's newest
    /// units continue a run of another tenant's text, so at most `ngram - 1` units of a
    /// run that trips reach the client. The default: a leak with the right usage and no
    /// marker (the incident's v3 shape) is only stopped here.
    #[default]
    Block,
    /// As block, and every stream is held back by `ngram + min_matches` units, so not one
    /// unit of a run that trips reaches the client; costs every stream that hold-back in
    /// time to first token. For pools of tenants whose prompts hold secrets.
    Strict,
}

impl LeakMode {
    /// Scan answers at all (and fingerprint prompts).
    pub fn is_on(self) -> bool {
        self != LeakMode::Off
    }

    /// Stop an answer that trips (block and strict).
    pub fn blocks(self) -> bool {
        self >= LeakMode::Block
    }
}

/// `[isolation]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct IsolationConfig {
    /// Environment variable holding the secret the per-tenant cache salts derive from
    /// (keep it equal across replicas). Unset or empty: a random secret per start.
    pub salt_secret_env: Option<String>,
    /// Text units (words, other characters) per fingerprinted n-gram.
    pub ngram: usize,
    /// How long prompts are remembered.
    #[serde(with = "humantime_serde")]
    pub window: Duration,
    /// Memory bound: stored n-gram hashes across all tenants.
    pub max_entries: usize,
    /// Distinct foreign n-grams before an answer is a suspected leak.
    pub min_matches: usize,
    /// Bytes of each prompt fingerprinted (its tail, where the incident's leaks came from);
    /// bounds the cost of encoding million-token prompts.
    pub fingerprint_bytes: bytesize::ByteSize,
}

impl Default for IsolationConfig {
    fn default() -> Self {
        Self {
            salt_secret_env: None,
            ngram: 8,
            window: Duration::from_secs(600),
            max_entries: 1_000_000,
            min_matches: 2,
            fingerprint_bytes: bytesize::ByteSize::kib(256),
        }
    }
}

/// One engine process.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct WorkerConfig {
    /// Base URL, e.g. `http://10.0.0.1:30000`.
    #[serde(with = "http_serde_uri")]
    pub url: http::Uri,
    /// KV pool size in tokens; the smaller of this and the discovered value is enforced.
    #[serde(default)]
    pub kv_tokens: Option<u64>,
    /// Prefill workers: the KV bootstrap port (else discovered from the engine).
    #[serde(default)]
    pub bootstrap_port: Option<u16>,
    /// Prefill workers: the host decode workers reach for KV (default: the URL's host).
    #[serde(default)]
    pub bootstrap_host: Option<String>,
    /// `https://` workers: the name sent as SNI and checked in the certificate, instead
    /// of the URL's host and `upstream.tls.server_name`.
    #[serde(default)]
    pub tls_server_name: Option<String>,
}

/// `[[tenants]]`
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TenantConfig {
    pub name: String,
    /// Hex SHA-256 digests of the tenant's API keys (never the keys themselves).
    #[serde(default)]
    pub api_key_sha256: Vec<String>,
    /// An environment variable holding keys (comma- or newline-separated); hashed at load.
    #[serde(default)]
    pub api_keys_env: Option<String>,
    /// A file holding keys, one per line (`#` comments); hashed at load.
    #[serde(default)]
    pub api_keys_file: Option<PathBuf>,
    /// Largest prompt this tenant may send, in tokens (an admission bound).
    #[serde(default)]
    pub max_prompt_tokens: Option<u64>,
    /// Largest `max_tokens` / `max_new_tokens` this tenant may ask for.
    #[serde(default)]
    pub max_new_tokens: Option<u64>,
    /// Models this tenant may use (empty: all).
    #[serde(default)]
    pub models: Vec<String>,
    /// Pools this tenant is pinned to (empty: any pool of the model).
    #[serde(default)]
    pub pools: Vec<String>,
    /// LoRA adapters this tenant may name in `lora_path` (adapter names as the engines
    /// registered them, never paths; empty: none).
    #[serde(default)]
    pub lora_adapters: Vec<String>,
    /// Requests per minute (burst: the whole minute at once).
    #[serde(default)]
    pub requests_per_minute: Option<u32>,
    /// Tokens per minute: prompt + max new tokens reserved at admission, settled with the
    /// engine's reported usage when the response ends.
    #[serde(default)]
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once (until the response body ends).
    #[serde(default)]
    pub max_concurrent: Option<u32>,
    /// May choose a pool of the model with the `x-kvgate-pool` header (testing a canary by
    /// hand, even at weight 0); others get 403 when they send it.
    #[serde(default)]
    pub choose_pool: bool,
    /// The leak detection of this tenant's answers where it is stricter than the pool's
    /// (`strict` for a tenant that must never receive a unit of a detected run; a tenant
    /// cannot lower a pool's mode, as the pool's mode protects the other tenants' prompts).
    #[serde(default)]
    pub leak_detection: Option<LeakMode>,
}

mod http_serde_uri {
    use serde::{de::Error, Deserialize, Deserializer};

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<http::Uri, D::Error> {
        let s = String::deserialize(d)?;
        s.parse::<http::Uri>().map_err(|e| {
            D::Error::custom(format!(
                "`{s}` is not a URL ({e}); write e.g. \"http://10.0.0.1:30000\""
            ))
        })
    }
}

impl Config {
    /// Read, parse and validate a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text, path)
    }

    /// Parse and validate config text; `path` anchors relative paths and error messages.
    pub fn from_toml(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let parse_error = |key: String, message: String| ConfigError::Parse {
            path: path.to_owned(),
            key,
            message,
        };
        let de = toml::de::Deserializer::parse(text)
            .map_err(|e| parse_error(String::from("."), e.to_string()))?;
        let mut config: Config = serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            parse_error(key, e.into_inner().to_string())
        })?;
        config.source = path.to_owned();
        validate(config)
    }

    /// The folder relative paths are resolved against.
    pub fn base_dir(&self) -> &Path {
        self.source.parent().unwrap_or_else(|| Path::new("."))
    }

    /// A model by name.
    pub fn model(&self, name: &str) -> Option<&ModelConfig> {
        self.models.iter().find(|m| m.name == name)
    }
}

/// The hex SHA-256 of a key, as `api_key_sha256` expects (`kvgate hash-key`).
pub fn hash_key(key: &str) -> String {
    use sha2::Digest;
    sha2::Sha256::digest(key.as_bytes())
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
mod tests;
