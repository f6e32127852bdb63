//! The per-event rules of a guarded stream (I1): what passes, what is rewritten, what trips.
//!
//! - an `error` event, or a `finish_reason` of abort/error, trips;
//! - `[DONE]` before every sample has a final `finish_reason` trips;
//! - prompt counts in `meta_info` / `usage` are cross-checked as soon as they appear;
//! - generated text is scanned for placeholder markers, incrementally (with overlap);
//! - usage the gateway asked for on the client's behalf is stripped again (`usage.rs`);
//! - output waits for the leak scan where its mode holds it (`hold.rs`).

use bytes::Bytes;
use serde_json::Value;
use std::collections::BTreeSet;

use super::inspect::typed::OpenAiChunk;
use super::inspect::{self, Expectation, Markers, Shape, Trip};
use super::leak::LeakScan;
use super::sse::SseEvent;
use crate::accounting::TokenUsage;
use hold::HoldBack;
use usage::{EngineUsage, UsageStrip};

mod hold;
mod unchecked;
mod usage;

pub use usage::UsageRewrite;

#[cfg(test)]
mod hold_tests;
#[cfg(test)]
mod proptests;

/// The trip for a first data event that is no completion chunk of the pool's protocol.
const NOT_A_CHUNK: Trip = Trip::Unparsable {
    detail: "the engine's first stream event is not a completion chunk",
};

/// What the checks read from one choice of an OpenAI chunk.
struct ChunkChoice<'t> {
    index: usize,
    finish_reason: Option<&'t str>,
    /// `delta.content`, else `text`.
    piece: Option<&'t str>,
}

/// What the checks read from an OpenAI chunk's `usage`.
#[derive(Default)]
struct ChunkUsage {
    prompt_tokens: Option<u64>,
    total_tokens: Option<u64>,
    /// The split the tenant's account takes.
    split: Option<TokenUsage>,
}

/// State of the checks over one stream.
#[derive(Debug)]
pub struct StreamCheck {
    shape: Shape,
    markers: Markers,
    expect: Expectation,
    batch: usize,
    seen: BTreeSet<usize>,
    finished: BTreeSet<usize>,
    done: bool,
    data_events: usize,
    /// Per sample: generated text already scanned (cumulative length for native streams) and
    /// the tail kept for markers spanning events.
    scanned: Vec<(usize, String)>,
    /// Whether the I1 checks run (off: only the leak scan).
    checks: bool,
    leak: Option<LeakScan>,
    /// Output held back for the leak scan (block and strict modes).
    held: HoldBack,
    /// The engine's usage as last reported.
    usage: EngineUsage,
    /// The usage the client did not ask for, taken out of its events.
    strip: UsageStrip,
    /// Read usual OpenAI chunks through the typed view (off only in the tests that compare
    /// it with the tree path).
    typed_view: bool,
}

impl StreamCheck {
    /// Checks for a stream of `batch` samples.
    pub fn new(
        shape: Shape,
        markers: Markers,
        expect: Expectation,
        batch: usize,
        rewrite: UsageRewrite,
    ) -> Self {
        Self {
            shape,
            markers,
            expect,
            batch: batch.max(1),
            seen: BTreeSet::new(),
            finished: BTreeSet::new(),
            done: false,
            data_events: 0,
            scanned: Vec::new(),
            checks: true,
            leak: None,
            held: HoldBack::default(),
            usage: EngineUsage::default(),
            strip: UsageStrip::new(rewrite),
            typed_view: true,
        }
    }

    /// Queue `bytes` for the client and return what may go out now (in order): everything,
    /// unless the leak scan holds output — in block mode while the newest units continue
    /// another tenant's text, in strict mode until enough later units were scanned — or
    /// the stream is done (see `guard/leak.rs` for what each guarantees).
    pub fn release(&mut self, bytes: Bytes) -> Vec<Bytes> {
        let leak = self.leak.as_ref().filter(|_| !self.done);
        self.held.release(bytes, leak)
    }

    /// The engine's reported usage (prompt + completion tokens), for rate-limit settlement.
    pub fn usage_total(&self) -> Option<u64> {
        self.usage.total()
    }

    /// The engine's reported usage split for the tenant's account.
    pub fn token_usage(&self) -> Option<TokenUsage> {
        self.usage.split()
    }

    /// Everything still held (the stream ended and passed).
    pub fn release_all(&mut self) -> Vec<Bytes> {
        self.held.release_all()
    }

    /// Also scan the generated text for other tenants' prompt fragments.
    pub fn with_leak_scan(mut self, leak: Option<LeakScan>) -> Self {
        self.leak = leak;
        self
    }

    /// Turn the I1 checks off (the pool's guard is disabled), keeping the leak scan.
    pub fn without_checks(mut self) -> Self {
        self.checks = false;
        self
    }

    /// Data events checked so far.
    pub fn data_events(&self) -> usize {
        self.data_events
    }

    /// Check one event: the bytes to forward (`None`: drop it), or a trip.
    pub fn event(&mut self, event: &SseEvent) -> Result<Option<Bytes>, Trip> {
        if event.comment_only || event.data.is_none() {
            return Ok(Some(event.raw.clone()));
        }
        self.data_events += 1;
        if !self.checks {
            return self.leak_only(event);
        }
        if event.is_done() {
            self.require_finished("the stream sent [DONE] before a final finish_reason")?;
            self.flush_leak()?;
            self.done = true;
            return Ok(Some(event.raw.clone()));
        }
        // The usual OpenAI chunk (no error, no usage) through the typed view: no tree built.
        if self.shape == Shape::OpenAi && self.typed_view {
            let chunk = event.data.as_deref().and_then(OpenAiChunk::parse);
            if let Some(chunk) = chunk {
                if self.data_events == 1 && !chunk.is_event() {
                    return Err(NOT_A_CHUNK);
                }
                let choices = chunk.choices.array().map(|c| {
                    c.iter()
                        .map(|choice| ChunkChoice {
                            index: choice.index.as_u64().unwrap_or(0) as usize,
                            finish_reason: choice.finish_reason.as_str(),
                            piece: choice.delta_text(),
                        })
                        .collect()
                });
                let (prompt_tokens, total_tokens) = chunk.usage_tokens();
                let no_choices = chunk.choices.array().is_none_or(|c| c.is_empty());
                self.openai_parts(
                    choices,
                    ChunkUsage {
                        prompt_tokens,
                        total_tokens,
                        split: chunk.token_usage(),
                    },
                )?;
                return Ok(self.rewrite_usage(event, chunk.has_usage(), no_choices, None));
            }
        }
        // Engines send JSON objects or [DONE], nothing else: anything else is not their
        // protocol (before the 200 this is a 502, like the non-streaming case).
        let Some(mut value) = event.json().filter(Value::is_object) else {
            return Err(Trip::Unparsable {
                detail: "a stream event from the engine is not a JSON object",
            });
        };
        if let Some(trip) = inspect::error_object(&value) {
            return Err(trip);
        }
        if self.data_events == 1 && !self.shape.is_event(&value) {
            return Err(NOT_A_CHUNK);
        }
        match self.shape {
            Shape::Native => self.native(&value)?,
            Shape::OpenAi => {
                self.openai(&value)?;
                let has_usage = value.get("usage").is_some_and(|u| !u.is_null());
                let no_choices = value
                    .get("choices")
                    .and_then(Value::as_array)
                    .is_none_or(|c| c.is_empty());
                return Ok(self.rewrite_usage(event, has_usage, no_choices, Some(&mut value)));
            }
        }
        Ok(Some(event.raw.clone()))
    }

    /// At the end of the stream: every sample finished and `[DONE]` seen.
    pub fn end(&mut self) -> Result<(), Trip> {
        self.flush_leak()?;
        if !self.checks {
            return Ok(());
        }
        self.require_finished("the stream ended before a final finish_reason")?;
        if !self.done {
            return Err(Trip::Truncated {
                detail: "the stream ended without [DONE]",
            });
        }
        Ok(())
    }

    /// Every sample has had its final `finish_reason`.
    fn all_finished(&self) -> bool {
        self.finished.len() >= self.batch && self.seen.iter().all(|i| self.finished.contains(i))
    }

    fn require_finished(&self, detail: &'static str) -> Result<(), Trip> {
        if !self.all_finished() {
            return Err(Trip::Truncated { detail });
        }
        Ok(())
    }

    fn native(&mut self, v: &Value) -> Result<(), Trip> {
        let index = v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize;
        self.seen.insert(index);
        if let Some(meta) = v.get("meta_info") {
            let used = ["prompt_tokens", "completion_tokens"]
                .iter()
                .filter_map(|k| meta.get(*k).and_then(Value::as_u64))
                .sum::<u64>();
            self.usage.sample(index, used);
            if let Some(split) = TokenUsage::from_meta(meta) {
                self.usage.sample_split(index, split);
            }
            if inspect::native_finish(meta.get("finish_reason").unwrap_or(&Value::Null))? {
                self.finished.insert(index);
            }
            self.expect.check_prompt_tokens(
                Some(index),
                meta.get("prompt_tokens").and_then(Value::as_u64),
            )?;
        }
        if let Some(text) = v.get("text").and_then(Value::as_str) {
            // Native text is cumulative: scan only what is new (plus the overlap).
            self.scan(index, text, true)?;
        }
        Ok(())
    }

    fn openai(&mut self, v: &Value) -> Result<(), Trip> {
        let choices = v.get("choices").and_then(Value::as_array).map(|c| {
            c.iter()
                .map(|choice| ChunkChoice {
                    index: choice.get("index").and_then(Value::as_u64).unwrap_or(0) as usize,
                    finish_reason: choice.get("finish_reason").and_then(Value::as_str),
                    piece: choice
                        .get("delta")
                        .and_then(|x| x.get("content"))
                        .or_else(|| choice.get("text"))
                        .and_then(Value::as_str),
                })
                .collect()
        });
        let usage = v.get("usage");
        let usage = ChunkUsage {
            prompt_tokens: usage
                .and_then(|x| x.get("prompt_tokens"))
                .and_then(Value::as_u64),
            total_tokens: usage
                .and_then(|x| x.get("total_tokens"))
                .and_then(Value::as_u64),
            split: usage.and_then(TokenUsage::from_usage),
        };
        self.openai_parts(choices, usage)
    }

    /// The OpenAI chunk checks over what they read, however it was read (tree or typed view).
    fn openai_parts(
        &mut self,
        choices: Option<Vec<ChunkChoice<'_>>>,
        usage: ChunkUsage,
    ) -> Result<(), Trip> {
        for choice in choices.iter().flatten() {
            self.seen.insert(choice.index);
            if inspect::openai_finish_reason(choice.finish_reason)? {
                self.finished.insert(choice.index);
            }
            if let Some(piece) = choice.piece {
                self.scan(choice.index, piece, false)?;
            }
            if let Some(n) = usage.prompt_tokens {
                self.expect
                    .check_prompt_tokens(Some(choice.index), Some(n))?;
            }
        }
        if let Some(total) = usage.total_tokens {
            match choices.as_ref().and_then(|c| c.first()) {
                Some(c) => self.usage.sample(c.index, total),
                None => self.usage.final_total(total),
            }
        }
        if let Some(split) = usage.split {
            match choices.as_ref().and_then(|c| c.first()) {
                Some(c) => self.usage.sample_split(c.index, split),
                None => self.usage.final_split(split),
            }
        }
        if choices.is_none_or(|c| c.is_empty()) {
            self.expect.check_prompt_tokens(None, usage.prompt_tokens)?;
        }
        Ok(())
    }

    fn flush_leak(&mut self) -> Result<(), Trip> {
        match self.leak.as_mut() {
            Some(leak) => leak.push("", true),
            None => Ok(()),
        }
    }

    /// Guard checks off: pass everything, scan the text for leaks only.
    fn leak_only(&mut self, event: &SseEvent) -> Result<Option<Bytes>, Trip> {
        if event.is_done() {
            self.flush_leak()?;
            self.done = true;
            return Ok(Some(event.raw.clone()));
        }
        if let Some(v) = event.json() {
            let pieces: Vec<(usize, String, bool)> = match self.shape {
                Shape::Native => v
                    .get("text")
                    .and_then(Value::as_str)
                    .map(|t| {
                        vec![(
                            v.get("index").and_then(Value::as_u64).unwrap_or(0) as usize,
                            t.to_owned(),
                            true,
                        )]
                    })
                    .unwrap_or_default(),
                Shape::OpenAi => v
                    .get("choices")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .filter_map(|c| {
                        let piece = c
                            .get("delta")
                            .and_then(|x| x.get("content"))
                            .or_else(|| c.get("text"))
                            .and_then(Value::as_str)?;
                        Some((
                            c.get("index").and_then(Value::as_u64).unwrap_or(0) as usize,
                            piece.to_owned(),
                            false,
                        ))
                    })
                    .collect(),
            };
            for (index, text, cumulative) in pieces {
                self.scan(index, &text, cumulative)?;
            }
            // Unchecked, still read for the tenant's account; usage the gateway asked for
            // on the client's behalf is taken out again.
            let mut v = v;
            if let Some((has_usage, no_choices)) = self.read_usage_unchecked(&v) {
                return Ok(self.rewrite_usage(event, has_usage, no_choices, Some(&mut v)));
            }
        }
        Ok(Some(event.raw.clone()))
    }

    fn scan(&mut self, index: usize, text: &str, cumulative: bool) -> Result<(), Trip> {
        if self.markers.is_empty() || !self.checks {
            // Only the leak scan wants the text.
            if self.scanned.len() <= index {
                self.scanned.resize_with(index + 1, Default::default);
            }
            let (done_len, _) = &mut self.scanned[index];
            let new = if cumulative {
                text.get(*done_len..).unwrap_or(text)
            } else {
                text
            };
            if let Some(leak) = self.leak.as_mut() {
                leak.push(new, false)?;
            }
            if cumulative {
                *done_len = text.len();
            }
            return Ok(());
        }
        if self.scanned.len() <= index {
            self.scanned.resize_with(index + 1, Default::default);
        }
        let (done_len, tail) = &mut self.scanned[index];
        let new = if cumulative {
            text.get(*done_len..).unwrap_or(text)
        } else {
            text
        };
        let window = format!("{tail}{new}");
        if self.markers.matches(&window) {
            return Err(Trip::PlaceholderMarker);
        }
        if let Some(leak) = self.leak.as_mut() {
            leak.push(new, false)?;
        }
        *done_len = if cumulative {
            text.len()
        } else {
            *done_len + new.len()
        };
        let keep = self.markers.overlap();
        let mut start = window.len().saturating_sub(keep);
        while !window.is_char_boundary(start) {
            start += 1;
        }
        *tail = window[start..].to_owned();
        Ok(())
    }

    /// What goes out for an OpenAI event: as received, or without the usage the client did
    /// not ask for (`usage.rs`), or nothing.
    fn rewrite_usage(
        &mut self,
        event: &SseEvent,
        has_usage: bool,
        no_choices: bool,
        tree: Option<&mut Value>,
    ) -> Option<Bytes> {
        if !has_usage {
            return Some(event.raw.clone());
        }
        let all_finished = self.all_finished();
        self.strip.apply(event, no_choices, all_finished, tree)
    }
}
