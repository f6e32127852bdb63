//! `[[pools]] cache_tiers` and `allow_shared_cache_tiers`: the cache levels an engine keeps
//! below its GPU prefix cache, and whether their keys honour the tenant's cache salt
//! (issue 40, I5).
//!
//! The salt partitions the engine's GPU prefix cache. Tiers below it may not see it: SGLang's
//! HiCache storage backends and LMCache key pages by their tokens, and llama.cpp has no salt
//! at all (its host-RAM prompt cache, `--cache-ram`, is on by default). A salted pool whose
//! engines keep such a tier would let tenants find each other's prompts there, so its
//! workers serve nothing unless the pool opts out (`fleet/cache_tiers.rs` decides; what the
//! engines report takes part, see there). The sources are in README, "Isolation".

use serde::Deserialize;
use std::collections::HashSet;

use super::invalid::Invalid;

/// A cache level below the GPU prefix cache.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TierKind {
    /// Host memory under the GPU cache, indexed by the same radix tree (SGLang HiCache L2:
    /// `--enable-hierarchical-cache`). Salted by default: its pages hang off the tree the
    /// salt partitions.
    Host,
    /// External storage under host memory (SGLang HiCache L3: `--hicache-storage-backend`
    /// file, mooncake, hf3fs, nixl, ...). Keyed by token hashes: not salted by default.
    Storage,
    /// LMCache (SGLang `--enable-lmcache`, vLLM's LMCache connector). Keyed by token chunks:
    /// not salted by default.
    Lmcache,
    /// llama.cpp's host-RAM prompt cache (`--cache-ram`, on by default). llama.cpp takes no
    /// salt: never salted.
    PromptCacheRam,
    /// Any other KV connector or offload tier (vLLM `--kv-transfer-config`, a custom
    /// backend). Not salted by default.
    Connector,
}

impl TierKind {
    /// Its name in config and reports.
    pub fn as_str(self) -> &'static str {
        match self {
            TierKind::Host => "host",
            TierKind::Storage => "storage",
            TierKind::Lmcache => "lmcache",
            TierKind::PromptCacheRam => "prompt_cache_ram",
            TierKind::Connector => "connector",
        }
    }

    /// Whether its keys include the salt when the config does not say.
    pub fn salted_by_default(self) -> bool {
        self == TierKind::Host
    }
}

/// One entry of `cache_tiers`: `{ tier = "storage", salted = false }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CacheTierConfig {
    pub tier: TierKind,
    /// Whether the tier's keys include the request's cache salt (default: true for `host`,
    /// false for every other tier).
    #[serde(default)]
    pub salted: Option<bool>,
}

impl CacheTierConfig {
    /// Whether its keys include the salt, as configured or by its kind's default.
    pub fn is_salted(&self) -> bool {
        self.salted.unwrap_or_else(|| self.tier.salted_by_default())
    }
}

/// The rules of a pool's `cache_tiers` (keys relative to the pool).
pub(super) fn check(tiers: Option<&[CacheTierConfig]>) -> Result<(), Invalid> {
    let mut seen = HashSet::new();
    for (i, t) in tiers.unwrap_or_default().iter().enumerate() {
        if !seen.insert(t.tier) {
            return Err(Invalid::new(
                format!("cache_tiers[{i}].tier"),
                format!("`{}` is listed twice; list each tier once", t.tier.as_str()),
            ));
        }
        if t.tier == TierKind::PromptCacheRam && t.salted == Some(true) {
            // llama.cpp's server reads no salt field at all (README, "Isolation").
            return Err(Invalid::new(
                format!("cache_tiers[{i}].salted"),
                "llama.cpp's host-RAM prompt cache takes no salt: write salted = false, or run llama-server with --cache-ram 0 and leave the tier out",
            ));
        }
    }
    Ok(())
}

impl super::Config {
    /// Whether `pool` keeps tenants apart in its engines' caches: it sends cache salts and
    /// more than one tenant may use it (its `tenants`, else every configured tenant, and
    /// `anonymous` with `server.allow_anonymous`). A pool one tenant owns has nobody to
    /// keep apart, whatever its tiers.
    pub fn separates_tenants(&self, pool: &super::PoolConfig) -> bool {
        let tenants = if pool.tenants.is_empty() {
            self.tenants.len() + usize::from(self.server.allow_anonymous)
        } else {
            pool.tenants.len()
        };
        pool.cache_salt && tenants > 1
    }
}
