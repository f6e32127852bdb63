//! `POST /v1/rerank` (and `PUT`), in SGLang's shapes (sglang 0.5.23).
//!
//! - The request: `V1RerankReqInput` (`protocol.py`): `query` and each of `documents` a
//!   string or a list of content parts, `instruct`, `top_n` (at least 1, its validator
//!   `validate_top_n`), `return_documents` (default true).
//! - Its checks: `OpenAIServingRerank._validate_request` (`serving_rerank.py`): an empty or
//!   blank query, no documents, an empty or blank document.
//! - The pairs: the sim's chat template is no Qwen3 reranker template, so SGLang takes the
//!   cross-encoder path (`_detect_rerank_backend` → `"cross_encoder"`): one
//!   `[query, document]` pair per document (`_convert_to_internal_request`; the text of
//!   content parts joined with a space, `_extract_text_from_content`), tokenized as a text
//!   pair with special tokens (`_tokenize_texts` with `is_cross_encoder`). A pair's ids are
//!   the query's then the document's, each with its special tokens, which is the pair
//!   template of the models kvgate ships (Qwen3 adds none, Llama-style BOS tokenizers one
//!   per sequence). Each pair is checked against the context and prefilled
//!   (`pooling.rs`).
//! - The answer: a list of `RerankResponse` (`_build_rerank_response`): `score`,
//!   `document` (only with `return_documents`), `index`, and the pair's `meta_info`
//!   (`id`, `finish_reason`, `prompt_tokens`, ...), sorted by score, highest first (ties
//!   keep the documents' order, as Python's stable sort and `heapq.nlargest` do), cut to
//!   `top_n`.
//!
//! The score is made up but deterministic and sensible: the share of the query's distinct
//! tokens that appear in the document, read from the pair's KV.

use std::collections::HashSet;
use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Map, Value};

use super::engine::SimEngine;
use super::errors::{bad_request, kind, validation};
use super::fields::{self, RouteBody};
use super::listen::{json_response, Body, ResetConnection};
use super::pooling::{meta_info, over_context, prefilled, unified_only};
use super::run;

/// A checked rerank request.
struct Rerank {
    query: String,
    documents: Vec<Value>,
    texts: Vec<String>,
    top_n: Option<usize>,
    return_documents: bool,
}

/// `POST /v1/rerank`.
pub(crate) async fn handle(
    engine: &Arc<SimEngine>,
    body: RouteBody,
) -> Result<Response<Body>, ResetConnection> {
    let body = match body.object() {
        Ok(body) => body,
        Err(message) => return Ok(validation(&message)),
    };
    let rerank = match checked(&body) {
        Ok(Ok(rerank)) => rerank,
        Ok(Err(message)) => return Ok(bad_request(&message)),
        Err(message) => return Ok(validation(&message)),
    };
    if let Some(refused) = unified_only(engine, "rerank").await? {
        return Ok(refused);
    }
    let tokenizer = Arc::clone(&engine.tokenizer);
    let query = rerank.query.clone();
    let texts = rerank.texts.clone();
    let encoded = run::off_thread(move || -> Result<(usize, Vec<Vec<u32>>), String> {
        let q = tokenizer.encode(&query, true).map_err(|e| e.to_string())?;
        let pairs = texts
            .iter()
            .map(|d| {
                let mut ids = q.clone();
                ids.extend(tokenizer.encode(d, true).map_err(|e| e.to_string())?);
                Ok(ids)
            })
            .collect::<Result<Vec<_>, String>>()?;
        Ok((q.len(), pairs))
    })
    .await;
    let (query_len, pairs) = match encoded {
        Some(Ok(encoded)) => encoded,
        Some(Err(message)) => return Ok(bad_request(&message)),
        None => return Ok(bad_request("tokenizer task failed")),
    };
    if let Some(refused) = over_context(engine, &pairs) {
        return Ok(refused);
    }
    let batch = match prefilled(engine, pairs).await {
        Ok(batch) => batch,
        Err(response) => return Ok(response),
    };
    let mut scored: Vec<(f64, Value)> = batch
        .items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            let (q, d) = item.kv.split_at(query_len.min(item.kv.len()));
            let score = relevance(q, d);
            let mut entry = json!({"score": score});
            if let Some(map) = entry.as_object_mut() {
                if rerank.return_documents {
                    let document = rerank.documents.get(index).cloned();
                    map.insert("document".into(), document.unwrap_or(Value::Null));
                }
                map.insert("index".into(), json!(index));
                map.insert("meta_info".into(), meta_info(item, batch.e2e));
            }
            (score, entry)
        })
        .collect();
    // Stable: equal scores keep the documents' order.
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    if let Some(n) = rerank.top_n {
        scored.truncate(n);
    }
    let list: Vec<Value> = scored.into_iter().map(|(_, entry)| entry).collect();
    Ok(json_response(StatusCode::OK, &Value::Array(list)))
}

/// The share of the query's distinct tokens found in the document.
fn relevance(query: &[u32], document: &[u32]) -> f64 {
    let wanted: HashSet<u32> = query.iter().copied().collect();
    if wanted.is_empty() {
        return 0.0;
    }
    let found: HashSet<u32> = document.iter().copied().collect();
    wanted.intersection(&found).count() as f64 / wanted.len() as f64
}

/// A rerank content's text: a string as it is, the text parts of a list joined by a space
/// (`_extract_text_from_content`). `Err`: not a `RerankContent`.
fn content_text(value: &Value, name: &str) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s.clone()),
        Value::Array(parts) => {
            let mut texts = Vec::new();
            for (i, part) in parts.iter().enumerate() {
                let Some(part) = part.as_object() else {
                    return Err(format!(
                        "{name}.{i}: Input should be a valid dictionary, got {}",
                        kind(part)
                    ));
                };
                match part.get("type").and_then(Value::as_str) {
                    Some("text") => texts.push(
                        part.get("text")
                            .and_then(Value::as_str)
                            .unwrap_or_default()
                            .to_string(),
                    ),
                    Some("image_url" | "video_url") => {}
                    _ => {
                        return Err(format!(
                            "{name}.{i}: Input tag does not match any of the expected tags: 'text', 'image_url', 'video_url'"
                        ))
                    }
                }
            }
            Ok(texts.join(" "))
        }
        other => Err(format!(
            "{name}: Input should be a valid string or list, got {}",
            kind(other)
        )),
    }
}

/// Python's truthiness of a content (`not doc`): an empty string or list is falsy.
fn is_empty(value: &Value) -> bool {
    match value {
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        _ => false,
    }
}

fn is_blank_text(value: &Value) -> bool {
    value.as_str().is_some_and(|s| s.trim().is_empty())
}

/// The request model's checks (outer `Err`), then `_validate_request`'s (inner `Err`).
fn checked(body: &Map<String, Value>) -> Result<Result<Rerank, String>, String> {
    let query_value = fields::required(body, "query")?;
    let query = content_text(query_value, "query")?;
    let documents = match fields::required(body, "documents")? {
        Value::Array(list) => list.clone(),
        other => {
            return Err(format!(
                "documents: Input should be a valid list, got {}",
                kind(other)
            ))
        }
    };
    let texts = documents
        .iter()
        .enumerate()
        .map(|(i, d)| content_text(d, &format!("documents.{i}")))
        .collect::<Result<Vec<_>, _>>()?;
    fields::opt_str(body, "instruct")?;
    let top_n = match fields::opt_int(body, "top_n")? {
        Some(n) if n < 1 => {
            return Err(
                "top_n: Value error, Value error, parameter top_n should be larger than 0.".into(),
            )
        }
        n => n.map(|n| usize::try_from(n).unwrap_or(usize::MAX)),
    };
    let return_documents = fields::flag(body, "return_documents", true)?;
    let refuse = |m: &str| Ok(Err(m.to_string()));
    if is_empty(query_value) {
        return refuse("Query cannot be empty");
    }
    if is_blank_text(query_value) {
        return refuse("Query cannot be empty or whitespace only");
    }
    if documents.is_empty() {
        return refuse("Documents cannot be empty");
    }
    for doc in &documents {
        if is_empty(doc) {
            return refuse("Each document must be a non-empty string");
        }
        if is_blank_text(doc) {
            return refuse("Each document cannot be empty or whitespace only");
        }
    }
    Ok(Ok(Rerank {
        query,
        documents,
        texts,
        top_n,
        return_documents,
    }))
}
