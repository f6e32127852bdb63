//! `POST /tokenize` and `POST /detokenize` (also under `/v1/`), in SGLang's shapes
//! (sglang 0.5.23, `serving_tokenize.py`).
//!
//! - `/tokenize`: `TokenizeRequest` (`protocol.py`): exactly one of `prompt` (a string or a
//!   list of strings, encoded with `add_special_tokens`, default true) and `messages`
//!   (rendered as for a chat completion: `OpenAIServingTokenize._tokenize_chat_request`,
//!   here through the same chat preparation as `/v1/chat/completions`). The answer is
//!   `TokenizeResponse`: `tokens` (a list, or a list of lists for a list of prompts),
//!   `count` (likewise), `max_model_len` (the tokenizer's `model_max_length`, else the
//!   context length: `_handle_non_streaming_request`).
//! - `/detokenize`: `DetokenizeRequest`: `tokens` (a list of ids or of id lists),
//!   `skip_special_tokens` (default true); the answer `{"text": ...}` likewise a string or
//!   a list (`OpenAIServingDetokenize._handle_non_streaming_request`, with its error
//!   messages).
//!
//! Neither touches the scheduler, so the engine's faults do not reach them (SGLang answers
//! them in its HTTP process). `add_generation_prompt` with `messages` (a render "as given")
//! is not served: 400.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};

use super::engine::SimEngine;
use super::errors::{bad_request, serving_error, validation};
use super::fields::{self, RouteBody};
use super::listen::{json_response, Body};
use super::run;
use kvgate_tokenize::ChatRequest;

/// What `/tokenize` is asked to encode.
enum Prompt {
    One(String),
    Many(Vec<String>),
    Chat(Map<String, Value>),
}

/// `POST /tokenize`.
pub(crate) async fn tokenize(engine: &Arc<SimEngine>, body: RouteBody) -> Response<Body> {
    let body = match body.object() {
        Ok(body) => body,
        Err(message) => return validation(&message),
    };
    let (prompt, add_special_tokens) = match request(&body) {
        Ok(Ok(request)) => request,
        Ok(Err(message)) => return bad_request(&message),
        Err(message) => return validation(&message),
    };
    let config = &engine.config;
    let max_model_len = config.model_max_length.unwrap_or(config.context_length);
    let rules = config.chat_rules;
    let tokenizer = Arc::clone(&engine.tokenizer);
    let encoded = run::off_thread(move || -> Result<Value, String> {
        let encode = |text: &str| {
            tokenizer
                .encode(text, add_special_tokens)
                .map_err(|e| e.to_string())
        };
        Ok(match prompt {
            Prompt::One(text) => {
                let ids = encode(&text)?;
                json!({"tokens": ids, "count": ids.len()})
            }
            Prompt::Many(texts) => {
                let lists = texts
                    .iter()
                    .map(|t| encode(t))
                    .collect::<Result<Vec<_>, _>>()?;
                let counts: Vec<usize> = lists.iter().map(Vec::len).collect();
                json!({"tokens": lists, "count": counts})
            }
            Prompt::Chat(chat) => {
                let request = ChatRequest::from_body(&chat)
                    .ok_or_else(|| "messages must be a list of message objects".to_string())?;
                let prompt = tokenizer
                    .chat_prompt(rules, &request)
                    .map_err(|e| e.to_string())?;
                let ids = tokenizer
                    .chat_prompt_ids(&prompt)
                    .map_err(|e| e.to_string())?;
                json!({"tokens": ids, "count": ids.len()})
            }
        })
    })
    .await;
    match encoded {
        Some(Ok(mut answer)) => {
            if let Some(map) = answer.as_object_mut() {
                map.insert("max_model_len".into(), json!(max_model_len));
            }
            json_response(StatusCode::OK, &answer)
        }
        // `_handle_non_streaming_request` answers a `ValueError` with a 400.
        Some(Err(message)) => bad_request(&message),
        None => serving_error(
            "Internal server error during tokenization: tokenizer task failed",
            "InternalServerError",
            500,
        ),
    }
}

/// The request model's checks (outer `Err`), then what the sim does not serve (inner).
fn request(body: &Map<String, Value>) -> Result<Result<(Prompt, bool), String>, String> {
    fields::opt_str(body, "model")?;
    let add_special_tokens = fields::flag(body, "add_special_tokens", true)?;
    fields::flag(body, "continue_final_message", false)?;
    fields::opt_object(body, "chat_template_kwargs")?;
    let add_generation_prompt = match fields::get(body, "add_generation_prompt") {
        None => None,
        Some(Value::Bool(b)) => Some(*b),
        Some(v) => {
            return Err(format!(
                "add_generation_prompt: Input should be a valid boolean, got {}",
                super::errors::kind(v)
            ))
        }
    };
    let prompt = match fields::get(body, "prompt") {
        None => None,
        Some(Value::String(s)) => Some(Prompt::One(s.clone())),
        Some(Value::Array(items)) => Some(Prompt::Many(
            items
                .iter()
                .enumerate()
                .map(|(i, t)| {
                    t.as_str().map(str::to_string).ok_or_else(|| {
                        format!(
                            "prompt.{i}: Input should be a valid string, got {}",
                            super::errors::kind(t)
                        )
                    })
                })
                .collect::<Result<_, _>>()?,
        )),
        Some(v) => {
            return Err(format!(
                "prompt: Input should be a valid string or list of strings, got {}",
                super::errors::kind(v)
            ))
        }
    };
    let messages = match fields::get(body, "messages") {
        None => None,
        Some(Value::Array(_)) => Some(()),
        Some(v) => {
            return Err(format!(
                "messages: Input should be a valid list, got {}",
                super::errors::kind(v)
            ))
        }
    };
    match (prompt, messages) {
        (Some(prompt), None) => Ok(Ok((prompt, add_special_tokens))),
        (None, Some(())) if add_generation_prompt.is_some() => Ok(Err(
            "The simulated engine does not render messages with add_generation_prompt on /tokenize."
                .into(),
        )),
        (None, Some(())) => {
            let mut chat = body.clone();
            chat.remove("prompt");
            chat.remove("add_special_tokens");
            Ok(Ok((Prompt::Chat(chat), add_special_tokens)))
        }
        _ => Err("Value error, Exactly one of 'prompt' or 'messages' must be provided.".into()),
    }
}

/// `POST /detokenize`.
pub(crate) fn detokenize(engine: &SimEngine, body: RouteBody) -> Response<Body> {
    let body = match body.object() {
        Ok(body) => body,
        Err(message) => return validation(&message),
    };
    let checked = (|| -> Result<(Value, bool), String> {
        fields::opt_str(&body, "model")?;
        let skip = fields::flag(&body, "skip_special_tokens", true)?;
        let tokens = fields::required(&body, "tokens")?;
        if !tokens.is_array() {
            return Err(format!(
                "tokens: Input should be a valid list, got {}",
                super::errors::kind(tokens)
            ));
        }
        Ok((tokens.clone(), skip))
    })();
    let (tokens, skip) = match checked {
        Ok(checked) => checked,
        Err(message) => return validation(&message),
    };
    let list = tokens.as_array().map(Vec::as_slice).unwrap_or_default();
    let decode = |ids: &Value, name: &str| -> Result<String, Box<Response<Body>>> {
        let ids = fields::ids(ids, name).map_err(|m| Box::new(validation(&m)))?;
        let Some(ids) = ids.into_iter().collect::<Option<Vec<u32>>>() else {
            // Python's int → unsigned conversion inside the tokenizer.
            return Err(Box::new(serving_error(
                "Internal server error during detokenization: can't convert negative int to unsigned",
                "InternalServerError",
                500,
            )));
        };
        engine.tokenizer.decode(&ids, skip).map_err(|e| {
            let e = e.to_string();
            Box::new(if e.to_lowercase().contains("decode") {
                serving_error(
                    &format!(
                        "Error decoding tokens: {e}. Input tokens might be invalid for the model."
                    ),
                    "DecodeError",
                    400,
                )
            } else {
                serving_error(
                    &format!("Internal server error during detokenization: {e}"),
                    "InternalServerError",
                    500,
                )
            })
        })
    };
    let text = match list.first() {
        None => Ok(json!("")),
        Some(Value::Array(_)) => list
            .iter()
            .enumerate()
            .map(|(i, ids)| decode(ids, &format!("tokens.{i}")))
            .collect::<Result<Vec<_>, _>>()
            .map(|texts| json!(texts)),
        Some(_) => decode(&tokens, "tokens").map(|text| json!(text)),
    };
    match text {
        Ok(text) => json_response(StatusCode::OK, &json!({"text": text})),
        Err(response) => *response,
    }
}
