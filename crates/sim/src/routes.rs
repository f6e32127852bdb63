//! The routes beyond generation and the info endpoints: embeddings, rerank, score,
//! tokenize / detokenize and the Responses API (`http_server.py` of sglang 0.5.23 names
//! each: `openai_v1_embeddings`, `v1_rerank_request`, `v1_score_request`,
//! `openai_v1_tokenize`, `openai_v1_detokenize`, `v1_responses_request`,
//! `v1_retrieve_responses`, `v1_cancel_responses`), and Anthropic's `/v1/messages` and
//! `/v1/messages/count_tokens` (served by SGLang's `anthropic/serving.py`).

use std::sync::Arc;

use hyper::{Method, Response, StatusCode};
use serde_json::json;

use super::engine::SimEngine;
use super::fields::RouteBody;
use super::listen::{json_response, Body, ResetConnection};
use super::{anthropic, embeddings, rerank, responses, score, tokenize_routes};

/// One of these routes.
pub(crate) enum Route {
    Embeddings,
    Rerank,
    Score,
    Tokenize,
    Detokenize,
    CreateResponse,
    RetrieveResponse(String),
    CancelResponse(String),
    Messages,
    CountTokens,
}

impl Route {
    /// The route of `method` and `path`: `None` when the path is none of these, `Some(Err)`
    /// when it is one but not with this method (405, as FastAPI answers).
    pub(crate) fn of(method: &Method, path: &str) -> Option<Result<Route, ()>> {
        let post = method == Method::POST;
        let route = match path {
            "/v1/embeddings" => post.then_some(Route::Embeddings),
            // SGLang registers rerank for POST and PUT.
            "/v1/rerank" => (post || method == Method::PUT).then_some(Route::Rerank),
            "/v1/score" => post.then_some(Route::Score),
            "/tokenize" | "/v1/tokenize" => post.then_some(Route::Tokenize),
            "/detokenize" | "/v1/detokenize" => post.then_some(Route::Detokenize),
            "/v1/responses" => post.then_some(Route::CreateResponse),
            "/v1/messages" => post.then_some(Route::Messages),
            "/v1/messages/count_tokens" => post.then_some(Route::CountTokens),
            _ => {
                let id = path.strip_prefix("/v1/responses/")?;
                match id.strip_suffix("/cancel") {
                    Some(id) if !id.is_empty() && !id.contains('/') => {
                        post.then(|| Route::CancelResponse(id.to_string()))
                    }
                    _ if !id.is_empty() && !id.contains('/') => {
                        (method == Method::GET).then(|| Route::RetrieveResponse(id.to_string()))
                    }
                    _ => return None,
                }
            }
        };
        Some(route.ok_or(()))
    }
}

/// Serves `route`.
pub(crate) async fn serve(
    engine: &Arc<SimEngine>,
    route: Route,
    body: RouteBody,
) -> Result<Response<Body>, ResetConnection> {
    match route {
        Route::Embeddings => embeddings::handle(engine, body).await,
        Route::Rerank => rerank::handle(engine, body).await,
        Route::Score => score::handle(engine, body).await,
        Route::Tokenize => Ok(tokenize_routes::tokenize(engine, body).await),
        Route::Detokenize => Ok(tokenize_routes::detokenize(engine, body)),
        Route::CreateResponse => responses::create(engine, body).await,
        Route::RetrieveResponse(id) => Ok(responses::retrieve(engine, &id)),
        Route::CancelResponse(id) => Ok(responses::cancel(engine, &id)),
        Route::Messages => anthropic::messages(engine, body).await,
        Route::CountTokens => Ok(anthropic::count_tokens(engine, body).await),
    }
}

/// FastAPI's answer to a known path with another method.
pub(crate) fn method_not_allowed() -> Response<Body> {
    json_response(
        StatusCode::METHOD_NOT_ALLOWED,
        &json!({"detail": "Method Not Allowed"}),
    )
}
