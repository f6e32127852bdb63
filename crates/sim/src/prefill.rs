//! A prefill's dealings with the engine's prefix cache (`prefix_cache.rs`): how much of its
//! prompt it finds cached, the prefill time it is charged for the rest, and its prompt's
//! blocks entering the cache once the prefill is over.
//!
//! Only engines that compute prompts do this: the unified and prefill roles. A decode
//! receives the KV ready-made; it reports the `cached_tokens` its prefill found, and counts
//! none of it as its own.
//!
//! The incident's fault paths (placeholder pages, stale pages) bypass the cache: they look
//! nothing up, insert nothing and count nothing here.

use std::sync::Arc;
use std::time::Duration;

use super::config::SimFault;
use super::engine::SimEngine;
use super::prefix_cache::{Partition, PrefixCache};
use super::request::Sample;
use super::stats::add;

/// Looks up `sample`'s prompt in the cache when it enters the running batch (where SGLang
/// matches it), counting its prompt and cached tokens; returns the cached tokens it
/// reports, and those it reuses without reporting them (`SimFault::SharedLowerTierSilent`).
///
/// At most `len - 1` tokens can match, as in SGLang (`max_prefix_len = input_len - 1`) and
/// vLLM: the last prompt token is always computed, its logits give the first output token.
/// So a repeated prompt of exactly `k` pages finds `k - 1` of them.
///
/// With a shared lower level (`SimFault::SharedLowerTier`), a longer match there wins: its
/// keys are the tokens alone, so it finds what any cache salt computed — the fault.
pub(crate) fn lookup(engine: &SimEngine, sample: &Sample) -> (usize, usize) {
    let ids = &sample.input_ids;
    let matchable = ids.get(..ids.len().saturating_sub(1)).unwrap_or_default();
    let own = engine
        .prefix_cache
        .as_ref()
        .map_or(0, |cache| cache.lookup(&sample.partition, matchable));
    let shared = engine
        .lower_tier
        .as_ref()
        .map_or(0, |tier| tier.lookup(&Partition::default(), matchable));
    let cached = own.max(shared);
    add(&engine.stats.prompt_tokens, ids.len());
    add(&engine.stats.cached_tokens, cached);
    if engine.config.fault == SimFault::SharedLowerTierSilent && shared > own {
        return (own, shared - own);
    }
    (cached, 0)
}

/// The prefill time of `uncached` prompt tokens (`prefill_token_latency` each), counted in
/// `prefill_tokens_charged` so tests can check the charge without reading clocks.
pub(crate) fn charge(engine: &SimEngine, uncached: usize) -> Duration {
    add(&engine.stats.prefill_tokens_charged, uncached);
    engine.config.prefill_time(uncached)
}

/// A prompt whose full blocks enter the cache once its prefill is over, which for a unified
/// engine is when its first token is due (`stream.rs`, `server.rs`): a request arriving
/// meanwhile is still computing its own copy and must not find these blocks yet.
#[derive(Clone, Debug)]
pub(crate) struct CacheInsert {
    cache: Arc<PrefixCache>,
    /// The shared lower level, which keeps the prompt under its tokens alone.
    lower_tier: Option<Arc<PrefixCache>>,
    partition: Partition,
    tokens: Arc<[u32]>,
}

impl CacheInsert {
    /// The insert of `sample`'s prompt; `None` when the engine has no prefix cache.
    pub(crate) fn of(engine: &SimEngine, sample: &Sample) -> Option<Self> {
        let cache = engine.prefix_cache.as_ref()?;
        Some(Self {
            cache: Arc::clone(cache),
            lower_tier: engine.lower_tier.clone(),
            partition: sample.partition.clone(),
            tokens: sample.input_ids.as_slice().into(),
        })
    }

    /// The prefill is over: its prompt's full blocks are cached.
    pub(crate) fn commit(self) {
        self.cache.insert(&self.partition, &self.tokens);
        if let Some(tier) = &self.lower_tier {
            tier.insert(&Partition::default(), &self.tokens);
        }
    }
}
