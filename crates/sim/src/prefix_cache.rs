//! The engine's prefix cache: full KV pages of earlier prompts, reused by later prompts that
//! start with the same tokens under the same cache partition.
//!
//! What real engines do, reduced to what shows from outside: SGLang's radix cache (page
//! granularity with `--page-size`) and vLLM's prefix caching keep the KV of full pages of
//! earlier prompts, match a new prompt's longest cached prefix page by page, report the
//! matched tokens as `cached_tokens`, skip computing them, and evict least recently used
//! pages when the pool needs room. Only full pages are cached: a partial page can't be
//! shared, since the next prompt may continue it differently.
//!
//! **Keys.** A block (one page of token ids) is keyed by a chained hash of its parent
//! block's key, its partition and its token ids, so a block matches only when everything
//! before it matched too, under the same partition. The key is a lookup aid only: an entry
//! also keeps its parent key, partition and tokens, and a lookup compares them, so a 64-bit
//! hash collision reads as a miss and can never hand out another partition's (or another
//! prefix's) blocks.
//!
//! **Partitions** keep tenants apart: a prompt only ever matches blocks inserted under the
//! same [`Partition`] (the request's `cache_salt` and SGLang's `extra_key`).
//!
//! **Bound and eviction.** At most `capacity` blocks are cached. Inserting into a full cache
//! evicts the least recently used *leaf* (a block no cached block continues), as SGLang's
//! radix cache evicts leaves first: every cached block stays reachable from its chain's
//! first block, so nothing cached is ever dead weight. A lookup or insert touches every
//! block of the chain it goes through, so pages many prompts share (a system prompt) stay
//! recent while a branch nobody comes back to ages out.
//!
//! The cache is its own account, separate from the KV pool's pages (`kv_pool.rs`): like
//! SGLang's evictable radix-cache pages, it never takes room from the running batch.

use std::collections::{BTreeSet, HashMap};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex, MutexGuard};

/// The cache partition a prompt belongs to: blocks of one partition never match another's.
///
/// Both fields empty (or absent from the request) is the shared default partition. The two
/// are kept apart rather than concatenated, so `("ab", "c")` and `("a", "bc")` stay distinct.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
pub(crate) struct Partition {
    /// The request's `cache_salt` (vLLM, SGLang; what kvgate sets per tenant).
    pub(crate) cache_salt: String,
    /// SGLang's `extra_key`.
    pub(crate) extra_key: String,
}

type BlockKey = u64;

/// One cached block and where it sits in its chain.
struct Block {
    parent: Option<BlockKey>,
    partition: Arc<Partition>,
    tokens: Box<[u32]>,
    /// Cached blocks that continue this one; a block with none is a leaf (evictable).
    children: usize,
    /// The cache's clock at the last lookup or insert that went through this block.
    last_used: u64,
}

#[derive(Default)]
struct State {
    blocks: HashMap<BlockKey, Block>,
    /// Leaves by `(last_used, key)`: the first one is the next to evict.
    leaves: BTreeSet<(u64, BlockKey)>,
    clock: u64,
}

/// A bounded, partitioned cache of full-page token prefixes with LRU eviction of leaves.
pub(crate) struct PrefixCache {
    state: Mutex<State>,
    page_size: usize,
    capacity: usize,
}

impl std::fmt::Debug for PrefixCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixCache")
            .field("page_size", &self.page_size)
            .field("capacity", &self.capacity)
            .field("blocks", &self.len())
            .finish()
    }
}

/// The key of a block: chained over its parent, so equal tokens at different places (or
/// after different prefixes) get different keys.
fn block_key(parent: Option<BlockKey>, partition: &Partition, tokens: &[u32]) -> BlockKey {
    // `DefaultHasher::new()` has fixed keys: keys are stable for the process's lifetime,
    // which is all an in-memory cache needs.
    let mut h = DefaultHasher::new();
    parent.hash(&mut h);
    partition.hash(&mut h);
    tokens.hash(&mut h);
    h.finish()
}

impl Block {
    fn is(&self, parent: Option<BlockKey>, partition: &Partition, tokens: &[u32]) -> bool {
        self.parent == parent && *self.partition == *partition && *self.tokens == *tokens
    }
}

impl State {
    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock
    }

    /// Marks `key` as just used, keeping its place in the leaf order in step.
    fn touch(&mut self, key: BlockKey) {
        let now = self.tick();
        let Some(block) = self.blocks.get_mut(&key) else {
            return;
        };
        let before = block.last_used;
        block.last_used = now;
        if self.leaves.remove(&(before, key)) {
            self.leaves.insert((now, key));
        }
    }

    /// The cached block for `tokens` after `parent`, if it is exactly that block.
    fn find(&self, parent: Option<BlockKey>, partition: &Partition, tokens: &[u32]) -> Lookup {
        let key = block_key(parent, partition, tokens);
        match self.blocks.get(&key) {
            Some(block) if block.is(parent, partition, tokens) => Lookup::Hit(key),
            Some(_) => Lookup::Collision,
            None => Lookup::Miss(key),
        }
    }

    /// Evicts the least recently used leaf other than `keep`; false when there is none.
    fn evict_one(&mut self, keep: Option<BlockKey>) -> bool {
        let victim = self
            .leaves
            .iter()
            .find(|(_, key)| Some(*key) != keep)
            .copied();
        let Some((used, key)) = victim else {
            return false;
        };
        self.leaves.remove(&(used, key));
        let Some(block) = self.blocks.remove(&key) else {
            return true;
        };
        if let Some(parent_key) = block.parent {
            if let Some(parent) = self.blocks.get_mut(&parent_key) {
                parent.children = parent.children.saturating_sub(1);
                if parent.children == 0 {
                    self.leaves.insert((parent.last_used, parent_key));
                }
            }
        }
        true
    }
}

enum Lookup {
    Hit(BlockKey),
    Miss(BlockKey),
    /// Another block has this key: treated as a miss that must not be overwritten.
    Collision,
}

impl PrefixCache {
    /// A cache of at most `capacity_tokens / page_size` full blocks (0: caches nothing).
    pub(crate) fn new(page_size: usize, capacity_tokens: usize) -> Self {
        let page_size = page_size.max(1);
        Self {
            state: Mutex::new(State::default()),
            page_size,
            capacity: capacity_tokens / page_size,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update keeps the maps consistent between statements; a poisoned cache is whole.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Blocks cached now.
    pub(crate) fn len(&self) -> usize {
        self.lock().blocks.len()
    }

    /// The most blocks the cache holds.
    #[cfg(test)]
    fn capacity(&self) -> usize {
        self.capacity
    }

    /// Tokens of the longest cached prefix of `tokens` under `partition` (a multiple of the
    /// page size); the matched blocks count as just used.
    pub(crate) fn lookup(&self, partition: &Partition, tokens: &[u32]) -> usize {
        let mut state = self.lock();
        let mut parent = None;
        let mut matched = 0;
        for chunk in tokens.chunks_exact(self.page_size) {
            let Lookup::Hit(key) = state.find(parent, partition, chunk) else {
                break;
            };
            state.touch(key);
            parent = Some(key);
            matched += chunk.len();
        }
        matched
    }

    /// Caches the full blocks of `tokens` under `partition` (those already cached count as
    /// just used), evicting least recently used leaves to stay within the bound. When the
    /// bound leaves no room, the prompt's first blocks stay and the rest are not cached: a
    /// chain is only useful from its start.
    pub(crate) fn insert(&self, partition: &Partition, tokens: &[u32]) {
        if self.capacity == 0 {
            return;
        }
        let mut state = self.lock();
        let mut shared: Option<Arc<Partition>> = None;
        let mut parent = None;
        for chunk in tokens.chunks_exact(self.page_size) {
            let key = match state.find(parent, partition, chunk) {
                Lookup::Hit(key) => {
                    state.touch(key);
                    key
                }
                Lookup::Collision => return,
                Lookup::Miss(key) => {
                    while state.blocks.len() >= self.capacity {
                        // The parent is on this prompt's chain: evicting it would orphan
                        // the block about to hang under it.
                        if !state.evict_one(parent) {
                            return;
                        }
                    }
                    let partition =
                        Arc::clone(shared.get_or_insert_with(|| Arc::new(partition.clone())));
                    let now = state.tick();
                    if let Some(parent_key) = parent {
                        if let Some(block) = state.blocks.get_mut(&parent_key) {
                            block.children += 1;
                            let used = block.last_used;
                            // No longer a leaf: it is continued by the block inserted now.
                            state.leaves.remove(&(used, parent_key));
                        }
                    }
                    state.blocks.insert(
                        key,
                        Block {
                            parent,
                            partition,
                            tokens: chunk.into(),
                            children: 0,
                            last_used: now,
                        },
                    );
                    state.leaves.insert((now, key));
                    key
                }
            };
            parent = Some(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pages of 4 tokens.
    const P: usize = 4;

    fn salt(s: &str) -> Partition {
        Partition {
            cache_salt: s.into(),
            extra_key: String::new(),
        }
    }

    /// `blocks` full blocks of distinct ids starting at `start`, plus `extra` loose tokens.
    fn prompt(start: u32, blocks: usize, extra: usize) -> Vec<u32> {
        (start..start + (blocks * P + extra) as u32).collect()
    }

    #[test]
    fn a_repeated_prompt_matches_its_full_blocks_only() {
        let cache = PrefixCache::new(P, 64);
        let none = Partition::default();
        let ids = prompt(100, 3, 2);
        assert_eq!(cache.lookup(&none, &ids), 0);
        cache.insert(&none, &ids);
        // The two loose tokens of the last, partial page are never cached.
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.lookup(&none, &ids), 3 * P);
        // A prompt that shares the first 1.5 blocks matches the one full block.
        let mut other = ids[..P + 2].to_vec();
        other.extend([7, 7, 7, 7, 7]);
        assert_eq!(cache.lookup(&none, &other), P);
        // Inserting the same prompt again adds nothing.
        cache.insert(&none, &ids);
        assert_eq!(cache.len(), 3);
    }

    #[test]
    fn a_block_matches_only_after_the_same_prefix() {
        let cache = PrefixCache::new(P, 64);
        let none = Partition::default();
        let ids = prompt(0, 2, 0);
        cache.insert(&none, &ids);
        // The second block's tokens alone (or after another first block) do not match.
        assert_eq!(cache.lookup(&none, &ids[P..]), 0);
        let mut moved = prompt(50, 1, 0);
        moved.extend_from_slice(&ids[P..]);
        assert_eq!(cache.lookup(&none, &moved), 0);
        // A growing conversation matches everything of the previous turn.
        let mut longer = ids.clone();
        longer.extend(prompt(900, 2, 1));
        assert_eq!(cache.lookup(&none, &longer), 2 * P);
        cache.insert(&none, &longer);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.lookup(&none, &longer), 4 * P);
    }

    #[test]
    fn partitions_never_share_blocks() {
        let cache = PrefixCache::new(P, 64);
        let ids = prompt(10, 2, 0);
        cache.insert(&salt("tenant-a"), &ids);
        assert_eq!(cache.lookup(&salt("tenant-b"), &ids), 0);
        assert_eq!(cache.lookup(&Partition::default(), &ids), 0);
        let extra = Partition {
            cache_salt: "tenant-a".into(),
            extra_key: "k".into(),
        };
        assert_eq!(cache.lookup(&extra, &ids), 0);
        // Salt and extra key are two fields, not one string: ("ab", "c") is not ("a", "bc").
        let ab_c = Partition {
            cache_salt: "ab".into(),
            extra_key: "c".into(),
        };
        let a_bc = Partition {
            cache_salt: "a".into(),
            extra_key: "bc".into(),
        };
        cache.insert(&ab_c, &ids);
        assert_eq!(cache.lookup(&a_bc, &ids), 0);
        assert_eq!(cache.lookup(&ab_c, &ids), 2 * P);
        assert_eq!(cache.lookup(&salt("tenant-a"), &ids), 2 * P);
    }

    #[test]
    fn the_least_recently_used_leaves_go_first() {
        // Room for four blocks.
        let cache = PrefixCache::new(P, 4 * P + 3);
        assert_eq!(cache.capacity(), 4);
        let none = Partition::default();
        let (a, b, c) = (prompt(100, 2, 0), prompt(200, 2, 0), prompt(300, 2, 0));
        cache.insert(&none, &a);
        cache.insert(&none, &b);
        // Full: c's two blocks evict a's leaf, then a's first block, which became a leaf.
        cache.insert(&none, &c);
        assert_eq!(cache.len(), 4);
        assert_eq!(cache.lookup(&none, &a), 0);
        assert_eq!(cache.lookup(&none, &b), 2 * P);
        assert_eq!(cache.lookup(&none, &c), 2 * P);
        // b was used before c: inserting a again evicts b's chain, the oldest.
        cache.insert(&none, &a);
        assert_eq!(cache.lookup(&none, &b), 0);
        assert_eq!(cache.lookup(&none, &c), 2 * P);
        assert_eq!(cache.lookup(&none, &a), 2 * P);
    }

    #[test]
    fn eviction_takes_leaves_so_every_cached_block_stays_reachable() {
        let cache = PrefixCache::new(P, 3 * P);
        let none = Partition::default();
        let shared = prompt(0, 1, 0);
        let mut x = shared.clone();
        x.extend(prompt(100, 1, 0));
        let mut y = shared.clone();
        y.extend(prompt(200, 1, 0));
        cache.insert(&none, &x);
        cache.insert(&none, &y);
        assert_eq!(cache.len(), 3);
        // Two new blocks: x's leaf goes first (the oldest), then y's leaf, although the
        // shared first block was used before it: evicting that would orphan y's leaf.
        cache.insert(&none, &prompt(500, 2, 0));
        assert_eq!(cache.len(), 3);
        assert_eq!(cache.lookup(&none, &x), P);
        assert_eq!(cache.lookup(&none, &y), P);
        assert_eq!(cache.lookup(&none, &prompt(500, 2, 0)), 2 * P);
    }

    #[test]
    fn a_prompt_longer_than_the_bound_keeps_its_first_blocks() {
        let cache = PrefixCache::new(P, 2 * P);
        let none = Partition::default();
        let long = prompt(0, 5, 0);
        cache.insert(&none, &long);
        assert_eq!(cache.len(), 2);
        assert_eq!(cache.lookup(&none, &long), 2 * P);
        // A zero bound caches nothing.
        let off = PrefixCache::new(P, P - 1);
        off.insert(&none, &long);
        assert_eq!(off.len(), 0);
        assert_eq!(off.lookup(&none, &long), 0);
    }
}
