//! A streamed body rewritten event by event: the engine's bytes are re-framed into SSE
//! events ([`SseReframer`]) and a [`Rewrite`] decides what the client gets for them. The
//! Responses guard and the Anthropic translation share this loop; each keeps its own rules.

use bytes::Bytes;
use futures_util::stream::{self, StreamExt};
use http_body::Frame;
use http_body_util::{BodyExt, StreamBody};

use super::{SseEvent, SseReframer};
use crate::body::{self, BoxBody, BoxError};

/// Why the engine's stream could not be read on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamFailure {
    /// An event grew past the re-framer's limit.
    Unreadable(String),
    /// The body failed (a reset, a timeout below).
    Broken(String),
}

/// What a rewritten stream does with the engine's events.
pub trait Rewrite: Send + 'static {
    /// Complete events (or, at the end, the unterminated tail): the bytes to send.
    fn events(&mut self, events: &[SseEvent]) -> Vec<u8>;
    /// The engine's stream failed: the bytes that end the client's.
    fn failed(&mut self, why: StreamFailure) -> Vec<u8>;
    /// The engine's body ended: what the stream still owes (an error when it never
    /// finished).
    fn ended(&mut self) -> Vec<u8>;
    /// Whether the stream is over: nothing more is read from the engine.
    fn done(&self) -> bool;
}

/// `body` as `rewrite` rewrites it.
pub fn rewrite_stream<R: Rewrite>(body: BoxBody, rewrite: R) -> BoxBody {
    let state = (body, SseReframer::new(), rewrite, false);
    let frames = stream::unfold(
        state,
        |(mut body, mut reframer, mut rewrite, mut over)| async move {
            loop {
                if over || rewrite.done() {
                    return None;
                }
                let mut events: Vec<SseEvent> = Vec::new();
                let out = match body.frame().await {
                    Some(Ok(frame)) => {
                        let Ok(data) = frame.into_data() else {
                            continue; // trailers
                        };
                        match reframer.push(&data, &mut events) {
                            Ok(()) => rewrite.events(&events),
                            Err(e) => {
                                over = true;
                                rewrite.failed(StreamFailure::Unreadable(e.to_string()))
                            }
                        }
                    }
                    Some(Err(e)) => {
                        over = true;
                        rewrite.failed(StreamFailure::Broken(e.to_string()))
                    }
                    None => {
                        over = true;
                        let tail: Vec<SseEvent> = reframer.finish().into_iter().collect();
                        let mut out = rewrite.events(&tail);
                        if !rewrite.done() {
                            out.extend(rewrite.ended());
                        }
                        out
                    }
                };
                if !out.is_empty() {
                    let frame = Ok::<_, BoxError>(Frame::data(Bytes::from(out)));
                    return Some((frame, (body, reframer, rewrite, over)));
                }
            }
        },
    );
    body::boxed(StreamBody::new(frames.boxed()))
}
