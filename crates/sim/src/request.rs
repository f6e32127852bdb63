//! Parsing of `/generate`, `/v1/chat/completions` and `/v1/completions` bodies into one model.
//!
//! Prompts are tokenized here with the model's real tokenizer, following the counting rules
//! of [`kvgate_tokenize`]: text with special tokens, templated chat without.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

use serde_json::Value;

use super::config::{SimConfig, SimRole, DEFAULT_BOOTSTRAP_PORT};
use super::options::{self, Options};
use super::prefix_cache::Partition;
use super::vision_load::Fetched;
use super::vision_prompt;
use kvgate_tokenize::{ChatPrompt, ChatRequest, ModelTokenizer};

/// SGLang's default `max_new_tokens` (native API and chat without `max_tokens`).
const DEFAULT_MAX_NEW_TOKENS: usize = 128;
/// OpenAI's (and SGLang's) default `max_tokens` of `/v1/completions`.
const DEFAULT_COMPLETION_MAX_TOKENS: usize = 16;

/// Which HTTP API a request came in on; it decides the response shapes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Api {
    Generate,
    Chat,
    Completions,
}

/// Where a decode finds its KV, and under which room a prefill publishes it.
#[derive(Clone, Debug)]
pub(crate) struct Target {
    pub(crate) host: Option<String>,
    pub(crate) port: u16,
    pub(crate) room: u64,
}

/// One prompt of a (possibly batched) request.
#[derive(Clone, Debug)]
pub(crate) struct Sample {
    pub(crate) input_ids: Vec<u32>,
    pub(crate) rid: String,
    pub(crate) bootstrap: Option<Target>,
    /// The prefix-cache partition (`cache_salt`, `extra_key`) its prompt belongs to.
    pub(crate) partition: Partition,
}

/// A generation request, whatever API it came from.
#[derive(Clone, Debug)]
pub(crate) struct GenRequest {
    pub(crate) api: Api,
    pub(crate) samples: Vec<Sample>,
    /// The native API answers a list for a batch (`text` / `input_ids` given as lists).
    pub(crate) is_batch: bool,
    pub(crate) max_new_tokens: usize,
    pub(crate) stream: bool,
    pub(crate) include_usage: bool,
    /// `stream_options.continuous_usage_stats` (vLLM, SGLang): usage in every chunk.
    pub(crate) continuous_usage: bool,
    /// Response id of the OpenAI APIs.
    pub(crate) id: String,
    /// What the OpenAI APIs' fields ask of the answer (`n`, `stop`, logprobs, tools, ...).
    pub(crate) options: Options,
}

/// Why a body is not a valid request.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ParseError {
    #[error("{0}")]
    BadRequest(String),
    #[error("The model `{0}` does not exist.")]
    ModelNotFound(String),
}

fn bad(msg: impl Into<String>) -> ParseError {
    ParseError::BadRequest(msg.into())
}

/// A random lowercase hex id, like SGLang's `uuid.uuid4().hex`.
pub(crate) fn random_hex() -> String {
    let a = RandomState::new().build_hasher().finish();
    let mut h = RandomState::new().build_hasher();
    h.write_u64(a);
    format!("{a:016x}{:016x}", h.finish())
}

/// What a parse makes of text prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Tokens {
    /// Their real token ids (the engine writes them to KV pages).
    Ids,
    /// Only their exact number, through the fast count-only path (ids are placeholders):
    /// the mock engine, which needs `prompt_tokens` and nothing else.
    CountOnly,
}

/// A tokenizer and what to make of text with it.
pub(crate) struct Tokenize<'a>(pub(crate) &'a ModelTokenizer, pub(crate) Tokens);

impl Tokenize<'_> {
    fn text(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>, ParseError> {
        let Tokenize(tokenizer, mode) = self;
        let err = |e: kvgate_tokenize::TokenizeError| bad(e.to_string());
        match mode {
            Tokens::Ids => tokenizer.encode(text, add_special_tokens).map_err(err),
            Tokens::CountOnly => Ok(vec![
                0;
                tokenizer
                    .count_fast(text, add_special_tokens)
                    .map_err(err)?
            ]),
        }
    }

    fn chat(&self, prompt: &ChatPrompt) -> Result<Vec<u32>, ParseError> {
        let Tokenize(tokenizer, mode) = self;
        let err = |e: kvgate_tokenize::TokenizeError| bad(e.to_string());
        match mode {
            Tokens::Ids => tokenizer.chat_prompt_ids(prompt).map_err(err),
            Tokens::CountOnly => Ok(vec![0; tokenizer.count_chat_prompt(prompt).map_err(err)?]),
        }
    }
}

/// Parses a request body, its text prompts turned into ids or only counted.
pub(crate) fn parse_with(
    api: Api,
    body: &Value,
    config: &SimConfig,
    tokenize: &Tokenize<'_>,
) -> Result<GenRequest, ParseError> {
    parse_with_images(api, body, config, tokenize, &Fetched::none())
}

/// [`parse_with`], the request's `http://` images already `fetched` (a vision model's).
pub(crate) fn parse_with_images(
    api: Api,
    body: &Value,
    config: &SimConfig,
    tokenize: &Tokenize<'_>,
    fetched: &Fetched,
) -> Result<GenRequest, ParseError> {
    let tokenizer = tokenize.0;
    if !body.is_object() {
        return Err(bad("The request body must be a JSON object."));
    }
    if api != Api::Generate {
        if let Some(model) = body.get("model").and_then(Value::as_str) {
            if !model.is_empty() && model != config.model {
                return Err(ParseError::ModelNotFound(model.to_string()));
            }
        }
    }
    let options = options::parse(api, body).map_err(ParseError::BadRequest)?;
    let (inputs, is_batch, max_new) = match api {
        Api::Generate => {
            let (inputs, is_batch) = generate_inputs(body, tokenize)?;
            let max_new = body
                .get("sampling_params")
                .and_then(|p| p.get("max_new_tokens"));
            (
                inputs,
                is_batch,
                count_field(max_new, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS)?,
            )
        }
        Api::Chat => {
            let messages = body
                .get("messages")
                .filter(|m| m.as_array().is_some_and(|a| !a.is_empty()));
            let Some(messages) = messages else {
                return Err(bad("messages must be a non-empty list"));
            };
            // The chat prepared as the engine kind it plays prepares it, then rendered.
            let request = body
                .as_object()
                .and_then(ChatRequest::from_body)
                .filter(|_| messages.is_array())
                .ok_or_else(|| bad("messages must be a non-empty list"))?;
            // A vision model takes image parts: their placeholders expanded to the images'
            // tokens (`vision_prompt`); a text-only one refuses them as SGLang does.
            let prompt = match &config.vision {
                None => tokenizer
                    .chat_prompt(config.chat_rules, &request)
                    .map_err(|e| bad(e.to_string()))?,
                Some(vision) => vision_prompt::expanded_prompt(
                    vision,
                    config.chat_rules,
                    tokenizer,
                    &request,
                    fetched,
                )
                .map_err(bad)?,
            };
            let ids = tokenize.chat(&prompt)?;
            let max = body
                .get("max_completion_tokens")
                .filter(|v| !v.is_null())
                .or_else(|| body.get("max_tokens"));
            (
                vec![ids],
                false,
                count_field(max, "max_tokens", DEFAULT_MAX_NEW_TOKENS)?,
            )
        }
        Api::Completions => {
            let inputs = completion_inputs(body.get("prompt"), tokenize)?;
            let max = count_field(
                body.get("max_tokens"),
                "max_tokens",
                DEFAULT_COMPLETION_MAX_TOKENS,
            )?;
            let is_batch = inputs.len() > 1;
            (inputs, is_batch, max)
        }
    };
    let n = inputs.len();
    let rids = rids(body.get("rid"), n)?;
    let mut samples = Vec::with_capacity(n);
    for (i, (input_ids, rid)) in inputs.into_iter().zip(rids).enumerate() {
        let bootstrap = match config.role {
            SimRole::Unified => None,
            SimRole::Prefill | SimRole::Decode => Some(bootstrap(body, i, n, config.role)?),
        };
        samples.push(Sample {
            input_ids,
            rid,
            bootstrap,
            partition: Partition {
                cache_salt: cache_key(body, "cache_salt", i, n)?,
                extra_key: cache_key(body, "extra_key", i, n)?,
            },
        });
    }
    let stream = match body.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => return Err(bad("stream must be a boolean")),
    };
    let include_usage = body
        .get("stream_options")
        .and_then(|o| o.get("include_usage"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let continuous_usage = body
        .get("stream_options")
        .and_then(|o| o.get("continuous_usage_stats"))
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let prefix = match api {
        Api::Chat => "chatcmpl-",
        Api::Completions => "cmpl-",
        Api::Generate => "",
    };
    Ok(GenRequest {
        api,
        samples,
        is_batch,
        max_new_tokens: max_new,
        stream,
        include_usage,
        continuous_usage,
        id: format!("{prefix}{}", random_hex()),
        options,
    })
}

/// A non-negative integer field, `null`/absent meaning `default`.
fn count_field(value: Option<&Value>, name: &str, default: usize) -> Result<usize, ParseError> {
    match value {
        None | Some(Value::Null) => Ok(default),
        Some(v) => v
            .as_u64()
            .and_then(|n| usize::try_from(n).ok())
            .ok_or_else(|| bad(format!("{name} must be a non-negative integer"))),
    }
}

fn token_ids(value: &Value) -> Option<Vec<u32>> {
    value
        .as_array()?
        .iter()
        .map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok()))
        .collect()
}

fn encode_text(text: &Value, tokenize: &Tokenize<'_>) -> Result<Vec<u32>, ParseError> {
    let Some(text) = text.as_str() else {
        return Err(bad("text must be a string or a list of strings"));
    };
    tokenize.text(text, true)
}

fn generate_inputs(
    body: &Value,
    tokenizer: &Tokenize<'_>,
) -> Result<(Vec<Vec<u32>>, bool), ParseError> {
    let text = body.get("text").filter(|v| !v.is_null());
    let ids = body.get("input_ids").filter(|v| !v.is_null());
    match (text, ids) {
        (Some(_), Some(_)) | (None, None) => Err(bad(
            "Either text, input_ids or input_embeds should be provided.",
        )),
        (Some(Value::Array(texts)), None) => {
            if texts.is_empty() {
                return Err(bad("text must not be an empty list"));
            }
            let inputs = texts
                .iter()
                .map(|t| encode_text(t, tokenizer))
                .collect::<Result<_, _>>()?;
            Ok((inputs, true))
        }
        (Some(text), None) => Ok((vec![encode_text(text, tokenizer)?], false)),
        (None, Some(ids)) => {
            let Some(list) = ids.as_array() else {
                return Err(bad(
                    "input_ids must be a list of token ids or a list of lists",
                ));
            };
            if list.first().is_some_and(Value::is_array) {
                let inputs = list
                    .iter()
                    .map(token_ids)
                    .collect::<Option<Vec<_>>>()
                    .ok_or_else(|| bad("input_ids must hold non-negative integer token ids"))?;
                Ok((inputs, true))
            } else {
                let ids = token_ids(ids)
                    .ok_or_else(|| bad("input_ids must hold non-negative integer token ids"))?;
                Ok((vec![ids], false))
            }
        }
    }
}

fn completion_inputs(
    prompt: Option<&Value>,
    tokenizer: &Tokenize<'_>,
) -> Result<Vec<Vec<u32>>, ParseError> {
    let invalid = || {
        bad("prompt must be a string, a list of strings, a token array or a list of token arrays")
    };
    match prompt {
        Some(Value::String(_)) => Ok(vec![encode_text(
            prompt.unwrap_or(&Value::Null),
            tokenizer,
        )?]),
        Some(Value::Array(items)) if !items.is_empty() => match items.first() {
            Some(Value::String(_)) => items.iter().map(|t| encode_text(t, tokenizer)).collect(),
            Some(Value::Array(_)) => items
                .iter()
                .map(token_ids)
                .collect::<Option<Vec<_>>>()
                .ok_or_else(invalid),
            Some(Value::Number(_)) => Ok(vec![
                token_ids(prompt.unwrap_or(&Value::Null)).ok_or_else(invalid)?
            ]),
            _ => Err(invalid()),
        },
        _ => Err(invalid()),
    }
}

fn rids(value: Option<&Value>, n: usize) -> Result<Vec<String>, ParseError> {
    match value {
        None | Some(Value::Null) => Ok((0..n).map(|_| random_hex()).collect()),
        Some(Value::String(s)) if n == 1 => Ok(vec![s.clone()]),
        Some(Value::Array(list)) if list.len() == n => list
            .iter()
            .map(|r| r.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad("rid must be a string or a list of strings")),
        Some(_) => Err(bad(
            "rid must be a string, or a list with one rid per prompt",
        )),
    }
}

/// Element `i` of a field that is either a scalar (for every sample) or a list of `n`.
fn per_sample<'a>(
    body: &'a Value,
    key: &str,
    i: usize,
    n: usize,
) -> Result<Option<&'a Value>, ParseError> {
    match body.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Array(list)) if list.len() == n => Ok(list.get(i).filter(|v| !v.is_null())),
        Some(Value::Array(_)) => Err(bad(format!("{key} must have one entry per prompt ({n})"))),
        Some(v) => Ok(Some(v)),
    }
}

/// A cache partition field (`cache_salt`, `extra_key`) of sample `i`: a string for every
/// sample or a list with one per sample, as SGLang takes both; absent, null and `""` are
/// all the default partition (SGLang turns `""` into `None`).
fn cache_key(body: &Value, key: &str, i: usize, n: usize) -> Result<String, ParseError> {
    match per_sample(body, key, i, n)? {
        None => Ok(String::new()),
        Some(Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(bad(format!(
            "{key} must be a string, or a list with one string per prompt"
        ))),
    }
}

fn bootstrap(body: &Value, i: usize, n: usize, role: SimRole) -> Result<Target, ParseError> {
    let room = match per_sample(body, "bootstrap_room", i, n)? {
        Some(v) if n > 1 && !body.get("bootstrap_room").is_some_and(Value::is_array) => {
            let _ = v;
            return Err(bad(
                "bootstrap_room must be a list with one room per prompt",
            ));
        }
        Some(v) => v
            .as_u64()
            .ok_or_else(|| bad("bootstrap_room must be a non-negative integer"))?,
        None => {
            return Err(bad(
                "bootstrap_room is required in disaggregation mode (prefill/decode)",
            ))
        }
    };
    let host = match per_sample(body, "bootstrap_host", i, n)? {
        Some(v) => Some(
            v.as_str()
                .ok_or_else(|| bad("bootstrap_host must be a string"))?
                .to_string(),
        ),
        None if role == SimRole::Decode => {
            return Err(bad("bootstrap_host is required in decode mode"))
        }
        None => None,
    };
    let port = match per_sample(body, "bootstrap_port", i, n)? {
        Some(v) => v
            .as_u64()
            .and_then(|p| u16::try_from(p).ok())
            .ok_or_else(|| bad("bootstrap_port must be a port number"))?,
        None => DEFAULT_BOOTSTRAP_PORT,
    };
    Ok(Target { host, port, room })
}
