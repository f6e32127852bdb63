//! Prefix affinity (issue 31): inside the pool routing chose, prefer the worker that was
//! recently sent the longest prefix of the request's prompt — its engine likely still holds
//! those KV pages and skips their prefill — unless it is busier than the least loaded
//! candidate by more than `[prefix_routing] balance_margin`.
//!
//! - **Who is a candidate**: the pool's prefix workers (unified, or PD prefill; the decode
//!   worker is chosen by load, as before) that are eligible and — when the request claims
//!   within room (`[scheduling]`) — have room for it. Affinity only reorders preference
//!   among workers that could take the request now: a request never waits for its
//!   preferred worker while another has room.
//! - **Load** is a worker's KV in use as a share of what may be in flight there:
//!   1 − room ÷ (capacity × `kv_overcommit`), room counting kvgate's own account and what
//!   only the engine reports. The preferred worker wins while its share exceeds the least
//!   loaded candidate's by at most `balance_margin` (0.25: a quarter of its KV pool).
//! - **Outcome**: `hit` (the preferred worker took it), `miss` (no candidate held any
//!   block of it: today's choice by load), `balanced` (the preferred worker was too busy,
//!   or was taken meanwhile: today's choice). Whichever worker takes the request, its
//!   blocks are then remembered for that worker.
//! - **Partition**: keys are the prompt's chained block hashes seeded by the cache
//!   partition the engine sees ([`super::blocks`]): the tenant's salt on pools with
//!   `cache_salt`, one shared constant on the others. Two tenants of a salted pool never
//!   share affinity, as their engines never share cache.

use std::sync::Arc;
use std::time::Instant;

use super::blocks::{self, SHARED_PARTITION};
use super::{CachePartitions, RequestBlocks};
use crate::config::PrefixRoutingConfig;
use crate::fleet::{allowed, Candidate, Pool, PrefixIndex, Worker};

/// `[prefix_routing]` as routing applies it (per generation), with the tenants' cache
/// partitions (their salts).
#[derive(Debug, Clone)]
pub struct PrefixRouting {
    pub enabled: bool,
    pub balance_margin: f64,
    partitions: Arc<dyn CachePartitions>,
}

/// No tenant has a partition of its own (routing by prefix is off).
#[derive(Debug)]
struct Shared;

impl CachePartitions for Shared {
    fn partition(&self, _tenant: &str) -> u64 {
        SHARED_PARTITION
    }
}

impl PrefixRouting {
    /// From the config's `[prefix_routing]`, partitioning tenants by `partitions` (the
    /// salts isolation sends).
    pub fn from_config(config: &PrefixRoutingConfig, partitions: Arc<dyn CachePartitions>) -> Self {
        Self {
            enabled: config.enabled,
            balance_margin: config.balance_margin,
            partitions,
        }
    }

    /// Off: every request is routed by load only.
    pub fn off() -> Self {
        Self {
            enabled: false,
            balance_margin: 0.0,
            partitions: Arc::new(Shared),
        }
    }

    /// The request's affinity in `pool`: its block keys in the pool's cache partition
    /// (waiting for the chain if it is still being computed). None when the pool does not
    /// choose by prefix, or the request has no full block.
    pub async fn affinity<'p>(
        &self,
        pool: &'p Pool,
        blocks: Option<&RequestBlocks>,
        tenant: Option<&str>,
    ) -> Option<Affinity<'p>> {
        if !self.enabled {
            return None;
        }
        let index = pool.prefix.as_ref()?;
        let chain = blocks?.0.chain().await?;
        if chain.is_empty() {
            return None;
        }
        // The partition the engine sees: isolation sends the tenant's salt on these pools.
        let partition = match tenant {
            Some(tenant) if pool.cache_salt => self.partitions.partition(tenant),
            _ => SHARED_PARTITION,
        };
        Some(Affinity {
            pool,
            index,
            keys: Arc::from(blocks::seeded(&chain, partition)),
            margin: self.balance_margin,
        })
    }
}

/// How a request's worker was chosen (`kvgate_prefix_route_total{outcome}`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// The worker holding the longest prefix took it.
    Hit,
    /// No candidate held any of it: by load.
    Miss,
    /// The worker holding it was too busy (or taken meanwhile): by load.
    Balanced,
}

/// The worker a request prefers, before it is taken.
#[derive(Debug)]
pub struct Preference {
    /// None: choose by load.
    pub worker: Option<Arc<Worker>>,
    pub outcome: Outcome,
    /// Per candidate (by slot): the leading blocks it holds.
    held: Vec<(usize, usize)>,
}

/// One request's prefix preference in its pool.
#[derive(Debug)]
pub struct Affinity<'p> {
    pool: &'p Pool,
    index: &'p PrefixIndex,
    keys: Arc<[u64]>,
    margin: f64,
}

impl Affinity<'_> {
    /// The prompt's block keys in the pool's partition.
    pub fn keys(&self) -> &Arc<[u64]> {
        &self.keys
    }

    /// The preferred worker of `workers` (the pool's prefix workers): among the eligible
    /// ones with room for `need` tokens (any eligible one when None), the one holding the
    /// longest prefix — unless its KV share in use exceeds the least loaded one's by over
    /// the margin.
    pub fn prefer(
        &self,
        workers: &[Arc<Worker>],
        need: Option<u64>,
        overcommit: f64,
    ) -> Preference {
        let everyone: Vec<Candidate> = workers.iter().map(|w| w.prefix_candidate()).collect();
        // Workers that left service since the last request: their entries go now.
        self.index.sync(&everyone);
        let fits = |w: &Arc<Worker>| w.is_eligible() && need.is_none_or(|n| w.fits(n, overcommit));
        let (candidates, ids): (Vec<&Arc<Worker>>, Vec<Candidate>) = workers
            .iter()
            .zip(&everyone)
            .filter(|(w, _)| fits(w))
            .map(|(w, c)| (w, *c))
            .unzip();
        if candidates.is_empty() {
            return Preference {
                worker: None,
                outcome: Outcome::Miss,
                held: Vec::new(),
            };
        }
        let held = self.index.longest(&self.keys, &ids, Instant::now());
        let by_load = |outcome| Preference {
            worker: None,
            outcome,
            held: ids
                .iter()
                .map(|c| c.slot)
                .zip(held.iter().copied())
                .collect(),
        };
        let loads: Vec<f64> = candidates
            .iter()
            .map(|w| used_share(w, overcommit))
            .collect();
        // The longest prefix; among equals, the least loaded.
        let best = (0..candidates.len())
            .max_by(|&a, &b| held[a].cmp(&held[b]).then(loads[b].total_cmp(&loads[a])));
        let Some(best) = best.filter(|&b| held[b] > 0) else {
            return by_load(Outcome::Miss);
        };
        let least = loads.iter().copied().fold(f64::INFINITY, f64::min);
        if loads[best] - least > self.margin {
            return by_load(Outcome::Balanced);
        }
        Preference {
            worker: Some(candidates[best].clone()),
            ..by_load(Outcome::Hit)
        }
    }

    /// The request's worker was taken as `preference` said, or by load (`outcome`: a hit
    /// whose worker was taken meanwhile by another request is `balanced`): remember its
    /// blocks there and count the outcome.
    pub fn taken(&self, worker: &Worker, preference: &Preference, outcome: Outcome) {
        let candidate = worker.prefix_candidate();
        let matched = preference
            .held
            .iter()
            .find(|(slot, _)| *slot == candidate.slot)
            .map_or(0, |(_, n)| *n);
        self.index.insert(&self.keys, candidate, Instant::now());
        // For the other replicas (only kept while they are shared with: `prefix_share`).
        self.index.outbox.push(candidate.slot, &self.keys);
        let counters = self.index.counters(&self.pool.name);
        match outcome {
            Outcome::Hit => counters.hit.increment(1),
            Outcome::Miss => counters.miss.increment(1),
            Outcome::Balanced => counters.balanced.increment(1),
        }
        counters.prompt_blocks.increment(self.keys.len() as u64);
        counters.matched_blocks.increment(matched as u64);
    }
}

/// A request routed by prefix went to `worker` after all (a retry on another worker):
/// remember its `keys` there.
pub fn taken_instead(pool: &Pool, worker: &Worker, keys: &Arc<[u64]>) {
    if let Some(index) = &pool.prefix {
        let candidate = worker.prefix_candidate();
        index.insert(keys, candidate, Instant::now());
        index.outbox.push(candidate.slot, keys);
    }
}

/// A worker's KV in use as a share of what may be in flight there (1.0 when unknown).
fn used_share(worker: &Worker, overcommit: f64) -> f64 {
    let allowed = worker.kv_tokens().map_or(0, |c| allowed(c, overcommit));
    match (allowed, worker.room(overcommit)) {
        (0, _) | (_, None) => 1.0,
        (allowed, Some(room)) => 1.0 - room.min(allowed) as f64 / allowed as f64,
    }
}

#[cfg(test)]
mod tests;
