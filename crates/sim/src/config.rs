//! Configuration of one simulated engine: its role, pool, limits and injected fault.

use std::num::NonZeroUsize;
use std::time::Duration;

use super::vision::VisionConfig;

/// SGLang's default `--disaggregation-bootstrap-port`, reported when no bootstrap listener runs.
pub const DEFAULT_BOOTSTRAP_PORT: u16 = 8998;

/// Settings of one simulated engine (the SGLang server arguments that matter here).
#[derive(Clone, Debug)]
pub struct SimConfig {
    /// Unified, prefill or decode worker.
    pub role: SimRole,
    /// Served model name (`/v1/models` id, `served_model_name`).
    pub model: String,
    /// KV pool size in tokens (`max_total_num_tokens`).
    pub kv_tokens: usize,
    /// The model's context window (`context_length`).
    pub context_length: usize,
    /// Tokens per KV page.
    pub page_size: usize,
    /// Injected misbehaviour; [`SimFault::None`] is the fixed engine.
    pub fault: SimFault,
    /// Sleep between two generated tokens, so tests can hold a stream open.
    pub token_latency: Duration,
    /// Sleep before the first generated token event of a stream (time to first token),
    /// instead of one `token_latency`. Zero (the default): one `token_latency`, as before.
    pub first_token_latency: Duration,
    /// Prefill time per prompt token, spent before the first token (after admission, with
    /// the pages held), so a longer prompt has a longer time to first token. It adds to
    /// `first_token_latency` (or its one `token_latency`). A prefill worker spends it before
    /// publishing the KV; a decode, which receives the KV, does not. Zero (the default): no
    /// prefill time, as before.
    pub prefill_token_latency: Duration,
    /// SGLang's `--max-running-requests`: the most requests in the running batch at once;
    /// more wait in the queue. `None` (the default): only the KV pool bounds the batch.
    pub max_running_requests: Option<NonZeroUsize>,
    /// How long a decode waits for its room on the prefill's bootstrap server; also bounds
    /// how long any request waits in the scheduler's queue for admission.
    pub bootstrap_timeout: Duration,
    /// Reported engine version.
    pub version: String,
    /// Serve `/get_server_info` and `/server_info`. Off: like engines without them (older
    /// releases, vLLM), so a gateway must trust its configured capacity — the way tests
    /// reproduce the incident's configuration mismatch.
    pub server_info: bool,
    /// The KV pool `/get_server_info` reports (`max_total_num_tokens`, and the
    /// `max_req_input_len` derived from it) when it differs from the real `kv_tokens`: an
    /// engine that overstates its pool. `None`: the real size.
    pub reported_kv_tokens: Option<usize>,
    /// SGLang's `--disable-radix-cache`: no prefix cache, every prompt token is computed
    /// and `cached_tokens` is always 0. Off (the default, as in SGLang): prompts reuse the
    /// full pages of earlier prompts of the same cache partition (`prefix_cache.rs`).
    pub disable_radix_cache: bool,
    /// Bound of the prefix cache in tokens, below the KV pool's (rounded down to full
    /// pages). `None` (the default): the pool's size, `kv_tokens`.
    pub prefix_cache_tokens: Option<usize>,
    /// SGLang's `--enable-cache-report`: OpenAI `usage` carries `prompt_tokens_details:
    /// {"cached_tokens": N}`. Off (the default, as in SGLang): `prompt_tokens_details` is
    /// null. `/generate`'s `meta_info.cached_tokens` is reported either way.
    pub enable_cache_report: bool,
    /// SGLang's `--reasoning-parser`: a thinking answer's thought goes to
    /// `reasoning_content` (with `separate_reasoning`, true by default) instead of staying
    /// in `content` as `<think>…</think>`. `None` (the default, as in SGLang): no parser.
    pub reasoning_parser: Option<ReasoningParser>,
    /// Which engine's rules prepare a chat before its template renders it.
    pub chat_rules: kvgate_tokenize::ChatRules,
    /// The tokenizer's `model_max_length` (`tokenizer_config.json`), which `/tokenize`
    /// reports as `max_model_len` as SGLang does. `None` (the default): the context length,
    /// SGLang's fallback for a tokenizer without one.
    pub model_max_length: Option<usize>,
    /// SGLang's `--enable-response-store`: `/v1/responses` keeps responses (`store`) for
    /// `previous_response_id`, `GET /v1/responses/{id}`, `background` and `cancel`, in this
    /// engine process only. Off (the default, as in SGLang): those are refused; a prefill
    /// or decode worker never keeps them (SGLang has no store in PD mode).
    pub enable_response_store: bool,
    /// A vision model (`--vision`): chats may carry `image_url` parts, each counted as the
    /// model's image processor counts it (`vision.rs`). `None` (the default): a text-only
    /// model, which refuses them as SGLang does.
    pub vision: Option<VisionConfig>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            role: SimRole::Unified,
            model: "sim-model".to_string(),
            kv_tokens: 65_536,
            context_length: 32_768,
            page_size: 16,
            fault: SimFault::None,
            token_latency: Duration::ZERO,
            first_token_latency: Duration::ZERO,
            prefill_token_latency: Duration::ZERO,
            max_running_requests: None,
            bootstrap_timeout: Duration::from_secs(5),
            version: "0.5.22-sim".to_string(),
            server_info: true,
            reported_kv_tokens: None,
            disable_radix_cache: false,
            prefix_cache_tokens: None,
            enable_cache_report: false,
            reasoning_parser: None,
            chat_rules: kvgate_tokenize::ChatRules::Sglang,
            model_max_length: None,
            enable_response_store: false,
            vision: None,
        }
    }
}

impl SimConfig {
    /// SGLang's `max_req_len = min(context_len - 1, max_total_num_tokens - 1)`.
    pub fn max_req_len(&self) -> usize {
        self.context_length
            .saturating_sub(1)
            .min(self.kv_tokens.saturating_sub(1))
    }

    /// SGLang's `max_req_input_len = max_req_len - 5`: longer inputs are aborted by the scheduler.
    pub fn max_req_input_len(&self) -> usize {
        self.max_req_len().saturating_sub(5)
    }

    /// Prefill time of a prompt of `prompt_tokens` tokens.
    pub fn prefill_time(&self, prompt_tokens: usize) -> Duration {
        let tokens = u32::try_from(prompt_tokens).unwrap_or(u32::MAX);
        self.prefill_token_latency.saturating_mul(tokens)
    }

    /// The prefix cache's bound in tokens, `None` with the radix cache disabled: the KV
    /// pool, or `prefix_cache_tokens` where that is smaller.
    pub fn prefix_cache_capacity(&self) -> Option<usize> {
        if self.disable_radix_cache {
            return None;
        }
        Some(
            self.prefix_cache_tokens
                .map_or(self.kv_tokens, |t| t.min(self.kv_tokens)),
        )
    }

    /// The KV pool the engine reports: `reported_kv_tokens`, or the real `kv_tokens`.
    pub fn reported_kv_tokens(&self) -> usize {
        self.reported_kv_tokens.unwrap_or(self.kv_tokens)
    }

    /// The `max_req_input_len` the engine reports, derived from the pool it reports.
    pub fn reported_max_req_input_len(&self) -> usize {
        self.context_length
            .saturating_sub(1)
            .min(self.reported_kv_tokens().saturating_sub(1))
            .saturating_sub(5)
    }
}

/// A reasoning parser of SGLang's `--reasoning-parser`.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReasoningParser {
    /// Qwen3's `<think>…</think>`, thinking switched by `enable_thinking`.
    Qwen3,
}

impl ReasoningParser {
    /// Its name, as `/get_server_info` reports it.
    pub fn name(self) -> &'static str {
        match self {
            ReasoningParser::Qwen3 => "qwen3",
        }
    }
}

/// Which part of a (possibly disaggregated) deployment the engine plays.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimRole {
    /// Prefill and decode in one engine (`disaggregation_mode = "null"`).
    Unified,
    /// Prefill worker: computes KV and hands it out on its bootstrap listener.
    Prefill,
    /// Decode worker: fetches KV from the prefill named in the request and generates.
    Decode,
}

impl SimRole {
    /// Value of `disaggregation_mode` in `/get_server_info`.
    pub fn disaggregation_mode(self) -> &'static str {
        match self {
            SimRole::Unified => "null",
            SimRole::Prefill => "prefill",
            SimRole::Decode => "decode",
        }
    }
}

/// A misbehaviour to inject; each reproduces something real engines have done.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum SimFault {
    /// The fixed engine (SGLang ≥ 0.5.22): over-long prompts are refused before any KV transfer.
    None,
    /// The incident: an over-long prompt is aborted into a one-token placeholder, yet its
    /// (stale) pages are published as ready and decode answers 200 from them.
    Incident,
    /// Stream a few tokens, then end with `finish_reason.type == "abort"`, all on HTTP 200.
    AbortMidStream,
    /// HTTP 200 stream carrying `data: {"error": ...}` before `[DONE]`; on the prefill-only
    /// routes (embeddings, rerank, score), an error object answered with HTTP 200.
    ErrorEvent,
    /// HTTP 200 with `finish_reason: {"type": "abort", "status_code": null}`.
    AbortNoStatus,
    /// Accept generation requests and never answer.
    Hang,
    /// Close the connection of a generation request without any response.
    Reset,
    /// Report a `prompt_tokens` that differs from the real input length.
    WrongPromptTokens,
    /// Prefill answers HTTP 200 with an abort and publishes its room as aborted.
    PrefillAbort,
    /// Streams stop after a few token events: no final `finish_reason`, no `[DONE]`
    /// (a connection cut mid-stream, as the client sees it).
    CutStream,
    /// Streams send two token events, then go silent with the connection open (a stuck
    /// engine): only a deadline ends them.
    StallStream,
    /// The incident's quiet form (a prefix-cache bug): reused KV pages are taken to hold the
    /// new prompt already and are not rewritten, so the answer is read from what an earlier
    /// request left there, with the right `prompt_tokens`, a normal finish and no marker.
    /// Only the leak detector can tell.
    SilentLeak,
    /// The first stream event is not JSON (an HTML error page from a broken proxy in front
    /// of the engine), then the normal stream.
    GarbageEvent,
    /// The incident's "v3 shape": the engine admits inputs by its context length instead
    /// of its KV pool, and a prompt that does not fit its real pool gets the pages that are
    /// free (capped at the pool), not rewritten, and is answered from what they hold — with
    /// the exact `prompt_tokens`, a normal finish and no marker (unified and prefill roles;
    /// a decode reads the stale pages its prefill published). Combined with
    /// `reported_kv_tokens` above the real pool, only a leak check can tell.
    StaleKv,
    /// Not a fault: limits judged as llama.cpp's server judges them (no SGLang margin): a
    /// prompt of `min(context_length, kv_tokens)` tokens or more is refused, a shorter one
    /// generates until that capacity at most.
    LlamaCppLimits,
    /// A second cache level below the prefix cache whose keys are the tokens alone, as
    /// SGLang's HiCache storage backends and LMCache are (issue 40): a prompt another cache
    /// salt computed is found there, reported in `cached_tokens` and not computed again (so
    /// its time to first token shows it too). `/get_server_info` reports it as SGLang's
    /// server arguments would (`enable_hierarchical_cache`, `hicache_storage_backend =
    /// "file"`).
    SharedLowerTier,
    /// The same shared level, restored silently as llama.cpp's host-RAM prompt cache has
    /// been seen to: the found tokens are not computed again but reported as 0 cached, and
    /// `/get_server_info` says nothing of the tier. Only the time to first token shows it.
    SharedLowerTierSilent,
}

impl SimFault {
    /// Whether it keeps a shared, token-keyed cache level below the prefix cache.
    pub fn shared_lower_tier(self) -> bool {
        matches!(
            self,
            SimFault::SharedLowerTier | SimFault::SharedLowerTierSilent
        )
    }
}
