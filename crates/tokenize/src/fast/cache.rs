//! Bounded, thread-safe caches keyed by text: token counts per pre-token and per chat
//! segment, and the token ids of pre-tokens (the ids path, `fast::ids`).
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

/// What a cache holds per text, and the bytes it weighs beyond its key.
pub(crate) trait Cached {
    fn extra_bytes(&self) -> usize;
}

impl Cached for u32 {
    fn extra_bytes(&self) -> usize {
        0
    }
}

impl Cached for Box<[u32]> {
    fn extra_bytes(&self) -> usize {
        std::mem::size_of_val::<[u32]>(self)
    }
}

/// One shard: two generations of `text → value`.
struct Generations<V> {
    hot: HashMap<Box<str>, V, Hasher>,
    cold: HashMap<Box<str>, V, Hasher>,
    hot_bytes: usize,
}

impl<V> Default for Generations<V> {
    fn default() -> Self {
        Self {
            hot: HashMap::default(),
            cold: HashMap::default(),
            hot_bytes: 0,
        }
    }
}

/// A sharded, bounded `text → token count` map.
pub(crate) type CountCache = TextCache<u32>;

/// A sharded, bounded `text → token ids` map.
pub(crate) type IdsCache = TextCache<Box<[u32]>>;

/// A sharded, bounded `text → value` map.
pub(crate) struct TextCache<V> {
    shards: Vec<Mutex<Generations<V>>>,
    hasher: Hasher,
    /// Per shard and generation: at most this many entries…
    gen_entries: usize,
    /// …and this many key bytes.
    gen_bytes: usize,
}

impl<V: Cached> TextCache<V> {
    /// A cache holding at most `max_entries` entries of at most `max_bytes` key (and value)
    /// bytes in all (`0` entries disables it).
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

    fn shard(&self, key: &str) -> Option<&Mutex<Generations<V>>> {
        if self.gen_entries == 0 {
            return None;
        }
        let hash = self.hasher.hash_one(key);
        // usize is at least 32 bits on every target this runs on; the modulo keeps it in range.
        let index = (hash >> 32) as usize % SHARDS;
        self.shards.get(index)
    }

    /// `read` of the value cached for `key`, if any (read under the shard's lock: a value
    /// is used in place, never cloned).
    pub(crate) fn get_with<R>(&self, key: &str, read: impl FnOnce(&V) -> R) -> Option<R> {
        let shard = self.shard(key)?;
        // A panic while holding the lock cannot leave a map half-updated in a way that
        // gives a wrong value (inserts are single calls), so a poisoned lock is still usable.
        let mut g = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some(v) = g.hot.get(key) {
            return Some(read(v));
        }
        let (k, v) = g.cold.remove_entry(key)?;
        let out = read(&v);
        Self::insert_hot(&mut g, k, v, self.gen_entries, self.gen_bytes);
        Some(out)
    }

    /// Remembers `key → value` (entries heavier than a generation's byte budget are not
    /// kept).
    pub(crate) fn insert(&self, key: &str, value: V) {
        let Some(shard) = self.shard(key) else {
            return;
        };
        if key.len() + value.extra_bytes() > self.gen_bytes {
            return;
        }
        let mut g = shard.lock().unwrap_or_else(PoisonError::into_inner);
        if g.hot.contains_key(key) {
            return;
        }
        Self::insert_hot(&mut g, key.into(), value, self.gen_entries, self.gen_bytes);
    }

    fn insert_hot(g: &mut Generations<V>, key: Box<str>, value: V, entries: usize, bytes: usize) {
        let weight = key.len() + value.extra_bytes();
        if g.hot.len() >= entries || g.hot_bytes + weight > bytes {
            g.cold = std::mem::take(&mut g.hot);
            g.hot_bytes = 0;
        }
        g.hot_bytes += weight;
        g.hot.insert(key, value);
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

impl TextCache<u32> {
    /// The cached count of `key`, if any.
    pub(crate) fn get(&self, key: &str) -> Option<u32> {
        self.get_with(key, |&n| n)
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
