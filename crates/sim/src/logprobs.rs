//! Made-up but deterministic logprobs of generated tokens, in the shapes SGLang answers:
//! chat's `{"content": [{token, logprob, bytes, top_logprobs}]}` and completions'
//! `{tokens, token_logprobs, top_logprobs, text_offset}`.
//!
//! The sim decodes greedily, so each chosen token is the likeliest: its logprob (in
//! `(-0.2, 0]`) heads its `top_logprobs`, and the other alternatives — other tokens of the
//! vocabulary, picked from the chosen id and position — follow, each less likely than the
//! one before. Token texts are single-token decodes with special tokens kept, as SGLang's
//! `return_text_in_logprobs` gives them.

use std::ops::Range;

use serde_json::{json, Map, Value};

use kvgate_tokenize::ModelTokenizer;

/// One generated token's logprobs.
#[derive(Clone, Debug)]
pub(crate) struct Entry {
    pub(crate) token: String,
    pub(crate) logprob: f64,
    /// The likeliest tokens at its position, most likely first; the chosen one first of all.
    pub(crate) top: Vec<(String, f64)>,
    /// Characters of the answer's text before this token.
    pub(crate) offset: usize,
}

/// splitmix64: a fixed, well-spread hash of a token and its position.
fn mix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    x ^ (x >> 31)
}

fn token_text(tokenizer: &ModelTokenizer, id: u32) -> String {
    tokenizer.decode(&[id], false).unwrap_or_default()
}

/// A number in `[0, 1)` from a hash, in steps of 0.0001.
fn unit(h: u64) -> f64 {
    (h % 10_000) as f64 / 10_000.0
}

/// `x` to four decimals, so logprobs read as an engine's do.
fn round(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

/// The logprobs of `ids` (generated in this order), with `k` alternatives each.
pub(crate) fn entries(tokenizer: &ModelTokenizer, ids: &[u32], k: usize) -> Vec<Entry> {
    let vocab = u64::try_from(tokenizer.vocab_size())
        .unwrap_or(u64::MAX)
        .max(2);
    let mut offset = 0;
    ids.iter()
        .enumerate()
        .map(|(pos, &id)| {
            let token = token_text(tokenizer, id);
            let h = mix(u64::from(id) ^ ((pos as u64) << 32));
            let logprob = round(-0.2 * unit(h));
            let mut top = Vec::with_capacity(k);
            if k > 0 {
                top.push((token.clone(), logprob));
            }
            let mut seen = vec![token.clone()];
            let mut last = logprob;
            let mut probe = h;
            // Distinct, non-empty texts; a bounded number of tries per alternative.
            for _ in 0..k.saturating_sub(1) * 4 {
                if top.len() >= k {
                    break;
                }
                probe = mix(probe);
                let alt = u32::try_from(probe % vocab).unwrap_or(0);
                let text = token_text(tokenizer, alt);
                if text.is_empty() || seen.contains(&text) {
                    continue;
                }
                last = round(last - 0.75 - unit(mix(probe)));
                seen.push(text.clone());
                top.push((text, last));
            }
            let entry = Entry {
                offset,
                token,
                logprob,
                top,
            };
            offset += entry.token.chars().count();
            entry
        })
        .collect()
}

fn bytes(text: &str) -> Value {
    Value::from(text.as_bytes().to_vec())
}

/// Chat's `logprobs` of the tokens in `range` of `entries`.
pub(crate) fn chat(entries: &[Entry], range: Range<usize>) -> Value {
    let content: Vec<Value> = entries
        .get(range)
        .unwrap_or_default()
        .iter()
        .map(|e| {
            let top: Vec<Value> = e
                .top
                .iter()
                .map(|(t, lp)| json!({"token": t, "logprob": lp, "bytes": bytes(t)}))
                .collect();
            json!({"token": e.token, "logprob": e.logprob, "bytes": bytes(&e.token), "top_logprobs": top})
        })
        .collect();
    json!({ "content": content })
}

/// Completions' `logprobs` of the tokens in `range` of `entries`; `k` 0 gives no
/// alternatives (`null` per token), as SGLang does.
pub(crate) fn completion(entries: &[Entry], range: Range<usize>, k: usize) -> Value {
    let slice = entries.get(range).unwrap_or_default();
    let top: Vec<Value> = slice
        .iter()
        .map(|e| {
            if k == 0 {
                return Value::Null;
            }
            let map: Map<String, Value> =
                e.top.iter().map(|(t, lp)| (t.clone(), json!(lp))).collect();
            Value::Object(map)
        })
        .collect();
    json!({
        "tokens": slice.iter().map(|e| e.token.clone()).collect::<Vec<_>>(),
        "token_logprobs": slice.iter().map(|e| e.logprob).collect::<Vec<_>>(),
        "top_logprobs": top,
        "text_offset": slice.iter().map(|e| e.offset).collect::<Vec<_>>(),
    })
}
