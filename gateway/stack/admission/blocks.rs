//! The prompt's KV blocks, for prefix-aware routing (issue 31): the exact token ids of the
//! request's first prompt as the engine will see them, hashed into chained block hashes
//! ([`crate::stack::routing::blocks::chain`]) that routing matches against its pools'
//! prefix indexes.
//!
//! - token ids (`input_ids`, completions token arrays): as given;
//! - text (`/generate` `text`, completions `prompt`): encoded with special tokens, as
//!   admission counts it;
//! - chat: rendered through the model's chat template (admission has just rendered it) and
//!   encoded without special tokens. A conversation seen before (the same messages and
//!   tools) takes its chain from a bounded cache, with no render and no encode.
//!
//! Only requests that may land on a pool choosing by prefix (`[prefix_routing]` on, and
//! more than one unified or prefill worker to choose from) are hashed; the others cost
//! nothing. Ids come from the tokenizer's fast ids path ([`ModelTokenizer::ids_fast`]);
//! prompts up to [`INLINE_COUNT_BYTES`] are done on the request's thread, longer ones on the
//! blocking pool when one of the counting slots is free at once (otherwise the request is
//! routed by load: affinity is never worth a wait), and routing awaits the result.

use futures_util::future::{BoxFuture, FutureExt, Shared};
use std::collections::HashMap;
use std::hash::BuildHasher;
use std::sync::{Arc, Mutex};

use super::chat::render_chat;
use super::count::ImageIdSalts;
use super::count::{Measured, INLINE_COUNT_BYTES};
use super::AdmissionState;
use crate::error::GatewayError;
use crate::stack::api::prompt_view::Prompts;
use crate::stack::api::{InferenceRequest, PromptInput, PromptView};
use crate::stack::routing::blocks::chain;
use crate::stack::routing::{BlockChain, RequestBlocks};
use crate::vision::salt_image_ids;
use kvgate_tokenize::{ChatKey, ChatPrompt, ChatRules, ModelTokenizer};

const SHARDS: usize = 16;
/// Conversations whose chains a shard keeps…
const CHAINS_PER_SHARD: usize = 1024;
/// …and blocks (8 bytes each: 16 shards of 64 Ki blocks are 8 MiB at most).
const BLOCKS_PER_SHARD: usize = 64 * 1024;

/// What admission needs to hash prompts into blocks (`[prefix_routing]` on).
#[derive(Debug)]
pub struct PrefixHashing {
    /// Tokens per block (`block_size`).
    pub block_size: usize,
    chains: Arc<ChainCache>,
}

impl PrefixHashing {
    /// Hashing into blocks of `block_size` tokens.
    pub fn new(block_size: usize) -> Self {
        Self {
            block_size,
            chains: Arc::new(ChainCache::new()),
        }
    }
}

/// The chains of conversations seen before, by [`ChatKey`]: a repeat is neither rendered
/// nor encoded again. Bounded per shard in chains and blocks; a full shard starts over.
#[derive(Debug)]
struct ChainCache {
    hasher: foldhash::fast::FixedState,
    shards: Vec<Mutex<ChainShard>>,
}

/// One shard: chains by conversation, and the blocks they hold in all.
type ChainShard = (HashMap<ChatKey, Arc<[u64]>>, usize);

impl ChainCache {
    fn new() -> Self {
        Self {
            hasher: foldhash::fast::FixedState::default(),
            shards: (0..SHARDS).map(|_| Mutex::default()).collect(),
        }
    }

    fn shard(&self, key: ChatKey) -> Option<&Mutex<ChainShard>> {
        self.shards
            .get((self.hasher.hash_one(key) >> 32) as usize % SHARDS)
    }

    fn get(&self, key: ChatKey) -> Option<Arc<[u64]>> {
        let shard = self.shard(key)?.lock().unwrap_or_else(|p| p.into_inner());
        shard.0.get(&key).cloned()
    }

    fn insert(&self, key: ChatKey, blocks: Arc<[u64]>) {
        let Some(shard) = self.shard(key) else {
            return;
        };
        if blocks.len() > BLOCKS_PER_SHARD {
            return;
        }
        let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner());
        let (chains, held) = &mut *shard;
        if chains.len() >= CHAINS_PER_SHARD || *held + blocks.len() > BLOCKS_PER_SHARD {
            chains.clear();
            *held = 0;
        }
        *held += blocks.len();
        if let Some(old) = chains.insert(key, blocks) {
            *held = held.saturating_sub(old.len());
        }
    }
}

type ChainFuture = Shared<BoxFuture<'static, Option<Arc<[u64]>>>>;

/// One request's prompt blocks: ready, or being computed on the blocking pool.
#[derive(Debug, Clone)]
pub enum PromptBlocks {
    Ready(Option<Arc<[u64]>>),
    Pending(ChainFuture),
}

impl BlockChain for PromptBlocks {
    fn chain(&self) -> BoxFuture<'static, Option<Arc<[u64]>>> {
        match self {
            PromptBlocks::Ready(chain) => futures_util::future::ready(chain.clone()).boxed(),
            PromptBlocks::Pending(job) => job.clone().boxed(),
        }
    }
}

/// What to hash, owned (it may go to the blocking pool).
enum Work {
    Ids(Vec<u32>),
    /// Plain text, encoded with special tokens.
    Text(Arc<str>),
    /// A prepared and rendered chat, and how its images' tokens are salted.
    Chat(Arc<ChatPrompt>, Option<ImageIdSalts>),
}

/// Whether a request for `model` may need its prompt blocks: prefix routing is on and one
/// of the model's pools chooses by prefix (admission then encodes a small first prompt
/// instead of only counting it: the ids give the count too).
pub(super) fn wanted(state: &AdmissionState, model: &str) -> bool {
    state.prefix.is_some()
        && state
            .fleet
            .pools_of(model)
            .iter()
            .any(|p| p.prefix.is_some())
}

/// The prompt blocks of an admitted request, when one of its `admitted` pools chooses its
/// worker by prefix (None otherwise: nothing is computed). `measured` is admission's
/// measure of its samples, prepared by `rules`. An error (the prompt or template could not
/// be read again, which admission's own reading of them rules out) leaves the request to be
/// routed by load.
pub(super) fn start(
    state: &AdmissionState,
    tokenizer: &Arc<ModelTokenizer>,
    parsed: &InferenceRequest,
    (measured, rules): (&[Measured], ChatRules),
    admitted: &[Arc<str>],
) -> Result<Option<RequestBlocks>, GatewayError> {
    let Some(prefix) = &state.prefix else {
        return Ok(None);
    };
    let chooses = |name: &Arc<str>| state.fleet.pool(name).is_some_and(|p| p.prefix.is_some());
    if !admitted.iter().any(chooses) {
        return Ok(None);
    }
    let Some(first) = measured.first() else {
        return Ok(None);
    };
    // Fewer tokens than a block (the bound, when not counted, is never below the count).
    if first.tokens.value() < prefix.block_size as u64 {
        return Ok(None);
    }
    let key = first.chat.as_ref().and_then(|(key, _)| *key);
    let remember = |blocks: Arc<[u64]>| {
        if let Some(key) = key {
            prefix.chains.insert(key, blocks.clone());
        }
        Some(ready(Some(blocks)))
    };
    // Counted inline from its ids (the common case): hashing them is all that is left.
    if let Some(ids) = &first.ids {
        return Ok(remember(Arc::from(chain(ids, prefix.block_size))));
    }
    if let Some(cached) = key.and_then(|k| prefix.chains.get(k)) {
        return Ok(Some(ready(Some(cached))));
    }
    let work = match (&first.chat, parsed.prompts()?.into_iter().next()) {
        (Some((_, Some(prompt))), _) => Work::Chat(prompt.clone(), first.image_ids.clone()),
        (
            Some((_, None)),
            Some(PromptInput::Chat {
                messages,
                tools,
                fields,
            }),
        ) => {
            // Counted from the cache, never rendered here: render it now.
            let prompt = render_chat(tokenizer, &parsed.model, rules, messages, tools, fields)?;
            Work::Chat(Arc::new(prompt), None)
        }
        (_, Some(PromptInput::Text(text))) => Work::Text(Arc::from(text.as_ref())),
        (_, Some(PromptInput::Ids(_))) => match parsed.prompt_view()? {
            Some(PromptView::Samples(Prompts::Ids(mut all))) if !all.is_empty() => {
                Work::Ids(all.swap_remove(0))
            }
            _ => return Ok(None),
        },
        _ => return Ok(None),
    };
    let block_size = prefix.block_size;
    let chains = prefix.chains.clone();
    let remember = move |blocks: Option<Arc<[u64]>>| {
        if let (Some(key), Some(blocks)) = (key, &blocks) {
            chains.insert(key, blocks.clone());
        }
        blocks
    };
    let long = match &work {
        Work::Ids(_) => false,
        Work::Text(text) => text.len() > INLINE_COUNT_BYTES,
        Work::Chat(prompt, _) => prompt.rendered.len() > INLINE_COUNT_BYTES,
    };
    if !long {
        return Ok(Some(ready(remember(hash(tokenizer, work, block_size)))));
    }
    // Long: on the blocking pool, if a counting slot is free now.
    let Ok(permit) = state.permits.clone().try_acquire_owned() else {
        return Ok(Some(ready(None)));
    };
    let tokenizer = tokenizer.clone();
    let task = tokio::task::spawn_blocking(move || {
        let _permit = permit;
        remember(hash(&tokenizer, work, block_size))
    });
    let job: ChainFuture = async move { task.await.ok().flatten() }.boxed().shared();
    Ok(Some(RequestBlocks(Arc::new(PromptBlocks::Pending(job)))))
}

fn ready(blocks: Option<Arc<[u64]>>) -> RequestBlocks {
    RequestBlocks(Arc::new(PromptBlocks::Ready(blocks)))
}

/// The chain of `work` (None when the tokenizer failed: routed by load).
fn hash(tokenizer: &ModelTokenizer, work: Work, block_size: usize) -> Option<Arc<[u64]>> {
    let ids = match work {
        Work::Ids(ids) => ids,
        Work::Text(text) => tokenizer.ids_fast(&text, true).ok()?,
        Work::Chat(prompt, salts) => {
            let mut ids = tokenizer.chat_prompt_ids(&prompt).ok()?;
            if let Some(salts) = salts {
                salt_image_ids(&mut ids, salts.0, &salts.1);
            }
            ids
        }
    };
    Some(Arc::from(chain(&ids, block_size)))
}

#[cfg(test)]
mod tests;
