//! `POST /v1/score`, in SGLang's shapes (sglang 0.5.23), for the sim's generation
//! (CausalLM) model.
//!
//! - The request: `ScoringRequest` (`protocol.py`): `query` (text or token ids), `items`
//!   (a text, a list of texts or a list of id lists), `label_token_ids` (one list for every
//!   item, or one list per item), `apply_softmax`, `temperature` (> 0), `item_first`,
//!   `return_token_logprobs`, `model` (echoed; default `"default"`).
//! - Its checks and prompts: `TokenizerManagerScoreMixin.score_request`
//!   (`tokenizer_manager_score_mixin.py`), in its order: the temperature, the labels
//!   (required for a CausalLM model; non-empty, one list per item, non-negative, no
//!   duplicates, within the vocabulary), then the prompts — text query and items joined as
//!   text (`f"{query}{item}"`, or item first), encoded with special tokens as a
//!   `GenerateReqInput`'s text is; id query and id items concatenated. A text query with id
//!   items formats each id list as Python text, as that f-string does. Each prompt is then
//!   checked against the context (`_validate_one_request`) and prefilled with
//!   `max_new_tokens = 0` (`pooling.rs`).
//! - The answer: `ScoringResponse` (`serving_score.py`): `scores` (one row per item, a
//!   probability per label: `exp(logprob)`, or the softmax over the labels with
//!   `apply_softmax` and `temperature`: `_convert_logprobs_to_scores`), `token_logprobs`
//!   with `return_token_logprobs`, `pooled_hidden_states: null`, `model`, `usage`
//!   (`prompt_tokens == total_tokens`, the prompts' sum), `object: "scoring"`.
//!
//! The label log-probabilities are made up but deterministic: a function of the prompt's
//! KV and the label. `score_extraction_token`, embedding overrides and `--enable-mis` are
//! not served. The vocabulary bound is the tokenizer's size with its added tokens (HF's
//! `vocab_size` leaves those out).

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};

use super::embeddings::usage;
use super::engine::SimEngine;
use super::errors::{bad_request, kind, validation};
use super::fields::{self, RouteBody};
use super::listen::{json_response, Body, ResetConnection};
use super::pooling::{encode_texts, mix, over_context, prefilled, unified_only, unit};

/// The prompts to score, before tokenizing.
enum Prompts {
    Texts(Vec<String>),
    Ids(Vec<Vec<u32>>),
}

/// A checked score request.
struct Score {
    prompts: Prompts,
    labels: Vec<Vec<u32>>,
    softmax: bool,
    temperature: f64,
    token_logprobs: bool,
    model: String,
}

/// `POST /v1/score`.
pub(crate) async fn handle(
    engine: &Arc<SimEngine>,
    body: RouteBody,
) -> Result<Response<Body>, ResetConnection> {
    let body = match body.object() {
        Ok(body) => body,
        Err(message) => return Ok(validation(&message)),
    };
    let score = match checked(&body, engine.tokenizer.vocab_size()) {
        Ok(Ok(Some(score))) => score,
        Ok(Ok(None)) => {
            // No items: no prompt, no score.
            let model = fields::opt_str(&body, "model").ok().flatten();
            let logprobs = fields::flag(&body, "return_token_logprobs", false).unwrap_or(false);
            return Ok(answer(
                json!([]),
                logprobs.then(|| json!([])),
                model.unwrap_or("default"),
                0,
            ));
        }
        Ok(Err(message)) => return Ok(bad_request(&message)),
        Err(message) => return Ok(validation(&message)),
    };
    if let Some(refused) = unified_only(engine, "scoring").await? {
        return Ok(refused);
    }
    let inputs = match score.prompts {
        Prompts::Ids(ids) => ids,
        Prompts::Texts(texts) => match encode_texts(engine, texts).await {
            Ok(ids) => ids,
            Err(message) => return Ok(bad_request(&message)),
        },
    };
    if let Some(refused) = over_context(engine, &inputs) {
        return Ok(refused);
    }
    let batch = match prefilled(engine, inputs).await {
        Ok(batch) => batch,
        Err(response) => return Ok(response),
    };
    let mut rows = Vec::new();
    let mut logprob_rows = Vec::new();
    for (item, labels) in batch.items.iter().zip(&score.labels) {
        let logprobs: Vec<f64> = labels.iter().map(|&l| logprob(&item.kv, l)).collect();
        rows.push(probabilities(&logprobs, score.softmax, score.temperature));
        logprob_rows.push(logprobs);
    }
    let token_logprobs = score.token_logprobs.then(|| json!(logprob_rows));
    Ok(answer(
        json!(rows),
        token_logprobs,
        &score.model,
        batch.prompt_tokens(),
    ))
}

fn answer(
    scores: Value,
    token_logprobs: Option<Value>,
    model: &str,
    prompt: usize,
) -> Response<Body> {
    let body = json!({
        "scores": scores,
        "pooled_hidden_states": null,
        "token_logprobs": token_logprobs,
        "model": model,
        "usage": usage(prompt),
        "object": "scoring",
    });
    json_response(StatusCode::OK, &body)
}

/// The sim model's log-probability of `label` after a prompt whose KV is `kv`.
fn logprob(kv: &[u32], label: u32) -> f64 {
    let prompt = kv.iter().fold(0x5151_u64, |h, &t| mix(h ^ u64::from(t)));
    -0.1 - 6.0 * unit(prompt ^ (u64::from(label) << 32))
}

/// `_convert_logprobs_to_scores`: probabilities, or the softmax over the labels at
/// `temperature`.
fn probabilities(logprobs: &[f64], softmax: bool, temperature: f64) -> Vec<f64> {
    if !softmax {
        return logprobs.iter().map(|l| l.exp()).collect();
    }
    let max = logprobs.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = logprobs
        .iter()
        .map(|l| ((l - max) / temperature).exp())
        .collect();
    let sum: f64 = weights.iter().sum();
    weights.iter().map(|w| w / sum).collect()
}

/// Python's `str` of a list of ints (`[1, 2, 3]`).
fn py_list(ids: &[u32]) -> String {
    let inner: Vec<String> = ids.iter().map(u32::to_string).collect();
    format!("[{}]", inner.join(", "))
}

/// The request model's types (outer `Err`), then `score_request`'s checks (inner `Err`);
/// `Ok(Ok(None))`: no items, an empty answer.
fn checked(
    body: &Map<String, Value>,
    vocab: usize,
) -> Result<Result<Option<Score>, String>, String> {
    let model = fields::opt_str(body, "model")?
        .unwrap_or("default")
        .to_string();
    let softmax = fields::flag(body, "apply_softmax", false)?;
    let token_logprobs = fields::flag(body, "return_token_logprobs", false)?;
    let item_first = fields::flag(body, "item_first", false)?;
    let pooled = fields::flag(body, "return_pooled_hidden_states", false)?;
    let temperature = fields::opt_f64(body, "temperature")?.unwrap_or(1.0);
    if !(temperature.is_finite() && temperature > 0.0) {
        return Err("temperature: Input should be greater than 0".into());
    }
    let query = match fields::get(body, "query") {
        None => None,
        Some(Value::String(s)) => Some(Err(s.clone())),
        Some(v @ Value::Array(_)) => Some(Ok(fields::ids(v, "query")?)),
        Some(v) => {
            return Err(format!(
                "query: Input should be a valid string or list, got {}",
                kind(v)
            ))
        }
    };
    let items = fields::get(body, "items");
    if let Some(v) = items {
        if !v.is_string() && !v.is_array() {
            return Err(format!(
                "items: Input should be a valid string or list, got {}",
                kind(v)
            ));
        }
    }
    let labels = fields::get(body, "label_token_ids");
    let refuse = |m: String| Ok(Err(m));
    if fields::get(body, "score_extraction_token").is_some() {
        return refuse("The simulated engine does not serve score_extraction_token.".into());
    }
    if temperature != 1.0 && !softmax {
        return refuse("temperature requires apply_softmax=True".into());
    }
    let Some(labels) = labels else {
        return refuse("label_token_ids is required for generation (CausalLM) models.".into());
    };
    let Some(items) = items else {
        return refuse("items must be provided".into());
    };
    let num_items = match items {
        Value::String(s) if s.is_empty() => return Ok(Ok(None)),
        Value::Array(a) if a.is_empty() => return Ok(Ok(None)),
        Value::String(_) => 1,
        Value::Array(a) => a.len(),
        _ => 0,
    };
    let labels = match label_lists(labels, num_items, vocab)? {
        Ok(labels) => labels,
        Err(message) => return refuse(message),
    };
    if pooled {
        return refuse("return_pooled_hidden_states is not supported for CausalLM models. It requires a model with a task-specific head (e.g. SequenceClassification or RewardModel).".into());
    }
    let join = |a: &str, b: &str| {
        if item_first {
            format!("{b}{a}")
        } else {
            format!("{a}{b}")
        }
    };
    let prompts = match (query, items) {
        (None | Some(Err(_)), Value::String(item)) => {
            let query = match fields::get(body, "query") {
                Some(Value::String(q)) => q.as_str(),
                _ => "",
            };
            Prompts::Texts(vec![join(query, item)])
        }
        (Some(Err(query)), Value::Array(list)) => Prompts::Texts(
            list.iter()
                .enumerate()
                .map(|(i, item)| match item {
                    Value::String(s) => Ok(join(&query, s)),
                    ids => {
                        let ids = fields::ids(ids, &format!("items.{i}"))?;
                        Ok(join(
                            &query,
                            &py_list(&ids.into_iter().flatten().collect::<Vec<_>>()),
                        ))
                    }
                })
                .collect::<Result<_, String>>()?,
        ),
        (None, Value::Array(list)) if list.first().is_some_and(Value::is_string) => Prompts::Texts(
            list.iter()
                .map(|item| {
                    item.as_str()
                        .map(|s| join("", s))
                        .ok_or_else(|| "items: Input should be a valid list of strings".to_string())
                })
                .collect::<Result<_, _>>()?,
        ),
        (query, Value::Array(list)) if list.first().is_some_and(Value::is_array) => {
            let query: Vec<u32> = match query {
                Some(Ok(ids)) => ids.into_iter().flatten().collect(),
                _ => Vec::new(),
            };
            let mut prompts = Vec::with_capacity(list.len());
            for (i, item) in list.iter().enumerate() {
                let item: Vec<u32> = fields::ids(item, &format!("items.{i}"))?
                    .into_iter()
                    .flatten()
                    .collect();
                let (a, b) = if item_first {
                    (&item, &query)
                } else {
                    (&query, &item)
                };
                prompts.push(a.iter().chain(b.iter()).copied().collect());
            }
            Prompts::Ids(prompts)
        }
        _ => return refuse("Invalid combination of query/items types for score_request.".into()),
    };
    Ok(Ok(Some(Score {
        prompts,
        labels,
        softmax,
        temperature,
        token_logprobs,
        model,
    })))
}

/// `label_token_ids` as one list per item (outer `Err`: not a list of ints or of int
/// lists; inner `Err`: `score_request`'s refusals, in its order).
fn label_lists(
    labels: &Value,
    num_items: usize,
    vocab: usize,
) -> Result<Result<Vec<Vec<u32>>, String>, String> {
    let Some(list) = labels.as_array() else {
        return Err(format!(
            "label_token_ids: Input should be a valid list, got {}",
            kind(labels)
        ));
    };
    if list.is_empty() {
        return Ok(Err("label_token_ids must be a nonempty list".into()));
    }
    let lists: Vec<Vec<Option<u32>>> = if list.first().is_some_and(Value::is_array) {
        let lists = list
            .iter()
            .enumerate()
            .map(|(i, l)| fields::ids(l, &format!("label_token_ids.{i}")))
            .collect::<Result<Vec<_>, _>>()?;
        if lists.len() != num_items {
            return Ok(Err("label_token_ids must have one list per item".into()));
        }
        lists
    } else {
        vec![fields::ids(labels, "label_token_ids")?; num_items]
    };
    let mut out = Vec::with_capacity(lists.len());
    for labels in lists {
        if labels.is_empty() {
            return Ok(Err("each item must have a nonempty candidate list".into()));
        }
        let Some(labels) = labels.into_iter().collect::<Option<Vec<u32>>>() else {
            return Ok(Err(
                "label_token_ids must contain nonnegative integers".into()
            ));
        };
        let mut seen = std::collections::HashSet::new();
        if !labels.iter().all(|l| seen.insert(*l)) {
            return Ok(Err(
                "label_token_ids must not contain duplicate tokens".into()
            ));
        }
        if let Some(id) = labels.iter().find(|&&l| l as usize >= vocab) {
            return Ok(Err(format!(
                "Token ID {id} is out of vocabulary (vocab size: {vocab})"
            )));
        }
        out.push(labels);
    }
    Ok(Ok(out))
}
