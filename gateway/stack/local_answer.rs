//! `/tokenize`, `/detokenize` and Anthropic's `/v1/messages/count_tokens`, answered by kvgate from the model's own tokenizer in
//! SGLang's shapes (sglang 0.5.23 `serving_tokenize.py`), with no engine round trip.
//!
//! They sit below the rate limits (a tenant's requests per minute and concurrency hold
//! for them too; they hold no engine tokens) and above routing: no pool, worker or guard
//! is involved. What `/tokenize` answers for `messages` is exactly what admission counts
//! for the same chat on the model's first pool (its `chat_rules`), so a client can size a
//! request before sending it.
//!
//! - `/tokenize`: `prompt` (a string or a list of strings; `add_special_tokens`, default
//!   true) or `messages` (with `tools` and the template fields chat completions take) →
//!   `{"tokens", "count", "max_model_len"}` (lists for a list of prompts); `max_model_len`
//!   is the model's `context_window`.
//! - `/detokenize`: `tokens` (a list of ids or of id lists; `skip_special_tokens`, default
//!   true) → `{"text"}` (a list for a list of lists). An id outside the vocabulary is a 400.
//! - `/v1/messages/count_tokens`: `{"input_tokens"}`, the count admission gives the same
//!   `/v1/messages` request (its translation to a chat, prepared and rendered by the
//!   model's first pool's rules): what kvgate would send the engine.
//!
//! A vision model's chat with images is counted as admission counts it: each image read (its
//! header) under the model's pools' rules, its placeholder expanded to its tokens.

use bytes::Bytes;
use http::{Request, Response};
use serde_json::{json, Value};
use std::sync::Arc;

use crate::body::{self, BoxBody};
use crate::error::GatewayError;
use crate::fleet::CountRules;
use crate::stack::admission::{render_chat, render_chat_with_media, AdmissionState};
use crate::stack::api::prompt_view::{self, Prompts};
use crate::stack::api::{Endpoint, InferenceRequest};
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};
use crate::vision::{may_hold_images, ChatImages, ModelVision};
use kvgate_tokenize::{ChatPrompt, ModelTokenizer};

/// The local-answer stage.
#[derive(Debug, Clone)]
pub struct LocalAnswer {
    state: Arc<AdmissionState>,
}

impl LocalAnswer {
    /// Answer from the tokenizers (and pools) of `state`.
    pub fn layer(state: Arc<AdmissionState>) -> StageLayer<Self> {
        StageLayer::new(Self { state })
    }
}

impl Stage for LocalAnswer {
    fn handle(&self, request: Request<Bytes>, next: Next) -> StageFuture {
        let Some(parsed) = request
            .extensions()
            .get::<InferenceRequest>()
            .filter(|p| p.endpoint.is_local())
            .cloned()
        else {
            return next.oneshot(request);
        };
        let state = self.state.clone();
        Box::pin(async move {
            let model = state.models.get(&parsed.model).ok_or_else(|| {
                GatewayError::Internal(format!("no tokenizer loaded for `{}`", parsed.model))
            })?;
            let tokenizer = model.tokenizer.clone();
            let window = model.context_window;
            let pools = state.fleet.pools_of(&parsed.model);
            let rules = pools
                .first()
                .map_or(CountRules::default(), |p| p.count_rules());
            let names: Vec<&str> = pools.iter().map(|p| &*p.name).collect();
            let images = chat_images(model.vision.as_ref(), &parsed, &names).await?;
            // Tokenizing is CPU work: off the async threads, within admission's bound on
            // concurrent counts (a flood of huge bodies must not starve admission).
            let permit = match tokio::time::timeout(
                std::time::Duration::from_secs(10),
                state.permits.clone().acquire_owned(),
            )
            .await
            {
                Ok(Ok(permit)) => permit,
                _ => {
                    return Err(GatewayError::Overloaded {
                        ceiling: "token counting",
                    }
                    .into())
                }
            };
            let answer = tokio::task::spawn_blocking(move || {
                let _permit = permit;
                let images = images.as_ref();
                match parsed.endpoint {
                    Endpoint::Tokenize => tokenize(&tokenizer, &parsed, rules, window, images),
                    Endpoint::CountTokens => count_tokens(&tokenizer, &parsed, rules, images),
                    _ => detokenize(&tokenizer, &parsed),
                }
            })
            .await
            .map_err(|e| GatewayError::Internal(format!("tokenizer task failed: {e}")))??;
            Ok::<Response<BoxBody>, _>(body::json_response(answer.to_string()))
        })
    }
}

fn flag(parsed: &InferenceRequest, name: &str, default: bool) -> Result<bool, GatewayError> {
    match parsed.fields.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(Value::Bool(b)) => Ok(*b),
        Some(_) => Err(GatewayError::invalid(
            format!("`{name}` must be a boolean"),
            Some(name),
        )),
    }
}

fn tokenizing(e: kvgate_tokenize::TokenizeError) -> GatewayError {
    GatewayError::Internal(format!("tokenizing: {e}"))
}

/// The images of a vision model's chat, read (None for any other request).
async fn chat_images(
    vision: Option<&(Arc<ModelVision>, Option<u32>)>,
    parsed: &InferenceRequest,
    pools: &[&str],
) -> Result<Option<ChatImages>, GatewayError> {
    let (Some(vision), Some(raw)) = (vision, parsed.raw.get("messages")) else {
        return Ok(None);
    };
    if !may_hold_images(raw) {
        return Ok(None);
    }
    let messages: Value = serde_json::from_str(raw).map_err(|e| {
        GatewayError::invalid(
            format!("`messages` could not be read: {e}"),
            Some("messages"),
        )
    })?;
    ChatImages::read(vision, &parsed.model, messages, pools).await
}

/// The chat's prompt as admission counts it on a pool of `rules`: its images expanded.
fn chat_prompt(
    tokenizer: &ModelTokenizer,
    parsed: &InferenceRequest,
    rules: CountRules,
    messages: &str,
    images: Option<&ChatImages>,
) -> Result<ChatPrompt, GatewayError> {
    let tools = parsed.raw.get("tools").filter(|t| *t != "null");
    let Some(images) = images else {
        return render_chat(
            tokenizer,
            &parsed.model,
            rules.chat,
            messages,
            tools,
            &parsed.fields,
        );
    };
    let mut prepared = render_chat_with_media(
        tokenizer,
        &parsed.model,
        rules.chat,
        &images.messages,
        tools,
        &parsed.fields,
    )?;
    images.expand(&parsed.model, &mut prepared, rules.image_cap)?;
    Ok(prepared.prompt)
}

fn tokenize(
    tokenizer: &ModelTokenizer,
    parsed: &InferenceRequest,
    rules: CountRules,
    window: u64,
    images: Option<&ChatImages>,
) -> Result<Value, GatewayError> {
    let (tokens, count) = if let Some(messages) = parsed.raw.get("messages") {
        let prompt = chat_prompt(tokenizer, parsed, rules, messages, images)?;
        let ids = tokenizer.chat_prompt_ids(&prompt).map_err(tokenizing)?;
        let n = ids.len();
        (json!(ids), json!(n))
    } else {
        let specials = flag(parsed, "add_special_tokens", true)?;
        let raw = parsed.raw.get("prompt").unwrap_or("null");
        let encode = |t: &str| tokenizer.encode(t, specials).map_err(tokenizing);
        match prompt_view::prompts(raw, "prompt")? {
            Prompts::Texts(texts) if raw.starts_with('"') => {
                let ids = encode(texts.first().map_or("", |t| t.as_ref()))?;
                let n = ids.len();
                (json!(ids), json!(n))
            }
            Prompts::Texts(texts) => {
                let lists = texts
                    .iter()
                    .map(|t| encode(t))
                    .collect::<Result<Vec<_>, _>>()?;
                let counts: Vec<usize> = lists.iter().map(Vec::len).collect();
                (json!(lists), json!(counts))
            }
            Prompts::Ids(_) => {
                return Err(GatewayError::invalid(
                    "`prompt` must be a string or a list of strings",
                    Some("prompt"),
                ))
            }
        }
    };
    Ok(json!({"tokens": tokens, "count": count, "max_model_len": window}))
}

/// Anthropic's `count_tokens`: the prompt of the chat the request translates to, counted
/// exactly as admission counts a `/v1/messages` request with the same fields.
fn count_tokens(
    tokenizer: &ModelTokenizer,
    parsed: &InferenceRequest,
    rules: CountRules,
    images: Option<&ChatImages>,
) -> Result<Value, GatewayError> {
    let messages = parsed.raw.get("messages").unwrap_or("[]");
    let prompt = chat_prompt(tokenizer, parsed, rules, messages, images)?;
    let n = tokenizer.count_chat_prompt(&prompt).map_err(tokenizing)?;
    Ok(crate::anthropic::count_tokens_reply(n as u64))
}

fn detokenize(
    tokenizer: &ModelTokenizer,
    parsed: &InferenceRequest,
) -> Result<Value, GatewayError> {
    let skip = flag(parsed, "skip_special_tokens", true)?;
    let raw = parsed.raw.get("tokens").unwrap_or("[]");
    let vocab = tokenizer.vocab_size();
    let decode = |ids: &[u32]| -> Result<String, GatewayError> {
        if let Some(bad) = ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(GatewayError::invalid(
                format!("token id {bad} is outside this model's vocabulary of {vocab}"),
                Some("tokens"),
            ));
        }
        tokenizer.decode(ids, skip).map_err(|e| {
            GatewayError::invalid(
                format!("the tokens could not be decoded: {e}"),
                Some("tokens"),
            )
        })
    };
    if raw.trim() == "[]" {
        return Ok(json!({"text": ""}));
    }
    let text = match prompt_view::prompts(raw, "tokens")? {
        Prompts::Ids(lists) if prompt_view::is_nested_ids(raw) => json!(lists
            .iter()
            .map(|ids| decode(ids))
            .collect::<Result<Vec<_>, _>>()?),
        Prompts::Ids(lists) => json!(decode(lists.first().map_or(&[][..], Vec::as_slice))?),
        Prompts::Texts(_) => {
            return Err(GatewayError::invalid(
                "`tokens` must be a list of token ids or a list of token-id lists",
                Some("tokens"),
            ))
        }
    };
    Ok(json!({ "text": text }))
}
