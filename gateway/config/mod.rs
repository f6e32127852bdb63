//! Typed gateway configuration (TOML), validated at load.
//!
//! The file is parsed with `deny_unknown_fields` through `serde_path_to_error`, so a typo
//! or a wrong type is reported with its key path (`pools[1].prefill[0].kv_tokens`). Each
//! section's type holds its own rules (`PoolConfig::check`, …); the rules across sections
//! live in `validate`; every error names the key and says how to fix it. Config is pure
//! data: it never builds clients or responses.
//!
//! The reference for every key is `config/example.toml` and `config/README.md`.

mod adapter_name;
mod admission;
mod audit;
mod cache_tiers;
mod discovery;
mod engine_version;
mod files;
mod guard;
mod health;
mod invalid;
mod isolation;
mod limits;
mod models;
mod pools;
mod prefix_routing;
mod preflight;
mod priority;
mod rollout;
mod scheduling;
mod server;
mod tenants;
mod tracing;
mod upstream;
mod validate;
mod vision;
mod workers;

use serde::Deserialize;
use std::path::{Path, PathBuf};

use invalid::Invalid;

pub use adapter_name::{AdapterName, AdapterNameError};
pub use admission::AdmissionConfig;
pub use audit::{AuditConfig, AuditSink};
pub use cache_tiers::{CacheTierConfig, TierKind};
pub use discovery::DiscoveryConfig;
pub use engine_version::{EngineVersion, VersionError};
pub use guard::GuardConfig;
pub use health::{HealthConfig, OutlierConfig};
pub use isolation::{IsolationConfig, LeakMode};
pub use limits::{
    is_tls, LimitsBackend, LimitsConfig, LimitsFailurePolicy, RedisServers, RedisTarget,
    RedisTlsConfig, SentinelConfig,
};
pub use models::{AnthropicMessages, ModelConfig};
pub use pools::{ChatRules, EngineKind, PoolConfig, PoolMode};
pub use prefix_routing::PrefixRoutingConfig;
pub use preflight::PreflightConfig;
pub use priority::{Priority, PriorityError};
pub use rollout::{PromotionConfig, RollbackMargins, RolloutConfig};
pub use scheduling::SchedulingConfig;
pub use server::{ServerConfig, TlsConfig};
pub use tenants::{hash_key, TenantConfig};
pub use tracing::TracingConfig;
pub use upstream::{UpstreamConfig, UpstreamTlsConfig};
pub use vision::{PoolImagesConfig, VisionConfig, VisionFamilyName};
pub use workers::{Discover, WorkerConfig};

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
    /// How worker entries with `discover` are resolved (DNS names of engines).
    #[serde(default)]
    pub discovery: DiscoveryConfig,
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
    /// The per-pool gateway queue used while a pool is full (applies on reload).
    #[serde(default)]
    pub scheduling: SchedulingConfig,
    /// Inside a pool, prefer the worker that holds a request's prompt prefix in its cache.
    #[serde(default)]
    pub prefix_routing: PrefixRoutingConfig,
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

/// Resolve relative paths against the config file and check every rule: each section's
/// own, then the rules across sections.
pub fn validate(mut config: Config) -> Result<Config, ConfigError> {
    let base = config.base_dir().to_owned();
    match config.check(&base) {
        Ok(()) => Ok(config),
        Err(Invalid { key, reason }) => Err(ConfigError::Invalid {
            path: config.source,
            key,
            reason,
        }),
    }
}

impl Config {
    /// The first broken rule. Sections are checked in the order the single `validate()`
    /// checked them before each section held its own rules, so a config with one mistake
    /// reports what it always did; a rule across sections runs once the sections it reads
    /// are valid (a pool's `model` is looked up among valid models).
    fn check(&mut self, base: &Path) -> Result<(), Invalid> {
        self.server.check(base)?;
        self.upstream.check(base)?;
        validate::buffers(&self.server, &self.upstream)?;
        self.audit.check()?;
        self.isolation.check()?;
        self.limits.check(base)?;
        self.admission.check()?;
        self.scheduling.check()?;
        self.prefix_routing.check()?;
        models::check_models(&mut self.models, base)?;
        pools::check_pools(&self.pools)?;
        validate::pools_name_models(&self.models, &self.pools)?;
        tenants::check_tenants(&mut self.tenants, base)?;
        self.limits.check_tenant_names(&self.tenants)?;
        validate::tenants_name_models_and_pools(&self.models, &self.pools, &self.tenants)?;
        validate::rollouts_name_pools(&self.models, &self.pools, &self.rollouts)?;
        self.health.check()?;
        self.discovery.check()?;
        self.preflight.check()?;
        self.tracing.check()?;
        validate::someone_can_call(&self.server, &self.tenants)
    }
}

#[cfg(test)]
mod tests;
