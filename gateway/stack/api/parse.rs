//! Request parsing: the buffered JSON body becomes an [`InferenceRequest`] extension.
//!
//! Only structure is checked here (is it a JSON object, are the prompt fields of the right
//! shape, is the model known); counting tokens is the admission stage's job.

use bytes::Bytes;
use http::Request;
use serde_json::{Map, Value};
use std::sync::Arc;
use tower::filter::{FilterLayer, Predicate};

use super::anthropic_body;
use super::prompt_view::{self, Prompts};
use super::raw::{self, RawFields};
use super::request::bulk_fields;
use super::ModelCatalog;
use super::{fields, Endpoint, EngineDirectives, InferenceRequest};
use crate::body::BoxError;
use crate::error::GatewayError;

/// Parse and structurally validate one request body. The prompt stays in `body` (shared,
/// not copied): see `api::raw`.
pub fn parse_inference(
    endpoint: Endpoint,
    body: &Bytes,
    catalog: &ModelCatalog,
) -> Result<InferenceRequest, GatewayError> {
    if matches!(endpoint, Endpoint::ListModels | Endpoint::RetrieveModel) {
        return Err(GatewayError::Internal(
            "list-models requests carry no body to parse".into(),
        ));
    }
    if endpoint.is_anthropic() {
        return parse_anthropic(endpoint, body, catalog);
    }
    if endpoint.is_stored_response() {
        // No body to read: the stored response's owner (`stack::responses`) names the
        // model and the worker.
        return Ok(InferenceRequest {
            endpoint,
            model: String::new(),
            stream: false,
            batch: 0,
            fields: Map::new(),
            raw: RawFields::default(),
            directives: EngineDirectives::default(),
            verbatim: None,
        });
    }
    let (fields, raw) = raw::split(body, bulk_fields(endpoint))?;
    let stream = match fields.get("stream") {
        None | Some(Value::Null) => false,
        Some(Value::Bool(b)) => *b,
        Some(_) => {
            return Err(GatewayError::invalid(
                "`stream` must be a boolean",
                Some("stream"),
            ))
        }
    };
    // The allowlist: engine-control and unknown fields are refused by name (api::fields).
    fields::check(endpoint, &fields)?;
    let batch = match endpoint {
        Endpoint::ChatCompletions => {
            let messages = raw.get("messages").ok_or_else(|| {
                GatewayError::invalid(
                    "`messages` must be an array of message objects",
                    Some("messages"),
                )
            })?;
            prompt_view::messages(messages)?;
            1
        }
        Endpoint::Completions => prompt_batch(raw.get("prompt"), "prompt")?,
        Endpoint::Embeddings => prompt_batch(raw.get("input"), "input")?,
        Endpoint::Rerank => {
            super::pooling_view::rerank_pairs(raw.get("query"), raw.get("documents"))?
                .documents
                .len()
        }
        // Counted once the request is built (`item_first` is among its fields).
        Endpoint::Score => 0,
        Endpoint::CreateResponse => 1,
        Endpoint::Tokenize => {
            tokenize_input(&raw)?;
            0
        }
        Endpoint::Detokenize => {
            detokenize_input(&raw)?;
            0
        }
        _ => generate_batch(&raw)?,
    };
    // On `/generate` the (optional) `model` only selects the gateway model: SGLang's
    // GenerateReqInput has none, so `api::fields` keeps it from the engine.
    let model = catalog.resolve(endpoint, &fields)?;
    let mut request = InferenceRequest {
        endpoint,
        model,
        stream,
        batch,
        fields,
        raw,
        directives: EngineDirectives::default(),
        verbatim: None,
    };
    if endpoint == Endpoint::Score {
        request.batch = request.score_prompts()?.len();
    }
    Ok(request)
}

/// An Anthropic Messages body, as the chat completions request it becomes
/// (`anthropic_body`), parsed as one, so admission, limits, routing and the guard treat it
/// as any chat. `count_tokens` keeps its own endpoint (kvgate answers it); a body the
/// engine takes as it is becomes [`Endpoint::EngineMessages`], keeping it to send.
fn parse_anthropic(
    endpoint: Endpoint,
    body: &Bytes,
    catalog: &ModelCatalog,
) -> Result<InferenceRequest, GatewayError> {
    let map: Map<String, Value> = serde_json::from_slice(body)
        .map_err(|e| GatewayError::invalid(format!("the body must be a JSON object: {e}"), None))?;
    let to_engine = map
        .get("model")
        .and_then(Value::as_str)
        .is_some_and(|m| catalog.passes_anthropic_through(m));
    let chat = anthropic_body::chat_of(endpoint, &map, to_engine)?;
    let mut parsed = parse_inference(Endpoint::ChatCompletions, &chat, catalog)?;
    match endpoint {
        Endpoint::CountTokens => {
            parsed.endpoint = Endpoint::CountTokens;
            parsed.batch = 0;
        }
        _ if to_engine => {
            parsed.endpoint = Endpoint::EngineMessages;
            parsed.verbatim = Some(Arc::new(map));
        }
        _ => {}
    }
    Ok(parsed)
}

/// `/tokenize`: exactly one of `prompt` (a string or a list of strings) and `messages` (a
/// chat, with its `tools`).
fn tokenize_input(raw: &RawFields) -> Result<(), GatewayError> {
    match (raw.get("prompt"), raw.get("messages")) {
        (Some(prompt), None) => match prompt_view::prompts(prompt, "prompt") {
            Ok(Prompts::Texts(_)) => Ok(()),
            _ => Err(GatewayError::invalid(
                "`prompt` must be a string or a non-empty list of strings",
                Some("prompt"),
            )),
        },
        (None, Some(messages)) => prompt_view::messages(messages).map(drop),
        (Some(_), Some(_)) => Err(GatewayError::invalid(
            "send either `prompt` or `messages`, not both",
            Some("prompt"),
        )),
        (None, None) => Err(GatewayError::invalid(
            "`prompt` or `messages` is required",
            Some("prompt"),
        )),
    }
}

/// `/detokenize`: `tokens`, a list of token ids or a list of token-id lists.
fn detokenize_input(raw: &RawFields) -> Result<(), GatewayError> {
    let bad = || {
        GatewayError::invalid(
            "`tokens` must be a list of token ids or a list of token-id lists",
            Some("tokens"),
        )
    };
    match raw.get("tokens") {
        Some(tokens) => match prompt_view::prompts(tokens, "tokens") {
            Ok(Prompts::Ids(_)) => Ok(()),
            _ if tokens.trim() == "[]" => Ok(()),
            _ => Err(bad()),
        },
        None => Err(GatewayError::invalid(
            "`tokens` is required",
            Some("tokens"),
        )),
    }
}

fn prompt_batch(prompt: Option<&str>, field: &str) -> Result<usize, GatewayError> {
    match prompt {
        Some(raw) => Ok(prompt_view::prompts(raw, field)?.len()),
        None => Err(GatewayError::invalid(
            format!("`{field}` is required"),
            Some(field),
        )),
    }
}

/// SGLang `/generate`: `text` (a string or a non-empty list of strings) or `input_ids` (a
/// list of token ids or a list of token-id lists), never both.
fn generate_batch(raw: &RawFields) -> Result<usize, GatewayError> {
    match (raw.get("text"), raw.get("input_ids")) {
        (Some(text), None) => match prompt_view::prompts(text, "text") {
            Ok(Prompts::Texts(texts)) => Ok(texts.len()),
            _ => Err(GatewayError::invalid(
                "`text` must be a string or a non-empty list of strings",
                Some("text"),
            )),
        },
        (None, Some(ids)) => match prompt_view::prompts(ids, "input_ids") {
            Ok(Prompts::Ids(ids)) => Ok(ids.len()),
            _ => Err(GatewayError::invalid(
                "`input_ids` must be a list of token ids or a list of token-id lists",
                Some("input_ids"),
            )),
        },
        (Some(_), Some(_)) => Err(GatewayError::invalid(
            "send either `text` or `input_ids`, not both",
            Some("text"),
        )),
        (None, None) => Err(GatewayError::invalid(
            "`text` or `input_ids` is required",
            Some("text"),
        )),
    }
}

/// The tower predicate that runs [`parse_inference`] and inserts the result.
#[derive(Debug, Clone)]
pub struct Parse {
    catalog: ModelCatalog,
}

impl Predicate<Request<Bytes>> for Parse {
    type Request = Request<Bytes>;

    fn check(&mut self, mut request: Request<Bytes>) -> Result<Request<Bytes>, BoxError> {
        let endpoint = Endpoint::classify(request.method(), request.uri().path())?;
        let parsed = parse_inference(endpoint, request.body(), &self.catalog)?;
        request.extensions_mut().insert(parsed);
        Ok(request)
    }
}

/// The parse stage as a layer.
pub type ParseLayer = FilterLayer<Parse>;

impl Parse {
    /// The parse stage over `catalog`.
    pub fn layer(catalog: ModelCatalog) -> ParseLayer {
        FilterLayer::new(Parse { catalog })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn catalog() -> ModelCatalog {
        ModelCatalog::new(["qwen3".to_string()], Some("qwen3".into()))
    }

    fn parse(endpoint: Endpoint, body: &str) -> Result<InferenceRequest, GatewayError> {
        parse_inference(
            endpoint,
            &Bytes::copy_from_slice(body.as_bytes()),
            &catalog(),
        )
    }

    #[test]
    fn generate_batches_are_counted_and_model_is_defaulted() {
        let r = parse(Endpoint::Generate, r#"{"text":["a","b"],"stream":true}"#).unwrap();
        assert_eq!((r.batch, r.stream, r.model.as_str()), (2, true, "qwen3"));
        let r = parse(Endpoint::Generate, r#"{"input_ids":[[1,2],[3],[4]]}"#).unwrap();
        assert_eq!(r.batch, 3);
        let r = parse(
            Endpoint::Generate,
            r#"{"input_ids":[1,2,3],"model":"qwen3"}"#,
        )
        .unwrap();
        assert_eq!(r.batch, 1);
    }

    #[test]
    fn malformed_bodies_are_invalid_requests() {
        for (endpoint, body) in [
            (Endpoint::Generate, "{"),
            (Endpoint::Generate, "[1]"),
            (Endpoint::Generate, r#"{"text":1}"#),
            (Endpoint::Generate, r#"{"text":"a","input_ids":[1]}"#),
            (Endpoint::Generate, r#"{"input_ids":[-1]}"#),
            (
                Endpoint::ChatCompletions,
                r#"{"model":"qwen3","messages":[]}"#,
            ),
            (
                Endpoint::ChatCompletions,
                r#"{"model":"qwen3","messages":[{"content":"x"}]}"#,
            ),
            (Endpoint::Completions, r#"{"model":"qwen3"}"#),
            (
                Endpoint::Completions,
                r#"{"model":"qwen3","prompt":"x","stream":"yes"}"#,
            ),
            (Endpoint::Completions, r#"{"prompt":"x"}"#),
        ] {
            let err = parse(endpoint, body).unwrap_err();
            assert!(
                matches!(err, GatewayError::InvalidRequest { .. }),
                "{body}: {err:?}"
            );
        }
    }

    /// JSON values built from the names the parser looks at, so that random bodies reach
    /// its deeper branches (prompt shapes, batches, sampling_params, the allowlist).
    fn json_value() -> impl proptest::strategy::Strategy<Value = Value> {
        use proptest::prelude::*;
        let key = prop::sample::select(vec![
            "model",
            "text",
            "input_ids",
            "prompt",
            "messages",
            "role",
            "content",
            "sampling_params",
            "max_new_tokens",
            "max_tokens",
            "stream",
            "stream_options",
            "include_usage",
            "rid",
            "lora_path",
            "cache_salt",
            "n",
            "x",
        ]);
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::from),
            any::<i64>().prop_map(Value::from),
            (0u64..50_000).prop_map(Value::from),
            prop::sample::select(vec!["qwen3", "user", "hi", "", "gpt-9", "/x"])
                .prop_map(Value::from),
        ];
        leaf.prop_recursive(4, 48, 6, move |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..5).prop_map(Value::Array),
                prop::collection::vec((key.clone(), inner), 0..6).prop_map(|kv| {
                    Value::Object(kv.into_iter().map(|(k, v)| (k.to_owned(), v)).collect())
                }),
            ]
        })
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

        #[test]
        fn arbitrary_bodies_never_panic_and_accepted_ones_are_consistent(
            value in json_value(),
            endpoint in proptest::sample::select(vec![
                Endpoint::Generate, Endpoint::Completions, Endpoint::ChatCompletions,
            ]),
        ) {
            let body = value.to_string();
            match parse(endpoint, &body) {
                Ok(r) => {
                    // An accepted request names its prompts, one per sample, and passes the
                    // allowlist; every budget it states is readable.
                    proptest::prop_assert_eq!(r.prompts().map(|p| p.len()).ok(), Some(r.batch));
                    proptest::prop_assert!(fields::check(endpoint, &r.fields).is_ok());
                    proptest::prop_assert!(!r.fields.contains_key("rid"));
                    for i in 0..r.batch {
                        let _ = r.requested_max_new(i);
                    }
                }
                Err(e) => {
                    proptest::prop_assert!(e.status().is_client_error(), "{:?}", e);
                }
            }
        }

        #[test]
        fn arbitrary_bytes_are_a_client_error(bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            if let Err(e) = parse_inference(Endpoint::Generate, &Bytes::from(bytes), &catalog()) {
                proptest::prop_assert!(e.status().is_client_error());
            }
        }
    }

    #[test]
    fn unknown_model_is_model_not_found() {
        let err = parse(Endpoint::Completions, r#"{"model":"gpt-9","prompt":"x"}"#).unwrap_err();
        assert!(matches!(err, GatewayError::ModelNotFound { .. }));
    }
}
