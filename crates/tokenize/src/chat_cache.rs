//! Exact counts of whole conversations seen before, so a repeated chat skips its render.
//!
//! Rendering the chat template is the largest part of counting a short chat (tens of µs
//! for Qwen3's template, far more than counting the rendered text through the segment
//! cache). The same conversation arrives again and again in practice: retries, `n`-way
//! fan-outs sent as separate requests, evaluation sets, fixed prompts behind a product
//! feature, health probes. A conversation's count is a pure function of its messages, tools
//! and template arguments, so it is cached under a 128-bit keyed hash of them (two
//! independent SipHash keys, fresh each process: a client can neither predict nor aim for a
//! collision). The hash is over the JSON text exactly as the client sent it (the gateway
//! passes that text on to the engine unchanged), so a hit needs no parse at all; the same
//! conversation written with other whitespace is another key, and costs one render. Templates that read the clock (`strftime_now`) are never cached: their
//! output changes by itself.
//!
//! The table is bounded: 16 shards of at most [`ENTRIES_PER_SHARD`] entries; a full shard
//! starts over (a miss only costs a render).

use std::collections::hash_map::RandomState;
use std::collections::HashMap;
use std::hash::{BuildHasher, Hasher};
use std::sync::Mutex;

const SHARDS: usize = 16;
/// Entries kept per shard (64 Ki conversations in all, ≈ 1.5 MiB).
pub const ENTRIES_PER_SHARD: usize = 4096;

/// The key of one conversation as the template sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ChatKey(u64, u64);

/// Counts of conversations, keyed by [`ChatKey`].
pub(crate) struct ChatCountCache {
    keys: (RandomState, RandomState),
    shards: Vec<Mutex<HashMap<ChatKey, usize>>>,
}

impl ChatCountCache {
    pub(crate) fn new() -> Self {
        Self {
            keys: (RandomState::new(), RandomState::new()),
            shards: (0..SHARDS).map(|_| Mutex::new(HashMap::new())).collect(),
        }
    }

    /// The key of `messages` and `tools` (their JSON text) prepared with `options`.
    pub(crate) fn key(&self, messages: &str, tools: Option<&str>, options: &str) -> ChatKey {
        let hash = |state: &RandomState| {
            let mut h = state.build_hasher();
            h.write_usize(options.len());
            h.write(options.as_bytes());
            // Lengths first: no two (messages, tools) pairs feed the same bytes.
            h.write_usize(messages.len());
            h.write(messages.as_bytes());
            match tools {
                Some(t) => {
                    h.write_usize(t.len());
                    h.write(t.as_bytes());
                }
                None => h.write_u8(0xff),
            }
            h.finish()
        };
        ChatKey(hash(&self.keys.0), hash(&self.keys.1))
    }

    fn shard(&self, key: ChatKey) -> Option<&Mutex<HashMap<ChatKey, usize>>> {
        self.shards.get((key.0 as usize) % SHARDS)
    }

    pub(crate) fn get(&self, key: ChatKey) -> Option<usize> {
        let shard = self.shard(key)?.lock().ok()?;
        shard.get(&key).copied()
    }

    pub(crate) fn insert(&self, key: ChatKey, count: usize) {
        let Some(Ok(mut shard)) = self.shard(key).map(Mutex::lock) else {
            return;
        };
        if shard.len() >= ENTRIES_PER_SHARD && !shard.contains_key(&key) {
            shard.clear();
        }
        shard.insert(key, count);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_tell_conversations_apart_and_repeat_for_the_same_one() {
        let cache = ChatCountCache::new();
        let a = r#"[{"role":"user","content":"ab"}]"#;
        let key = cache.key(a, None, "sglang");
        assert_eq!(key, cache.key(String::from(a).as_str(), None, "sglang"));
        for other in [
            r#"[{"role":"user","content":"a"},{"role":"user","content":"b"}]"#,
            r#"[{"role":"user","content":"ab","name":null}]"#,
            r#"[{"role":"user","content":["ab"]}]"#,
            r#"[{"role":"user","content":1}]"#,
        ] {
            assert_ne!(key, cache.key(other, None, "sglang"), "{other}");
        }
        assert_ne!(key, cache.key(a, None, "vllm"));
        assert_ne!(key, cache.key(a, Some("[]"), "sglang"));
        // The boundary between messages and tools is part of the key.
        assert_ne!(
            cache.key("[1]", Some("[]"), "sglang"),
            cache.key("[1][", Some("]"), "sglang")
        );
        cache.insert(key, 7);
        assert_eq!(cache.get(key), Some(7));
        assert_eq!(cache.get(cache.key(a, None, "vllm")), None);
    }

    #[test]
    fn a_full_shard_starts_over() {
        let cache = ChatCountCache::new();
        for i in 0..(ENTRIES_PER_SHARD * SHARDS * 2) {
            cache.insert(cache.key(&i.to_string(), None, "sglang"), i);
        }
        for shard in &cache.shards {
            assert!(shard.lock().unwrap().len() <= ENTRIES_PER_SHARD);
        }
    }
}
