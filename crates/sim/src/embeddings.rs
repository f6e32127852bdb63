//! `POST /v1/embeddings`, in SGLang's shapes (sglang 0.5.23).
//!
//! - The request: `EmbeddingRequest` (`protocol.py`): `input` (a string, a list of
//!   strings, a list of token ids or a list of id lists), `model`, `encoding_format`
//!   (`"float"` or `"base64"`), `dimensions`, `user`, `rid`.
//! - Its checks, in SGLang's order: the request model's types, then
//!   `OpenAIServingEmbedding._validate_request` (`serving_embedding.py`: the format, an
//!   empty or blank input, negative ids), then per input the tokenizer manager's
//!   `_validate_one_request` (`tokenizer_manager.py`: the context length, then
//!   `_validate_for_matryoshka_dim`), then the scheduler's `max_req_input_len`.
//! - Tokenizing: `_tokenize_texts` (`tokenizer_manager.py`) calls the tokenizer with its
//!   defaults, so text is encoded with special tokens, as `/generate`'s text is; id lists
//!   are taken as they are.
//! - The answer: `EmbeddingResponse` of `_build_embedding_response`: `data[i] =
//!   {"embedding", "index", "object": "embedding"}`, `model` the model path, `object:
//!   "list"`, `usage` a `UsageInfo` with `prompt_tokens == total_tokens` (its other fields
//!   at their defaults, as FastAPI serializes the model). `base64` is
//!   `_serialize_embedding`'s little-endian float32 bytes.
//!
//! The vectors are made up but deterministic: the sim's model has 64 dimensions (its
//! `hidden_size`, and it takes any Matryoshka `dimensions` up to that), each token adds a
//! fixed pseudo-random vector, and the sum is L2-normalized after truncation. Texts that
//! share tokens point the same way. They are computed from the KV the prompt left in its
//! pages (`pooling.rs`), so a stale-KV fault shows as a wrong vector.
//!
//! Multimodal inputs (a list of `{text, image, video}`) are not served: 400.

use std::sync::Arc;

use hyper::Response;
use serde_json::{json, Map, Value};

use super::engine::SimEngine;
use super::errors::{bad_request, validation};
use super::fields::{self, RouteBody};
use super::listen::{json_response, Body, ResetConnection};
use super::pooling::{encode_texts, prefilled, unified_only, unit};

/// The sim model's embedding size (`hidden_size`).
pub(crate) const HIDDEN_SIZE: usize = 64;

/// What `input` holds, before tokenizing.
enum Input {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

/// `POST /v1/embeddings`.
pub(crate) async fn handle(
    engine: &Arc<SimEngine>,
    body: RouteBody,
) -> Result<Response<Body>, ResetConnection> {
    let body = match body.object() {
        Ok(body) => body,
        Err(message) => return Ok(validation(&message)),
    };
    let (input, format, dimensions) = match checked(&body) {
        Ok(Ok(checked)) => checked,
        Ok(Err(message)) => return Ok(bad_request(&message)),
        Err(message) => return Ok(validation(&message)),
    };
    if let Some(refused) = unified_only(engine, "embeddings").await? {
        return Ok(refused);
    }
    let inputs = match input {
        Input::Ids(ids) => ids,
        Input::Texts(texts) => match encode_texts(engine, texts).await {
            Ok(ids) => ids,
            Err(message) => return Ok(bad_request(&message)),
        },
    };
    if let Err(message) = tokenizer_manager_checks(engine, &inputs, dimensions) {
        return Ok(bad_request(&message));
    }
    let batch = match prefilled(engine, inputs).await {
        Ok(batch) => batch,
        Err(response) => return Ok(response),
    };
    let dims = dimensions.unwrap_or(HIDDEN_SIZE);
    let data: Vec<Value> = batch
        .items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let vector = embed(&item.kv, dims);
            let embedding = if format == "base64" {
                json!(base64_f32(&vector))
            } else {
                json!(vector.iter().map(|&x| f64::from(x)).collect::<Vec<_>>())
            };
            json!({"embedding": embedding, "index": index, "object": "embedding"})
        })
        .collect();
    let prompt = batch.prompt_tokens();
    let body = json!({
        "data": data,
        "model": engine.config.model,
        "object": "list",
        "usage": usage(prompt),
    });
    Ok(json_response(hyper::StatusCode::OK, &body))
}

/// A `UsageInfo` of a prefill-only answer, every field as SGLang serializes it.
pub(crate) fn usage(prompt_tokens: usize) -> Value {
    json!({
        "prompt_tokens": prompt_tokens,
        "total_tokens": prompt_tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": null,
        "reasoning_tokens": 0,
        "completion_tokens_details": null,
    })
}

type Checked = (Input, String, Option<usize>);

/// The request model's types (outer `Err`: a validation error), then
/// `_validate_request`'s checks (inner `Err`: a refused input).
fn checked(body: &Map<String, Value>) -> Result<Result<Checked, String>, String> {
    let input = fields::required(body, "input")?;
    fields::opt_str(body, "model")?;
    fields::opt_str(body, "user")?;
    let format = match body.get("encoding_format") {
        None => "float".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(v) => {
            return Err(format!(
                "encoding_format: Input should be a valid string, got {}",
                super::errors::kind(v)
            ))
        }
    };
    let dimensions = fields::opt_int(body, "dimensions")?;
    let input = typed_input(input)?;
    if format != "float" && format != "base64" {
        return Ok(Err(format!(
            "encoding_format must be either 'float' or 'base64', got {}",
            fields::py_repr(&format)
        )));
    }
    let input = match input {
        Ok(input) => input,
        Err(message) => return Ok(Err(message)),
    };
    // `_validate_for_matryoshka_dim` runs later, per input, after the length checks.
    let dimensions = dimensions.map(|d| usize::try_from(d).unwrap_or(0));
    Ok(Ok((input, format, dimensions)))
}

/// `input` as one of `EmbeddingInput`'s types (outer `Err`), then refused when empty,
/// blank or holding a negative id (inner `Err`).
fn typed_input(input: &Value) -> Result<Result<Input, String>, String> {
    let invalid = || {
        "input: Input should be a valid string, a list of strings, a list of integers or a list of lists of integers"
            .to_string()
    };
    match input {
        Value::String(s) if s.is_empty() => Ok(Err("Input cannot be empty".into())),
        Value::String(s) if s.trim().is_empty() => {
            Ok(Err("Input cannot be empty or whitespace only".into()))
        }
        Value::String(s) => Ok(Ok(Input::Texts(vec![s.clone()]))),
        Value::Array(items) if items.is_empty() => Ok(Err("Input cannot be empty".into())),
        Value::Array(items) => match items.first() {
            Some(Value::String(_)) => {
                let texts: Vec<String> = items
                    .iter()
                    .map(|t| t.as_str().map(str::to_string).ok_or_else(invalid))
                    .collect::<Result<_, _>>()?;
                if let Some(i) = texts.iter().position(|t| t.trim().is_empty()) {
                    return Ok(Err(format!(
                        "Input at index {i} cannot be empty or whitespace only"
                    )));
                }
                Ok(Ok(Input::Texts(texts)))
            }
            Some(Value::Number(_)) => {
                let ids = fields::ids(input, "input")?;
                if let Some(i) = ids.iter().position(Option::is_none) {
                    return Ok(Err(format!("Token ID at index {i} must be non-negative")));
                }
                Ok(Ok(Input::Ids(vec![ids.into_iter().flatten().collect()])))
            }
            Some(Value::Array(_)) => {
                let mut lists = Vec::with_capacity(items.len());
                for (i, item) in items.iter().enumerate() {
                    let ids = fields::ids(item, &format!("input.{i}"))?;
                    if ids.iter().any(Option::is_none) {
                        return Ok(Err(format!(
                            "Token IDs of input {i} must be non-negative integers"
                        )));
                    }
                    lists.push(ids.into_iter().flatten().collect());
                }
                Ok(Ok(Input::Ids(lists)))
            }
            Some(Value::Object(_)) => Ok(Err(
                "The simulated engine takes no multimodal embedding inputs.".into(),
            )),
            _ => Err(invalid()),
        },
        _ => Err(invalid()),
    }
}

/// `_validate_one_request` of each input: its length against the context, then the
/// Matryoshka `dimensions` (the sim's model takes any size up to its hidden size).
fn tokenizer_manager_checks(
    engine: &SimEngine,
    inputs: &[Vec<u32>],
    dimensions: Option<usize>,
) -> Result<(), String> {
    let context = engine.config.context_length;
    for input in inputs {
        let n = input.len();
        if n >= context {
            return Err(format!(
                "The input ({n} tokens) is longer than the model's context length ({context} tokens)."
            ));
        }
        match dimensions {
            Some(0) => return Err("Requested dimensions must be greater than 0".into()),
            Some(d) if d > HIDDEN_SIZE => {
                return Err(format!(
                    "Provided dimensions are greater than max embedding dimension: {HIDDEN_SIZE}"
                ))
            }
            _ => {}
        }
    }
    Ok(())
}

/// The sim model's embedding of a prompt's KV: the sum of each token's fixed vector, cut
/// to `dims` and L2-normalized (a zero vector stays zero).
pub(crate) fn embed(kv: &[u32], dims: usize) -> Vec<f32> {
    let mut sum = vec![0f64; HIDDEN_SIZE];
    for &token in kv {
        for (d, x) in sum.iter_mut().enumerate() {
            *x += unit((u64::from(token) << 8) | d as u64) * 2.0 - 1.0;
        }
    }
    sum.truncate(dims.min(HIDDEN_SIZE));
    let norm = sum.iter().map(|x| x * x).sum::<f64>().sqrt();
    sum.iter()
        .map(|x| if norm > 0.0 { (x / norm) as f32 } else { 0.0 })
        .collect()
}

/// Little-endian float32 bytes in standard base64 with padding (`_serialize_embedding`).
fn base64_f32(vector: &[f32]) -> String {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let bytes: Vec<u8> = vector.iter().flat_map(|x| x.to_le_bytes()).collect();
    let mut out = String::with_capacity(bytes.len().div_ceil(3) * 4);
    for chunk in bytes.chunks(3) {
        let b = [
            chunk.first().copied().unwrap_or(0),
            chunk.get(1).copied().unwrap_or(0),
            chunk.get(2).copied().unwrap_or(0),
        ];
        let n = (u32::from(b[0]) << 16) | (u32::from(b[1]) << 8) | u32::from(b[2]);
        for (k, shift) in [18u32, 12, 6, 0].into_iter().enumerate() {
            if k <= chunk.len() {
                out.push(char::from(ALPHABET[((n >> shift) & 63) as usize]));
            } else {
                out.push('=');
            }
        }
    }
    out
}
