//! The fingerprint store: which tenant's recent prompts hold each n-gram of token ids.
//!
//! # Layout
//!
//! Hashes are spread over [`SHARDS`] shards (bits 40.. of the hash), each behind its own
//! `RwLock`, so recording a prompt and scanning responses rarely wait on each other. A
//! shard is a ring of time-bucketed generations, oldest first: a bucket is a
//! `HashMap<u64, Slot>` opened for at most `window / GENERATIONS` (one minute by default)
//! and at most its share of `max_entries`. Whole buckets are dropped, oldest first, when
//! their newest entry is older than the window or when the shard is at its entry cap — so
//! eviction costs nothing per entry and memory never exceeds the cap.
//!
//! # Ownership
//!
//! A slot holds one owner: a tenant, or [`COMMON`] once a second tenant records the same
//! n-gram in that bucket. A lookup merges the live buckets: one tenant everywhere is an
//! owner, two tenants (in one bucket or across buckets) are common text — a public
//! document, a system prompt, boilerplate — which never counts as a leak. Each slot also
//! keeps the time it was last recorded, so an entry older than the window never matches
//! even while its bucket is still alive.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::{Duration, Instant};

use super::filter::PresenceFilter;
use super::hash::{ngram_hashes, prompt_hash};
/// Owners as the scanner sees them (defined beside the shards that compute them).
pub(super) use super::shard::Owner;
use super::shard::{Bucket, Limits, Shard, Slot, COMMON};

/// Number of lock shards (a power of two; the shard is hash bits 40..44).
pub(crate) const SHARDS: usize = 16;
const SHARD_SHIFT: u32 = 40;
/// Time buckets per window: the granularity of whole-bucket eviction.
const GENERATIONS: u32 = 10;
/// Bytes one stored entry takes in a bucket's table: key, slot and hashbrown's control byte.
pub const ENTRY_BYTES: usize = std::mem::size_of::<(u64, Slot)>() + 1;

/// Tuning of the leak detector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LeakDetectorConfig {
    /// Tokens per n-gram (at least 1). Longer n-grams are more specific to one prompt;
    /// shorter ones catch smaller fragments but match more common phrasing.
    pub ngram: usize,
    /// How long a prompt is remembered.
    pub window: Duration,
    /// Upper bound on stored n-gram hashes across all tenants (the memory bound).
    pub max_entries: usize,
    /// Distinct foreign n-grams in one response before it is a suspected leak (at least 1).
    pub min_matches: usize,
}

impl Default for LeakDetectorConfig {
    fn default() -> Self {
        Self {
            ngram: 8,
            window: Duration::from_secs(600),
            max_entries: 1_000_000,
            min_matches: 2,
        }
    }
}

/// Recent prompts' n-gram fingerprints per tenant; cheap to clone (shared state), thread-safe.
#[derive(Clone)]
pub struct FingerprintStore {
    inner: Arc<Inner>,
}

pub(crate) struct Inner {
    pub(crate) config: LeakDetectorConfig,
    shards: Box<[RwLock<Shard>]>,
    shard_mask: u64,
    /// Which hashes may be stored: scanners skip the shards for the rest.
    pub(crate) filter: PresenceFilter,
    limits: Limits,
    /// Tenant name → small id, so a slot is 8 bytes. Grows with the number of tenants
    /// that ever sent a prompt, which the API keys bound.
    tenants: RwLock<HashMap<String, u32>>,
    /// When each (tenant, whole prompt) was last recorded: the same prompt from the same
    /// tenant within one generation span is not recorded again.
    recent: Mutex<HashMap<(u32, u64), Instant>>,
}

/// Mixed into text keys so they never equal a unit-sequence hash.
const TEXT_KEY_TAG: u64 = 0x7465_7874_6b65_7921;

/// Prompts remembered in [`Inner::recent`]; past it the memo starts over.
const RECENT_PROMPTS: usize = 65_536;

// === impl FingerprintStore ===

impl FingerprintStore {
    /// An empty store. `ngram` and `min_matches` below 1 are raised to 1.
    pub fn new(config: LeakDetectorConfig) -> Self {
        let config = LeakDetectorConfig {
            ngram: config.ngram.max(1),
            min_matches: config.min_matches.max(1),
            ..config
        };
        // Small caps get one shard, so no shard's share rounds down to nothing.
        let shards = if config.max_entries >= SHARDS * GENERATIONS as usize {
            SHARDS
        } else {
            1
        };
        let shard_cap = config.max_entries / shards;
        // Slot times are u32 milliseconds after the bucket start: a bucket must close
        // before that overflows (49 days), whatever the window.
        let span = (config.window / GENERATIONS).clamp(
            Duration::from_millis(1),
            Duration::from_millis(u64::from(u32::MAX)),
        );
        let limits = Limits {
            window: config.window,
            span,
            shard_cap,
            bucket_cap: (shard_cap / GENERATIONS as usize).max(1),
        };
        Self {
            inner: Arc::new(Inner {
                shards: (0..shards).map(|_| RwLock::default()).collect(),
                shard_mask: shards as u64 - 1,
                filter: PresenceFilter::new(config.max_entries),
                limits,
                config,
                tenants: RwLock::default(),
                recent: Mutex::default(),
            }),
        }
    }

    /// The configuration in force (after raising zero values).
    pub fn config(&self) -> &LeakDetectorConfig {
        &self.inner.config
    }

    /// Records the n-grams of `tenant`'s prompt (token ids, as the engine's KV pages hold
    /// them) at `now`. Prompts shorter than one n-gram record nothing.
    ///
    /// The same prompt sent again by the same tenant within one generation span
    /// (`window / 10`) is not recorded again, as its n-grams are already stored: a prompt is
    /// remembered for at least `window - window / 10` after its last send.
    pub fn record_prompt(&self, tenant: &str, prompt_ids: &[u32], now: Instant) {
        if prompt_ids.len() < self.inner.config.ngram {
            return;
        }
        self.record_once(tenant, prompt_hash(prompt_ids), now, || {
            std::borrow::Cow::Borrowed(prompt_ids)
        });
    }

    /// As [`Self::record_prompt`] for a prompt known by `text_key` (a hash of its text, see
    /// `hash::text_key`): `units` turns it into units only when this tenant did not send the
    /// same text within the last span, so a repeated prompt costs one pass of hashing.
    pub fn record_text_prompt(
        &self,
        tenant: &str,
        text_key: u64,
        now: Instant,
        units: impl FnOnce() -> Vec<u32>,
    ) {
        // Tagged apart from unit-sequence hashes of the same store.
        self.record_once(tenant, text_key ^ TEXT_KEY_TAG, now, || {
            std::borrow::Cow::Owned(units())
        });
    }

    /// Record the prompt `key` names, unless this tenant recorded it within the last span;
    /// `ids` makes its units only when they are needed.
    fn record_once<'a>(
        &self,
        tenant: &str,
        key: u64,
        now: Instant,
        ids: impl FnOnce() -> std::borrow::Cow<'a, [u32]>,
    ) {
        if self.inner.limits.shard_cap == 0 {
            return;
        }
        let Some(owner) = self.inner.tenant_id(tenant, true) else {
            return;
        };
        if self.inner.recorded_lately(owner, key, now) {
            return;
        }
        let ids = ids();
        if ids.len() >= self.inner.config.ngram {
            self.record_ngrams(owner, &ids, now);
        }
    }

    fn record_ngrams(&self, owner: u32, prompt_ids: &[u32], now: Instant) {
        let n = self.inner.config.ngram;
        // Hash outside any lock, then take each shard's lock once per prompt.
        let mut per_shard: Vec<Vec<u64>> = vec![Vec::new(); self.inner.shards.len()];
        let mut hashes = Vec::new();
        ngram_hashes(prompt_ids, n, &mut hashes);
        for hash in hashes {
            per_shard[self.inner.shard_of(hash)].push(hash);
        }
        for (shard, hashes) in self.inner.shards.iter().zip(per_shard) {
            if hashes.is_empty() {
                continue;
            }
            let mut shard = shard.write().unwrap_or_else(PoisonError::into_inner);
            shard.expire(now, self.inner.limits.window);
            for hash in hashes {
                // Under the shard's write lock: a rebuild reads this shard either before the
                // lock (and its cleared copy gets this bit here, after the clear) or after
                // (and copies the entry itself), so no stored entry is ever missing a bit.
                self.inner.filter.set(hash);
                shard.insert(hash, owner, now, &self.inner.limits);
            }
        }
    }

    /// Drops, in every shard, the buckets whose entries are all older than the window.
    ///
    /// Recording does this for the shards it touches, and expired entries never match
    /// anyway; call this from a timer to give back the memory of a store gone quiet. Also
    /// rebuilds the scanners' presence filter from what is left, so it forgets the dropped.
    pub fn expire(&self, now: Instant) {
        for shard in self.inner.shards.iter() {
            let mut shard = shard.write().unwrap_or_else(PoisonError::into_inner);
            shard.expire(now, self.inner.limits.window);
        }
        self.inner.filter.rebuild(|add| {
            for shard in self.inner.shards.iter() {
                let shard = shard.read().unwrap_or_else(PoisonError::into_inner);
                for bucket in &shard.buckets {
                    bucket.map.keys().for_each(|&hash| add(hash));
                }
            }
        });
    }

    /// Stored n-gram entries (an n-gram recorded in several buckets counts once per bucket).
    pub fn len(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.read().unwrap_or_else(PoisonError::into_inner).entries)
            .sum()
    }

    /// Whether nothing is stored.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Approximate heap and inline memory use in bytes: the tables as allocated (not just
    /// their entries), the rings and the tenant names.
    pub fn memory_bytes(&self) -> usize {
        let mut total = std::mem::size_of::<Inner>()
            + self.inner.shards.len() * std::mem::size_of::<RwLock<Shard>>()
            + self.inner.filter.memory_bytes();
        for shard in self.inner.shards.iter() {
            let shard = shard.read().unwrap_or_else(PoisonError::into_inner);
            total += shard.buckets.capacity() * std::mem::size_of::<Bucket>();
            total += shard
                .buckets
                .iter()
                .map(|b| table_bytes(b.map.capacity(), ENTRY_BYTES))
                .sum::<usize>();
        }
        let tenants = self
            .inner
            .tenants
            .read()
            .unwrap_or_else(PoisonError::into_inner);
        total += table_bytes(tenants.capacity(), std::mem::size_of::<(String, u32)>() + 1);
        total + tenants.keys().map(String::capacity).sum::<usize>()
    }

    /// The shared tables, for the scanners (`scan.rs`), which read what this store writes.
    pub(crate) fn inner(&self) -> &Arc<Inner> {
        &self.inner
    }
}

impl std::fmt::Debug for FingerprintStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FingerprintStore")
            .field("config", &self.inner.config)
            .field("len", &self.len())
            .finish_non_exhaustive()
    }
}

/// Bytes of a hashbrown table with `capacity` usable slots of `slot_bytes` each (control
/// bytes included, plus one SIMD group of trailing control bytes).
fn table_bytes(capacity: usize, slot_bytes: usize) -> usize {
    if capacity == 0 {
        return 0;
    }
    // hashbrown keeps 1/8 of the buckets free beyond 8 buckets, one below that.
    let buckets = if capacity < 8 {
        (capacity + 1).next_power_of_two()
    } else {
        (capacity * 8 / 7).next_power_of_two()
    };
    buckets * slot_bytes + 16
}

// === impl Inner ===

impl Inner {
    fn shard_of(&self, hash: u64) -> usize {
        // Bits 40.. are free: hashbrown uses the low bits for the index, the top 7 for tags.
        ((hash >> SHARD_SHIFT) & self.shard_mask) as usize
    }

    pub(crate) fn tenant_id(&self, tenant: &str, create: bool) -> Option<u32> {
        let read = self.tenants.read().unwrap_or_else(PoisonError::into_inner);
        if let Some(&id) = read.get(tenant) {
            return Some(id);
        }
        drop(read);
        if !create {
            return None;
        }
        let mut write = self.tenants.write().unwrap_or_else(PoisonError::into_inner);
        let next = u32::try_from(write.len()).ok().filter(|&id| id < COMMON)?;
        Some(*write.entry(tenant.to_owned()).or_insert(next))
    }

    /// Whether `owner` recorded the prompt hashed to `hash` less than one span before
    /// `now`; if not, notes that it does now.
    fn recorded_lately(&self, owner: u32, hash: u64, now: Instant) -> bool {
        let mut recent = self.recent.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(at) = recent.get_mut(&(owner, hash)) {
            if now.saturating_duration_since(*at) < self.limits.span {
                return true;
            }
            *at = now;
            return false;
        }
        if recent.len() >= RECENT_PROMPTS {
            recent.clear();
        }
        recent.insert((owner, hash), now);
        false
    }

    /// Who owns each of `hashes` among entries no older than the window at `now`, in order:
    /// the presence filter answers for most, and each shard's lock is taken at most once.
    pub(crate) fn owners(&self, hashes: &[u64], now: Instant, out: &mut Vec<Owner>) {
        out.clear();
        let view = self.filter.view();
        out.extend(hashes.iter().map(|&h| {
            if view.maybe(h) {
                Owner::Unknown
            } else {
                Owner::Nobody
            }
        }));
        if !view.still_valid() {
            // A rebuild began during the batch: its "surely not" answers are not trusted.
            out.iter_mut().for_each(|o| *o = Owner::Unknown);
        }
        // The few the filter passed, by shard, so each shard's lock is taken once.
        let mut todo: Vec<(usize, usize)> = (out.iter().enumerate())
            .filter(|(_, o)| **o == Owner::Unknown)
            .map(|(i, _)| (self.shard_of(hashes[i]), i))
            .collect();
        todo.sort_unstable();
        for group in todo.chunk_by(|a, b| a.0 == b.0) {
            let shard = self.shards[group[0].0]
                .read()
                .unwrap_or_else(PoisonError::into_inner);
            for &(_, i) in group {
                out[i] = shard.owner(hashes[i], now, self.limits.window);
            }
        }
    }
}
