//! Requests that only prefill: an embedding's input, a rerank pair, a score prompt.
//!
//! SGLang runs them as requests with `max_new_tokens = 0` (`EmbeddingReqInput`
//! `normalize_batch_and_arguments` in `io_struct.py`; the score mixin's `GenerateReqInput`):
//! the tokenizer manager's length checks, then the scheduler's (`validate_input_length`,
//! `max_req_input_len`), then a prefill in the running batch. The sim does the same
//! through its scheduler (`schedule.rs`): each input takes KV pages for its prompt, finds
//! what the prefix cache holds, is charged its prefill time and leaves its KV in the
//! pages, which is what an embedding or score is computed from — so a fault that makes a
//! prompt read stale pages (`--fault incident`, `stale-kv`, `silent-leak`) shows in the
//! vectors and scores too. The output faults (`abort-mid-stream`, `error-event`,
//! `abort-no-status`, `wrong-prompt-tokens`) change the results as they change a generation's.
//!
//! Only the unified role runs them (no bootstrap room, no transfer): the callers refuse
//! them on a prefill or decode worker.

use std::sync::Arc;
use std::time::Instant;

use hyper::Response;

use super::config::SimRole;
use super::engine::SimEngine;
use super::errors::{bad_request, error_in_success, prefill_failure};
use super::listen::{Body, ResetConnection};
use super::prefill::{self, CacheInsert};
use super::prefix_cache::Partition;
use super::request::{random_hex, Sample};
use super::schedule::{self, Finish};
use super::scheduler::Running;
use super::stream::Pace;

/// Token ids of `texts`, each encoded with special tokens (SGLang's tokenizer manager does
/// so for embedding and score prompts), on the blocking pool; the engine's 400 message when
/// the tokenizer fails.
pub(crate) async fn encode_texts(
    engine: &Arc<SimEngine>,
    texts: Vec<String>,
) -> Result<Vec<Vec<u32>>, String> {
    let tokenizer = Arc::clone(&engine.tokenizer);
    let encoded = super::run::off_thread(move || {
        texts
            .iter()
            .map(|t| tokenizer.encode(t, true))
            .collect::<Result<Vec<_>, _>>()
    })
    .await;
    match encoded {
        Some(Ok(ids)) => Ok(ids),
        Some(Err(e)) => Err(e.to_string()),
        None => Err("tokenizer task failed".to_owned()),
    }
}

/// What one prompt's prefill left.
#[derive(Clone, Debug)]
pub(crate) struct Prefilled {
    pub(crate) rid: String,
    pub(crate) prompt_tokens: usize,
    /// The KV its pages hold after the prefill: its own ids on a correct engine.
    pub(crate) kv: Vec<u32>,
    pub(crate) finish: Finish,
}

/// The prompts' prefills, in order, and their end-to-end seconds.
pub(crate) struct Batch {
    pub(crate) items: Vec<Prefilled>,
    pub(crate) e2e: f64,
}

impl Batch {
    /// The first failed prompt's finish, if any (the whole request fails with it).
    pub(crate) fn failure(&self) -> Option<&Finish> {
        self.items
            .iter()
            .map(|p| &p.finish)
            .find(|f| !matches!(f, Finish::Stop { .. } | Finish::Length { .. }))
    }

    /// Prompt tokens of all the prompts (`usage.prompt_tokens`).
    pub(crate) fn prompt_tokens(&self) -> usize {
        self.items.iter().map(|p| p.prompt_tokens).sum()
    }
}

/// Prefills `inputs` as one batch: each is admitted (holding its pages until all are done),
/// then the batch takes its prefill time, after which the prompts are cached and the pages
/// freed.
pub(crate) async fn prefill_only(engine: &Arc<SimEngine>, inputs: Vec<Vec<u32>>) -> Batch {
    let started = Instant::now();
    let mut items = Vec::with_capacity(inputs.len());
    let mut holds: Vec<Running> = Vec::new();
    let mut inserts: Vec<CacheInsert> = Vec::new();
    let mut uncached = 0;
    for input_ids in inputs {
        let sample = Sample {
            input_ids,
            rid: random_hex(),
            bootstrap: None,
            partition: Partition::default(),
        };
        let (mut result, hold) = schedule::run_sample(engine, 0, &sample).await;
        let kv = hold
            .as_ref()
            .map(|pages| pages.content())
            .unwrap_or_default();
        uncached += result.uncached_tokens();
        inserts.extend(result.cache_insert.take());
        holds.extend(hold);
        items.push(Prefilled {
            rid: result.rid,
            prompt_tokens: result.prompt_tokens,
            kv,
            finish: result.finish,
        });
    }
    let prefill = prefill::charge(engine, uncached);
    // The answer is ready when the prefill is: a generation's time to its first token.
    let wait = Pace::of(&engine.config).after_prefill(prefill).first;
    if !wait.is_zero() {
        tokio::time::sleep(wait).await;
    }
    inserts.into_iter().for_each(CacheInsert::commit);
    drop(holds);
    Batch {
        items,
        e2e: started.elapsed().as_secs_f64(),
    }
}

/// SGLang's `meta_info` of a prefill-only result (`_handle_batch_output` in
/// `tokenizer_manager.py`, for a `BatchEmbeddingOutput`): its id, a `length` finish of 0
/// new tokens, its prompt tokens, the weight version, no retractions, and its latency.
pub(crate) fn meta_info(item: &Prefilled, e2e: f64) -> serde_json::Value {
    serde_json::json!({
        "id": item.rid,
        "finish_reason": super::reply::finish_json(&item.finish),
        "prompt_tokens": item.prompt_tokens,
        "weight_version": "default",
        "num_retractions": 0,
        "e2e_latency": e2e,
    })
}

/// SplitMix64: the sim's deterministic stand-in for a model's numbers.
pub(crate) fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

/// A deterministic number in `[0, 1)` from `x`.
pub(crate) fn unit(x: u64) -> f64 {
    // 53 bits of the hash, as a double's mantissa holds them.
    (mix(x) >> 11) as f64 / (1u64 << 53) as f64
}

/// What every prefill-only route checks before its work: only the unified role serves it
/// (`what` names the route in the refusal), then the connection faults apply.
pub(crate) async fn unified_only(
    engine: &Arc<SimEngine>,
    what: &str,
) -> Result<Option<Response<Body>>, ResetConnection> {
    if engine.config.role != SimRole::Unified {
        return Ok(Some(bad_request(&format!(
            "The simulated engine serves {what} only in the unified role."
        ))));
    }
    super::run::connection_faults(engine).await?;
    Ok(None)
}

/// The scheduler's context check (`validate_input_length`) of prompts the route built.
pub(crate) fn over_context(engine: &SimEngine, inputs: &[Vec<u32>]) -> Option<Response<Body>> {
    let context = engine.config.context_length;
    inputs
        .iter()
        .map(Vec::len)
        .find(|&n| n >= context)
        .map(|n| {
            bad_request(&format!(
            "The input ({n} tokens) is longer than the model's context length ({context} tokens)."
        ))
        })
}

/// Prefill `inputs`; the `error-event` fault and a failed finish answer as the engine's
/// errors do.
pub(crate) async fn prefilled(
    engine: &Arc<SimEngine>,
    inputs: Vec<Vec<u32>>,
) -> Result<Batch, Response<Body>> {
    let batch = prefill_only(engine, inputs).await;
    if let Some(response) = error_in_success(engine) {
        return Err(response);
    }
    match batch.failure().and_then(prefill_failure) {
        Some(response) => Err(response),
        None => Ok(batch),
    }
}
