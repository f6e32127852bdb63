//! What makes a prefill-only answer a false success: an embedding, rerank or score
//! answer that is an error inside a 2xx, an abort, a result missing for an input, or a
//! prompt count that disagrees with the gateway's.
//!
//! Shapes (sglang 0.5.23 `serving_embedding.py`, `serving_rerank.py`, `serving_score.py`;
//! vLLM's `/v1/embeddings` answers the OpenAI shape too):
//! - embeddings: `{"data": [{"embedding", "index"}...], "usage": {"prompt_tokens", ...}}`,
//!   one item per input;
//! - rerank: a list of `{"score", "index", "meta_info": {"finish_reason", "prompt_tokens"}}`,
//!   sorted by score and cut to `top_n`, so between one item and one per document;
//! - score: `{"scores": [[...]...], "usage": {"prompt_tokens", ...}}`, one row per item.

use serde_json::Value;

use super::{error_object, native_finish, Expectation, Trip};

/// Which prefill-only answer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PoolingShape {
    Embeddings,
    Rerank,
    Score,
}

/// The I1 checks of a prefill-only answer to a request of `batch` inputs.
pub fn check_pooling(
    shape: PoolingShape,
    body: &[u8],
    batch: usize,
    expect: &Expectation,
) -> Result<(), Trip> {
    let Ok(v) = serde_json::from_slice::<Value>(body) else {
        return Err(Trip::EmptyResult {
            detail: "the answer is not JSON",
        });
    };
    if let Some(trip) = error_object(&v) {
        return Err(trip);
    }
    let missing = |detail| Err(Trip::EmptyResult { detail });
    match shape {
        PoolingShape::Embeddings => {
            let Some(data) = v.get("data").and_then(Value::as_array) else {
                return missing("the answer has no data");
            };
            if data.len() != batch {
                return missing("the answer has not one embedding per input");
            }
            let empty = |e: &Value| match e.get("embedding") {
                Some(Value::Array(x)) => x.is_empty(),
                Some(Value::String(s)) => s.is_empty(),
                _ => true,
            };
            if data.iter().any(empty) {
                return missing("an embedding is empty");
            }
            let mut seen = vec![false; batch];
            for item in data {
                match item
                    .get("index")
                    .and_then(Value::as_u64)
                    .map(|i| i as usize)
                {
                    Some(i) if i < batch && !seen[i] => seen[i] = true,
                    _ => return missing("the embeddings do not name each input once"),
                }
            }
            expect.check_prompt_tokens(None, usage_prompt_tokens(&v))
        }
        PoolingShape::Rerank => {
            let Some(items) = v.as_array() else {
                return missing("the answer is not a list of results");
            };
            if items.is_empty() || items.len() > batch {
                return missing("the answer has no result, or more results than documents");
            }
            let mut seen = vec![false; batch];
            for item in items {
                if let Some(trip) = error_object(item) {
                    return Err(trip);
                }
                let index = item.get("index").and_then(Value::as_u64);
                let score = item.get("score").and_then(Value::as_f64);
                let (Some(index), Some(score)) = (index, score) else {
                    return missing("a result has no index or score");
                };
                if index as usize >= batch || seen[index as usize] || !score.is_finite() {
                    return missing(
                        "a result names no document or one named before, or its score is not a number",
                    );
                }
                seen[index as usize] = true;
                // SGLang's results carry their pair's finish and count.
                let Some(meta) = item.get("meta_info") else {
                    return missing("a result has no meta_info");
                };
                native_finish(meta.get("finish_reason").unwrap_or(&Value::Null))?;
                expect.check_prompt_tokens(
                    Some(index as usize),
                    meta.get("prompt_tokens").and_then(Value::as_u64),
                )?;
            }
            Ok(())
        }
        PoolingShape::Score => {
            let Some(scores) = v.get("scores").and_then(Value::as_array) else {
                return missing("the answer has no scores");
            };
            let empty_row = |r: &Value| r.as_array().is_none_or(|r| r.is_empty());
            if scores.len() != batch || scores.iter().any(empty_row) {
                return missing("the answer has not one score row per item");
            }
            expect.check_prompt_tokens(None, usage_prompt_tokens(&v))
        }
    }
}

/// The engine's usage of a prefill-only answer (prompt tokens: nothing is generated).
pub fn pooling_usage(shape: PoolingShape, body: &[u8]) -> Option<u64> {
    let v = serde_json::from_slice::<Value>(body).ok()?;
    match shape {
        PoolingShape::Embeddings | PoolingShape::Score => usage_prompt_tokens(&v),
        PoolingShape::Rerank => Some(
            v.as_array()?
                .iter()
                .filter_map(|i| i.get("meta_info")?.get("prompt_tokens")?.as_u64())
                .sum(),
        ),
    }
}

fn usage_prompt_tokens(v: &Value) -> Option<u64> {
    v.get("usage")?.get("prompt_tokens")?.as_u64()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;
    use std::sync::Arc;

    fn expect(counts: &[u64]) -> Expectation {
        Expectation {
            prompt_tokens: Some(Arc::from(counts)),
            tolerance: 0,
        }
    }

    fn check(shape: PoolingShape, v: Value, batch: usize, counts: &[u64]) -> Result<(), Trip> {
        check_pooling(shape, v.to_string().as_bytes(), batch, &expect(counts))
    }

    #[test]
    fn embeddings_need_one_vector_per_input_and_the_right_count() {
        let ok = json!({"data": [{"embedding": [0.1], "index": 0}, {"embedding": "AAAA", "index": 1}], "usage": {"prompt_tokens": 5, "total_tokens": 5}});
        assert!(check(PoolingShape::Embeddings, ok.clone(), 2, &[2, 3]).is_ok());
        assert_eq!(
            pooling_usage(PoolingShape::Embeddings, ok.to_string().as_bytes()),
            Some(5)
        );
        assert!(matches!(
            check(PoolingShape::Embeddings, ok.clone(), 2, &[2, 4]),
            Err(Trip::PromptTokens { .. })
        ));
        assert!(check(PoolingShape::Embeddings, ok, 3, &[1, 1, 3]).is_err());
        let error = json!({"object": "error", "message": "aborted", "code": 500});
        assert!(matches!(
            check(PoolingShape::Embeddings, error, 1, &[1]),
            Err(Trip::ErrorIn2xx { .. })
        ));
        let twice = json!({"data": [{"embedding": [0.1], "index": 0}, {"embedding": [0.2], "index": 0}], "usage": {"prompt_tokens": 5}});
        assert!(check(PoolingShape::Embeddings, twice, 2, &[2, 3]).is_err());
        let empty = json!({"data": [{"embedding": [], "index": 0}]});
        assert!(check(PoolingShape::Embeddings, empty, 1, &[1]).is_err());
    }

    #[test]
    fn rerank_results_name_documents_and_carry_their_counts() {
        let item = |i: u64, n: u64, finish: Value| json!({"score": 0.5, "index": i, "meta_info": {"finish_reason": finish, "prompt_tokens": n}});
        let stop = json!({"type": "length", "length": 0});
        let ok = json!([item(1, 7, stop.clone()), item(0, 4, stop.clone())]);
        assert!(check(PoolingShape::Rerank, ok.clone(), 2, &[4, 7]).is_ok());
        assert_eq!(
            pooling_usage(PoolingShape::Rerank, ok.to_string().as_bytes()),
            Some(11)
        );
        assert!(check(PoolingShape::Rerank, ok, 2, &[7, 4]).is_err());
        let aborted = json!([item(0, 4, json!({"type": "abort", "message": "x"}))]);
        assert!(matches!(
            check(PoolingShape::Rerank, aborted, 1, &[4]),
            Err(Trip::Aborted { .. })
        ));
        assert!(check(PoolingShape::Rerank, json!([]), 1, &[4]).is_err());
        let twice = json!([item(0, 4, stop.clone()), item(0, 4, stop.clone())]);
        assert!(check(PoolingShape::Rerank, twice, 2, &[4, 4]).is_err());
        assert!(check(
            PoolingShape::Rerank,
            json!([{"score": 0.5, "index": 0}]),
            1,
            &[4]
        )
        .is_err());
        assert!(check(PoolingShape::Rerank, json!([item(3, 4, stop)]), 1, &[4]).is_err());
    }

    #[test]
    fn score_needs_a_row_per_item() {
        let ok = json!({"scores": [[0.2], [0.9]], "usage": {"prompt_tokens": 6}});
        assert!(check(PoolingShape::Score, ok.clone(), 2, &[3, 3]).is_ok());
        assert!(check(PoolingShape::Score, ok, 1, &[6]).is_err());
        let empty = json!({"scores": [[], [0.1]], "usage": {"prompt_tokens": 6}});
        assert!(check(PoolingShape::Score, empty, 2, &[3, 3]).is_err());
        assert!(check(
            PoolingShape::Score,
            json!({"error": {"message": "x"}}),
            1,
            &[1]
        )
        .is_err());
    }
}
