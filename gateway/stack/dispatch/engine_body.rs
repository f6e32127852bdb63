//! The engine's request body, built once per request: the client's passthrough fields
//! (`api::fields`), the stages' [`EngineDirectives`] and dispatch's own routing fields,
//! with the prompt spliced in from the client's own bytes (`api::raw`: checked by parsing,
//! never rebuilt). This is the only place the outgoing JSON is written.

use bytes::Bytes;
use serde_json::{Map, Value};

use super::bootstrap;
use crate::config::EngineKind;
use crate::error::GatewayError;
use crate::fleet::{Pool, Worker};
use crate::stack::api::{fields, Endpoint, EngineDirectives, InferenceRequest};

/// Build the body of `request` for `pool`; `prefill` is the prefill worker of a
/// disaggregated pair (adds the bootstrap fields); `rid` is the gateway's request id,
/// SGLang's `rid` (one per sample for a batch: `<id>-<i>`).
pub fn build(
    request: InferenceRequest,
    pool: &Pool,
    prefill: Option<&Worker>,
    rid: &str,
) -> Result<Bytes, GatewayError> {
    build_for(request, &pool.served_model, pool.engine, prefill, rid)
}

fn build_for(
    request: InferenceRequest,
    served_model: &str,
    engine: EngineKind,
    prefill: Option<&Worker>,
    rid: &str,
) -> Result<Bytes, GatewayError> {
    let InferenceRequest {
        endpoint,
        batch,
        fields: client,
        raw,
        directives,
        verbatim,
        ..
    } = request;
    if let Some(verbatim) = verbatim {
        // The engine builds the prompt itself from the client's body (admission counted
        // the chat it builds): nothing is added but the engine's own name for the model.
        let mut body = Map::clone(&verbatim);
        body.insert("model".into(), Value::from(served_model));
        return serde_json::to_vec(&body)
            .map(Bytes::from)
            .map_err(|e| GatewayError::Internal(format!("encoding the engine's body: {e}")));
    }
    let mut body = fields::passthrough(endpoint, client);
    if !matches!(endpoint, Endpoint::Generate | Endpoint::Rerank) {
        // Engines know the model by their own served name.
        body.insert("model".into(), Value::from(served_model));
    }
    apply_directives(endpoint, &mut body, &directives);
    if engine == EngineKind::Sglang && endpoint.takes_rid() {
        // Only the gateway names requests inside the engine (clients' `rid` is refused).
        let rid = if batch > 1 {
            Value::Array(
                (0..batch)
                    .map(|i| Value::from(format!("{rid}-{i}")))
                    .collect(),
            )
        } else {
            Value::from(rid)
        };
        body.insert("rid".into(), rid);
    }
    if let Some(prefill) = prefill {
        bootstrap::inject(&mut body, prefill, batch);
    }
    let raw_len: usize = raw.iter().map(|(n, v)| n.len() + v.len() + 4).sum();
    let mut out = Vec::with_capacity(raw_len + 64 * (body.len() + 1));
    serde_json::to_writer(&mut out, &body)
        .map_err(|e| GatewayError::Internal(format!("encoding the engine's body: {e}")))?;
    // `{...}` → `{...,"messages":<the client's bytes>}`.
    if raw_len > 0 && out.last() == Some(&b'}') {
        out.pop();
        let mut first = body.is_empty();
        for (name, value) in raw.iter() {
            if !first {
                out.push(b',');
            }
            first = false;
            // Bulk names are plain ASCII identifiers: no escaping needed.
            out.push(b'"');
            out.extend_from_slice(name.as_bytes());
            out.extend_from_slice(b"\":");
            out.extend_from_slice(value);
        }
        out.push(b'}');
    }
    Ok(Bytes::from(out))
}

fn apply_directives(endpoint: Endpoint, body: &mut Map<String, Value>, d: &EngineDirectives) {
    if let Some(default) = d.default_max_new_tokens {
        default_max_new(endpoint, body, default);
    }
    if let Some(id) = &d.response_id {
        body.insert("request_id".to_owned(), Value::String(id.clone()));
    }
    if let Some(salt) = d
        .cache_salt
        .as_ref()
        .filter(|_| endpoint.takes_cache_salt())
    {
        body.insert("cache_salt".to_owned(), Value::String(salt.clone()));
    }
    if d.stream_usage {
        let options = body
            .entry("stream_options")
            .or_insert_with(|| Value::Object(Map::new()));
        if !options.is_object() {
            *options = Value::Object(Map::new());
        }
        if let Some(options) = options.as_object_mut() {
            options.insert("include_usage".into(), Value::Bool(true));
            options.insert("continuous_usage_stats".into(), Value::Bool(true));
        }
    }
}

/// Fill the new-token allowance of every sample the client gave none.
fn default_max_new(endpoint: Endpoint, body: &mut Map<String, Value>, default: u64) {
    match endpoint {
        Endpoint::ChatCompletions => {
            if body.get("max_tokens").is_none_or(Value::is_null)
                && body.get("max_completion_tokens").is_none_or(Value::is_null)
            {
                body.insert("max_tokens".into(), Value::from(default));
            }
        }
        Endpoint::Completions => {
            if body.get("max_tokens").is_none_or(Value::is_null) {
                body.insert("max_tokens".into(), Value::from(default));
            }
        }
        Endpoint::Generate => {
            let params = body
                .entry("sampling_params")
                .or_insert_with(|| Value::Object(Map::new()));
            let fill = |p: &mut Value| {
                if let Value::Object(p) = p {
                    if p.get("max_new_tokens").is_none_or(Value::is_null) {
                        p.insert("max_new_tokens".into(), Value::from(default));
                    }
                }
            };
            match params {
                Value::Array(per_sample) => per_sample.iter_mut().for_each(fill),
                Value::Null => {
                    *params = serde_json::json!({ "max_new_tokens": default });
                }
                other => fill(other),
            }
        }
        // SGLang samples `max_output_tokens - 2` new tokens (`to_sampling_params`): the
        // allowance plus those two.
        Endpoint::CreateResponse => {
            if body.get("max_output_tokens").is_none_or(Value::is_null) {
                body.insert(
                    "max_output_tokens".into(),
                    Value::from(default.saturating_add(2)),
                );
            }
        }
        // Prefill-only and local routes have no new-token allowance.
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn request(endpoint: Endpoint, body: Value, directives: EngineDirectives) -> InferenceRequest {
        let Value::Object(fields) = body else {
            panic!("not an object")
        };
        InferenceRequest::from_fields(endpoint, "qwen3".into(), false, 1, fields, directives)
    }

    fn sent(request: InferenceRequest) -> Value {
        let bytes = build_for(request, "served", EngineKind::Openai, None, "id").unwrap();
        serde_json::from_slice(&bytes).unwrap()
    }

    #[test]
    fn sglang_engines_get_the_gateways_rid_one_per_sample() {
        let mut r = request(
            Endpoint::Generate,
            json!({"text": ["a", "b"]}),
            EngineDirectives::default(),
        );
        r.batch = 2;
        let bytes = build_for(r, "served", EngineKind::Sglang, None, "abc").unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["rid"], json!(["abc-0", "abc-1"]));
        let r = request(
            Endpoint::ChatCompletions,
            json!({"messages": []}),
            EngineDirectives::default(),
        );
        let bytes = build_for(r, "served", EngineKind::Sglang, None, "abc").unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["rid"], "abc");
    }

    #[test]
    fn the_prompt_reaches_the_engine_byte_for_byte() {
        let client = br#"{"model":"qwen3","messages":[ {"role":"user","content":"caf\u00e9 \"x\""} ],"tools":null,"cache_salt":"forged"}"#;
        let catalog = crate::stack::api::ModelCatalog::new(["qwen3".to_string()], None);
        let parsed = crate::stack::api::parse_inference(
            Endpoint::ChatCompletions,
            &Bytes::from_static(client),
            &catalog,
        )
        .unwrap();
        let bytes = build_for(parsed, "served", EngineKind::Openai, None, "id").unwrap();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(
            text.contains(r#""messages":[ {"role":"user","content":"caf\u00e9 \"x\""} ]"#),
            "{text}"
        );
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(body["model"], "served");
        assert_eq!(body["tools"], Value::Null);
        assert!(body.get("cache_salt").is_none());
        // Only bulk fields: the object is still well formed.
        let only = request(
            Endpoint::Completions,
            json!({"prompt": "p"}),
            EngineDirectives::default(),
        );
        let bytes = build_for(only, "served", EngineKind::Sglang, None, "r").unwrap();
        let body: Value = serde_json::from_slice(&bytes).unwrap();
        assert_eq!(
            (body["prompt"].clone(), body["rid"].clone()),
            (json!("p"), json!("r"))
        );
    }

    #[test]
    fn model_default_fills_only_missing_budgets() {
        let d = EngineDirectives {
            default_max_new_tokens: Some(7),
            ..Default::default()
        };
        let g = sent(request(Endpoint::Generate, json!({"text": "a"}), d.clone()));
        assert_eq!(g["sampling_params"]["max_new_tokens"], 7);
        assert!(g.get("model").is_none());
        let c = sent(request(
            Endpoint::ChatCompletions,
            json!({"model": "qwen3", "max_tokens": 3, "messages": []}),
            d.clone(),
        ));
        assert_eq!(
            (c["max_tokens"].clone(), c["model"].clone()),
            (json!(3), json!("served"))
        );
        let b = sent(request(
            Endpoint::Generate,
            json!({"text": ["a", "b"], "sampling_params": [{"max_new_tokens": 2}, {}]}),
            d,
        ));
        assert_eq!(
            b["sampling_params"],
            json!([{"max_new_tokens": 2}, {"max_new_tokens": 7}])
        );
    }

    #[test]
    fn only_the_gateway_salt_reaches_the_engine() {
        let d = EngineDirectives {
            cache_salt: Some("tenant-salt".into()),
            ..Default::default()
        };
        let forged = json!({"prompt": "x", "cache_salt": "victim", "extra_key": "k"});
        let body = sent(request(Endpoint::Completions, forged.clone(), d));
        assert_eq!(body["cache_salt"], "tenant-salt");
        assert!(body.get("extra_key").is_none());
        let body = sent(request(
            Endpoint::Completions,
            forged,
            EngineDirectives::default(),
        ));
        assert!(body.get("cache_salt").is_none());
    }

    #[test]
    fn stream_usage_keeps_the_clients_other_options() {
        let d = EngineDirectives {
            stream_usage: true,
            ..Default::default()
        };
        let body = sent(request(
            Endpoint::ChatCompletions,
            json!({"messages": [], "stream_options": {"other": 1}}),
            d.clone(),
        ));
        assert_eq!(
            body["stream_options"],
            json!({"other": 1, "include_usage": true, "continuous_usage_stats": true})
        );
        let body = sent(request(
            Endpoint::ChatCompletions,
            json!({"messages": [], "stream_options": 5}),
            d,
        ));
        assert_eq!(body["stream_options"]["include_usage"], true);
    }
}
