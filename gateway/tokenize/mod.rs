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
//! Encoding is CPU work (≈ 2 MB/s on one core); callers on an async runtime should run long
//! prompts on a blocking thread.

mod error;
mod template;

use std::path::Path;

pub use error::TokenizeError;
use template::ChatTemplate;

/// A model's tokenizer and chat template, loaded once and shared (`Arc`) between requests.
pub struct ModelTokenizer {
    inner: tokenizers::Tokenizer,
    template: Option<ChatTemplate>,
    eos_token_id: Option<u32>,
    /// BOS to prepend with special tokens, when the config asks for it and `tokenizer.json`
    /// does not add it itself (HF rebuilds the post-processor in that case).
    extra_bos: Option<u32>,
    /// EOS to append with special tokens, likewise.
    extra_eos: Option<u32>,
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
    /// Loads `tokenizer.json` and, if given, the chat template and special tokens of
    /// `tokenizer_config.json`.
    pub fn from_files(
        tokenizer_json: &Path,
        tokenizer_config_json: Option<&Path>,
    ) -> Result<Self, TokenizeError> {
        let inner =
            tokenizers::Tokenizer::from_file(tokenizer_json).map_err(|e| TokenizeError::Load {
                path: tokenizer_json.to_path_buf(),
                reason: e.to_string(),
            })?;
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
        let extra_bos = bos_token_id.filter(|_| config.add_bos_token && !already(bos_token_id));
        let extra_eos = eos_token_id.filter(|_| config.add_eos_token && !already(eos_token_id));
        Ok(Self {
            inner,
            template: config.template,
            eos_token_id,
            extra_bos,
            extra_eos,
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
        let Some(template) = &self.template else {
            return Err(TokenizeError::NoChatTemplate);
        };
        template.render(messages, tools, add_generation_prompt)
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
