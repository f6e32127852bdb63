//! The scheduler's length limits, as the engine (or the fault it plays) judges them:
//! SGLang's `max_req_input_len` and `max_req_len`, the context length alone under
//! [`SimFault::StaleKv`], llama.cpp's `n_ctx` under [`SimFault::LlamaCppLimits`].

use super::config::SimFault;
use super::engine::SimEngine;

/// The scheduler's message for an input at or over its limit.
pub(crate) fn input_too_long(len: usize, max: usize) -> String {
    format!(
        "Input length ({len} tokens) exceeds the maximum allowed length ({max} tokens). \
         Use a shorter input or enable --allow-auto-truncate."
    )
}

/// The scheduler clips `max_new_tokens` so the sequence fits `max_req_len` (under
/// [`SimFault::StaleKv`], the context length's: the pool is not looked at).
pub(crate) fn clip_max_new(engine: &SimEngine, input: usize, max_new: usize) -> usize {
    if engine.config.fault == SimFault::LlamaCppLimits {
        return max_new.min(llama_cpp_n_ctx(engine).saturating_sub(input));
    }
    let max_req_len = if engine.config.fault == SimFault::StaleKv {
        engine.config.context_length.saturating_sub(1)
    } else {
        engine.config.max_req_len()
    };
    max_new.min(max_req_len.saturating_sub(input + 1))
}

/// The scheduler's input limit: `max_req_input_len`, or under [`SimFault::StaleKv`] the
/// one its context length alone gives (the v3 shape admits by context, not by pool).
pub(crate) fn input_limit(engine: &SimEngine) -> usize {
    if engine.config.fault == SimFault::LlamaCppLimits {
        return llama_cpp_n_ctx(engine);
    }
    if engine.config.fault == SimFault::StaleKv {
        engine.config.context_length.saturating_sub(6)
    } else {
        engine.config.max_req_input_len()
    }
}

/// The capacity under [`SimFault::LlamaCppLimits`]: llama.cpp's `n_ctx`.
fn llama_cpp_n_ctx(engine: &SimEngine) -> usize {
    engine.config.context_length.min(engine.config.kv_tokens)
}
