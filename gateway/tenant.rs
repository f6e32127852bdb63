//! Who a tenant is and what it may do: the policy auth attaches to every request, read by
//! tenant rules, admission and the rate limit. Shared by those stages, so it depends on none.

use std::collections::HashSet;
use std::sync::Arc;

use crate::config::{LeakMode, Priority, TenantConfig};

/// The tenant name used when `server.allow_anonymous` admits key-less requests.
pub const ANONYMOUS_TENANT: &str = "anonymous";

/// A tenant's limits (`None` = unlimited; `Some(0)` refuses everything in that dimension).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct TenantLimits {
    /// Requests admitted per minute (burst: the whole minute at once).
    pub requests_per_minute: Option<u32>,
    /// Tokens (prompt + max new tokens at admission, engine usage at settlement) per minute.
    pub tokens_per_minute: Option<u64>,
    /// Requests in flight at once, from admission until the response body ends.
    pub max_concurrent: Option<u32>,
}

impl TenantLimits {
    /// No limit in any dimension.
    pub const UNLIMITED: Self = Self {
        requests_per_minute: None,
        tokens_per_minute: None,
        max_concurrent: None,
    };
}

/// What a tenant may do, from its `[[tenants]]` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TenantPolicy {
    pub name: Arc<str>,
    /// Largest prompt in tokens (an admission bound).
    pub max_prompt_tokens: Option<u64>,
    /// Largest new-token allowance per sample.
    pub max_new_tokens: Option<u64>,
    /// Models it may use (None: all).
    pub models: Option<HashSet<String>>,
    /// Pools it is pinned to (None: any).
    pub pools: Option<HashSet<String>>,
    /// Rate and concurrency limits.
    pub limits: TenantLimits,
    /// LoRA adapter names it may use (empty: none).
    pub lora_adapters: HashSet<String>,
    /// `chat_template_kwargs` keys it may not send (empty: all allowed).
    pub denied_template_kwargs: HashSet<String>,
    /// May choose a pool with `x-kvgate-pool`.
    pub choose_pool: bool,
    /// Leak detection of its answers where stricter than the pool's (None: the pool's).
    pub leak_detection: Option<LeakMode>,
    /// Its share of served tokens in a full pool's queue, against its class (at least 1).
    pub weight: u32,
    /// The class of its requests without an `x-kvgate-priority` header.
    pub priority: Priority,
    /// The highest class it may ask for with `x-kvgate-priority` (at least `priority`).
    pub max_priority: Priority,
}

impl TenantPolicy {
    pub(crate) fn from_config(t: &TenantConfig) -> Self {
        let set = |v: &[String]| (!v.is_empty()).then(|| v.iter().cloned().collect());
        Self {
            name: Arc::from(t.name.as_str()),
            max_prompt_tokens: t.max_prompt_tokens,
            max_new_tokens: t.max_new_tokens,
            models: set(&t.models),
            pools: set(&t.pools),
            limits: TenantLimits {
                requests_per_minute: t.requests_per_minute,
                tokens_per_minute: t.tokens_per_minute,
                max_concurrent: t.max_concurrent,
            },
            lora_adapters: t.lora_adapters.iter().cloned().collect(),
            denied_template_kwargs: t.denied_chat_template_kwargs.iter().cloned().collect(),
            choose_pool: t.choose_pool,
            leak_detection: t.leak_detection,
            weight: t.weight.max(1),
            priority: t.priority,
            max_priority: t.max_priority().max(t.priority),
        }
    }

    pub(crate) fn anonymous() -> Self {
        Self {
            name: Arc::from(ANONYMOUS_TENANT),
            max_prompt_tokens: None,
            max_new_tokens: None,
            models: None,
            pools: None,
            limits: TenantLimits::UNLIMITED,
            lora_adapters: HashSet::new(),
            denied_template_kwargs: HashSet::new(),
            choose_pool: false,
            leak_detection: None,
            weight: 1,
            priority: Priority::Standard,
            max_priority: Priority::Standard,
        }
    }

    /// Whether the tenant may use the LoRA adapter `name`.
    pub fn allows_lora(&self, name: &str) -> bool {
        self.lora_adapters.contains(name)
    }

    /// The leak mode of this tenant's answers on a pool whose own mode is `pool`: the
    /// stricter of the two.
    pub fn leak_mode(&self, pool: LeakMode) -> LeakMode {
        self.leak_detection.map_or(pool, |mine| mine.max(pool))
    }

    /// Whether the tenant may use `model`.
    pub fn allows_model(&self, model: &str) -> bool {
        self.models.as_ref().is_none_or(|m| m.contains(model))
    }
}
