//! The prompts of prefill-only requests, read from their raw JSON as SGLang builds them
//! (sglang 0.5.23):
//!
//! - `/v1/rerank`: one `[query, document]` pair per document, each side a string or a list
//!   of text parts joined with a space (`serving_rerank.py` `_extract_text_from_content`),
//!   tokenized as a text pair with special tokens on each side (the cross-encoder path,
//!   `_tokenize_texts` with `is_cross_encoder`).
//! - `/v1/score`: text query and text items joined as `f"{query}{item}"` (or item first),
//!   encoded with special tokens; token-id query and items concatenated
//!   (`tokenizer_manager_score_mixin.py` `score_request`). SGLang also accepts a text query
//!   with token-id items, formatting each id list as Python text into the prompt: kvgate
//!   refuses that mix (400), it is never what a client means.
//!
//! Image and video parts are refused: a prompt the gateway cannot count, it cannot admit.

use serde_json::value::RawValue;
use std::borrow::Cow;

use super::prompt_view::Text;
use crate::error::GatewayError;

/// A rerank request's query and documents.
#[derive(Debug)]
pub struct RerankPairs<'a> {
    pub query: Cow<'a, str>,
    pub documents: Vec<Cow<'a, str>>,
}

/// The prompts of a score request.
#[derive(Debug)]
pub enum ScorePrompts<'a> {
    /// One text per item: the query and the item, joined.
    Texts(Vec<Cow<'a, str>>),
    /// One id count per item: the query's ids and the item's.
    Ids(Vec<usize>),
}

impl ScorePrompts<'_> {
    /// The number of items.
    pub fn len(&self) -> usize {
        match self {
            ScorePrompts::Texts(t) => t.len(),
            ScorePrompts::Ids(n) => n.len(),
        }
    }

    /// Whether there are none (never, once checked).
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// `query` and `documents` of `/v1/rerank`.
pub fn rerank_pairs<'a>(
    query: Option<&'a str>,
    documents: Option<&'a str>,
) -> Result<RerankPairs<'a>, GatewayError> {
    let query = rerank_content(query.ok_or_else(|| required("query"))?, "query")?;
    let raw = documents.ok_or_else(|| required("documents"))?;
    let items: Vec<&'a RawValue> = serde_json::from_str(raw).map_err(|_| {
        GatewayError::invalid(
            "`documents` must be a list of strings or of content-part lists",
            Some("documents"),
        )
    })?;
    if items.is_empty() {
        return Err(GatewayError::invalid(
            "`documents` must not be empty",
            Some("documents"),
        ));
    }
    let documents = items
        .iter()
        .enumerate()
        .map(|(i, d)| rerank_content(d.get(), &format!("documents[{i}]")))
        .collect::<Result<_, _>>()?;
    Ok(RerankPairs { query, documents })
}

/// A rerank query or document: a string, or text parts joined with a space.
fn rerank_content<'a>(raw: &'a str, field: &str) -> Result<Cow<'a, str>, GatewayError> {
    if raw.starts_with('"') {
        let text: Text<'a> = serde_json::from_str(raw).map_err(|_| {
            GatewayError::invalid(format!("`{field}` must be a string"), Some(field))
        })?;
        return Ok(text.0);
    }
    let parts: Vec<serde_json::Map<String, serde_json::Value>> = serde_json::from_str(raw)
        .map_err(|_| {
            GatewayError::invalid(
                format!("`{field}` must be a string or a list of content parts"),
                Some(field),
            )
        })?;
    let mut texts = Vec::with_capacity(parts.len());
    for (i, part) in parts.iter().enumerate() {
        match (part.get("type").and_then(|t| t.as_str()), part.get("text")) {
            (Some("text"), Some(serde_json::Value::String(t))) => texts.push(t.as_str()),
            _ => return Err(GatewayError::UnsupportedParameter {
                reason:
                    "only text parts are admitted: the gateway cannot count image or video parts",
                param: format!("{field}[{i}]"),
            }),
        }
    }
    Ok(Cow::Owned(texts.join(" ")))
}

/// `query` and `items` of `/v1/score`; `item_first` puts the item before the query.
pub fn score_prompts<'a>(
    query: Option<&'a str>,
    items: Option<&'a str>,
    item_first: bool,
) -> Result<ScorePrompts<'a>, GatewayError> {
    let items = items.ok_or_else(|| required("items"))?;
    let join = |q: &str, item: &str| -> Cow<'a, str> {
        Cow::Owned(if item_first {
            format!("{item}{q}")
        } else {
            format!("{q}{item}")
        })
    };
    let bad_mix = || {
        GatewayError::invalid(
            "send `query` and `items` both as text or both as token ids",
            Some("items"),
        )
    };
    let query_ids: Option<usize> = match query {
        None | Some("null") => None,
        Some(q) if q.starts_with('"') => None,
        Some(q) => Some(
            serde_json::from_str::<Vec<u32>>(q)
                .map_err(|_| {
                    GatewayError::invalid(
                        "`query` must be a string or a list of token ids",
                        Some("query"),
                    )
                })?
                .len(),
        ),
    };
    let query_text: Cow<'a, str> = match query {
        Some(q) if q.starts_with('"') => serde_json::from_str::<Text<'a>>(q)
            .map(|t| t.0)
            .map_err(|_| GatewayError::invalid("`query` must be a string", Some("query")))?,
        _ => Cow::Borrowed(""),
    };
    if items.starts_with('"') {
        if query_ids.is_some() {
            return Err(bad_mix());
        }
        let item: Text<'a> = serde_json::from_str(items)
            .map_err(|_| GatewayError::invalid("`items` must be a string", Some("items")))?;
        return Ok(ScorePrompts::Texts(vec![join(&query_text, &item.0)]));
    }
    let list: Vec<&'a RawValue> = serde_json::from_str(items).map_err(|_| {
        GatewayError::invalid(
            "`items` must be a string, a list of strings or a list of token-id lists",
            Some("items"),
        )
    })?;
    if list.is_empty() {
        return Err(GatewayError::invalid(
            "`items` must not be empty",
            Some("items"),
        ));
    }
    if list[0].get().starts_with('"') {
        if query_ids.is_some() {
            return Err(bad_mix());
        }
        return list
            .iter()
            .enumerate()
            .map(|(i, item)| {
                serde_json::from_str::<Text<'a>>(item.get())
                    .map(|t| join(&query_text, &t.0))
                    .map_err(|_| {
                        GatewayError::invalid(
                            format!("`items[{i}]` must be a string"),
                            Some("items"),
                        )
                    })
            })
            .collect::<Result<_, _>>()
            .map(ScorePrompts::Texts);
    }
    if query.is_some_and(|q| q.starts_with('"')) {
        return Err(bad_mix());
    }
    list.iter()
        .enumerate()
        .map(|(i, item)| {
            serde_json::from_str::<Vec<u32>>(item.get())
                .map(|ids| ids.len() + query_ids.unwrap_or(0))
                .map_err(|_| {
                    GatewayError::invalid(
                        format!("`items[{i}]` must be a list of token ids"),
                        Some("items"),
                    )
                })
        })
        .collect::<Result<_, _>>()
        .map(ScorePrompts::Ids)
}

fn required(field: &str) -> GatewayError {
    GatewayError::invalid(format!("`{field}` is required"), Some(field))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rerank_reads_strings_and_text_parts() {
        let p = rerank_pairs(
            Some(r#""what is kv""#),
            Some(
                r#"["a cache", [{"type":"text","text":"pages"},{"type":"text","text":"of keys"}]]"#,
            ),
        )
        .unwrap();
        assert_eq!(p.query, "what is kv");
        assert_eq!(p.documents, ["a cache", "pages of keys"]);
        let image = r#"[[{"type":"image_url","image_url":{"url":"x"}}]]"#;
        assert!(matches!(
            rerank_pairs(Some(r#""q""#), Some(image)),
            Err(GatewayError::UnsupportedParameter { ref param, .. }) if param == "documents[0][0]"
        ));
        assert!(rerank_pairs(Some(r#""q""#), Some("[]")).is_err());
        assert!(rerank_pairs(None, Some(r#"["d"]"#)).is_err());
    }

    #[test]
    fn score_joins_text_and_concatenates_ids() {
        match score_prompts(Some(r#""Is it ""#), Some(r#"["red?", "blue?"]"#), false).unwrap() {
            ScorePrompts::Texts(t) => assert_eq!(t, ["Is it red?", "Is it blue?"]),
            other => panic!("{other:?}"),
        }
        match score_prompts(Some(r#""Q""#), Some(r#""I""#), true).unwrap() {
            ScorePrompts::Texts(t) => assert_eq!(t, ["IQ"]),
            other => panic!("{other:?}"),
        }
        match score_prompts(Some("[1,2]"), Some("[[3],[4,5,6]]"), false).unwrap() {
            ScorePrompts::Ids(n) => assert_eq!(n, [3, 5]),
            other => panic!("{other:?}"),
        }
        assert!(score_prompts(Some(r#""q""#), Some("[[1]]"), false).is_err());
        assert!(score_prompts(Some("[1]"), Some(r#"["a"]"#), false).is_err());
        assert!(score_prompts(Some(r#""q""#), Some("[]"), false).is_err());
        assert!(score_prompts(Some(r#""q""#), None, false).is_err());
    }
}
