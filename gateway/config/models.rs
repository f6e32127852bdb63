//! `[[models]]`: the models the gateway serves, by the name clients send.

use serde::Deserialize;
use std::collections::HashSet;
use std::path::{Path, PathBuf};

use super::engine_version::EngineVersion;
use super::files::resolve;
use super::invalid::Invalid;
use super::vision::VisionConfig;

/// `[[models]]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ModelConfig {
    /// What clients send as `model`.
    pub name: String,
    /// `tokenizer.json`, relative to the config file.
    pub tokenizer: PathBuf,
    /// `tokenizer_config.json` holding `chat_template`; relative to the config file.
    pub chat_template: Option<PathBuf>,
    /// The model's context window in tokens.
    pub context_window: u64,
    /// New tokens assumed (and sent to the engine) when a request names none; unset: the
    /// engines' defaults (`/generate` 128, completions 16, chat the rest of the window).
    #[serde(default)]
    pub default_max_new_tokens: Option<u64>,
    /// Workers whose engine reports an older version (or none) may not serve this model,
    /// e.g. "0.5.22" (the first SGLang release that refuses over-long prompts up front).
    #[serde(default)]
    pub min_engine_version: Option<String>,
    /// How `POST /v1/messages` (Anthropic's Messages API) reaches the engines: `translate`
    /// (the default) or `engine`.
    #[serde(default)]
    pub anthropic_messages: AnthropicMessages,
    /// The model takes images (`[models.vision]`); without it, image parts are refused.
    #[serde(default)]
    pub vision: Option<VisionConfig>,
}

/// How Anthropic's Messages API is served for a model.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum AnthropicMessages {
    /// kvgate translates the request into a chat completion and the answer back: the
    /// engine sees a chat, so kvgate counts, salts and guards it like any chat (an
    /// aborted generation shows as an abort). Works on every engine and pool mode.
    #[default]
    Translate,
    /// The body goes as it is to the engine's own `/v1/messages` (SGLang serves it),
    /// counted as the chat SGLang builds from it (`kvgate_tokenize::prepare::anthropic`,
    /// refusing shapes whose conversion depends on the SGLang version or its flags). What
    /// it costs, and why `translate` is the default: SGLang's Anthropic request has no
    /// `cache_salt` (so the model's pools must set `cache_salt = false`) and no bootstrap
    /// fields (unified pools only), and it answers a generation aborted without a status
    /// as `stop_reason: "end_turn"`, which no gateway can tell from a finished one.
    Engine,
}

impl ModelConfig {
    /// The rules of one model; keys are relative to it (`context_window`). Its files are
    /// resolved against `base`.
    pub(super) fn check(&mut self, base: &Path) -> Result<(), Invalid> {
        if self.name.trim().is_empty() {
            return Err(Invalid::new("name", "must not be empty"));
        }
        if self.context_window == 0 {
            return Err(Invalid::new(
                "context_window",
                "must be the model's context window in tokens, e.g. 131072",
            ));
        }
        if self.default_max_new_tokens == Some(0) {
            return Err(Invalid::new(
                "default_max_new_tokens",
                "must be at least 1, or left out to use the engines' defaults",
            ));
        }
        if let Some(v) = &self.min_engine_version {
            EngineVersion::parse(v)
                .map_err(|e| Invalid::new("min_engine_version", e.to_string()))?;
        }
        resolve(base, &mut self.tokenizer, "tokenizer")?;
        if let Some(t) = self.chat_template.as_mut() {
            resolve(base, t, "chat_template")?;
        }
        if let Some(vision) = self.vision.as_mut() {
            vision.check(base).map_err(|e| e.under("vision"))?;
        }
        Ok(())
    }
}

/// The rules of the `[[models]]` list: at least one model, names unique, each model valid.
pub(super) fn check_models(models: &mut [ModelConfig], base: &Path) -> Result<(), Invalid> {
    if models.is_empty() {
        return Err(Invalid::new(
            "models",
            "no model is configured; add a [[models]] table with name, tokenizer and context_window",
        ));
    }
    let mut names = HashSet::new();
    for (i, model) in models.iter_mut().enumerate() {
        // A repeated name was valid where it was first seen, so this comes first.
        if !names.insert(model.name.clone()) {
            return Err(Invalid::new(
                format!("models[{i}].name"),
                format!(
                    "`{}` is defined twice; model names must be unique",
                    model.name
                ),
            ));
        }
        model
            .check(base)
            .map_err(|e| e.under(&format!("models[{i}]")))?;
    }
    Ok(())
}
