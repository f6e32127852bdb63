//! [`InferenceRequest`]: the one typed request every stage reads.
//!
//! Parsing builds it once. Stages read the client's fields through its accessors (which
//! prompt, which budget, token ids or text) and record what they decided for the engine in
//! [`EngineDirectives`]; none of them edits JSON. Dispatch builds the engine's body once,
//! from the passthrough fields (`api::fields`) plus the directives and its own routing
//! fields (`dispatch::engine_body`).

use serde_json::{Map, Value};
use std::borrow::Cow;
use std::sync::Arc;

use super::pooling_view::{self, ScorePrompts};
use super::prompt_view::{self, Message, Prompts};
use super::raw::RawFields;
use super::Endpoint;
use crate::error::GatewayError;

/// One client request, whichever API it came through.
#[derive(Debug, Clone)]
pub struct InferenceRequest {
    /// The route it arrived on (and is forwarded to).
    pub endpoint: Endpoint,
    /// The gateway model name (`[[models]].name`).
    pub model: String,
    /// Whether the client asked for an SSE stream.
    pub stream: bool,
    /// Number of prompts in the request (SGLang and completions batches); 1 for chat.
    pub batch: usize,
    /// The client's small fields (everything but the prompt and `tools`), structurally
    /// validated by parsing. Read-only for the stages: what of them reaches an engine is
    /// decided by `api::fields`.
    pub fields: Map<String, Value>,
    /// The prompt (and chat `tools`) as the client sent them: spliced into the engine's
    /// body unchanged, read through `api::prompt_view`.
    pub raw: RawFields,
    /// What the stages decided the engine must receive; applied once, at dispatch.
    pub directives: EngineDirectives,
    /// The client's body, sent to the engine as it is but for `model`
    /// ([`Endpoint::EngineMessages`]: the engine builds the chat that `fields` and `raw`
    /// hold for counting and checking).
    pub verbatim: Option<Arc<Map<String, Value>>>,
}

/// The stages' decisions about the engine's body.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineDirectives {
    /// New-token allowance for every sample the client gave none (admission: the model's
    /// default or the tenant's cap), so the engine cannot generate more than was admitted.
    pub default_max_new_tokens: Option<u64>,
    /// The tenant's prefix-cache salt (isolation), for pools that take one.
    pub cache_salt: Option<String>,
    /// Ask an OpenAI-format engine for usage in every stream chunk (the guard's early
    /// prompt-count check); the guard strips what the client did not ask for.
    pub stream_usage: bool,
    /// The id of a `/v1/responses` response, chosen by kvgate (`stack::responses`) and
    /// sent as SGLang's `request_id`, so the owner is recorded under the id the engine
    /// stores it by.
    pub response_id: Option<String>,
}

/// Most sequences one prompt may ask for (`n`, `best_of`).
pub const MAX_FANOUT: u64 = 128;

/// One prompt to count.
#[derive(Debug, Clone)]
pub enum PromptInput<'a> {
    /// Raw text, encoded with special tokens.
    Text(Cow<'a, str>),
    /// Token ids: the count is their number.
    Ids(usize),
    /// A text pair (a rerank query and document): each side encoded with special tokens,
    /// the ids of the first then the second.
    Pair(Cow<'a, str>, Cow<'a, str>),
    /// A `/v1/responses` request's fields: the chat SGLang builds from them
    /// (`kvgate_tokenize::prepare::responses`), prepared and rendered by SGLang's rules.
    Responses(&'a Map<String, Value>),
    /// Chat messages (and tools) to prepare and render through the template, as raw JSON,
    /// with the request's other fields (`tool_choice`, `chat_template_kwargs`, ...).
    Chat {
        messages: &'a str,
        tools: Option<&'a str>,
        fields: &'a Map<String, Value>,
    },
}

/// A request's prompt, read: chat messages, or the texts or ids of every sample.
#[derive(Debug)]
pub enum PromptView<'a> {
    Chat(Vec<Message<'a>>),
    Samples(Prompts<'a>),
}

/// The fields of `endpoint` kept raw (`api::raw`): the bulk of every body.
pub fn bulk_fields(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::ChatCompletions
        | Endpoint::Messages
        | Endpoint::EngineMessages
        | Endpoint::CountTokens => &["messages", "tools"],
        Endpoint::Completions => &["prompt"],
        Endpoint::Generate => &["text", "input_ids"],
        Endpoint::Embeddings => &["input"],
        Endpoint::Rerank => &["query", "documents"],
        Endpoint::Score => &["query", "items"],
        Endpoint::Tokenize => &["prompt", "messages", "tools"],
        Endpoint::Detokenize => &["tokens"],
        // A Responses body stays whole in `fields`: its prompt is built from several of them.
        Endpoint::CreateResponse | Endpoint::RetrieveResponse | Endpoint::CancelResponse => &[],
        Endpoint::ListModels | Endpoint::RetrieveModel => &[],
    }
}

// === impl InferenceRequest ===

impl InferenceRequest {
    /// A request built in code (probes, tests): `fields` holds every field, the bulk ones
    /// included; they are moved to [`Self::raw`].
    pub fn from_fields(
        endpoint: Endpoint,
        model: String,
        stream: bool,
        batch: usize,
        mut fields: Map<String, Value>,
        directives: EngineDirectives,
    ) -> Self {
        let bulk: Vec<(&'static str, Value)> = bulk_fields(endpoint)
            .iter()
            .filter_map(|name| Some((*name, fields.shift_remove(*name)?)))
            .collect();
        let refs: Vec<(&'static str, &Value)> = bulk.iter().map(|(n, v)| (*n, v)).collect();
        Self {
            endpoint,
            model,
            stream,
            batch,
            fields,
            raw: RawFields::from_values(&refs),
            directives,
            verbatim: None,
        }
    }

    /// The prompt of every sample, in order (`batch` of them).
    pub fn prompts(&self) -> Result<Vec<PromptInput<'_>>, GatewayError> {
        let found = match self.endpoint {
            // The engine builds a chat from an Anthropic body: counted as that chat.
            Endpoint::ChatCompletions | Endpoint::EngineMessages => vec![PromptInput::Chat {
                messages: self.raw.get("messages").unwrap_or("null"),
                tools: self.raw.get("tools").filter(|t| *t != "null"),
                fields: &self.fields,
            }],
            Endpoint::Completions | Endpoint::Generate | Endpoint::Embeddings => {
                match self.prompt_view()? {
                    Some(PromptView::Samples(Prompts::Texts(texts))) => {
                        texts.into_iter().map(PromptInput::Text).collect()
                    }
                    Some(PromptView::Samples(Prompts::Ids(ids))) => {
                        ids.iter().map(|i| PromptInput::Ids(i.len())).collect()
                    }
                    _ => Vec::new(),
                }
            }
            Endpoint::Rerank => {
                let pairs =
                    pooling_view::rerank_pairs(self.raw.get("query"), self.raw.get("documents"))?;
                pairs
                    .documents
                    .into_iter()
                    .map(|d| PromptInput::Pair(pairs.query.clone(), d))
                    .collect()
            }
            Endpoint::Score => match self.score_prompts()? {
                ScorePrompts::Texts(texts) => texts.into_iter().map(PromptInput::Text).collect(),
                ScorePrompts::Ids(lens) => lens.into_iter().map(PromptInput::Ids).collect(),
            },
            Endpoint::CreateResponse => vec![PromptInput::Responses(&self.fields)],
            Endpoint::ListModels
            | Endpoint::RetrieveModel
            | Endpoint::Tokenize
            | Endpoint::Detokenize
            | Endpoint::Messages
            | Endpoint::CountTokens
            | Endpoint::RetrieveResponse
            | Endpoint::CancelResponse => Vec::new(),
        };
        if found.len() != self.batch {
            return Err(GatewayError::Internal(format!(
                "parsed {} prompts for a batch of {}",
                found.len(),
                self.batch
            )));
        }
        Ok(found)
    }

    /// A score request's prompts (`query` and `items`, joined as SGLang joins them).
    pub fn score_prompts(&self) -> Result<ScorePrompts<'_>, GatewayError> {
        let item_first = match self.fields.get("item_first") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return Err(GatewayError::invalid(
                    "`item_first` must be a boolean",
                    Some("item_first"),
                ))
            }
        };
        pooling_view::score_prompts(self.raw.get("query"), self.raw.get("items"), item_first)
    }

    /// The prompt, read from its raw JSON (None: a request without one, or one whose
    /// prompt is built from several fields: rerank and score).
    pub fn prompt_view(&self) -> Result<Option<PromptView<'_>>, GatewayError> {
        if matches!(
            self.endpoint,
            Endpoint::Rerank
                | Endpoint::Score
                | Endpoint::Tokenize
                | Endpoint::Detokenize
                | Endpoint::CountTokens
                | Endpoint::CreateResponse
                | Endpoint::RetrieveResponse
                | Endpoint::CancelResponse
        ) {
            return Ok(None);
        }
        let param = self.prompt_param();
        let Some(raw) = self.raw.get(param) else {
            return Ok(None);
        };
        Ok(Some(match self.endpoint {
            Endpoint::ChatCompletions | Endpoint::EngineMessages => {
                PromptView::Chat(prompt_view::messages(raw)?)
            }
            _ => PromptView::Samples(prompt_view::prompts(raw, param)?),
        }))
    }

    /// The JSON field that holds the prompt (the `param` of a refusal).
    pub fn prompt_param(&self) -> &'static str {
        match self.endpoint {
            Endpoint::ChatCompletions => "messages",
            Endpoint::Completions => "prompt",
            Endpoint::Generate if self.raw.contains("input_ids") => "input_ids",
            Endpoint::Embeddings => "input",
            Endpoint::Rerank => "documents",
            Endpoint::Score => "items",
            Endpoint::Tokenize if self.raw.contains("messages") => "messages",
            Endpoint::Tokenize => "prompt",
            Endpoint::Detokenize => "tokens",
            Endpoint::Messages | Endpoint::EngineMessages | Endpoint::CountTokens => "messages",
            Endpoint::CreateResponse | Endpoint::RetrieveResponse | Endpoint::CancelResponse => {
                "input"
            }
            Endpoint::Generate | Endpoint::ListModels | Endpoint::RetrieveModel => "text",
        }
    }

    /// The JSON field that holds the new-token allowance.
    pub fn max_tokens_param(&self) -> &'static str {
        match self.endpoint {
            Endpoint::Generate => "sampling_params",
            _ => "max_tokens",
        }
    }

    /// Whether the prompts are token ids (the engine's count must then match exactly).
    pub fn token_id_input(&self) -> bool {
        match self.endpoint {
            Endpoint::Generate => self.raw.contains("input_ids"),
            Endpoint::Completions => self
                .raw
                .get("prompt")
                .is_some_and(prompt_view::is_token_ids),
            Endpoint::Embeddings => self.raw.get("input").is_some_and(prompt_view::is_token_ids),
            Endpoint::Score => self.raw.get("items").is_some_and(prompt_view::is_token_ids),
            _ => false,
        }
    }

    /// The client's own `stream_options` flag `key` (`include_usage`, ...).
    pub fn client_stream_option(&self, key: &str) -> bool {
        self.fields
            .get("stream_options")
            .and_then(|o| o.get(key))
            .and_then(Value::as_bool)
            .unwrap_or(false)
    }

    /// How many sequences each prompt generates (`n`, `best_of`, `sampling_params.n`): every
    /// one needs its own new tokens in the decode KV pool and in the token budget.
    pub fn fanout(&self) -> Result<u64, GatewayError> {
        let read = |v: Option<&Value>, name: &str| match v {
            None | Some(Value::Null) => Ok(1),
            Some(v) => v
                .as_u64()
                .filter(|n| (1..=MAX_FANOUT).contains(n))
                .ok_or_else(|| {
                    GatewayError::invalid(
                        format!("`{name}` must be an integer from 1 to {MAX_FANOUT}"),
                        Some(name),
                    )
                }),
        };
        let body = &self.fields;
        match self.endpoint {
            Endpoint::ChatCompletions => read(body.get("n"), "n"),
            Endpoint::Completions => {
                Ok(read(body.get("n"), "n")?.max(read(body.get("best_of"), "best_of")?))
            }
            Endpoint::Generate => match body.get("sampling_params") {
                Some(Value::Object(p)) => read(p.get("n"), "n"),
                Some(Value::Array(items)) => items
                    .iter()
                    .map(|p| read(p.get("n"), "n"))
                    .try_fold(1, |most, n| n.map(|n| most.max(n))),
                _ => Ok(1),
            },
            _ => Ok(1),
        }
    }

    /// The client's requested new tokens for sample `i` (None: not given); prefill-only
    /// requests generate none.
    pub fn requested_max_new(&self, i: usize) -> Result<Option<u64>, GatewayError> {
        let body = &self.fields;
        match self.endpoint {
            Endpoint::Embeddings | Endpoint::Rerank | Endpoint::Score => Ok(Some(0)),
            // SGLang generates at most `max_output_tokens - 2` (`to_sampling_params`): the
            // field itself bounds it.
            Endpoint::CreateResponse => {
                max_tokens_field(body.get("max_output_tokens"), "max_output_tokens")
            }
            Endpoint::ChatCompletions | Endpoint::EngineMessages => {
                match max_tokens_field(body.get("max_completion_tokens"), "max_completion_tokens")?
                {
                    Some(v) => Ok(Some(v)),
                    None => max_tokens_field(body.get("max_tokens"), "max_tokens"),
                }
            }
            Endpoint::Completions => max_tokens_field(body.get("max_tokens"), "max_tokens"),
            Endpoint::Generate => match body.get("sampling_params") {
                None | Some(Value::Null) => Ok(None),
                Some(Value::Object(p)) => {
                    max_tokens_field(p.get("max_new_tokens"), "max_new_tokens")
                }
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
            Endpoint::ListModels
            | Endpoint::RetrieveModel
            | Endpoint::Tokenize
            | Endpoint::Detokenize
            | Endpoint::Messages
            | Endpoint::CountTokens
            | Endpoint::RetrieveResponse
            | Endpoint::CancelResponse => Ok(None),
        }
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
