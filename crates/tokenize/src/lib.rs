//! A model's real tokenizer plus its HF chat template: the source of exact token counts.
//!
//! [`ModelTokenizer`] loads `tokenizer.json` (HF `tokenizers`, pure Rust build) and, when
//! present, `tokenizer_config.json` beside it for `chat_template`, `bos_token` and
//! `eos_token`. The gateway uses it to count prompts before admission; the simulated engine
//! uses it to produce the same counts a real SGLang engine reports.
//!
//! # Counting rules
//!
//! These follow SGLang, so the gateway's count equals the engine's `prompt_tokens`:
//! - **Plain text prompts** (`/generate` `text`, `/v1/completions` `prompt` strings) are
//!   encoded with `add_special_tokens = true`, SGLang's default: BOS is added where the
//!   model's tokenizer adds it (DeepSeek-V3 does, Qwen3 does not). Like HF's
//!   `LlamaTokenizerFast`, `add_bos_token` / `add_eos_token` of `tokenizer_config.json` are
//!   honoured even when `tokenizer.json`'s own post-processor does not add them.
//! - **Templated chat** (`/v1/chat/completions`) is first rendered with
//!   [`ModelTokenizer::apply_chat_template`] (with `add_generation_prompt = true`) and the
//!   result is encoded with `add_special_tokens = false`, because the template already holds
//!   BOS where the model wants one.
//! - **Token-id prompts** (`input_ids`, token arrays) count as their length.
//!
//! # Fast counting
//!
//! Plain encoding is CPU work (≈ 2 MB/s on one core). [`ModelTokenizer::ids_fast`] gives
//! `encode`'s ids through the same steps as the count-only path. [`ModelTokenizer::count_fast`],
//! [`ModelTokenizer::count_up_to`] and [`ModelTokenizer::count_rendered_chat`] give the
//! same numbers as [`ModelTokenizer::count`] through a count-only path (see `fast`'s docs
//! for its design and exactness argument) that is an order of magnitude faster, stops
//! early past a limit, and reuses the counts of chat segments seen before. Configurations
//! it does not model fall back to the plain encode ([`ModelTokenizer::fast_count_unsupported`]
//! says why). Callers on an async runtime should still run long prompts on a blocking thread.

mod chat_cache;
mod chat_prompt;
mod error;
mod fast;
pub mod prepare;
mod pyjson;
mod strftime;
mod template;
pub mod vision;

use std::path::Path;

pub use chat_cache::ChatKey;
pub use error::TokenizeError;
pub use fast::CountConfig;
pub use prepare::{
    ChatPrompt, ChatRequest, ChatRules, MediaKind, MediaPart, ModelInput, MultimodalPrompt,
    TokenRepeat,
};
use template::ChatTemplate;

/// The result of [`ModelTokenizer::count_up_to`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Count {
    /// The exact token count (it may exceed the limit when counting finished anyway).
    Exact(usize),
    /// Counting stopped early: the text has at least `at_least` tokens, and `at_least > limit`.
    Over {
        /// A lower bound of the exact count, greater than the limit.
        at_least: usize,
    },
}

impl Count {
    /// The exact count, or the lower bound when counting stopped early.
    pub fn at_least(self) -> usize {
        match self {
            Count::Exact(n) | Count::Over { at_least: n } => n,
        }
    }
}

/// A model's tokenizer and chat template, loaded once and shared (`Arc`) between requests.
pub struct ModelTokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    eos_token_id: Option<u32>,
    bos_token_id: Option<u32>,
    /// BOS to prepend with special tokens, when the config asks for it and `tokenizer.json`
    /// does not add it itself (HF rebuilds the post-processor in that case).
    extra_bos: Option<u32>,
    /// EOS to append with special tokens, likewise.
    extra_eos: Option<u32>,
    /// Tokens the `tokenizer.json` post-processor adds with special tokens.
    post_processor_tokens: usize,
    /// The ids the post-processor puts before and after a text's own (None: it does
    /// something else, and the ids path falls back to the plain encode).
    post_processor_ids: Option<Around>,
    /// The count-only path, when the configuration is one it models exactly.
    fast: Result<fast::FastCounter, String>,
    /// Counts of whole conversations seen before.
    chat_counts: chat_cache::ChatCountCache,
    /// [`ModelTokenizer::inline_system_support`], probed on first use.
    inline_system: std::sync::OnceLock<bool>,
}

impl std::fmt::Debug for ModelTokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ModelTokenizer")
            .field("vocab_size", &self.vocab_size())
            .field("has_chat_template", &self.has_chat_template())
            .field("eos_token_id", &self.eos_token_id)
            .finish()
    }
}

impl ModelTokenizer {
    /// Loads a model directory as HF ships it: `dir/tokenizer.json`, plus
    /// `dir/tokenizer_config.json` (chat template, special tokens) when it exists.
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizeError> {
        let config = dir.join("tokenizer_config.json");
        Self::from_files(
            &dir.join("tokenizer.json"),
            config.exists().then_some(config.as_path()),
        )
    }

    /// Loads `tokenizer.json` and, if given, the chat template and special tokens of
    /// `tokenizer_config.json`.
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
    ) -> Result<Self, TokenizeError> {
        Self::from_files_with(
            tokenizer_json,
            tokenizer_config_json,
            CountConfig::default(),
        )
    }

    /// As [`ModelTokenizer::from_files`], with the fast counting path tuned by `count`.
    pub fn from_files_with(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
        count: CountConfig,
    ) -> Result<Self, TokenizeError> {
        let load_err = |reason: String| TokenizeError::Load {
            path: tokenizer_json.to_path_buf(),
            reason,
        };
        let json = std::fs::read_to_string(tokenizer_json).map_err(|e| load_err(e.to_string()))?;
        let inner: tokenizers::Tokenizer = json.parse().map_err(|e| load_err(format!("{e}")))?;
        let post_processor_tokens = inner
            .get_post_processor()
            .map_or(0, |p| tokenizers::PostProcessor::added_tokens(p, false));
        let fast = fast::FastCounter::new(&json, count);
        let config = match tokenizer_config_json {
            Some(path) => load_config(path)?,
            None => TokenizerConfig::default(),
        };
        let token_id = |t: &Option<String>| t.as_deref().and_then(|t| inner.token_to_id(t));
        let eos_token_id = token_id(&config.eos_token);
        let bos_token_id = token_id(&config.bos_token);
        let probe = inner
            .encode_fast("", true)
            .map_err(|e| TokenizeError::Encode(e.to_string()))?;
        let already = |id: Option<u32>| id.is_some_and(|id| probe.get_ids().contains(&id));
        let post_processor_ids = around(&inner)?;
        let extra_bos = bos_token_id.filter(|_| config.add_bos_token && !already(bos_token_id));
        let extra_eos = eos_token_id.filter(|_| config.add_eos_token && !already(eos_token_id));
        Ok(Self {
            inner,
            template: config.template,
            eos_token_id,
            bos_token_id,
            extra_bos,
            extra_eos,
            post_processor_tokens,
            post_processor_ids,
            fast,
            chat_counts: chat_cache::ChatCountCache::new(),
            inline_system: std::sync::OnceLock::new(),
        })
    }

    /// Token ids of `text`; `add_special_tokens` runs the tokenizer's post-processor (BOS).
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, TokenizeError> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::Encode(e.to_string()))?;
        if !add_special_tokens {
            return Ok(encoding.get_ids().to_vec());
        }
        let mut ids = Vec::with_capacity(encoding.len() + 2);
        ids.extend(self.extra_bos);
        ids.extend_from_slice(encoding.get_ids());
        ids.extend(self.extra_eos);
        Ok(ids)
    }

    /// Exactly `encode(text, add_special_tokens)`, through the fast path's steps (see
    /// `fast::ids`): no offsets or per-token strings, each distinct pre-token looked up
    /// once, pre-tokens seen before from a shared cache. Configurations or inputs the fast
    /// path does not model take the plain encode.
    pub fn ids_fast(
        &self,
        text: &str,
        add_special_tokens: bool,
    ) -> Result<Vec<u32>, TokenizeError> {
        let (Ok(fast), Some((before, after))) = (&self.fast, &self.post_processor_ids) else {
            return self.encode(text, add_special_tokens);
        };
        let mut ids = Vec::with_capacity(text.len() / 3 + 4);
        if add_special_tokens {
            ids.extend(self.extra_bos);
            ids.extend_from_slice(before);
        }
        match fast.ids(self.inner.get_model(), text, &mut ids) {
            Ok(()) => {}
            Err(fast::Halt::Encode(e)) => return Err(TokenizeError::Encode(e)),
            Err(fast::Halt::Fallback | fast::Halt::Over) => {
                return self.encode(text, add_special_tokens)
            }
        }
        if add_special_tokens {
            ids.extend_from_slice(after);
            ids.extend(self.extra_eos);
        }
        Ok(ids)
    }

    /// The ids of a rendered chat prompt (`add_special_tokens = false`, as for templated
    /// chat), equal to `encode(rendered, false)`. Like [`Self::count_rendered_chat`], the
    /// ids of the text segments between added tokens are cached (bounded, shared by all
    /// callers), so a conversation that grew by one message only encodes the new text.
    pub fn ids_rendered_chat(&self, rendered: &str) -> Result<Vec<u32>, TokenizeError> {
        if let Ok(fast) = &self.fast {
            let mut ids = Vec::with_capacity(rendered.len() / 3 + 4);
            match fast.ids_segments(self.inner.get_model(), rendered, &mut ids) {
                Ok(()) => return Ok(ids),
                Err(fast::Halt::Encode(e)) => return Err(TokenizeError::Encode(e)),
                Err(fast::Halt::Fallback | fast::Halt::Over) => {}
            }
        }
        self.encode(rendered, false)
    }

    /// Number of tokens of `text` (see the module's counting rules).
    pub fn count(&self, text: &str, add_special_tokens: bool) -> Result<usize, TokenizeError> {
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizeError::Encode(e.to_string()))?;
        let extra = if add_special_tokens {
            usize::from(self.extra_bos.is_some()) + usize::from(self.extra_eos.is_some())
        } else {
            0
        };
        Ok(encoding.len() + extra)
    }

    /// Exactly `encode(text, add_special_tokens).len()`, without building ids, offsets or strings.
    pub fn count_fast(&self, text: &str, add_special_tokens: bool) -> Result<usize, TokenizeError> {
        Ok(self
            .count_up_to(text, add_special_tokens, usize::MAX)?
            .at_least())
    }

    /// As [`ModelTokenizer::count_fast`], but may stop early once the count exceeds `limit`:
    /// returns `Count::Exact(n)` or `Count::Over { at_least }` (`at_least > limit`).
    pub fn count_up_to(
        &self,
        text: &str,
        add_special_tokens: bool,
        limit: usize,
    ) -> Result<Count, TokenizeError> {
        let extra = self.special_tokens_added(add_special_tokens);
        if let Ok(fast) = &self.fast {
            // Counting the text against `limit - extra` makes `text + extra > limit` exact.
            match fast.count(self.inner.get_model(), text, limit.saturating_sub(extra)) {
                Ok((n, false)) => return Ok(Count::Exact(n + extra)),
                Ok((n, true)) => {
                    return Ok(Count::Over {
                        at_least: n + extra,
                    })
                }
                Err(fast::Halt::Encode(e)) => return Err(TokenizeError::Encode(e)),
                Err(fast::Halt::Fallback | fast::Halt::Over) => {}
            }
        }
        let n = self.count(text, add_special_tokens)?;
        Ok(if n > limit {
            Count::Over { at_least: n }
        } else {
            Count::Exact(n)
        })
    }

    /// Token count of a rendered chat prompt (`add_special_tokens = false`, as for templated
    /// chat), equal to `count(rendered, false)`. The counts of the text segments between
    /// added tokens are cached (bounded, shared by all callers), so re-counting a
    /// conversation that grew by one message only counts the new text.
    pub fn count_rendered_chat(&self, rendered: &str) -> Result<usize, TokenizeError> {
        if let Ok(fast) = &self.fast {
            match fast.count_segments(self.inner.get_model(), rendered) {
                Ok(n) => return Ok(n),
                Err(fast::Halt::Encode(e)) => return Err(TokenizeError::Encode(e)),
                Err(fast::Halt::Fallback | fast::Halt::Over) => {}
            }
        }
        self.count(rendered, false)
    }

    /// An upper bound of `count(text, add_special_tokens)` for any text of `text_bytes`
    /// UTF-8 bytes, for admitting short prompts without counting them.
    ///
    /// Every byte-level BPE token and every added token covers at least one byte of the
    /// *normalized* text, so tokens ≤ normalized bytes; NFC can grow UTF-8 text up to 3×
    /// (U+1D160 becomes three 4-byte code points), so the bound is 3 × bytes for an NFC
    /// tokenizer (Qwen3) and bytes for one without normalizer (DeepSeek-V3), plus the
    /// special tokens `add_special_tokens` adds. For a configuration the fast path does not
    /// model, no bound is known and `usize::MAX` is returned.
    pub fn token_upper_bound(&self, text_bytes: usize, add_special_tokens: bool) -> usize {
        match &self.fast {
            Ok(fast) => text_bytes
                .saturating_mul(fast.normalize().max_expansion())
                .saturating_add(self.special_tokens_added(add_special_tokens)),
            Err(_) => usize::MAX,
        }
    }

    /// Why the fast counting path is off for this tokenizer (`None` when it is on).
    pub fn fast_count_unsupported(&self) -> Option<&str> {
        self.fast.as_ref().err().map(String::as_str)
    }

    /// Tokens added around the text with special tokens: post-processor and config BOS/EOS.
    fn special_tokens_added(&self, add_special_tokens: bool) -> usize {
        if !add_special_tokens {
            return 0;
        }
        self.post_processor_tokens
            + usize::from(self.extra_bos.is_some())
            + usize::from(self.extra_eos.is_some())
    }

    /// Text of `ids`; unknown ids are skipped.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizeError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizeError::Decode(e.to_string()))
    }

    /// HF-compatible `apply_chat_template(messages, tools=..., add_generation_prompt=..., tokenize=False)`.
    pub fn apply_chat_template(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
    ) -> Result<String, TokenizeError> {
        self.apply_chat_template_with(messages, tools, add_generation_prompt, None)
    }

    /// As [`ModelTokenizer::apply_chat_template`], with extra template variables
    /// (`**kwargs` in HF, e.g. `{"enable_thinking": false}` for Qwen3); they override the
    /// special tokens but not the other arguments.
    pub fn apply_chat_template_with(
        &self,
        messages: &serde_json::Value,
        tools: Option<&serde_json::Value>,
        add_generation_prompt: bool,
        template_kwargs: Option<&serde_json::Value>,
    ) -> Result<String, TokenizeError> {
        let Some(template) = &self.template else {
            return Err(TokenizeError::NoChatTemplate);
        };
        template.render(messages, tools, add_generation_prompt, template_kwargs)
    }

    /// The key under which the count of this conversation is remembered: its `messages`
    /// and `tools` JSON text and `options`, everything else that shapes its prompt (the
    /// rules and the request's other prompt fields: [`ChatRequest::options_key`]). `None`
    /// when it must not be remembered: no template, or one that reads the clock.
    pub fn chat_key(&self, messages: &str, tools: Option<&str>, options: &str) -> Option<ChatKey> {
        let template = self.template.as_ref()?;
        template
            .is_pure()
            .then(|| self.chat_counts.key(messages, tools, options))
    }

    /// The exact count remembered for a conversation by [`Self::remember_chat_count`].
    pub fn cached_chat_count(&self, key: ChatKey) -> Option<usize> {
        self.chat_counts.get(key)
    }

    /// Remember the exact count of a conversation's rendered prompt.
    pub fn remember_chat_count(&self, key: ChatKey, count: usize) {
        self.chat_counts.insert(key, count);
    }

    /// Whether `tokenizer_config.json` provided a chat template.
    pub fn has_chat_template(&self) -> bool {
        self.template.is_some()
    }

    /// Id of the configured `eos_token`, when it is in the vocabulary.
    pub fn eos_token_id(&self) -> Option<u32> {
        self.eos_token_id
    }

    /// Vocabulary size including added tokens (Python's `len(tokenizer)`).
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// Ids put before and after a text's own.
type Around = (Vec<u32>, Vec<u32>);

/// The ids the post-processor adds before and after a text's own, found by encoding a
/// probe with and without special tokens; None when the text's ids are not a contiguous
/// part of the result (a post-processor that rewrites them).
fn around(inner: &tokenizers::Tokenizer) -> Result<Option<Around>, TokenizeError> {
    let encode = |special: bool| {
        inner
            .encode_fast("probe", special)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| TokenizeError::Encode(e.to_string()))
    };
    let (with, without) = (encode(true)?, encode(false)?);
    if without.is_empty() {
        return Ok(None);
    }
    Ok(with
        .windows(without.len())
        .position(|w| w == without.as_slice())
        .map(|at| (with[..at].to_vec(), with[at + without.len()..].to_vec())))
}

/// What `tokenizer_config.json` contributes.
#[derive(Default)]
struct TokenizerConfig {
    template: Option<ChatTemplate>,
    bos_token: Option<String>,
    eos_token: Option<String>,
    add_bos_token: bool,
    add_eos_token: bool,
}

/// Reads the chat template and special tokens from `tokenizer_config.json`.
fn load_config(path: &Path) -> Result<TokenizerConfig, TokenizeError> {
    let load_err = |reason: String| TokenizeError::Load {
        path: path.to_path_buf(),
        reason,
    };
    let raw = std::fs::read_to_string(path).map_err(|e| load_err(e.to_string()))?;
    let config: serde_json::Value =
        serde_json::from_str(&raw).map_err(|e| load_err(e.to_string()))?;
    let bos = special_token(config.get("bos_token"));
    let eos = special_token(config.get("eos_token"));
    let template = match template_source(config.get("chat_template")) {
        Some(source) => Some(ChatTemplate::new(source, bos.clone(), eos.clone())?),
        None => None,
    };
    let flag = |key: &str| config.get(key).and_then(|v| v.as_bool()).unwrap_or(false);
    Ok(TokenizerConfig {
        template,
        bos_token: bos,
        eos_token: eos,
        add_bos_token: flag("add_bos_token"),
        add_eos_token: flag("add_eos_token"),
    })
}

/// A special token is either a string or an `AddedToken` object `{ "content": ... }`.
fn special_token(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Object(map) => map.get("content")?.as_str().map(str::to_string),
        _ => None,
    }
}

/// `chat_template` is a string, or a list of `{name, template}` of which "default" is used.
fn template_source(value: Option<&serde_json::Value>) -> Option<String> {
    match value? {
        serde_json::Value::String(s) => Some(s.clone()),
        serde_json::Value::Array(list) => list
            .iter()
            .find(|t| t.get("name").and_then(|n| n.as_str()) == Some("default"))
            .and_then(|t| t.get("template"))
            .and_then(|t| t.as_str())
            .map(str::to_string),
        _ => None,
    }
}

#[cfg(test)]
mod tests;
