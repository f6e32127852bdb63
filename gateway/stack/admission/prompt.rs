//! What the engine will count: the prompt of every sample of a request, and how many new
//! tokens each may generate.
//!
//! - chat: the messages rendered through the model's chat template (with the generation
//!   prompt, as SGLang's OpenAI server does), encoded without special tokens;
//! - completions: `prompt` as a string, a list of strings, token ids or a list of token-id
//!   lists; strings are encoded with special tokens (SGLang's default);
//! - `/generate`: `text` (string or list) or `input_ids` (list or list of lists).
//!
//! Missing `max_tokens` / `max_new_tokens`: the model's `default_max_new_tokens` when
//! configured (and then sent to the engine, so it cannot generate more than was admitted);
//! otherwise the engines' own defaults — `/generate` 128 (SGLang `sampling_params`),
//! completions 16 (OpenAI), chat the rest of the context window (OpenAI/SGLang).

use serde_json::{Map, Value};

use crate::error::GatewayError;
use crate::stack::api::{Endpoint, InferenceRequest};

/// SGLang's `sampling_params.max_new_tokens` default.
pub const GENERATE_DEFAULT_MAX_NEW_TOKENS: u64 = 128;
/// OpenAI's (and SGLang's) `/v1/completions` `max_tokens` default.
pub const COMPLETIONS_DEFAULT_MAX_TOKENS: u64 = 16;

/// One prompt to count.
#[derive(Debug, Clone, Copy)]
pub enum PromptInput<'a> {
    /// Raw text, encoded with special tokens.
    Text(&'a str),
    /// Token ids: the count is their number.
    Ids(usize),
    /// Chat messages (and tools) to render through the template.
    Chat {
        messages: &'a Value,
        tools: Option<&'a Value>,
    },
}

/// How many new tokens a sample may generate.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaxNew {
    /// A number: from the client, the model default or the engine default.
    Tokens(u64),
    /// The rest of the context window (chat without `max_tokens`).
    RestOfWindow,
}

/// One sample of a request.
#[derive(Debug, Clone, Copy)]
pub struct Sample<'a> {
    pub input: PromptInput<'a>,
    pub max_new: MaxNew,
}

/// The JSON field that holds the new-token allowance.
pub fn max_tokens_param(endpoint: Endpoint) -> &'static str {
    match endpoint {
        Endpoint::Generate => "sampling_params",
        _ => "max_tokens",
    }
}

/// The JSON field that holds the prompt (the `param` of a refusal).
pub fn prompt_param(endpoint: Endpoint, body: &Map<String, Value>) -> &'static str {
    match endpoint {
        Endpoint::ChatCompletions => "messages",
        Endpoint::Completions => "prompt",
        Endpoint::Generate if body.contains_key("input_ids") => "input_ids",
        Endpoint::Generate | Endpoint::ListModels => "text",
    }
}

fn max_tokens_field(value: Option<&Value>, name: &str) -> Result<Option<u64>, GatewayError> {
    match value {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_u64().map(Some).ok_or_else(|| {
            GatewayError::invalid(
                format!("`{name}` must be a non-negative integer"),
                Some(name),
            )
        }),
    }
}

/// The client's requested new tokens for sample `i` (None: not given).
pub(super) fn requested_max_new(
    request: &InferenceRequest,
    i: usize,
) -> Result<Option<u64>, GatewayError> {
    let body = &request.body;
    match request.endpoint {
        Endpoint::ChatCompletions => {
            let v = max_tokens_field(body.get("max_completion_tokens"), "max_completion_tokens")?;
            match v {
                Some(v) => Ok(Some(v)),
                None => max_tokens_field(body.get("max_tokens"), "max_tokens"),
            }
        }
        Endpoint::Completions => max_tokens_field(body.get("max_tokens"), "max_tokens"),
        Endpoint::Generate => match body.get("sampling_params") {
            None | Some(Value::Null) => Ok(None),
            Some(Value::Object(p)) => max_tokens_field(p.get("max_new_tokens"), "max_new_tokens"),
            Some(Value::Array(per_sample)) => match per_sample.get(i) {
                Some(Value::Object(p)) => {
                    max_tokens_field(p.get("max_new_tokens"), "max_new_tokens")
                }
                Some(Value::Null) | None => Ok(None),
                Some(_) => Err(GatewayError::invalid(
                    "`sampling_params` entries must be objects",
                    Some("sampling_params"),
                )),
            },
            Some(_) => Err(GatewayError::invalid(
                "`sampling_params` must be an object or a list of objects",
                Some("sampling_params"),
            )),
        },
        Endpoint::ListModels => Ok(None),
    }
}

fn engine_default(endpoint: Endpoint) -> MaxNew {
    match endpoint {
        Endpoint::Generate => MaxNew::Tokens(GENERATE_DEFAULT_MAX_NEW_TOKENS),
        Endpoint::Completions => MaxNew::Tokens(COMPLETIONS_DEFAULT_MAX_TOKENS),
        Endpoint::ChatCompletions | Endpoint::ListModels => MaxNew::RestOfWindow,
    }
}

fn list(v: &Value) -> Vec<PromptInput<'_>> {
    match v {
        Value::String(s) => vec![PromptInput::Text(s)],
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .filter_map(Value::as_str)
            .map(PromptInput::Text)
            .collect(),
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .filter_map(Value::as_array)
            .map(|a| PromptInput::Ids(a.len()))
            .collect(),
        Value::Array(items) => vec![PromptInput::Ids(items.len())],
        _ => Vec::new(),
    }
}

fn prompts(request: &InferenceRequest) -> Result<Vec<PromptInput<'_>>, GatewayError> {
    let body = &request.body;
    let found = match request.endpoint {
        Endpoint::ChatCompletions => vec![PromptInput::Chat {
            messages: body.get("messages").unwrap_or(&Value::Null),
            tools: body.get("tools").filter(|t| !t.is_null()),
        }],
        Endpoint::Completions => body.get("prompt").map(list).unwrap_or_default(),
        Endpoint::Generate => body
            .get("text")
            .or_else(|| body.get("input_ids"))
            .map(list)
            .unwrap_or_default(),
        Endpoint::ListModels => Vec::new(),
    };
    if found.len() != request.batch {
        return Err(GatewayError::Internal(format!(
            "parsed {} prompts for a batch of {}",
            found.len(),
            request.batch
        )));
    }
    Ok(found)
}

/// Every sample of `request` with its new-token allowance.
pub fn samples(
    request: &InferenceRequest,
    model_default: Option<u64>,
) -> Result<Vec<Sample<'_>>, GatewayError> {
    prompts(request)?
        .into_iter()
        .enumerate()
        .map(|(i, input)| {
            let max_new = match requested_max_new(request, i)? {
                Some(n) => MaxNew::Tokens(n),
                None => model_default.map_or(engine_default(request.endpoint), MaxNew::Tokens),
            };
            Ok(Sample { input, max_new })
        })
        .collect()
}

/// Make the engine use the model default that admission assumed, when the client sent none.
pub fn apply_model_default(request: &mut InferenceRequest, model_default: Option<u64>) {
    let Some(default) = model_default else { return };
    let body = &mut request.body;
    match request.endpoint {
        Endpoint::ChatCompletions => {
            if body.get("max_tokens").is_none_or(Value::is_null)
                && body.get("max_completion_tokens").is_none_or(Value::is_null)
            {
                body.insert("max_tokens".into(), Value::from(default));
            }
        }
        Endpoint::Completions => {
            if body.get("max_tokens").is_none_or(Value::is_null) {
                body.insert("max_tokens".into(), Value::from(default));
            }
        }
        Endpoint::Generate => {
            let params = body
                .entry("sampling_params")
                .or_insert_with(|| Value::Object(Map::new()));
            let fill = |p: &mut Value| {
                if let Value::Object(p) = p {
                    if p.get("max_new_tokens").is_none_or(Value::is_null) {
                        p.insert("max_new_tokens".into(), Value::from(default));
                    }
                }
            };
            match params {
                Value::Array(per_sample) => per_sample.iter_mut().for_each(fill),
                Value::Null => {
                    *params = serde_json::json!({ "max_new_tokens": default });
                }
                other => fill(other),
            }
        }
        Endpoint::ListModels => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stack::api::{parse_inference, ModelCatalog};

    fn parse(endpoint: Endpoint, body: Value) -> InferenceRequest {
        let text = "[server]\nallow_anonymous = true\n[[models]]\nname = \"qwen3\"\ntokenizer = \"tokenizers/qwen3/tokenizer.json\"\ncontext_window = 100\n[[pools]]\nname = \"p\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{ url = \"http://127.0.0.1:1\" }]\n".to_string();
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("config/x.toml");
        let cfg = crate::config::Config::from_toml(&text, &path).unwrap();
        parse_inference(
            endpoint,
            body.to_string().as_bytes(),
            &ModelCatalog::from_config(&cfg),
        )
        .unwrap()
    }

    #[test]
    fn defaults_follow_the_engines_unless_the_model_sets_one() {
        let g = parse(
            Endpoint::Generate,
            serde_json::json!({"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 3}, {}]}),
        );
        let s = samples(&g, None).unwrap();
        assert_eq!(s[0].max_new, MaxNew::Tokens(3));
        assert_eq!(s[1].max_new, MaxNew::Tokens(128));
        let c = parse(
            Endpoint::ChatCompletions,
            serde_json::json!({"model": "qwen3", "messages": [{"role": "user", "content": "x"}]}),
        );
        assert_eq!(samples(&c, None).unwrap()[0].max_new, MaxNew::RestOfWindow);
        assert_eq!(
            samples(&c, Some(64)).unwrap()[0].max_new,
            MaxNew::Tokens(64)
        );
        let p = parse(
            Endpoint::Completions,
            serde_json::json!({"model": "qwen3", "prompt": [[1, 2, 3], [4]]}),
        );
        let s = samples(&p, None).unwrap();
        assert!(matches!(s[0].input, PromptInput::Ids(3)));
        assert!(matches!(s[1].input, PromptInput::Ids(1)));
        assert_eq!(s[0].max_new, MaxNew::Tokens(16));
    }

    #[test]
    fn model_default_is_sent_to_the_engine() {
        let mut g = parse(Endpoint::Generate, serde_json::json!({"text": "a"}));
        apply_model_default(&mut g, Some(7));
        assert_eq!(g.body["sampling_params"]["max_new_tokens"], 7);
        let mut c = parse(
            Endpoint::ChatCompletions,
            serde_json::json!({"model": "qwen3", "max_tokens": 3, "messages": [{"role": "user", "content": "x"}]}),
        );
        apply_model_default(&mut c, Some(7));
        assert_eq!(c.body["max_tokens"], 3);
    }

    #[test]
    fn bad_max_tokens_is_invalid() {
        let c = parse(
            Endpoint::Completions,
            serde_json::json!({"model": "qwen3", "prompt": "x", "max_tokens": -1}),
        );
        assert!(matches!(
            samples(&c, None),
            Err(GatewayError::InvalidRequest { .. })
        ));
    }
}
