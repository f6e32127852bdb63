//! A pool's prefix index (issue 31): which KV blocks of recent prompts were sent to which
//! of its workers, so routing can send a request where the longest prefix of its prompt is
//! likely still in the engine's prefix cache.
//!
//! - **Keys** are block keys (`stack::routing` hashes a prompt's token ids into chained
//!   keys, one per full block, seeded by the tenant's cache partition): a key stands for its
//!   block *and every block before it*, so a worker holding key `i` held the whole prefix.
//! - **Holders.** Each key remembers up to [`HOLDERS`] workers (by their slot in the pool),
//!   each with when it was sent there and the worker's cache epoch then. A worker whose epoch
//!   moved on (it was drained, ejected or went down: its cache may be gone, and it is not
//!   where a conversation should stick) no longer counts, and its entries are purged.
//! - **Bounds**, like an engine's cache: at most `max_blocks` keys, the least recently sent
//!   evicted first; a holder older than `max_age` no longer counts. A prompt's blocks are
//!   inserted last block first, so its first blocks — the ones other prompts share — are
//!   the most recent and the last to go, and what a worker holds stays a prefix.
//! - **Lookup** gives, per candidate worker, the number of leading keys it holds: galloping
//!   then bisecting over the keys (a worker's holdings are a prefix), so a long prompt costs
//!   a few dozen probes, not one per block.
//!
//! Thread-safe with low contention: 16 shards by key, each a mutex over an LRU list in a
//! slab (no per-entry allocation); a probe or an insert holds one shard for a few hash
//! operations.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use super::prefix_outbox::Outbox;

/// Workers remembered per key; a fifth replaces the one sent there longest ago.
pub const HOLDERS: usize = 4;
/// Shards of a large index (a small one has one, so its bound is exact).
const SHARDS: usize = 16;
/// An index this large is sharded.
const SHARDED_FROM: usize = 1024;
/// The clock of holders, in ticks of this length since the index was built.
const TICK: Duration = Duration::from_millis(100);
/// No node.
const NIL: u32 = u32::MAX;
/// An empty holder's slot.
const EMPTY: u16 = u16::MAX;

/// One worker a key was sent to.
#[derive(Debug, Clone, Copy)]
struct Holder {
    slot: u16,
    /// The worker's cache epoch when it was sent (its low bits).
    epoch: u16,
    /// When, in ticks.
    at: u32,
}

const NO_HOLDER: Holder = Holder {
    slot: EMPTY,
    epoch: 0,
    at: 0,
};

/// One key in a shard's LRU list.
#[derive(Debug, Clone, Copy)]
struct Node {
    key: u64,
    /// Towards the most recent.
    prev: u32,
    /// Towards the least recent.
    next: u32,
    holders: [Holder; HOLDERS],
}

/// One shard: a key → node map over a slab of nodes in LRU order.
#[derive(Debug, Clone)]
struct Shard {
    map: HashMap<u64, u32, foldhash::fast::FixedState>,
    nodes: Vec<Node>,
    free: Vec<u32>,
    /// The most recently sent.
    head: u32,
    /// The least recently sent.
    tail: u32,
}

/// A worker routing asks about: its slot in the pool and its cache epoch now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Candidate {
    pub slot: usize,
    pub epoch: u64,
}

/// What a pool's index holds now (`GET /pools`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexSize {
    pub blocks: usize,
    pub max_blocks: usize,
}

/// The prefix index of one pool's workers of one role (unified, or PD prefill).
#[derive(Debug)]
pub struct PrefixIndex {
    shards: Box<[Mutex<Shard>]>,
    per_shard: usize,
    max_age_ticks: u64,
    born: Instant,
    /// Per slot: the worker's cache epoch the index last saw (a change purges its entries).
    seen: Box<[AtomicU64]>,
    counters: OnceLock<PrefixCounters>,
    /// This replica's inserts for the other replicas (`prefix_share`).
    pub outbox: Outbox,
}

/// The pool's prefix-routing counters (`metrics::PREFIX_*`), looked up once: every request
/// routed by prefix updates them.
#[derive(Debug)]
pub struct PrefixCounters {
    pub hit: ::metrics::Counter,
    pub miss: ::metrics::Counter,
    pub balanced: ::metrics::Counter,
    pub prompt_blocks: ::metrics::Counter,
    pub matched_blocks: ::metrics::Counter,
}

impl PrefixIndex {
    /// An empty index over `workers` slots, holding at most `max_blocks` keys, each holder
    /// counting for `max_age`.
    pub fn new(workers: usize, max_blocks: usize, max_age: Duration) -> Self {
        let shards = if max_blocks >= SHARDED_FROM {
            SHARDS
        } else {
            1
        };
        Self::with_shards(workers, max_blocks, max_age, shards)
    }

    /// [`PrefixIndex::new`] with `shards` shards (at least 1): the bench compares one lock
    /// with the sharded index.
    pub fn with_shards(
        workers: usize,
        max_blocks: usize,
        max_age: Duration,
        shards: usize,
    ) -> Self {
        let shards = shards.max(1);
        Self {
            shards: (0..shards).map(|_| Mutex::new(Shard::new())).collect(),
            per_shard: (max_blocks / shards).max(1),
            max_age_ticks: ticks(max_age),
            born: Instant::now(),
            seen: (0..workers).map(|_| AtomicU64::new(0)).collect(),
            counters: OnceLock::new(),
            outbox: Outbox::default(),
        }
    }

    /// The counters of `pool` (this index's pool), looked up on first use (after the
    /// recorder is installed).
    pub fn counters(&self, pool: &str) -> &PrefixCounters {
        self.counters.get_or_init(|| {
            use crate::metrics::{
                PREFIX_MATCHED_BLOCKS_TOTAL, PREFIX_PROMPT_BLOCKS_TOTAL, PREFIX_ROUTE_TOTAL,
            };
            let route = |outcome: &'static str| {
                ::metrics::counter!(PREFIX_ROUTE_TOTAL, "pool" => pool.to_owned(), "outcome" => outcome)
            };
            PrefixCounters {
                hit: route("hit"),
                miss: route("miss"),
                balanced: route("balanced"),
                prompt_blocks: ::metrics::counter!(PREFIX_PROMPT_BLOCKS_TOTAL, "pool" => pool.to_owned()),
                matched_blocks: ::metrics::counter!(PREFIX_MATCHED_BLOCKS_TOTAL, "pool" => pool.to_owned()),
            }
        })
    }

    fn tick(&self, now: Instant) -> u32 {
        u32::try_from(ticks(now.saturating_duration_since(self.born))).unwrap_or(u32::MAX)
    }

    /// Keys are hashes: their high bits pick the shard evenly.
    fn shard_of(&self, key: u64) -> usize {
        (key >> 32) as usize % self.shards.len()
    }

    fn shard(&self, key: u64) -> MutexGuard<'_, Shard> {
        self.shards[self.shard_of(key)]
            .lock()
            .unwrap_or_else(|p| p.into_inner())
    }

    /// Purge the entries of every candidate whose epoch moved on since the index last saw
    /// it (it left service meanwhile). Cheap when none did: one atomic per candidate.
    pub fn sync(&self, candidates: &[Candidate]) {
        for c in candidates {
            let Some(seen) = self.seen.get(c.slot) else {
                continue;
            };
            let before = seen.swap(c.epoch, Ordering::AcqRel);
            if before != c.epoch {
                self.purge(c.slot);
            }
        }
    }

    /// Drop slot `slot` from every key (keys left with no holder go).
    fn purge(&self, slot: usize) {
        let Ok(slot) = u16::try_from(slot) else {
            return;
        };
        for shard in self.shards.iter() {
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            shard.purge_slot(slot);
        }
    }

    /// Per candidate (in order), how many of `keys`' leading keys it holds at `now`.
    pub fn longest(&self, keys: &[u64], candidates: &[Candidate], now: Instant) -> Vec<usize> {
        let now = self.tick(now);
        let mut probed: HashMap<usize, [Holder; HOLDERS]> = HashMap::new();
        let mut held = |at: usize, c: &Candidate| {
            let holders = probed.entry(at).or_insert_with(|| self.holders(keys[at]));
            holders.iter().any(|h| {
                usize::from(h.slot) == c.slot
                    && h.epoch == c.epoch as u16
                    && u64::from(now.saturating_sub(h.at)) <= self.max_age_ticks
            })
        };
        candidates
            .iter()
            .map(|c| {
                if keys.is_empty() || !held(0, c) {
                    return 0;
                }
                // Held at `lo`; not held at `hi` (or `hi` is the end).
                let (mut lo, mut step) = (0, 1);
                let mut hi = loop {
                    let at = lo + step;
                    if at >= keys.len() {
                        break keys.len();
                    }
                    if !held(at, c) {
                        break at;
                    }
                    lo = at;
                    step *= 2;
                };
                while hi - lo > 1 {
                    let mid = lo + (hi - lo) / 2;
                    if held(mid, c) {
                        lo = mid;
                    } else {
                        hi = mid;
                    }
                }
                lo + 1
            })
            .collect()
    }

    fn holders(&self, key: u64) -> [Holder; HOLDERS] {
        let shard = self.shard(key);
        match shard.map.get(&key) {
            Some(&i) => shard.nodes[i as usize].holders,
            None => [NO_HOLDER; HOLDERS],
        }
    }

    /// Remember that `keys` were sent to `worker` at `now` (last key first: see the
    /// module docs), evicting the least recently sent keys and expired ones beyond the bound.
    pub fn insert(&self, keys: &[u64], worker: Candidate, now: Instant) {
        let Ok(slot) = u16::try_from(worker.slot) else {
            return;
        };
        let holder = Holder {
            slot,
            epoch: worker.epoch as u16,
            at: self.tick(now),
        };
        let expired_before = holder
            .at
            .saturating_sub(u32::try_from(self.max_age_ticks).unwrap_or(u32::MAX));
        if self.shards.len() == 1 {
            let mut shard = self.shard(0);
            for &key in keys.iter().rev() {
                shard.put(key, holder, self.per_shard, expired_before);
            }
            return;
        }
        // One lock per shard, not per key: the keys are grouped by shard first (a counting
        // sort), each group last key first.
        let n = self.shards.len();
        let of: Vec<usize> = keys.iter().map(|&k| self.shard_of(k)).collect();
        let mut starts = vec![0usize; n + 1];
        for &s in &of {
            starts[s + 1] += 1;
        }
        for s in 0..n {
            starts[s + 1] += starts[s];
        }
        let mut fill = starts.clone();
        let mut grouped = vec![0u64; keys.len()];
        for (&key, &s) in keys.iter().zip(&of).rev() {
            grouped[fill[s]] = key;
            fill[s] += 1;
        }
        for (s, shard) in self.shards.iter().enumerate() {
            let group = &grouped[starts[s]..starts[s + 1]];
            if group.is_empty() {
                continue;
            }
            let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
            for &key in group {
                shard.put(key, holder, self.per_shard, expired_before);
            }
        }
    }

    /// How long a block sent to a worker counts.
    pub fn max_age(&self) -> Duration {
        TICK.saturating_mul(u32::try_from(self.max_age_ticks).unwrap_or(u32::MAX))
    }

    /// The keys held now, and the bound.
    pub fn size(&self) -> IndexSize {
        let blocks = self
            .shards
            .iter()
            .map(|s| s.lock().unwrap_or_else(|p| p.into_inner()).map.len())
            .sum();
        IndexSize {
            blocks,
            max_blocks: self.per_shard * self.shards.len(),
        }
    }
}

fn ticks(d: Duration) -> u64 {
    (d.as_millis() / TICK.as_millis()) as u64
}

// === impl Shard ===

impl Shard {
    fn new() -> Self {
        Self {
            map: HashMap::default(),
            nodes: Vec::new(),
            free: Vec::new(),
            head: NIL,
            tail: NIL,
        }
    }

    fn unlink(&mut self, i: u32) {
        let Node { prev, next, .. } = self.nodes[i as usize];
        match prev {
            NIL => self.head = next,
            p => self.nodes[p as usize].next = next,
        }
        match next {
            NIL => self.tail = prev,
            n => self.nodes[n as usize].prev = prev,
        }
    }

    fn push_front(&mut self, i: u32) {
        let old = self.head;
        let node = &mut self.nodes[i as usize];
        node.prev = NIL;
        node.next = old;
        match old {
            NIL => self.tail = i,
            o => self.nodes[o as usize].prev = i,
        }
        self.head = i;
    }

    fn remove(&mut self, i: u32) {
        self.unlink(i);
        let key = self.nodes[i as usize].key;
        self.map.remove(&key);
        self.free.push(i);
    }

    /// `key` sent to `holder` now: the most recent key of the shard; then the least recent
    /// go while over `cap` or sent before `expired_before` by every holder.
    fn put(&mut self, key: u64, holder: Holder, cap: usize, expired_before: u32) {
        match self.map.get(&key) {
            Some(&i) => {
                let holders = &mut self.nodes[i as usize].holders;
                let at = holders
                    .iter()
                    .position(|h| h.slot == holder.slot)
                    .or_else(|| holders.iter().position(|h| h.slot == EMPTY))
                    .unwrap_or_else(|| {
                        let oldest = holders.iter().enumerate().min_by_key(|(_, h)| h.at);
                        oldest.map_or(0, |(i, _)| i)
                    });
                holders[at] = holder;
                self.unlink(i);
                self.push_front(i);
            }
            None => {
                let mut holders = [NO_HOLDER; HOLDERS];
                holders[0] = holder;
                let node = Node {
                    key,
                    prev: NIL,
                    next: NIL,
                    holders,
                };
                let i = match self.free.pop() {
                    Some(i) => {
                        self.nodes[i as usize] = node;
                        i
                    }
                    None => {
                        let Ok(i) = u32::try_from(self.nodes.len()) else {
                            return;
                        };
                        self.nodes.push(node);
                        i
                    }
                };
                self.map.insert(key, i);
                self.push_front(i);
            }
        }
        while self.tail != NIL {
            let tail = &self.nodes[self.tail as usize];
            let newest = tail.holders.iter().map(|h| h.at).max().unwrap_or(0);
            if self.map.len() <= cap && newest >= expired_before {
                break;
            }
            self.remove(self.tail);
        }
    }

    fn purge_slot(&mut self, slot: u16) {
        let mut i = self.head;
        while i != NIL {
            let next = self.nodes[i as usize].next;
            let holders = &mut self.nodes[i as usize].holders;
            for h in holders.iter_mut().filter(|h| h.slot == slot) {
                *h = NO_HOLDER;
            }
            if holders.iter().all(|h| h.slot == EMPTY) {
                self.remove(i);
            }
            i = next;
        }
    }
}

mod remap;

#[cfg(test)]
mod tests;
