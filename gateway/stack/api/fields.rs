//! Which client fields reach an engine — the one list, per endpoint.
//!
//! Today every field a client sends passes on, except those the gateway owns:
//!
//! | field | endpoints | what the engine gets |
//! |---|---|---|
//! | `model` | chat, completions | the pool's served name (dispatch) |
//! | `model` | `/generate` | nothing (SGLang's `GenerateReqInput` has no `model`) |
//! | `cache_salt`, `extra_key`, `prompt_cache_key` | all, also inside `sampling_params` (object or list) and `extra_body` | dropped; the tenant's own `cache_salt` where the pool takes one (isolation, I5) |
//! | `max_tokens` / `sampling_params.max_new_tokens` | all | the client's value; when absent, the default admission assumed (model default or tenant cap) |
//! | `stream_options.include_usage`, `.continuous_usage_stats` | chat, completions | set when the guard asks for usage; stripped from the answer when the client did not |
//! | `bootstrap_host`, `bootstrap_port`, `bootstrap_room` | all, PD pools | set by dispatch for the chosen prefill worker |
//!
//! Everything else is forwarded unchanged and in the client's order. Narrowing this to an
//! explicit allowlist of passthrough fields happens here, and only here.

use serde_json::{Map, Value};

use super::Endpoint;

/// Fields that select a prefix-cache partition (vLLM `cache_salt`, SGLang `extra_key`,
/// OpenAI `prompt_cache_key`). Only the gateway may set them.
pub const CACHE_KEY_FIELDS: [&str; 3] = ["cache_salt", "extra_key", "prompt_cache_key"];

/// Nested objects some clients and engine versions read request options from: SGLang's
/// `sampling_params` (an object, or a list of them for batches) and a literal `extra_body`
/// sent by clients that do not flatten it.
pub const NESTED_OPTION_FIELDS: [&str; 2] = ["sampling_params", "extra_body"];

/// The client's fields that may reach the engine for `endpoint`: `fields` minus every field
/// the gateway owns (see the table above). The gateway's own values are added by dispatch.
pub fn passthrough(endpoint: Endpoint, mut fields: Map<String, Value>) -> Map<String, Value> {
    if endpoint == Endpoint::Generate {
        fields.shift_remove("model");
    }
    strip_cache_keys(&mut fields);
    for field in NESTED_OPTION_FIELDS {
        match fields.get_mut(field) {
            Some(Value::Object(nested)) => strip_cache_keys(nested),
            Some(Value::Array(items)) => items
                .iter_mut()
                .filter_map(Value::as_object_mut)
                .for_each(strip_cache_keys),
            _ => {}
        }
    }
    fields
}

fn strip_cache_keys(map: &mut Map<String, Value>) {
    for field in CACHE_KEY_FIELDS {
        // `shift_remove` keeps the order of the remaining fields (serde_json
        // `preserve_order`), so the engine sees the client's body otherwise unchanged.
        map.shift_remove(field);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn object(value: Value) -> Map<String, Value> {
        match value {
            Value::Object(map) => map,
            other => panic!("not an object: {other}"),
        }
    }

    #[test]
    fn forged_client_salts_never_survive() {
        let body = passthrough(
            Endpoint::ChatCompletions,
            object(json!({
                "model": "qwen3",
                "cache_salt": "victim-salt",
                "extra_key": ["a", "b"],
                "prompt_cache_key": "shared",
                "sampling_params": {"max_new_tokens": 4, "cache_salt": "x", "extra_key": "y"},
                "extra_body": {"cache_salt": "z", "top_k": 5},
            })),
        );
        for field in CACHE_KEY_FIELDS {
            assert!(!body.contains_key(field), "{field} survived");
        }
        assert_eq!(body["sampling_params"], json!({"max_new_tokens": 4}));
        assert_eq!(body["extra_body"], json!({"top_k": 5}));
        assert_eq!(body["model"], json!("qwen3"));
    }

    #[test]
    fn batch_sampling_params_are_stripped_and_generate_loses_model() {
        let body = passthrough(
            Endpoint::Generate,
            object(json!({
                "model": "qwen3",
                "text": ["a", "b"],
                "sampling_params": [{"extra_key": "x", "temperature": 0}, {}, 3],
            })),
        );
        assert_eq!(body["sampling_params"], json!([{"temperature": 0}, {}, 3]));
        assert!(!body.contains_key("model"));
    }

    #[test]
    fn other_fields_keep_their_order() {
        let body = passthrough(
            Endpoint::Completions,
            object(json!({"a": 1, "cache_salt": "f", "b": 2, "c": 3})),
        );
        let keys: Vec<&str> = body.keys().map(String::as_str).collect();
        assert_eq!(keys, ["a", "b", "c"]);
    }
}
