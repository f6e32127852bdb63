//! Which client fields reach an engine: an explicit allowlist per endpoint, the one place
//! that decides it.
//!
//! A client field is either **passed** (listed below for its endpoint), **stripped**
//! (dropped without an error), or **refused** (400 `unsupported_parameter` naming it).
//! Anything not listed is refused: a new engine option reaches engines only once it is
//! added here.
//!
//! | field | what happens | why |
//! |---|---|---|
//! | OpenAI chat/completions standard fields, SGLang `/generate` `text`, `input_ids`, `sampling_params` (its keys: [`SAMPLING_PARAMS`]), `stream`, logprob options | passed | the request itself |
//! | `model` | replaced by the pool's served name (chat, completions); dropped on `/generate` | SGLang's `GenerateReqInput` has no `model` |
//! | `max_tokens` / `sampling_params.max_new_tokens` | passed; filled in when absent | the engine must not generate more than admission allowed |
//! | `stream_options` (`include_usage`, `continuous_usage_stats` only) | passed; usage also requested by the guard | the guard cross-checks prompt counts |
//! | `lora_path` | passed when it names adapters on the tenant's `lora_adapters` list (else 403) | adapters by name only: a path would load arbitrary weights |
//! | `cache_salt`, `extra_key`, `prompt_cache_key` | stripped; the tenant's own salt is set | the gateway owns the cache partition (I5); OpenAI SDKs send `prompt_cache_key` for OpenAI's own caching |
//! | `store`, `metadata`, `service_tier` | stripped | OpenAI platform features with no meaning to an engine; refusing them would break SDK defaults |
//! | `rid` | refused | the gateway generates every request id (a reused id can make SGLang refuse or confuse another tenant's request) |
//! | `bootstrap_host`, `bootstrap_port`, `bootstrap_room` | refused | set by dispatch for the chosen prefill worker only |
//! | `session_params`, `custom_logit_processor`, `custom_params`, `return_hidden_states`, `data_parallel_rank`, `priority`, `log_metrics` | refused | engine internals no tenant may steer |
//! | `input_embeds`, `image_data`, `audio_data`, `video_data`, `modalities` | refused | prompts the gateway cannot count, so cannot admit (I2) |
//! | `chat_template_kwargs`, `reasoning_effort`, `continue_final_message`, `add_generation_prompt`, `add_special_tokens` (chat) | passed | template variables and the final turn's handling: admission prepares the chat with them as the pool's engine does (`kvgate_tokenize::prepare`), so the count stays exact; a tenant may be denied template keys (`denied_chat_template_kwargs`) |
//! | `suffix`, `functions`, `function_call` | refused | they change the prompt the engine renders in ways the gateway does not model, so its count would be wrong |
//! | `extra_body` | refused | send its fields at the top level (the OpenAI SDK flattens it) |
//! | `store` on `/v1/responses` | passed | SGLang keeps the response for `previous_response_id`; kvgate records its owner (`stack::responses`) |
//! | `request_id` (responses) | refused | kvgate names every response itself; a chosen id could collide with another tenant's |
//! | `background`, `conversation`, `prompt` (responses) | refused | background runs are not served; stored prompts and conversations are text the gateway cannot count |
//! | `instruct` (rerank), embedding overrides, `score_extraction_token`, `return_pooled_hidden_states` | refused | a reranker template's prompt, or inputs and outputs the gateway does not count or check |
//! | anything else | refused | unknown to the gateway |

use serde_json::{Map, Value};

use super::Endpoint;
use crate::config::AdapterName;
use crate::error::GatewayError;

mod other_routes;
pub use other_routes::{
    DETOKENIZE_FIELDS, EMBEDDING_FIELDS, RERANK_FIELDS, RESPONSES_FIELDS, SCORE_FIELDS,
    TOKENIZE_FIELDS,
};

/// Fields that select a prefix-cache partition (vLLM `cache_salt`, SGLang `extra_key`,
/// OpenAI `prompt_cache_key`). Only the gateway may set them.
pub const CACHE_KEY_FIELDS: [&str; 3] = ["cache_salt", "extra_key", "prompt_cache_key"];

/// OpenAI platform fields with no engine meaning: dropped without an error.
pub const PLATFORM_FIELDS: [&str; 3] = ["store", "metadata", "service_tier"];

/// Sampling fields SGLang and vLLM accept on their OpenAI routes beyond OpenAI's own.
const ENGINE_SAMPLING: [&str; 12] = [
    "top_k",
    "min_p",
    "repetition_penalty",
    "min_tokens",
    "stop_token_ids",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "regex",
    "ebnf",
    "json_schema",
];

/// `/v1/chat/completions`: OpenAI's fields, and the engines' template controls that
/// admission models (`chat_template_kwargs`, `reasoning_effort`, `continue_final_message`,
/// and vLLM's and llama.cpp's `add_generation_prompt`, `add_special_tokens`).
pub const CHAT_FIELDS: [&str; 28] = [
    "model",
    "messages",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "n",
    "stop",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "top_logprobs",
    "seed",
    "user",
    "response_format",
    "tools",
    "tool_choice",
    "parallel_tool_calls",
    "lora_path",
    "separate_reasoning",
    "chat_template_kwargs",
    "reasoning_effort",
    "continue_final_message",
    "add_generation_prompt",
    "add_special_tokens",
];

/// `/v1/completions`.
pub const COMPLETION_FIELDS: [&str; 20] = [
    "model",
    "prompt",
    "max_tokens",
    "temperature",
    "top_p",
    "n",
    "best_of",
    "stop",
    "stream",
    "stream_options",
    "presence_penalty",
    "frequency_penalty",
    "logit_bias",
    "logprobs",
    "echo",
    "seed",
    "user",
    "response_format",
    "lora_path",
    "top_logprobs",
];

/// SGLang `/generate`.
pub const GENERATE_FIELDS: [&str; 11] = [
    "model",
    "text",
    "input_ids",
    "sampling_params",
    "stream",
    "return_logprob",
    "logprob_start_len",
    "top_logprobs_num",
    "token_ids_logprob",
    "return_text_in_logprobs",
    "lora_path",
];

/// Keys of SGLang's `sampling_params`.
pub const SAMPLING_PARAMS: [&str; 22] = [
    "max_new_tokens",
    "min_new_tokens",
    "stop",
    "stop_token_ids",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "frequency_penalty",
    "presence_penalty",
    "repetition_penalty",
    "ignore_eos",
    "skip_special_tokens",
    "spaces_between_special_tokens",
    "no_stop_trim",
    "n",
    "json_schema",
    "regex",
    "ebnf",
    "structural_tag",
    "logit_bias",
    "sampling_seed",
];

/// Keys of `stream_options`.
pub const STREAM_OPTIONS: [&str; 2] = ["include_usage", "continuous_usage_stats"];

/// Why a well-known engine-control field is refused (the client's error says so).
fn refusal_reason(field: &str) -> &'static str {
    match field {
        "rid" => "the gateway sets request ids itself; send yours as the x-request-id header (it is echoed back as x-client-request-id)",
        "bootstrap_host" | "bootstrap_port" | "bootstrap_room" => {
            "prefill/decode bootstrap fields are set by the gateway"
        }
        "session_params" | "custom_logit_processor" | "custom_params" | "return_hidden_states"
        | "data_parallel_rank" | "priority" | "log_metrics" => {
            "it controls engine internals, which the gateway owns"
        }
        "input_embeds" | "image_data" | "audio_data" | "video_data" | "modalities" => {
            "the gateway cannot count such a prompt, so it cannot admit it"
        }
        "suffix" | "functions" | "function_call" => {
            "it changes the prompt the engine renders in a way the gateway does not model, so it could not count it exactly"
        }
        "extra_body" => "send its fields at the top level of the body",
        "request_id" => "kvgate names every response itself (its id is tied to your tenant)",
        "background" => "background responses are not served through kvgate yet",
        "conversation" | "prompt" => {
            "it brings in prompt text stored elsewhere, which the gateway cannot count"
        }
        "instruct" => "it selects a reranker template prompt; kvgate counts rerank pairs as SGLang's cross-encoder path builds them, where it has no meaning",
        "embed_overrides" | "embed_override_token_id" | "query_embed_overrides"
        | "item_embed_overrides" => "embedding overrides replace prompt tokens the gateway counted",
        "score_extraction_token" | "return_pooled_hidden_states" => {
            "it changes what the engine computes in a way the gateway does not check"
        }
        _ => "it is not a field this gateway passes to engines",
    }
}

fn allowed(endpoint: Endpoint) -> &'static [&'static str] {
    match endpoint {
        Endpoint::ChatCompletions => &CHAT_FIELDS,
        Endpoint::Completions => &COMPLETION_FIELDS,
        Endpoint::Generate => &GENERATE_FIELDS,
        Endpoint::Embeddings => &EMBEDDING_FIELDS,
        Endpoint::Rerank => &RERANK_FIELDS,
        Endpoint::Score => &SCORE_FIELDS,
        Endpoint::Tokenize => &TOKENIZE_FIELDS,
        Endpoint::Detokenize => &DETOKENIZE_FIELDS,
        // Anthropic bodies are checked after their translation to a chat.
        Endpoint::Messages | Endpoint::EngineMessages | Endpoint::CountTokens => &CHAT_FIELDS,
        Endpoint::CreateResponse => &RESPONSES_FIELDS,
        Endpoint::RetrieveResponse | Endpoint::CancelResponse => &[],
        Endpoint::ListModels | Endpoint::RetrieveModel => &[],
    }
}

fn is_stripped(field: &str) -> bool {
    CACHE_KEY_FIELDS.contains(&field) || PLATFORM_FIELDS.contains(&field)
}

fn refuse(param: String, field: &str) -> GatewayError {
    GatewayError::UnsupportedParameter {
        reason: refusal_reason(field),
        param,
    }
}

/// Check every client field of `endpoint` against the allowlist: the first field that is
/// neither passed nor stripped is refused, named by its path (`sampling_params.custom_params`).
pub fn check(endpoint: Endpoint, fields: &Map<String, Value>) -> Result<(), GatewayError> {
    let passes = |f: &str| {
        allowed(endpoint).contains(&f)
            || (matches!(endpoint, Endpoint::ChatCompletions | Endpoint::Completions)
                && ENGINE_SAMPLING.contains(&f))
    };
    for (name, value) in fields {
        if is_stripped(name) && !keeps(endpoint, name) {
            continue;
        }
        if !passes(name) {
            return Err(refuse(name.clone(), name));
        }
        match name.as_str() {
            "sampling_params" => {
                let per_sample: Vec<&Map<String, Value>> = match value {
                    Value::Object(p) => vec![p],
                    Value::Array(items) => items.iter().filter_map(Value::as_object).collect(),
                    _ => Vec::new(), // shape errors are the parser's
                };
                for params in per_sample {
                    for key in params.keys() {
                        if !SAMPLING_PARAMS.contains(&key.as_str()) && !is_stripped(key) {
                            return Err(refuse(format!("sampling_params.{key}"), key));
                        }
                    }
                }
            }
            "stream_options" => {
                if let Value::Object(options) = value {
                    if let Some(key) = options
                        .keys()
                        .find(|k| !STREAM_OPTIONS.contains(&k.as_str()))
                    {
                        return Err(refuse(format!("stream_options.{key}"), key));
                    }
                }
            }
            "lora_path" => {
                lora_adapters(fields)?;
            }
            _ => {}
        }
    }
    Ok(())
}

/// The LoRA adapter names the request asks for (`lora_path`: a name, or one per sample;
/// `null` entries use the base model). 400 for anything that is not a name.
pub fn lora_adapters(fields: &Map<String, Value>) -> Result<Vec<&str>, GatewayError> {
    let bad = || {
        GatewayError::invalid(
            "`lora_path` must name an adapter (letters, digits, `.`, `_`, `-`), or be a list of names; paths are not accepted",
            Some("lora_path"),
        )
    };
    let names: Vec<&str> = match fields.get("lora_path") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(items)) => items
            .iter()
            .filter(|v| !v.is_null())
            .map(|v| v.as_str().ok_or_else(bad))
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad()),
    };
    if names.iter().any(|n| !AdapterName::is_valid(n)) {
        return Err(bad());
    }
    Ok(names)
}

/// The client's fields that reach the engine for `endpoint`: `fields` (already
/// [`check`]ed) minus the stripped ones and `/generate`'s `model`. The gateway's own
/// values are added by dispatch.
pub fn passthrough(endpoint: Endpoint, mut fields: Map<String, Value>) -> Map<String, Value> {
    // SGLang's `GenerateReqInput` and `V1RerankReqInput` have no `model`.
    if matches!(endpoint, Endpoint::Generate | Endpoint::Rerank) {
        fields.shift_remove("model");
    }
    let store = fields
        .shift_remove("store")
        .filter(|_| keeps(endpoint, "store"));
    strip(&mut fields);
    if let Some(store) = store {
        fields.insert("store".into(), store);
    }
    match fields.get_mut("sampling_params") {
        Some(Value::Object(nested)) => strip(nested),
        Some(Value::Array(items)) => items
            .iter_mut()
            .filter_map(Value::as_object_mut)
            .for_each(strip),
        _ => {}
    }
    fields
}

fn strip(map: &mut Map<String, Value>) {
    // With serde_json's `preserve_order`, `retain` keeps the order of the remaining
    // fields, so the engine sees the client's body otherwise unchanged.
    map.retain(|name, _| !is_stripped(name));
}

/// A platform field that means something on this route: `store` decides whether SGLang
/// keeps a response for `previous_response_id`.
fn keeps(endpoint: Endpoint, field: &str) -> bool {
    endpoint == Endpoint::CreateResponse && field == "store"
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

    fn refused(endpoint: Endpoint, body: Value) -> String {
        match check(endpoint, &object(body)) {
            Err(GatewayError::UnsupportedParameter { param, .. }) => param,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn forged_client_salts_never_survive() {
        let fields = object(json!({
            "model": "qwen3",
            "messages": [],
            "cache_salt": "victim-salt",
            "extra_key": ["a", "b"],
            "prompt_cache_key": "shared",
            "store": true,
        }));
        check(Endpoint::ChatCompletions, &fields).unwrap();
        let body = passthrough(Endpoint::ChatCompletions, fields);
        for field in CACHE_KEY_FIELDS.iter().chain(&PLATFORM_FIELDS) {
            assert!(!body.contains_key(*field), "{field} survived");
        }
        assert_eq!(body["model"], json!("qwen3"));
        let body = passthrough(
            Endpoint::Generate,
            object(
                json!({"text": "a", "sampling_params": {"max_new_tokens": 4, "cache_salt": "x", "extra_key": "y"}}),
            ),
        );
        assert_eq!(body["sampling_params"], json!({"max_new_tokens": 4}));
    }

    #[test]
    fn engine_control_fields_are_refused_by_name() {
        for field in [
            "rid",
            "session_params",
            "custom_logit_processor",
            "return_hidden_states",
            "bootstrap_room",
            "data_parallel_rank",
            "input_embeds",
            "extra_body",
            "no_such_field",
        ] {
            let body = json!({"text": "a", field: 1});
            assert_eq!(refused(Endpoint::Generate, body), field);
        }
        assert_eq!(
            refused(
                Endpoint::Generate,
                json!({"text": "a", "sampling_params": {"custom_params": {}}})
            ),
            "sampling_params.custom_params"
        );
        assert_eq!(
            refused(
                Endpoint::Generate,
                json!({"text": ["a", "b"], "sampling_params": [{}, {"temperature": 0, "evil": 1}]})
            ),
            "sampling_params.evil"
        );
        assert_eq!(
            refused(
                Endpoint::ChatCompletions,
                json!({"messages": [], "functions": [{"name": "f"}]})
            ),
            "functions"
        );
        // Template controls are modelled by admission, so they pass on chat only.
        check(
            Endpoint::ChatCompletions,
            &object(
                json!({"messages": [], "chat_template_kwargs": {"enable_thinking": false},
                           "reasoning_effort": "low", "continue_final_message": true}),
            ),
        )
        .unwrap();
        assert_eq!(
            refused(
                Endpoint::Completions,
                json!({"prompt": "x", "chat_template_kwargs": {}})
            ),
            "chat_template_kwargs"
        );
        assert_eq!(
            refused(
                Endpoint::Completions,
                json!({"prompt": "x", "stream_options": {"include_usage": true, "x": 1}})
            ),
            "stream_options.x"
        );
        // Engine sampling extras pass on the OpenAI routes, not at the top of /generate.
        check(
            Endpoint::ChatCompletions,
            &object(json!({"messages": [], "top_k": 5, "min_p": 0.1})),
        )
        .unwrap();
        assert_eq!(
            refused(Endpoint::Generate, json!({"text": "a", "top_k": 5})),
            "top_k"
        );
    }

    #[test]
    fn lora_adapters_are_names_never_paths() {
        let names = |v: Value| lora_adapters(&object(json!({ "lora_path": v }))).map(|n| n.len());
        assert_eq!(names(json!("sql-v2")).unwrap(), 1);
        assert_eq!(names(json!(["a", null, "b"])).unwrap(), 2);
        for bad in [
            json!("/models/evil"),
            json!("../x"),
            json!(""),
            json!(3),
            json!(["a/b"]),
        ] {
            assert!(names(bad.clone()).is_err(), "{bad}");
        }
        assert!(AdapterName::is_valid("chat.v1_2-x"));
        assert!(!AdapterName::is_valid(".."));
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
