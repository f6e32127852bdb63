//! The admission rule for one pool (I2), over every worker the request could land on.
//!
//! (For `engine = "openai"` pools the input limit is `min(context, kv)`, see
//! [`openai_input_limit`].) SGLang refuses an input of `max_req_input_len` tokens or more, with
//! `max_req_input_len = min(context_length - 1, pool - 1) - 5`; a prompt of exactly that
//! length reaches the engine's broken abort path, so it is refused here. For a pool:
//! - prompt < the smallest input limit of its prefill-side workers, and of its decode-side
//!   workers (a decode worker applies its own `max_req_input_len` to the same prompt),
//! - prompt + max new tokens ≤ the smallest KV pool of its decode-side workers,
//! - prompt < the model's context window and prompt + max new tokens ≤ the window.
//!
//! "Smallest" is over every eligible worker of the pool, so the verdict never depends on
//! which worker is picked; a worker of unknown capacity is not eligible (I3) and counts for
//! nothing.

use std::fmt;
use std::sync::Arc;

use crate::config::EngineKind;
use crate::fleet::{CountRules, Pool, PoolWorkers, Worker};

/// SGLang's input limit for a worker with context length `context` and KV pool `pool`.
pub fn sglang_max_req_input_len(context: u64, pool: u64) -> u64 {
    context
        .saturating_sub(1)
        .min(pool.saturating_sub(1))
        .saturating_sub(5)
}

/// OpenAI-style engines' input limit for a worker with context length `context` and KV
/// capacity `pool`: the smallest prompt they refuse. llama.cpp's server refuses a prompt of
/// `n_ctx` tokens or more ("the request exceeds the available context size") and stops a
/// generation at `n_ctx` with `finish_reason: "length"`; vLLM refuses a prompt of
/// `max_model_len` or more, and an explicit `max_tokens` that would pass it. Neither keeps
/// SGLang's margin of 5.
pub fn openai_input_limit(context: u64, pool: u64) -> u64 {
    context.min(pool)
}

/// The input limit of one worker (the smallest prompt its engine refuses), by the engine
/// kind's rule: for SGLang derived from its (enforced) pool and the window; for OpenAI-style
/// engines from its discovered context length (else its configured KV capacity, which is
/// llama.cpp's `-c`) and its pool; the engine's own reported limit when smaller.
pub fn worker_input_limit(w: &Worker, engine: EngineKind, window: u64) -> Option<u64> {
    let kv = w.kv_tokens()?;
    let derived = match engine {
        EngineKind::Sglang => {
            let context = w
                .discovered_context_length()
                .map_or(window, |c| c.min(window));
            sglang_max_req_input_len(context, kv)
        }
        EngineKind::Openai => openai_input_limit(w.discovered_context_length().unwrap_or(kv), kv),
    };
    Some(
        w.discovered_max_req_input_len()
            .map_or(derived, |d| d.min(derived)),
    )
}

/// A bound and the worker that sets it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerBound {
    pub tokens: u64,
    pub worker: String,
}

/// What one pool admits right now.
#[derive(Debug, Clone)]
pub struct PoolBudget {
    pub pool: Arc<str>,
    /// How the pool's engines prepare a chat and size images: the rules its prompts are
    /// counted by.
    pub rules: CountRules,
    pub context_window: u64,
    /// Smallest `max_req_input_len` of the eligible prefill-side workers.
    pub prefill_input_limit: Option<WorkerBound>,
    /// Smallest KV pool of the eligible prefill-side workers.
    pub prefill_pool: Option<WorkerBound>,
    /// Smallest KV pool of the eligible decode-side workers.
    pub decode_pool: Option<WorkerBound>,
    /// Smallest `max_req_input_len` of the eligible decode-side workers (for unified
    /// pools, the same workers as the prefill side).
    pub decode_input_limit: Option<WorkerBound>,
}

/// Which bound a refused prompt hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Bound {
    /// The model's context window.
    ContextWindow { window: u64 },
    /// A prefill-side worker's input limit.
    PrefillInput {
        pool: Arc<str>,
        worker: String,
        max_req_input_len: u64,
    },
    /// A decode worker's own input limit.
    DecodeInput {
        pool: Arc<str>,
        worker: String,
        max_req_input_len: u64,
    },
    /// A decode-side worker's KV pool.
    DecodePool {
        pool: Arc<str>,
        worker: String,
        kv_tokens: u64,
    },
    /// The tenant's prompt cap.
    TenantCap { tenant: Arc<str>, cap: u64 },
}

/// What the client reads: the bound and its pool, never a worker's address (that is in
/// the struct, for logs and audit lines).
impl fmt::Display for Bound {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Bound::ContextWindow { window } => write!(f, "the model's context window of {window} tokens"),
            Bound::PrefillInput { pool, max_req_input_len, .. } => write!(
                f,
                "the input limit of the prefill workers of pool `{pool}` (inputs of {max_req_input_len} tokens or more are refused)"
            ),
            Bound::DecodeInput { pool, max_req_input_len, .. } => write!(
                f,
                "the input limit of the decode workers of pool `{pool}` (inputs of {max_req_input_len} tokens or more are refused)"
            ),
            Bound::DecodePool { pool, kv_tokens, .. } => write!(
                f,
                "the KV pool of the decode workers of pool `{pool}` ({kv_tokens} tokens for prompt + max new tokens)"
            ),
            Bound::TenantCap { tenant, cap } => write!(f, "tenant `{tenant}`'s cap of {cap} prompt tokens"),
        }
    }
}

/// A failed check: which quantity, its value, the largest allowed value, the bound.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    /// `true` when the checked quantity is prompt + max new tokens, else the prompt alone.
    pub includes_new_tokens: bool,
    pub counted: u64,
    pub limit: u64,
    pub bound: Bound,
}

impl PoolBudget {
    /// The budget of `pool` for a model with context window `window`.
    pub fn of(pool: &Pool, window: u64) -> Self {
        let (prefill_side, decode_side): (&[Arc<Worker>], &[Arc<Worker>]) = match &pool.workers {
            PoolWorkers::Unified(ws) => (ws, ws),
            PoolWorkers::Disaggregated { prefill, decode } => (prefill, decode),
        };
        // Every worker whose capacity is known, whatever its health, drain or version:
        // routing may pick any of them once it is eligible again (an ejection ends, a
        // recovered worker comes back) between this admission and the pick, so the bound
        // must hold for all of them (I2). Unknown capacity never serves (I3).
        let smallest = |ws: &[Arc<Worker>], value: &dyn Fn(&Worker) -> Option<u64>| {
            ws.iter()
                .filter_map(|w| {
                    value(w).map(|tokens| WorkerBound {
                        tokens,
                        worker: w.authority.clone(),
                    })
                })
                .min_by_key(|b| b.tokens)
        };
        Self {
            pool: pool.name.clone(),
            rules: pool.count_rules(),
            context_window: window,
            prefill_input_limit: smallest(prefill_side, &|w| {
                worker_input_limit(w, pool.engine, window)
            }),
            prefill_pool: smallest(prefill_side, &|w| w.kv_tokens()),
            decode_pool: smallest(decode_side, &|w| w.kv_tokens()),
            decode_input_limit: smallest(decode_side, &|w| {
                worker_input_limit(w, pool.engine, window)
            }),
        }
    }

    /// The largest prompt this pool admits (with no new tokens), if it can admit any.
    pub fn max_prompt_tokens(&self) -> Option<u64> {
        let input = self.prefill_input_limit.as_ref()?.tokens.saturating_sub(1);
        let decode_input = self
            .decode_input_limit
            .as_ref()
            .map_or(u64::MAX, |b| b.tokens.saturating_sub(1));
        let decode = self.decode_pool.as_ref()?.tokens;
        Some(
            input
                .min(decode_input)
                .min(decode)
                .min(self.context_window.saturating_sub(1)),
        )
    }

    /// New tokens left for a prompt of `prompt` tokens: what the window and the decode KV
    /// pool hold beyond it (a chat without `max_tokens` is clamped to this, as SGLang does).
    pub fn room_for_new_tokens(&self, prompt: u64) -> u64 {
        let decode = self.decode_pool.as_ref().map_or(u64::MAX, |b| b.tokens);
        self.context_window.min(decode).saturating_sub(prompt)
    }

    /// Check one prompt of `prompt` tokens that may generate `max_new` tokens.
    pub fn check(&self, prompt: u64, max_new: u64) -> Result<(), Violation> {
        let total = prompt.saturating_add(max_new);
        let window = self.context_window;
        if prompt >= window {
            return Err(Violation {
                includes_new_tokens: false,
                counted: prompt,
                limit: window.saturating_sub(1),
                bound: Bound::ContextWindow { window },
            });
        }
        let (Some(input), Some(decode)) = (&self.prefill_input_limit, &self.decode_pool) else {
            // No eligible worker: routing answers 503 with the reasons.
            return Ok(());
        };
        if prompt >= input.tokens {
            return Err(Violation {
                includes_new_tokens: false,
                counted: prompt,
                limit: input.tokens.saturating_sub(1),
                bound: Bound::PrefillInput {
                    pool: self.pool.clone(),
                    worker: input.worker.clone(),
                    max_req_input_len: input.tokens,
                },
            });
        }
        if let Some(limit) = self
            .decode_input_limit
            .as_ref()
            .filter(|l| prompt >= l.tokens)
        {
            return Err(Violation {
                includes_new_tokens: false,
                counted: prompt,
                limit: limit.tokens.saturating_sub(1),
                bound: Bound::DecodeInput {
                    pool: self.pool.clone(),
                    worker: limit.worker.clone(),
                    max_req_input_len: limit.tokens,
                },
            });
        }
        if total > decode.tokens {
            return Err(Violation {
                includes_new_tokens: true,
                counted: total,
                limit: decode.tokens,
                bound: Bound::DecodePool {
                    pool: self.pool.clone(),
                    worker: decode.worker.clone(),
                    kv_tokens: decode.tokens,
                },
            });
        }
        if total > window {
            return Err(Violation {
                includes_new_tokens: true,
                counted: total,
                limit: window,
                bound: Bound::ContextWindow { window },
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn budget(window: u64, input: u64, decode: u64) -> PoolBudget {
        PoolBudget {
            rules: CountRules::default(),
            pool: Arc::from("p"),
            context_window: window,
            prefill_input_limit: Some(WorkerBound {
                tokens: input,
                worker: "prefill:1".into(),
            }),
            prefill_pool: None,
            decode_pool: Some(WorkerBound {
                tokens: decode,
                worker: "decode:1".into(),
            }),
            decode_input_limit: None,
        }
    }

    #[test]
    fn the_decode_workers_input_limit_bounds_the_prompt_too() {
        // Prefill 8,192 and decode 4,096: a 4,090-token prompt must not reach either leg.
        let mut b = budget(100_000, sglang_max_req_input_len(100_000, 8192), 100_000);
        b.decode_input_limit = Some(WorkerBound {
            tokens: sglang_max_req_input_len(100_000, 4096),
            worker: "decode:1".into(),
        });
        assert_eq!(b.max_prompt_tokens(), Some(4089));
        let v = b.check(4090, 1).unwrap_err();
        assert!(matches!(
            v.bound,
            Bound::DecodeInput {
                max_req_input_len: 4090,
                ..
            }
        ));
        assert!(b.check(4089, 1).is_ok());
        assert!(
            !v.bound.to_string().contains("decode:1"),
            "no address for clients"
        );
    }

    #[test]
    fn room_for_new_tokens_is_what_window_and_decode_pool_leave() {
        let b = budget(10_000, 9_000, 5_000);
        assert_eq!(b.room_for_new_tokens(1_000), 4_000);
        let b = budget(3_000, 9_000, 5_000);
        assert_eq!(b.room_for_new_tokens(1_000), 2_000);
    }

    #[test]
    fn sglang_input_limit_matches_the_engine_formula() {
        // The incident: 1,048,576-token window, 681,280-token prefill pool.
        assert_eq!(sglang_max_req_input_len(1_048_576, 681_280), 681_274);
        assert_eq!(sglang_max_req_input_len(4096, 100_000), 4090);
        assert_eq!(sglang_max_req_input_len(3, 3), 0);
    }

    #[test]
    fn a_prompt_of_exactly_max_req_input_len_is_refused() {
        let b = budget(1_048_576, 681_274, 1_048_576);
        assert_eq!(b.max_prompt_tokens(), Some(681_273));
        assert!(b.check(681_272, 0).is_ok());
        assert!(b.check(681_273, 0).is_ok());
        let v = b.check(681_274, 0).unwrap_err();
        assert_eq!((v.counted, v.limit), (681_274, 681_273));
        assert!(matches!(
            v.bound,
            Bound::PrefillInput {
                max_req_input_len: 681_274,
                ..
            }
        ));
    }

    #[test]
    fn decode_pool_bounds_prompt_plus_new_tokens() {
        let b = budget(10_000, 9_000, 5_000);
        assert!(b.check(4_000, 1_000).is_ok());
        let v = b.check(4_000, 1_001).unwrap_err();
        assert!(v.includes_new_tokens);
        assert_eq!((v.counted, v.limit), (5_001, 5_000));
        assert!(matches!(v.bound, Bound::DecodePool { .. }));
    }

    #[test]
    fn context_window_bounds_prompt_and_total() {
        let b = budget(1_000, 100_000, 100_000);
        assert!(matches!(
            b.check(1_000, 0).unwrap_err().bound,
            Bound::ContextWindow { .. }
        ));
        assert!(b.check(999, 1).is_ok());
        assert!(matches!(
            b.check(999, 2).unwrap_err().bound,
            Bound::ContextWindow { .. }
        ));
    }
}
