//! `[[pools]]`: engine pools; several pools of one model share its traffic by weight
//! (canaries).

use serde::Deserialize;
use std::collections::HashSet;

use super::cache_tiers::{self, CacheTierConfig};
use super::guard::GuardConfig;
use super::invalid::Invalid;
use super::isolation::LeakMode;
use super::vision::PoolImagesConfig;
use super::workers::WorkerConfig;
pub use kvgate_tokenize::ChatRules;

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
    /// How its engines prepare a chat before rendering it, which decides the prompt's token
    /// count (default: `sglang` for SGLang, `vllm` for other OpenAI servers; `llama_cpp` for
    /// llama.cpp's `llama-server`).
    #[serde(default)]
    pub chat_rules: Option<ChatRules>,
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
    /// Requests each worker runs at once, for workers that do not say their own
    /// (`max_running` on the worker wins; the engine's report is enforced when smaller).
    #[serde(default)]
    pub max_running: Option<u32>,
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
    /// The cache tiers its engines keep below the GPU prefix cache, for engines that do not
    /// report them (`[]`: none; unset: what the engines report, else the engine's default —
    /// llama.cpp keeps its host-RAM prompt cache unless started with `--cache-ram 0`).
    #[serde(default)]
    pub cache_tiers: Option<Vec<CacheTierConfig>>,
    /// Serve salted tenants even on engines with a tier that ignores the salt, accepting
    /// that tenants may then find each other's prompts there (by its timing, or in a
    /// restored answer). Off: such workers serve nothing (issue 40).
    #[serde(default)]
    pub allow_shared_cache_tiers: bool,
    /// Scan answers for fragments of other tenants' recent prompts: off | detect | block
    /// (default) | strict.
    #[serde(default)]
    pub leak_detection: LeakMode,
    /// The response guard of this pool (`[pools.guard]`).
    #[serde(default)]
    pub guard: GuardConfig,
    /// What its engines do with images and where kvgate may read them (`[pools.images]`;
    /// only for a model with `[models.vision]`).
    #[serde(default)]
    pub images: PoolImagesConfig,
}

fn default_weight() -> u32 {
    100
}

fn default_true() -> bool {
    true
}

impl PoolConfig {
    /// Whether `other` is this pool with other workers only (a DNS answer changed, a worker
    /// was added to or removed from the file): every other setting is the same.
    pub fn same_apart_from_workers(&self, other: &PoolConfig) -> bool {
        let without_workers = |p: &PoolConfig| PoolConfig {
            workers: Vec::new(),
            prefill: Vec::new(),
            decode: Vec::new(),
            ..p.clone()
        };
        without_workers(self) == without_workers(other)
    }

    /// The chat preparation rules of its engines.
    pub fn chat_rules(&self) -> ChatRules {
        self.chat_rules.unwrap_or(match self.engine {
            EngineKind::Sglang => ChatRules::Sglang,
            EngineKind::Openai => ChatRules::Vllm,
        })
    }

    /// The rules of one pool; keys are relative to it (`prefill[0].url`).
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if self.name.trim().is_empty() {
            return Err(Invalid::new("name", "must not be empty"));
        }
        if self.max_running == Some(0) {
            return Err(Invalid::new(
                "max_running",
                "must be at least 1 (the engines' --max-running-requests), or left out to discover it",
            ));
        }
        if self.max_in_flight == Some(0) {
            return Err(Invalid::new(
                "max_in_flight",
                "must be at least 1, or left out for no pool cap",
            ));
        }
        self.check_mode()?;
        if self.engine == EngineKind::Sglang
            && self.chat_rules.is_some_and(|r| r != ChatRules::Sglang)
        {
            return Err(Invalid::new(
                "chat_rules",
                "an SGLang engine prepares chats by SGLang's rules: leave chat_rules out, or set engine = \"openai\" for another server",
            ));
        }
        self.guard.check().map_err(|e| e.under("guard"))?;
        self.images.check().map_err(|e| e.under("images"))?;
        cache_tiers::check(self.cache_tiers.as_deref())?;
        for (list, workers) in [
            ("workers", &self.workers),
            ("prefill", &self.prefill),
            ("decode", &self.decode),
        ] {
            for (j, worker) in workers.iter().enumerate() {
                worker
                    .check(list == "prefill")
                    .map_err(|e| e.under(&format!("{list}[{j}]")))?;
            }
        }
        if let Some(path) = &self.health_path {
            if !path.starts_with('/') || path.contains(char::is_whitespace) {
                return Err(Invalid::new(
                    "health_path",
                    format!(
                        "`{path}` is not a path: write it as \"/health\" or \"/health_generate\""
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The worker lists a pool's mode needs, and the engines that can serve it.
    fn check_mode(&self) -> Result<(), Invalid> {
        match self.mode {
            PoolMode::Unified => {
                if self.workers.is_empty() {
                    return Err(Invalid::new(
                        "workers",
                        "a unified pool needs at least one worker: workers = [{ url = \"http://...\" }]",
                    ));
                }
                if !self.prefill.is_empty() || !self.decode.is_empty() {
                    return Err(Invalid::new(
                        "prefill",
                        "prefill/decode lists belong to mode = \"disaggregated\"; a unified pool lists `workers`",
                    ));
                }
            }
            PoolMode::Disaggregated => {
                if self.engine == EngineKind::Openai {
                    return Err(Invalid::new(
                        "mode",
                        "engine = \"openai\" pools are unified; prefill/decode disaggregation needs engine = \"sglang\"",
                    ));
                }
                if self.prefill.is_empty() || self.decode.is_empty() {
                    return Err(Invalid::new(
                        if self.prefill.is_empty() {
                            "prefill"
                        } else {
                            "decode"
                        },
                        "a disaggregated pool needs at least one prefill and one decode worker",
                    ));
                }
                if !self.workers.is_empty() {
                    return Err(Invalid::new(
                        "workers",
                        "`workers` belongs to mode = \"unified\"; list prefill and decode instead",
                    ));
                }
            }
        }
        Ok(())
    }
}

/// The rules of the `[[pools]]` list: names unique, each pool valid.
pub(super) fn check_pools(pools: &[PoolConfig]) -> Result<(), Invalid> {
    let mut names = HashSet::new();
    for (i, pool) in pools.iter().enumerate() {
        // A repeated name was valid where it was first seen, so this comes first.
        if !names.insert(pool.name.as_str()) {
            return Err(Invalid::new(
                format!("pools[{i}].name"),
                format!(
                    "`{}` is defined twice; pool names must be unique",
                    pool.name
                ),
            ));
        }
        pool.check().map_err(|e| e.under(&format!("pools[{i}]")))?;
    }
    Ok(())
}
