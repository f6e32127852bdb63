//! The data-port routes.

use http::Method;

use crate::error::GatewayError;

/// A data-port endpoint.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Endpoint {
    /// `POST /v1/chat/completions` (OpenAI)
    ChatCompletions,
    /// `POST /v1/completions` (OpenAI)
    Completions,
    /// `POST /generate` (SGLang native)
    Generate,
    /// `GET /v1/models`
    ListModels,
    /// `GET /v1/models/{id}` (the OpenAI SDK's `models.retrieve`)
    RetrieveModel,
    /// `POST /v1/embeddings` (OpenAI; SGLang and vLLM serve it)
    Embeddings,
    /// `POST /v1/rerank` (SGLang's cross-encoder rerank)
    Rerank,
    /// `POST /v1/score` (SGLang's label scoring)
    Score,
    /// `POST /tokenize` or `/v1/tokenize` (SGLang's shape), answered by kvgate itself
    Tokenize,
    /// `POST /detokenize` or `/v1/detokenize` (SGLang's shape), answered by kvgate itself
    Detokenize,
    /// `POST /v1/messages` (Anthropic's Messages API), translated to chat completions
    Messages,
    /// `POST /v1/messages` sent as it is to the engine's own `/v1/messages`, for a model
    /// with `anthropic_messages = "engine"`: parsing turns `Messages` into this once it
    /// knows the model (`classify` never answers it)
    EngineMessages,
    /// `POST /v1/messages/count_tokens` (Anthropic's), answered by kvgate itself
    CountTokens,
    /// `POST /v1/responses` (OpenAI's Responses API, as SGLang serves it)
    CreateResponse,
    /// `GET /v1/responses/{id}`: a stored response, from the worker that holds it
    RetrieveResponse,
    /// `POST /v1/responses/{id}/cancel`, on the worker that holds it
    CancelResponse,
}

/// What an endpoint asks of the pool that serves it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EngineNeeds {
    /// The engine must speak SGLang's own API (`/generate`, `/v1/rerank`, `/v1/score`).
    pub sglang: bool,
    /// The pool must be unified: SGLang runs prefill-only requests (embeddings, rerank,
    /// score) in one process, with no bootstrap room to hand KV to a decode worker.
    pub unified: bool,
}

impl Endpoint {
    /// Match a method and path; unknown paths are 404, known paths with the wrong method 405.
    pub fn classify(method: &Method, path: &str) -> Result<Endpoint, GatewayError> {
        let (endpoint, allowed) = match path {
            "/v1/chat/completions" => (Endpoint::ChatCompletions, Method::POST),
            "/v1/completions" => (Endpoint::Completions, Method::POST),
            "/generate" => (Endpoint::Generate, Method::POST),
            "/v1/models" => (Endpoint::ListModels, Method::GET),
            "/v1/embeddings" => (Endpoint::Embeddings, Method::POST),
            "/v1/rerank" => (Endpoint::Rerank, Method::POST),
            "/v1/score" => (Endpoint::Score, Method::POST),
            "/tokenize" | "/v1/tokenize" => (Endpoint::Tokenize, Method::POST),
            "/detokenize" | "/v1/detokenize" => (Endpoint::Detokenize, Method::POST),
            "/v1/messages" => (Endpoint::Messages, Method::POST),
            "/v1/messages/count_tokens" => (Endpoint::CountTokens, Method::POST),
            "/v1/responses" => (Endpoint::CreateResponse, Method::POST),
            p if model_id(p).is_some() => (Endpoint::RetrieveModel, Method::GET),
            p if stored_response(p).is_some_and(|(_, cancel)| cancel) => {
                (Endpoint::CancelResponse, Method::POST)
            }
            p if stored_response(p).is_some() => (Endpoint::RetrieveResponse, Method::GET),
            _ => {
                return Err(GatewayError::RouteNotFound {
                    method: method.to_string(),
                    path: path.to_owned(),
                    body_unread: false,
                })
            }
        };
        if *method != allowed {
            return Err(GatewayError::MethodNotAllowed {
                method: method.to_string(),
                path: path.to_owned(),
                body_unread: false,
            });
        }
        Ok(endpoint)
    }

    /// The path on the engine (the same as the client's).
    pub fn path(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "/v1/chat/completions",
            Endpoint::Completions => "/v1/completions",
            Endpoint::Generate => "/generate",
            Endpoint::ListModels | Endpoint::RetrieveModel => "/v1/models",
            Endpoint::Embeddings => "/v1/embeddings",
            Endpoint::Rerank => "/v1/rerank",
            Endpoint::Score => "/v1/score",
            Endpoint::Tokenize => "/tokenize",
            Endpoint::Detokenize => "/detokenize",
            // Sent to engines as chat completions (the request is translated at parsing).
            Endpoint::Messages => "/v1/chat/completions",
            Endpoint::EngineMessages => "/v1/messages",
            Endpoint::CountTokens => "/v1/messages/count_tokens",
            Endpoint::CreateResponse => "/v1/responses",
            // The stored response's own path (with its id) is the client's.
            Endpoint::RetrieveResponse | Endpoint::CancelResponse => "/v1/responses/{id}",
        }
    }

    /// A short metric label.
    pub fn label(self) -> &'static str {
        match self {
            Endpoint::ChatCompletions => "chat",
            Endpoint::Completions => "completions",
            Endpoint::Generate => "generate",
            Endpoint::ListModels | Endpoint::RetrieveModel => "models",
            Endpoint::Embeddings => "embeddings",
            Endpoint::Rerank => "rerank",
            Endpoint::Score => "score",
            Endpoint::Tokenize => "tokenize",
            Endpoint::Detokenize => "detokenize",
            Endpoint::Messages | Endpoint::EngineMessages => "messages",
            Endpoint::CountTokens => "count_tokens",
            Endpoint::CreateResponse => "responses",
            Endpoint::RetrieveResponse => "responses_retrieve",
            Endpoint::CancelResponse => "responses_cancel",
        }
    }

    /// What the serving pool must be.
    pub fn engine_needs(self) -> EngineNeeds {
        match self {
            Endpoint::Generate => EngineNeeds {
                sglang: true,
                unified: false,
            },
            // SGLang keeps a stored response in the one process that served it; an
            // Anthropic request has no bootstrap fields for a disaggregated pair.
            Endpoint::Rerank
            | Endpoint::EngineMessages
            | Endpoint::Score
            | Endpoint::CreateResponse
            | Endpoint::RetrieveResponse
            | Endpoint::CancelResponse => EngineNeeds {
                sglang: true,
                unified: true,
            },
            Endpoint::Embeddings => EngineNeeds {
                sglang: false,
                unified: true,
            },
            _ => EngineNeeds::default(),
        }
    }

    /// Prefill-only requests: the engine generates nothing (no new tokens, no stream).
    pub fn is_pooling(self) -> bool {
        matches!(
            self,
            Endpoint::Embeddings | Endpoint::Rerank | Endpoint::Score
        )
    }

    /// Answered by kvgate from the model's tokenizer: no engine is asked.
    pub fn is_local(self) -> bool {
        matches!(
            self,
            Endpoint::Tokenize | Endpoint::Detokenize | Endpoint::CountTokens
        )
    }

    /// Whether the client speaks Anthropic's API (its errors take Anthropic's shape).
    pub fn is_anthropic(self) -> bool {
        matches!(
            self,
            Endpoint::Messages | Endpoint::EngineMessages | Endpoint::CountTokens
        )
    }

    /// Whether the engine's API for this route takes a prefix-cache salt: SGLang's
    /// `EmbeddingRequest`, `V1RerankReqInput` and `ScoringRequest` have no `cache_salt` or
    /// `extra_key` (sglang 0.5.23 `protocol.py`), so none is sent there; nor has its
    /// `AnthropicMessagesRequest` (whose pools must not expect one: config `validate`).
    pub fn takes_cache_salt(self) -> bool {
        matches!(
            self,
            Endpoint::ChatCompletions
                | Endpoint::Completions
                | Endpoint::Generate
                | Endpoint::CreateResponse
        )
    }

    /// A stored response's own route: no prompt, the worker that holds it answers.
    pub fn is_stored_response(self) -> bool {
        matches!(self, Endpoint::RetrieveResponse | Endpoint::CancelResponse)
    }

    /// Whether the engine's API for this route takes SGLang's `rid` (`V1RerankReqInput` has
    /// none; a Responses request is named by its `request_id`, which kvgate sets).
    /// `AnthropicMessagesRequest` has none either.
    pub fn takes_rid(self) -> bool {
        !matches!(
            self,
            Endpoint::Rerank | Endpoint::CreateResponse | Endpoint::EngineMessages
        )
    }
}

/// The response id of `/v1/responses/{id}` (false) or `/v1/responses/{id}/cancel` (true).
pub fn stored_response(path: &str) -> Option<(&str, bool)> {
    let rest = path.strip_prefix("/v1/responses/")?;
    let (id, cancel) = match rest.strip_suffix("/cancel") {
        Some(id) => (id, true),
        None => (rest, false),
    };
    (!id.is_empty() && !id.contains('/')).then_some((id, cancel))
}

/// The model id of a `/v1/models/{id}` path, percent-decoded (ids such as `Qwen/Qwen3-8B`
/// arrive with their slash as is or as `%2F`); None for any other path or a bad escape.
pub fn model_id(path: &str) -> Option<String> {
    let raw = path
        .strip_prefix("/v1/models/")
        .filter(|id| !id.is_empty())?;
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' {
            let hex = std::str::from_utf8(bytes.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_label_is_exported_from_start_up() {
        use Endpoint::*;
        let all = [
            ChatCompletions,
            Completions,
            Generate,
            ListModels,
            RetrieveModel,
            Embeddings,
            Rerank,
            Score,
            Tokenize,
            Detokenize,
            Messages,
            EngineMessages,
            CountTokens,
            CreateResponse,
            RetrieveResponse,
            CancelResponse,
        ];
        for endpoint in all {
            assert!(
                crate::metrics::zero::ENDPOINT_LABELS.contains(&endpoint.label()),
                "{endpoint:?}"
            );
        }
    }

    #[test]
    fn classifies_known_routes_and_rejects_others() {
        assert_eq!(
            Endpoint::classify(&Method::POST, "/generate").unwrap(),
            Endpoint::Generate
        );
        assert!(matches!(
            Endpoint::classify(&Method::GET, "/generate"),
            Err(GatewayError::MethodNotAllowed { .. })
        ));
        assert_eq!(
            Endpoint::classify(&Method::GET, "/v1/models/Qwen/Qwen3-8B").unwrap(),
            Endpoint::RetrieveModel
        );
        assert_eq!(
            model_id("/v1/models/Qwen%2FQwen3-8B").as_deref(),
            Some("Qwen/Qwen3-8B")
        );
        assert_eq!(model_id("/v1/models/qwen3").as_deref(), Some("qwen3"));
        assert_eq!(model_id("/v1/models/"), None);
        assert_eq!(model_id("/v1/models/%zz"), None);
        assert!(matches!(
            Endpoint::classify(&Method::POST, "/v2/x"),
            Err(GatewayError::RouteNotFound { .. })
        ));
    }
}
