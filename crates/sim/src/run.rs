//! Running a parsed request through the engine and sending what it answers: the part of a
//! generation every route that schedules work shares (`/generate`, the OpenAI APIs,
//! `/v1/responses`, and the prefill-only routes of `pooling.rs`).
//!
//! [`schedule`] admits each sample into the running batch (KV pages, seat), charges the
//! prefill and prepares the prefix-cache inserts; [`send`] turns the reply into HTTP with
//! the engine's pace and its stream faults, holding the pages until the answer is out.

use std::sync::Arc;
use std::time::Instant;

use http_body_util::BodyExt;
use hyper::{Response, StatusCode};
use serde_json::Value;

use super::config::{SimFault, SimRole};
use super::engine::SimEngine;
use super::listen::{json_response, Body, ResetConnection};
use super::prefill::{self, CacheInsert};
use super::reply::{Event, Reply};
use super::request::{self, Api, GenRequest, ParseError};
use super::schedule::{self, SampleResult};
use super::scheduler::Running;
use super::stream::{Pace, SseBody};
use super::vision_load::{self, Fetched};

/// A request's samples after the scheduler ran them, with what they still hold.
pub(crate) struct Ran {
    pub(crate) results: Vec<SampleResult>,
    /// The running requests (pages and seats) to hold until the answer is out.
    pub(crate) pages: Vec<Running>,
    /// Prompts that enter the prefix cache once their prefill is over (the first token).
    pub(crate) inserts: Vec<CacheInsert>,
    pub(crate) pace: Pace,
    /// Seconds from the first admission to the last result.
    pub(crate) e2e: f64,
}

/// The connection faults of a route that schedules work: [`SimFault::Hang`] never answers,
/// [`SimFault::Reset`] drops the connection.
pub(crate) async fn connection_faults(engine: &SimEngine) -> Result<(), ResetConnection> {
    match engine.config.fault {
        SimFault::Hang => std::future::pending::<()>().await,
        SimFault::Reset => return Err(ResetConnection),
        _ => {}
    }
    Ok(())
}

/// Runs `work` on a blocking thread (tokenizing and rendering are CPU work); `None` when
/// the task failed.
pub(crate) async fn off_thread<T: Send + 'static>(
    work: impl FnOnce() -> T + Send + 'static,
) -> Option<T> {
    tokio::task::spawn_blocking(work).await.ok()
}

/// Parses a generation body of `api` off the async workers.
pub(crate) async fn parse(
    engine: &Arc<SimEngine>,
    api: Api,
    body: Value,
) -> Option<Result<GenRequest, ParseError>> {
    // A vision model's `http://` images are fetched here, on the async side; the parse
    // (rendering, tokenizing) runs on a blocking thread.
    let fetched = match (&engine.config.vision, api) {
        (Some(_), Api::Chat) => vision_load::prefetch(&engine.client, &body).await,
        _ => Fetched::none(),
    };
    let engine = Arc::clone(engine);
    off_thread(move || {
        let tokenize = request::Tokenize(&engine.tokenizer, request::Tokens::Ids);
        request::parse_with_images(api, &body, &engine.config, &tokenize, &fetched)
    })
    .await
}

/// Runs every sample of `req` through the scheduler, in order.
pub(crate) async fn schedule(engine: &Arc<SimEngine>, req: &GenRequest) -> Ran {
    let started = Instant::now();
    let mut results = Vec::with_capacity(req.samples.len());
    let mut pages = Vec::new();
    for sample in &req.samples {
        let (result, hold) = schedule::run_sample(engine, req.max_new_tokens, sample).await;
        results.push(result);
        pages.extend(hold);
    }
    let e2e = started.elapsed().as_secs_f64();
    // A unified engine computes the prompts' uncached KV before the first token; a prefill
    // worker spent that time before publishing, and a decode received the KV ready-made.
    let prefill = match engine.config.role {
        SimRole::Unified => {
            let uncached = results.iter().map(SampleResult::uncached_tokens).sum();
            prefill::charge(engine, uncached)
        }
        SimRole::Prefill | SimRole::Decode => std::time::Duration::ZERO,
    };
    let pace = Pace::of(&engine.config).after_prefill(prefill);
    // Unified prompts enter the prefix cache when their prefill is over: at the first token.
    let inserts: Vec<CacheInsert> = results
        .iter_mut()
        .filter_map(|r| r.cache_insert.take())
        .collect();
    Ran {
        results,
        pages,
        inserts,
        pace,
        e2e,
    }
}

/// Waits as long as generating `tokens` takes (the first after the prefill), caching the
/// prompts at the first token, then frees the pages: a non-streamed answer's time.
pub(crate) async fn settle(ran: Ran, tokens: usize) {
    let Ran {
        pages,
        inserts,
        pace,
        ..
    } = ran;
    if !pace.is_zero() && tokens > 0 {
        tokio::time::sleep(pace.first).await;
    }
    // The prefill is over by the first token: from now on the prompts are cache hits.
    inserts.into_iter().for_each(CacheInsert::commit);
    if !pace.is_zero() && tokens > 1 {
        let later = u32::try_from(tokens - 1).unwrap_or(u32::MAX);
        tokio::time::sleep(pace.every.saturating_mul(later)).await;
    }
    drop(pages);
}

/// Sends `reply`, which took `tokens` generated tokens, for the request that `ran`.
pub(crate) async fn send(
    engine: &Arc<SimEngine>,
    reply: Reply,
    tokens: usize,
    ran: Ran,
) -> Result<Response<Body>, ResetConnection> {
    match reply {
        Reply::Full { status, body } => {
            // A non-streaming answer still takes as long as generating its tokens.
            settle(ran, tokens).await;
            let code = StatusCode::from_u16(status).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
            Ok(json_response(code, &body))
        }
        Reply::Stream(events) => Ok(stream(engine, events, ran)),
    }
}

/// The SSE response of `events`, with the engine's stream faults applied.
pub(crate) fn stream(engine: &Arc<SimEngine>, mut events: Vec<Event>, ran: Ran) -> Response<Body> {
    let mut stall = false;
    match engine.config.fault {
        // Keep the first three token events; the end never comes.
        SimFault::CutStream => {
            let cut = nth_token_event(&events, 3).unwrap_or(events.len().saturating_sub(2));
            events.truncate(cut);
        }
        // Two token events, then silence with the connection open.
        SimFault::StallStream => {
            events.truncate(nth_token_event(&events, 2).unwrap_or(events.len()));
            stall = true;
        }
        SimFault::GarbageEvent => events.insert(
            0,
            Event {
                token: false,
                data: bytes::Bytes::from_static(
                    b"data: <html><body>502 Bad Gateway</body></html>\n\n",
                ),
            },
        ),
        _ => {}
    }
    let body = SseBody::new(
        events,
        ran.pace,
        ran.pages,
        Arc::clone(&engine.stats),
        Arc::clone(&engine.changed),
    )
    .stalling(stall)
    .caching(ran.inserts);
    let mut response = Response::new(body.boxed_unsync());
    response.headers_mut().insert(
        hyper::header::CONTENT_TYPE,
        hyper::header::HeaderValue::from_static("text/event-stream"),
    );
    response.headers_mut().insert(
        hyper::header::CACHE_CONTROL,
        hyper::header::HeaderValue::from_static("no-cache"),
    );
    response
}

/// The index of the event after the first `n` token events, if there are more.
fn nth_token_event(events: &[Event], n: usize) -> Option<usize> {
    let mut tokens = 0;
    events.iter().position(|e| {
        tokens += usize::from(e.token);
        tokens > n
    })
}
