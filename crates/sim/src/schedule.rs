//! What happens to one prompt inside the engine: length checks, KV pages, roles and faults.
//!
//! Every path that takes KV pages goes through the scheduler (`scheduler.rs`), so it waits
//! its turn in the FIFO queue and counts in the running batch while it holds them.
//!
//! Output derivation is deterministic so that stale pages show: the generated ids are the
//! last `min(max_new_tokens, content_len)` ids of the request's KV content.

use super::bootstrap;
use super::config::{SimFault, SimRole};
use super::engine::SimEngine;
use super::kv_pool::{Allocation, PoolError};
use super::limits::{clip_max_new, input_limit, input_too_long};
use super::prefill::{self, CacheInsert};
use super::request::{self, Sample};
use super::rooms::{AbortInfo, RoomState};
use super::scheduler::{Demand, Running};
use super::stats::bump;

/// Token id the scheduler swaps in for an aborted prompt (SGLang uses `[0]`).
const PLACEHOLDER_TOKEN: u32 = 0;

/// How a sample ended.
#[derive(Clone, Debug)]
pub(crate) enum Finish {
    /// Generation reached the end of its content (the sim's "EOS").
    Stop { matched: Option<u32> },
    /// `max_new_tokens` reached.
    Length { length: usize },
    /// Aborted, as SGLang's `FINISH_ABORT`.
    Abort(AbortInfo),
    /// Refused by the tokenizer manager before scheduling (SGLang raises `ValueError`).
    Rejected { message: String, status: u16 },
    /// An error raised while streaming (`data: {"error": ...}`).
    Error { message: String },
}

impl Finish {
    /// An HTTP status the engine answers with for a non-streaming request, if not 200.
    pub(crate) fn error_status(&self) -> Option<(u16, &str)> {
        match self {
            Finish::Rejected { message, status } => Some((*status, message)),
            Finish::Abort(AbortInfo {
                message,
                status_code: Some(status),
                ..
            }) => Some((*status, message)),
            Finish::Error { message } => Some((500, message)),
            _ => None,
        }
    }

    fn is_failure(&self) -> bool {
        matches!(
            self,
            Finish::Abort(_) | Finish::Rejected { .. } | Finish::Error { .. }
        )
    }
}

/// The outcome of one sample.
#[derive(Clone, Debug)]
pub(crate) struct SampleResult {
    pub(crate) rid: String,
    pub(crate) prompt_tokens: usize,
    /// Prompt tokens found in the prefix cache (a decode: those its prefill found).
    pub(crate) cached_tokens: usize,
    /// Prompt tokens reused from a shared lower level without being reported
    /// (`SimFault::SharedLowerTierSilent`): not computed, yet not in `cached_tokens`.
    pub(crate) silent_cached_tokens: usize,
    pub(crate) output_ids: Vec<u32>,
    pub(crate) finish: Finish,
    /// A unified engine's prompt to cache once its prefill is over (taken by `server.rs`).
    pub(crate) cache_insert: Option<CacheInsert>,
}

impl SampleResult {
    /// Prompt tokens the prefill computes: those not found in the cache.
    pub(crate) fn uncached_tokens(&self) -> usize {
        self.prompt_tokens
            .saturating_sub(self.cached_tokens + self.silent_cached_tokens)
    }
}

fn abort(message: String, status_code: Option<u16>) -> Finish {
    Finish::Abort(AbortInfo {
        message,
        status_code,
        err_type: None,
    })
}

fn pool_abort(err: &PoolError) -> Finish {
    match err {
        PoolError::TooLarge { .. } => abort(err.to_string(), Some(400)),
        PoolError::Exhausted { .. } => abort(err.to_string(), Some(503)),
    }
}

/// Runs one sample; the returned running request (if any) must live as long as its
/// response: it holds the pages and the seat in the running batch.
pub(crate) async fn run_sample(
    engine: &SimEngine,
    max_new_tokens: usize,
    sample: &Sample,
) -> (SampleResult, Option<Running>) {
    let mut result = SampleResult {
        rid: sample.rid.clone(),
        prompt_tokens: sample.input_ids.len(),
        cached_tokens: 0,
        silent_cached_tokens: 0,
        output_ids: Vec::new(),
        finish: Finish::Length { length: 0 },
        cache_insert: None,
    };
    let hold = match context_check(engine, sample.input_ids.len(), max_new_tokens) {
        Some(rejected) => {
            result.finish = rejected;
            None
        }
        None => match engine.config.role {
            SimRole::Unified => unified(engine, max_new_tokens, sample, &mut result).await,
            SimRole::Prefill => {
                prefill(engine, sample, &mut result).await;
                None
            }
            SimRole::Decode => decode(engine, max_new_tokens, sample, &mut result).await,
        },
    };
    if engine.config.role != SimRole::Prefill && !result.finish.is_failure() {
        output_fault(engine.config.fault, &mut result);
    }
    if result.finish.is_failure() {
        bump(&engine.stats.aborted);
    }
    (result, hold)
}

/// The tokenizer manager's checks, run by every role before anything is scheduled.
fn context_check(engine: &SimEngine, input: usize, max_new: usize) -> Option<Finish> {
    let context = engine.config.context_length;
    if input >= context {
        return Some(Finish::Rejected {
            message: format!(
                "The input ({input} tokens) is longer than the model's context length ({context} tokens)."
            ),
            status: 400,
        });
    }
    // llama.cpp does not refuse a prompt plus `max_tokens` over its context: it stops there.
    if input + max_new > context && engine.config.fault != SimFault::LlamaCppLimits {
        return Some(Finish::Rejected {
            message: format!(
                "Requested token count exceeds the model's maximum context length of {context} tokens. \
                 You requested a total of {} tokens: {input} tokens from the input messages and \
                 {max_new} tokens for the completion. Please reduce the number of tokens in the \
                 input messages or the completion to fit within the limit.",
                input + max_new
            ),
            status: 400,
        });
    }
    None
}

/// What `sample` asks of the scheduler: `kv_tokens` reserved, its prompt's length.
fn demand(sample: &Sample, kv_tokens: usize, prompt_tokens: usize) -> Demand<'_> {
    Demand {
        rid: &sample.rid,
        kv_tokens,
        prompt_tokens,
    }
}

/// [`SimFault::StaleKv`]'s path for a request of `tokens` KV tokens that does not fit the
/// real pool: the pages that are free (capped), not rewritten. `None`: the normal path.
async fn stale_pages(
    engine: &SimEngine,
    sample: &Sample,
    tokens: usize,
) -> Option<Result<Running, PoolError>> {
    if engine.config.fault != SimFault::StaleKv || tokens <= engine.config.kv_tokens {
        return None;
    }
    let input = sample.input_ids.len();
    Some(
        engine
            .scheduler
            .admit_capped(demand(sample, tokens, input))
            .await,
    )
}

/// Derives the generated ids from KV content and writes them after `written` slots.
fn generate(
    engine: &SimEngine,
    pages: &Allocation,
    written: usize,
    max_new: usize,
    result: &mut SampleResult,
) {
    let content = pages.content();
    let n = max_new.min(content.len());
    result.output_ids = content
        .get(content.len() - n..)
        .unwrap_or_default()
        .to_vec();
    result.finish = if n == max_new {
        Finish::Length { length: max_new }
    } else {
        Finish::Stop {
            matched: engine.tokenizer.eos_token_id(),
        }
    };
    pages.write_at(written, &result.output_ids);
}

/// The incident's path for an over-long prompt: abort "marked", a one-token placeholder
/// written, and pages allocated for the original length (capped at what is free) kept with
/// whatever an earlier request left in them.
async fn placeholder_pages(engine: &SimEngine, sample: &Sample) -> Result<Running, PoolError> {
    let input = sample.input_ids.len();
    let pages = engine
        .scheduler
        .admit_capped(demand(sample, input, input))
        .await?;
    pages.write_placeholder(PLACEHOLDER_TOKEN);
    Ok(pages)
}

async fn unified(
    engine: &SimEngine,
    max_new: usize,
    sample: &Sample,
    result: &mut SampleResult,
) -> Option<Running> {
    let input = sample.input_ids.len();
    let limit = input_limit(engine);
    if input >= limit {
        if engine.config.fault != SimFault::Incident {
            result.finish = abort(input_too_long(input, limit), Some(400));
            return None;
        }
        let pages = match placeholder_pages(engine, sample).await {
            Ok(pages) => pages,
            Err(err) => {
                result.finish = pool_abort(&err);
                return None;
            }
        };
        result.prompt_tokens = 1;
        generate(engine, &pages, 1, clip_max_new(engine, 1, max_new), result);
        return Some(pages);
    }
    let max_new = clip_max_new(engine, input, max_new);
    if let Some(stale) = stale_pages(engine, sample, input + max_new).await {
        // The v3 shape: answered from what the pages hold, counted exactly, no marker.
        return match stale {
            Ok(pages) => {
                generate(engine, &pages, input, max_new, result);
                Some(pages)
            }
            Err(err) => {
                result.finish = pool_abort(&err);
                None
            }
        };
    }
    let admitted = engine
        .scheduler
        .admit(demand(sample, input + max_new, input))
        .await;
    let pages = match admitted {
        Ok(pages) => pages,
        Err(err) => {
            result.finish = pool_abort(&err);
            return None;
        }
    };
    // The quiet leak's bug: pages that already hold KV are taken to hold this prompt.
    if engine.config.fault != SimFault::SilentLeak || pages.content().is_empty() {
        pages.write(&sample.input_ids);
    }
    (result.cached_tokens, result.silent_cached_tokens) = prefill::lookup(engine, sample);
    result.cache_insert = CacheInsert::of(engine, sample);
    generate(engine, &pages, input, max_new, result);
    Some(pages)
}

async fn prefill(engine: &SimEngine, sample: &Sample, result: &mut SampleResult) {
    let Some(room) = sample.bootstrap.as_ref().map(|b| b.room) else {
        result.finish = Finish::Rejected {
            message: "bootstrap_room is required in disaggregation mode".into(),
            status: 400,
        };
        return;
    };
    let input = sample.input_ids.len();
    let limit = input_limit(engine);
    let publish = |state: RoomState, pages: Option<Allocation>| {
        match state {
            RoomState::Aborted(_) => bump(&engine.stats.rooms_aborted),
            _ => bump(&engine.stats.rooms_published),
        }
        engine
            .rooms
            .publish(room, state, pages, engine.shutdown.clone());
    };
    if engine.config.fault == SimFault::PrefillAbort {
        let info = AbortInfo {
            message: "Request aborted by the prefill engine (simulated fault).".into(),
            status_code: None,
            err_type: None,
        };
        publish(RoomState::Aborted(info.clone()), None);
        result.finish = Finish::Abort(info);
        return;
    }
    let pages = if input >= limit {
        if engine.config.fault != SimFault::Incident {
            // The fixed engine: refuse with the original error before any KV transfer.
            let info = AbortInfo {
                message: input_too_long(input, limit),
                status_code: Some(400),
                err_type: None,
            };
            publish(RoomState::Aborted(info.clone()), None);
            result.finish = Finish::Abort(info);
            return;
        }
        result.prompt_tokens = 1;
        placeholder_pages(engine, sample).await
    } else if let Some(stale) = stale_pages(engine, sample, input).await {
        // The v3 shape: stale pages published as this prompt's KV, with its exact count.
        stale
    } else {
        match engine.scheduler.admit(demand(sample, input, input)).await {
            Ok(pages) => {
                pages.write(&sample.input_ids);
                (result.cached_tokens, result.silent_cached_tokens) =
                    prefill::lookup(engine, sample);
                result.cache_insert = CacheInsert::of(engine, sample);
                Ok(pages)
            }
            Err(err) => Err(err),
        }
    };
    match pages {
        Ok(pages) => {
            // Computing the KV of the uncached tokens takes the prefill time, in the running
            // batch; the decode waiting on the room sees it as a later publish.
            let compute = prefill::charge(engine, result.uncached_tokens());
            if !compute.is_zero() {
                tokio::time::sleep(compute).await;
            }
            // The prefill is over: its prompt is cached (the fault paths have no insert).
            if let Some(insert) = result.cache_insert.take() {
                insert.commit();
            }
            let state = RoomState::Ready {
                tokens: std::sync::Arc::new(pages.content()),
                prompt_tokens: result.prompt_tokens,
                cached_tokens: result.cached_tokens,
            };
            // Done with the batch; the pages wait in the room for the decode's transfer.
            publish(state, Some(pages.leave_batch()));
        }
        Err(err) => {
            let finish = pool_abort(&err);
            if let Finish::Abort(info) = &finish {
                publish(RoomState::Aborted(info.clone()), None);
            }
            result.finish = finish;
        }
    }
}

async fn decode(
    engine: &SimEngine,
    max_new: usize,
    sample: &Sample,
    result: &mut SampleResult,
) -> Option<Running> {
    let fetched = match &sample.bootstrap {
        Some(request::Target {
            host: Some(host),
            port,
            room,
        }) => bootstrap::fetch(
            &engine.client,
            host,
            *port,
            *room,
            engine.config.bootstrap_timeout,
        )
        .await
        .ok(),
        _ => None,
    };
    let (tokens, prompt_tokens) = match fetched {
        Some(RoomState::Ready {
            tokens,
            prompt_tokens,
            cached_tokens,
        }) => {
            result.cached_tokens = cached_tokens;
            (tokens, prompt_tokens)
        }
        Some(RoomState::Aborted(info)) => {
            result.finish = Finish::Abort(info);
            return None;
        }
        Some(RoomState::Pending) | None => {
            result.finish = abort(
                "Failed to get kvcache from prefill instance".into(),
                Some(500),
            );
            return None;
        }
    };
    bump(&engine.stats.kv_received);
    result.prompt_tokens = prompt_tokens;
    let max_new = clip_max_new(engine, tokens.len(), max_new);
    let admitted = engine
        .scheduler
        .admit(demand(sample, tokens.len() + max_new, tokens.len()))
        .await;
    let pages = match admitted {
        Ok(pages) => pages,
        Err(err) => {
            result.finish = pool_abort(&err);
            return None;
        }
    };
    pages.write(&tokens);
    generate(engine, &pages, tokens.len(), max_new, result);
    Some(pages)
}

/// Faults that change what the answering engine (unified or decode) reports.
fn output_fault(fault: SimFault, result: &mut SampleResult) {
    match fault {
        SimFault::AbortMidStream => {
            result.output_ids.truncate(3);
            result.finish = abort(
                "Request aborted mid-stream by the engine (simulated fault).".into(),
                None,
            );
        }
        SimFault::ErrorEvent => {
            result.output_ids.truncate(2);
            result.finish = Finish::Error {
                message: "Internal error while generating (simulated fault).".into(),
            };
        }
        SimFault::AbortNoStatus => {
            result.output_ids.clear();
            result.finish = abort(
                "Request aborted (simulated fault, no status code).".into(),
                None,
            );
        }
        SimFault::WrongPromptTokens => {
            result.prompt_tokens = if result.prompt_tokens > 1 {
                result.prompt_tokens - 1
            } else {
                result.prompt_tokens + 1
            };
        }
        SimFault::None
        | SimFault::Incident
        | SimFault::Hang
        | SimFault::Reset
        | SimFault::PrefillAbort
        | SimFault::CutStream
        | SimFault::StallStream
        | SimFault::SilentLeak
        | SimFault::GarbageEvent
        | SimFault::StaleKv
        | SimFault::LlamaCppLimits
        | SimFault::SharedLowerTier
        | SimFault::SharedLowerTierSilent => {}
    }
}
