//! `POST /v1/responses`, `GET /v1/responses/{id}` and `POST /v1/responses/{id}/cancel`,
//! as sglang 0.5.23 serves them for a model without Harmony (`serving_responses.py`:
//! `create_responses`, `responses_full_generator`, `_responses_stream_generator_non_harmony`,
//! `retrieve_responses`, `cancel_responses`; `http_server.py` routes them). SGLang has no
//! `DELETE` for a response.
//!
//! `create`: the request model (`responses_request.rs`; the prompt's fields and the chat
//! they become are `kvgate_tokenize::prepare::responses`), then `create_responses`' checks in
//! its order (shell tools; the store for `previous_response_id` and `background`;
//! `background` without `store`; the model; `tool_choice`; logprobs when streaming; the
//! previous response's id and presence), then the chat it becomes is prepared and counted
//! as a chat completion (`request.rs`), scheduled (`run.rs`) and answered (`answer.rs`),
//! its answer shaped by `responses_output.rs`. With `--enable-response-store` and `store`
//! (the default), the response and its conversation are kept (`responses_store.rs`) when
//! it is answered; `background` answers `queued` at once and generates in a task that
//! `cancel` stops.
//!
//! How a failure shows, as SGLang's code paths give it: a refused prompt (over the context,
//! over `max_req_input_len`) is a 400 `invalid_request_error` when not streamed (the
//! `ValueError` of `responses_full_generator`; another abort status is raised as an
//! `HTTPException`, answered as a 400 whose message starts with that status), and a
//! `response.failed` event in a 200 stream. An abort without a status (`--fault
//! abort-mid-stream`, `abort-no-status`) is a 200 response with `status: "failed"` and
//! `error: {"code": "server_error", ...}` (and the text generated so far), plain or
//! streamed; an error raised mid-stream (`--fault error-event`) ends the stream with
//! `response.failed` right after the deltas. The connection and stream faults (`hang`,
//! `reset`, `cut-stream`, `stall-stream`, `garbage-event`) apply as for a chat.
//!
//! A kept response is stored when its answer is ready, before a paced answer has been
//! sent in full.

use std::sync::Arc;

use hyper::{Response, StatusCode};
use serde_json::{json, Value};

use super::answer::{answers, Answer, Style};
use super::config::SimRole;
use super::engine::SimEngine;
use super::errors::{responses_error, responses_validation};
use super::fields::RouteBody;
use super::listen::{json_response, Body, ResetConnection};
use super::reply::Reply;
use super::request::{Api, GenRequest};
use super::responses_output::{self as output, Outcome};
use super::responses_request::{self as request, ResponsesRequest};
use super::responses_stream::{self as stream, Events};
use super::run::{self, Ran};
use super::schedule::{Finish, SampleResult};
use super::stream::Pace;
use kvgate_tokenize::prepare::ResponsesError;

const INVALID: &str = "invalid_request_error";

fn refuse(message: &str, param: Option<&str>) -> Response<Body> {
    responses_error(message, INVALID, param, 400)
}

/// Whether this engine keeps responses: `--enable-response-store`, unified role only.
fn store_enabled(engine: &SimEngine) -> bool {
    engine.config.enable_response_store && engine.config.role == SimRole::Unified
}

/// `_response_store_disabled_error`.
fn store_disabled(param: &str) -> Response<Body> {
    refuse(
        "Response store is disabled. Stateful Responses require --enable-response-store on a \
         standalone server; response storage is unavailable in PD mode.",
        Some(param),
    )
}

/// `_make_invalid_id_error` and `_make_not_found_error`: `Err` when `id` is not stored.
fn lookup(engine: &SimEngine, id: &str) -> Result<Value, Box<Response<Body>>> {
    if !id.starts_with("resp_") {
        return Err(Box::new(refuse(
            &format!("Invalid 'response_id': '{id}'. Expected an ID that begins with 'resp'."),
            Some("response_id"),
        )));
    }
    engine.responses.get(id).ok_or_else(|| {
        Box::new(responses_error(
            &format!("Response with id '{id}' not found."),
            INVALID,
            Some("response_id"),
            404,
        ))
    })
}

/// A refusal of `create_responses` as its 400.
fn refused(error: ResponsesError) -> Response<Body> {
    match error {
        ResponsesError::Refused { message, param } => refuse(&message, param),
        other => refuse(&other.to_string(), None),
    }
}

/// `create_responses`' checks before the prompt is built.
fn refusal(engine: &SimEngine, req: &ResponsesRequest) -> Option<Response<Body>> {
    if let Some(error) = req.prompt.shell_refusal() {
        return Some(refused(error));
    }
    let enabled = store_enabled(engine);
    if !enabled && req.previous_response_id.is_some() {
        return Some(store_disabled("previous_response_id"));
    }
    if !enabled && req.background {
        return Some(store_disabled("background"));
    }
    if req.background && req.store != Some(true) {
        return Some(refuse(
            "background=true requires store=true.",
            Some("store"),
        ));
    }
    if let Some(model) = &req.model {
        // `_parse_model_parameter`: `base:adapter` names the base model.
        let served = &engine.config.model;
        let base = model
            .split_once(':')
            .map_or(model.as_str(), |(b, _)| b.trim());
        if model != served && base != served {
            let message = format!("The model '{model}' does not exist");
            return Some(responses_error(&message, INVALID, Some("model"), 404));
        }
    }
    if let Some(error) = req.prompt.tool_choice_refusal() {
        return Some(refused(error));
    }
    if req.stream && req.include_logprobs {
        return Some(refuse(
            "logprobs are not supported in streaming mode",
            Some("logprobs"),
        ));
    }
    if let Some(id) = &req.previous_response_id {
        if let Err(response) = lookup(engine, id) {
            return Some(*response);
        }
    }
    None
}

/// `POST /v1/responses`.
pub(crate) async fn create(
    engine: &Arc<SimEngine>,
    body: RouteBody,
) -> Result<Response<Body>, ResetConnection> {
    let req = match body.object().and_then(|body| request::parse(&body)) {
        Ok(req) => req,
        Err(message) => return Ok(responses_validation(&message)),
    };
    if let Some(response) = refusal(engine, &req) {
        return Ok(response);
    }
    run::connection_faults(engine).await?;
    let stored = req
        .previous_response_id
        .as_deref()
        .and_then(|id| engine.responses.history(id))
        .unwrap_or_default();
    let history = req.prompt.history(stored);
    let inline_system = engine.tokenizer.inline_system_support();
    let chat = match req.chat_body(&history, inline_system) {
        Ok(chat) => chat,
        Err(e) => return Ok(refused(ResponsesError::Unconvertible(e))),
    };
    let mut gen = match run::parse(engine, Api::Chat, Value::Object(chat)).await {
        Some(Ok(gen)) => gen,
        Some(Err(e)) => return Ok(refuse(&format!("{e} None"), None)),
        None => return Ok(refuse("tokenizer task failed", None)),
    };
    if req.prompt.max_output_tokens.is_none() {
        // No budget: the scheduler gives what the context leaves (`init_req_max_new_tokens`).
        let input = gen.samples.first().map_or(0, |s| s.input_ids.len());
        gen.max_new_tokens = engine.config.context_length.saturating_sub(input);
    }
    let model = req
        .model
        .clone()
        .unwrap_or_else(|| engine.config.model.clone());
    let created = output::now();
    if let Some(message) = req.prompt.max_tokens_error() {
        if !req.stream {
            return Ok(refuse(&message, None));
        }
        let ran = Ran {
            results: Vec::new(),
            pages: Vec::new(),
            inserts: Vec::new(),
            pace: Pace::default(),
            e2e: 0.0,
        };
        let events = failed_stream(&req, &model, created, &message);
        return run::send(engine, Reply::Stream(events), 0, ran).await;
    }
    let persist = store_enabled(engine) && req.store == Some(true);
    if req.background && !req.stream && persist {
        return Ok(background(engine, req, gen, model, created, history));
    }
    let ran = run::schedule(engine, &gen).await;
    let style = style(engine);
    if req.stream {
        let (events, tokens, kept) =
            streamed(engine, &req, &gen, &ran.results, &style, &model, created);
        if let (true, Some((response, items))) = (persist, kept) {
            engine
                .responses
                .put(&req.id, response, with_items(history, &items));
        }
        return run::send(engine, Reply::Stream(events), tokens, ran).await;
    }
    match full(engine, &req, &gen, &ran.results, &style, &model, created) {
        Ok((response, items, tokens)) => {
            if persist {
                let history = with_items(history, &items);
                engine.responses.put(&req.id, response.clone(), history);
            }
            run::send(
                engine,
                Reply::Full {
                    status: 200,
                    body: response,
                },
                tokens,
                ran,
            )
            .await
        }
        Err(message) => Ok(refuse(&message, None)),
    }
}

fn with_items(mut history: Vec<Value>, items: &[Value]) -> Vec<Value> {
    history.extend(output::stored(items));
    history
}

fn style(engine: &SimEngine) -> Style<'_> {
    Style {
        tokenizer: &engine.tokenizer,
        template: engine.thinking,
        reasoning_parser: engine.config.reasoning_parser.is_some(),
        plain: engine.config.role == SimRole::Prefill,
    }
}

/// The one answer of a Responses request.
fn answer(gen: &GenRequest, results: &[SampleResult], style: &Style) -> Option<Answer> {
    answers(gen, results, style)
        .into_iter()
        .next()?
        .into_iter()
        .next()
}

/// The message of a failed finish.
fn failure_message(finish: &Finish) -> Option<&str> {
    match finish {
        Finish::Stop { .. } | Finish::Length { .. } => None,
        Finish::Abort(info) => Some(&info.message),
        Finish::Rejected { message, .. } | Finish::Error { message } => Some(message),
    }
}

fn outcome(engine: &SimEngine, result: &SampleResult, answer: &Answer) -> Outcome {
    let (status, error) = output::status(answer.finish, failure_message(&result.finish));
    let cached = if engine.config.enable_cache_report {
        result.cached_tokens
    } else {
        0
    };
    Outcome {
        status,
        error,
        usage: output::usage(result.prompt_tokens, answer.ids.len(), cached),
    }
}

/// A non-streamed answer: the response, its items and its generated tokens; `Err`: the
/// message of the 400 a refused or failed prompt gets.
#[allow(clippy::too_many_arguments)]
fn full(
    engine: &SimEngine,
    req: &ResponsesRequest,
    gen: &GenRequest,
    results: &[SampleResult],
    style: &Style,
    model: &str,
    created: u64,
) -> Result<(Value, Vec<Value>, usize), String> {
    let result = results.first().ok_or("no result")?;
    match &result.finish {
        Finish::Rejected { message, .. } | Finish::Error { message } => return Err(message.clone()),
        Finish::Abort(info) => match info.status_code {
            Some(400) => return Err(info.message.clone()),
            // `str()` of the `HTTPException` the tokenizer manager raises.
            Some(status) => return Err(format!("{status}: {}", info.message)),
            None => {}
        },
        Finish::Stop { .. } | Finish::Length { .. } => {}
    }
    let answer = answer(gen, results, style).ok_or("no answer")?;
    let items = output::items(req, &answer);
    let outcome = outcome(engine, result, &answer);
    let response = output::response(req, model, created, items.clone(), &outcome);
    Ok((response, items, answer.ids.len()))
}

/// A failed response without output (`response.failed` of an exception).
fn failed(req: &ResponsesRequest, model: &str, created: u64, message: &str) -> Value {
    let outcome = Outcome {
        status: "failed",
        error: json!({"code": "server_error", "message": message}),
        usage: Value::Null,
    };
    output::response(req, model, created, Vec::new(), &outcome)
}

fn failed_stream(
    req: &ResponsesRequest,
    model: &str,
    created: u64,
    message: &str,
) -> Vec<crate::reply::Event> {
    let initial = output::pending(req, model, created, "in_progress");
    Events::open(&initial).close(&failed(req, model, created, message))
}

/// A streamed answer: its events, its generated tokens, and the response and items to
/// keep (none when an exception ended it).
#[allow(clippy::type_complexity)]
fn streamed(
    engine: &SimEngine,
    req: &ResponsesRequest,
    gen: &GenRequest,
    results: &[SampleResult],
    style: &Style,
    model: &str,
    created: u64,
) -> (Vec<crate::reply::Event>, usize, Option<(Value, Vec<Value>)>) {
    let answer = match (results.first(), answer(gen, results, style)) {
        (Some(result), Some(answer)) if !matches!(result.finish, Finish::Rejected { .. }) => {
            (result, answer)
        }
        (result, _) => {
            let message = result
                .and_then(|r| failure_message(&r.finish))
                .unwrap_or("no result");
            return (failed_stream(req, model, created, message), 0, None);
        }
    };
    let (result, answer) = answer;
    let initial = output::pending(req, model, created, "in_progress");
    let mut events = Events::open(&initial);
    let tokens = answer.ids.len();
    if let Finish::Error { message } = &result.finish {
        // An exception mid-stream: `response.failed` at once, open items left open.
        stream::stream_items(req, &answer, &mut events, false);
        let events = events.close(&failed(req, model, created, message));
        return (events, tokens, None);
    }
    let items = stream::stream_items(req, &answer, &mut events, true);
    let outcome = outcome(engine, result, &answer);
    let response = output::response(req, model, created, items.clone(), &outcome);
    let events = events.close(&response);
    (events, tokens, Some((response, items)))
}

/// `background`: the queued response now, the generation in a task that stores its end.
fn background(
    engine: &Arc<SimEngine>,
    req: ResponsesRequest,
    gen: GenRequest,
    model: String,
    created: u64,
    history: Vec<Value>,
) -> Response<Body> {
    let queued = output::pending(&req, &model, created, "queued");
    engine
        .responses
        .put(&req.id, queued.clone(), history.clone());
    let id = req.id.clone();
    let task = {
        let engine = Arc::clone(engine);
        tokio::spawn(async move {
            engine.responses.set_status(&req.id, "in_progress");
            let ran = run::schedule(&engine, &gen).await;
            let style = style(&engine);
            match full(&engine, &req, &gen, &ran.results, &style, &model, created) {
                Ok((response, items, tokens)) => {
                    run::settle(ran, tokens).await;
                    engine
                        .responses
                        .put(&req.id, response, with_items(history, &items));
                }
                Err(_) => {
                    drop(ran);
                    // `_run_background_request`: an error response marks it failed.
                    engine.responses.set_status(&req.id, "failed");
                }
            }
        })
    };
    engine.responses.set_task(&id, task.abort_handle());
    json_response(StatusCode::OK, &queued)
}

/// `GET /v1/responses/{id}`.
pub(crate) fn retrieve(engine: &SimEngine, id: &str) -> Response<Body> {
    if !store_enabled(engine) {
        return store_disabled("response_id");
    }
    match lookup(engine, id) {
        Ok(response) => json_response(StatusCode::OK, &response),
        Err(response) => *response,
    }
}

/// `POST /v1/responses/{id}/cancel`.
pub(crate) fn cancel(engine: &SimEngine, id: &str) -> Response<Body> {
    if !store_enabled(engine) {
        return store_disabled("response_id");
    }
    if let Err(response) = lookup(engine, id) {
        return *response;
    }
    match engine.responses.cancel(id) {
        Some(response) => json_response(StatusCode::OK, &response),
        None => responses_error(
            &format!("Response with id '{id}' not found."),
            INVALID,
            Some("response_id"),
            404,
        ),
    }
}
