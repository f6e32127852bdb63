//! The models clients may name ([`ModelCatalog`]): which exist, which one SGLang's
//! `/generate` defaults to, and whose Anthropic requests go to the engines as they are.

use serde_json::{Map, Value};
use std::collections::BTreeSet;
use std::sync::Arc;

use super::Endpoint;
use crate::config::{AnthropicMessages, Config, EngineKind};
use crate::error::GatewayError;

/// The models clients may name, and the default for SGLang `/generate` (which has no
/// `model` field) when exactly one model is served by SGLang pools.
#[derive(Debug, Clone)]
pub struct ModelCatalog {
    names: Arc<BTreeSet<String>>,
    generate_default: Option<String>,
    /// Models whose Anthropic requests go to the engines as they are
    /// (`anthropic_messages = "engine"`).
    engine_messages: Arc<BTreeSet<String>>,
}

impl ModelCatalog {
    /// Build the catalog from the config.
    pub fn from_config(config: &Config) -> Self {
        let names: BTreeSet<String> = config.models.iter().map(|m| m.name.clone()).collect();
        let sglang: BTreeSet<&str> = config
            .pools
            .iter()
            .filter(|p| p.engine == EngineKind::Sglang)
            .map(|p| p.model.as_str())
            .collect();
        let generate_default = match sglang.len() {
            1 => sglang.iter().next().map(|s| s.to_string()),
            _ => None,
        };
        let engine_messages = config
            .models
            .iter()
            .filter(|m| m.anthropic_messages == AnthropicMessages::Engine)
            .map(|m| m.name.clone())
            .collect();
        Self {
            names: Arc::new(names),
            generate_default,
            engine_messages: Arc::new(engine_messages),
        }
    }

    /// A catalog of `names`, `/generate` defaulting to `generate_default`.
    pub fn new(names: impl IntoIterator<Item = String>, generate_default: Option<String>) -> Self {
        Self {
            names: Arc::new(names.into_iter().collect()),
            generate_default,
            engine_messages: Arc::default(),
        }
    }

    /// Whether `model`'s Anthropic requests go to the engines as they are.
    pub(super) fn passes_anthropic_through(&self, model: &str) -> bool {
        self.engine_messages.contains(model)
    }

    /// All model names, sorted.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.names.iter().map(String::as_str)
    }

    pub(super) fn resolve(
        &self,
        endpoint: Endpoint,
        body: &Map<String, Value>,
    ) -> Result<String, GatewayError> {
        match body.get("model") {
            Some(Value::String(model)) => {
                if self.names.contains(model) {
                    Ok(model.clone())
                } else {
                    Err(GatewayError::ModelNotFound {
                        model: model.clone(),
                    })
                }
            }
            Some(_) => Err(GatewayError::invalid(
                "`model` must be a string",
                Some("model"),
            )),
            // SGLang's own routes name no model (`/generate`, `/v1/rerank`) or default it:
            // the one model SGLang pools serve, or for kvgate's own tokenizer routes the one
            // model there is.
            None if matches!(
                endpoint,
                Endpoint::Generate
                    | Endpoint::Rerank
                    | Endpoint::Score
                    | Endpoint::Tokenize
                    | Endpoint::Detokenize
            ) =>
            {
                let only = (self.names.len() == 1)
                    .then(|| self.names.iter().next().cloned())
                    .flatten();
                let default = match endpoint {
                    Endpoint::Tokenize | Endpoint::Detokenize => only,
                    _ => None,
                };
                default
                    .or_else(|| self.generate_default.clone())
                    .ok_or_else(|| {
                        GatewayError::invalid(
                            format!(
                                "this gateway serves several models: add \"model\" to the {} body",
                                endpoint.path()
                            ),
                            Some("model"),
                        )
                    })
            }
            None => Err(GatewayError::invalid(
                "you must provide a model parameter",
                Some("model"),
            )),
        }
    }
}
