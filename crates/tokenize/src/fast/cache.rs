//! Bounded, thread-safe caches of token counts: per pre-token and per chat segment.
//!
//! Both are keyed by the *text itself* (compared byte for byte on every hit), not by a
//! hash alone: a hash collision, accidental or crafted by a tenant, could otherwise make a
//! long segment count as a short one and slip past admission. Hashing only picks the shard
//! and bucket.
//!
//! Eviction is generational: each shard has a `hot` and a `cold` map. New entries go to
//! `hot`; a hit in `cold` moves the entry back to `hot`; when `hot` reaches half of the
//! shard's budget, `cold` is dropped and `hot` becomes `cold`. So an entry used at least
//! once per generation stays, memory never exceeds the budget, and no per-hit bookkeeping
//! (LRU lists) is needed.

use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Mutex, PoisonError};

/// Fixed-seed hashing is fine here: keys are verified, so a flooding attacker can at
/// worst slow one shard's lookups, and shards are small.
type Hasher = foldhash::fast::FixedState;

const SHARDS: usize = 16;

/// One shard: two generations of `text → count`.
#[derive(Default)]
struct Generations {
    hot: HashMap<Box<str>, u32, Hasher>,
    cold: HashMap<Box<str>, u32, Hasher>,
    hot_bytes: usize,
}

/// A sharded, bounded `text → token count` map.
pub(crate) struct CountCache {
    shards: Vec<Mutex<Generations>>,
    hasher: Hasher,
    /// Per shard and generation: at most this many entries…
    gen_entries: usize,
    /// …and this many key bytes.
    gen_bytes: usize,
}

impl CountCache {
    /// A cache holding at most `max_entries` entries of at most `max_bytes` key bytes in all
    /// (`0` entries disables it).
    pub(crate) fn new(max_entries: usize, max_bytes: usize) -> Self {
        Self {
            shards: (0..SHARDS)
                .map(|_| Mutex::new(Generations::default()))
                .collect(),
            hasher: Hasher::default(),
            gen_entries: max_entries / SHARDS / 2,
            gen_bytes: max_bytes / SHARDS / 2,
        }
    }

    fn shard(&self, key: &str) -> Option<&Mutex<Generations>> {
        if self.gen_entries == 0 {
            return None;
        }
        let hash = self.hasher.hash_one(key);
        // usize is at least 32 bits on every target this runs on; the modulo keeps it in range.
        let index = (hash >> 32) as usize % SHARDS;
        self.shards.get(index)
    }

    /// The cached count of `key`, if any.
    pub(crate) fn get(&self, key: &str) -> Option<u32> {
        let shard = self.shard(key)?;
        // A panic while holding the lock cannot leave a map half-updated in a way that
        // gives a wrong count (inserts are single calls), so a poisoned lock is still usable.
        let mut g = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(&n) = g.hot.get(key) {
            return Some(n);
        }
        let (k, n) = g.cold.remove_entry(key)?;
        Self::insert_hot(&mut g, k, n, self.gen_entries, self.gen_bytes);
        Some(n)
    }

    /// Remembers `key → count` (keys longer than a generation's byte budget are not kept).
    pub(crate) fn insert(&self, key: &str, count: u32) {
        let Some(shard) = self.shard(key) else {
            return;
        };
        if key.len() > self.gen_bytes {
            return;
        }
        let mut g = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if g.hot.contains_key(key) {
            return;
        }
        Self::insert_hot(&mut g, key.into(), count, self.gen_entries, self.gen_bytes);
    }

    fn insert_hot(g: &mut Generations, key: Box<str>, count: u32, entries: usize, bytes: usize) {
        if g.hot.len() >= entries || g.hot_bytes + key.len() > bytes {
            g.cold = std::mem::take(&mut g.hot);
            g.hot_bytes = 0;
        }
        g.hot_bytes += key.len();
        g.hot.insert(key, count);
    }

    /// Number of entries held (both generations), for tests.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.shards
            .iter()
            .map(|s| {
                let g = s.lock().unwrap_or_else(PoisonError::into_inner);
                g.hot.len() + g.cold.len()
            })
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_and_keeps_recently_used_entries() {
        let cache = CountCache::new(SHARDS * 8, 1 << 20);
        for i in 0..10_000u32 {
            cache.insert(&format!("key{i}"), i);
            // key0 is touched every round, so it survives every generation change.
            assert_eq!(cache.get("key0"), Some(0));
        }
        assert!(cache.len() <= SHARDS * 8, "{}", cache.len());
        assert_eq!(cache.get("key9999"), Some(9999));
        assert_eq!(cache.get("key17"), None);
    }

    #[test]
    fn disabled_and_oversized_keys_are_not_kept() {
        let off = CountCache::new(0, 1 << 20);
        off.insert("a", 1);
        assert_eq!(off.get("a"), None);
        let small = CountCache::new(1024, SHARDS * 2 * 4);
        small.insert("12345", 1);
        assert_eq!(small.get("12345"), None);
        small.insert("1234", 1);
        assert_eq!(small.get("1234"), Some(1));
    }
}
