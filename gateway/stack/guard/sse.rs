//! The guard's SSE re-framer: an incremental parser that turns the byte chunks of an engine's
//! `text/event-stream` body into complete events, each carrying its exact received bytes so the
//! guard can pass it through untouched, hold it back, or replace it.
//!
//! Parsing follows the WHATWG EventSource rules, adapted for a proxy that must re-emit:
//!
//! - lines end in CRLF, LF or a lone CR; a CR that ends one chunk and an LF that starts the next
//!   are one terminator;
//! - an event ends at a blank line; every blank line ends one event, so two blank lines in a row
//!   yield an event with no fields (its `raw` is the extra blank line) — nothing is dropped;
//! - `:` lines are comments: ignored for the fields, kept in `raw`;
//! - `name: value` strips exactly one space after the colon; a line without a colon is a field
//!   with an empty value; `data` lines join with `\n`; `event` and `id` keep the last value
//!   (an `id` containing NUL is ignored); other fields (including `retry`) are ignored;
//! - a UTF-8 BOM at the very start of the stream is skipped for parsing (and kept in `raw`);
//! - invalid UTF-8 in a field is converted lossily; `raw` keeps the bytes.
//!
//! Memory is bounded by [`SseReframer::with_limit`]: an event longer than the limit is an
//! [`SseError`], not an ever-growing buffer.
//!
//! Cost: each chunk is copied once into a buffer shared by the events cut from it
//! ([`BytesMut::split_to`], no copy per event); terminators are found with `memchr` from a scan
//! cursor, so every byte is looked at once however the stream is chunked. The buffer grows in
//! slabs of at least [`SLAB_BYTES`], so most pushes allocate nothing beyond the events' fields.
//!
//! One latency caveat: an event whose final blank line ends in a lone CR at the very end of a
//! chunk is held until the next byte (or [`SseReframer::finish`]) shows whether an LF follows,
//! since that LF belongs to the event's `raw`. SGLang, vLLM and OpenAI terminate with LF, so
//! their streams are never held.

use bytes::{Bytes, BytesMut};
use memchr::{memchr, memchr2};

mod rewrite;
#[cfg(test)]
pub(crate) mod tests;

pub use rewrite::{rewrite_stream, Rewrite, StreamFailure};

/// Default for [`SseReframer::with_limit`]: 16 MiB per event.
pub const DEFAULT_MAX_EVENT_BYTES: usize = 16 * 1024 * 1024;

/// Minimum size the buffer grows by, so small chunks share one allocation.
pub const SLAB_BYTES: usize = 64 * 1024;

const BOM: &[u8] = b"\xEF\xBB\xBF";

/// One complete SSE event as received.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SseEvent {
    /// The event's bytes exactly as received, including its terminating blank line
    /// (pass-through re-emission). The first event also carries a leading BOM, if any.
    pub raw: Bytes,
    /// `data:` lines joined with '\n' (one leading space after the colon stripped, per the
    /// spec); None when the event has no data field.
    pub data: Option<String>,
    /// `event:` field, if any (the last one wins).
    pub event: Option<String>,
    /// `id:` field, if any (the last one without a NUL wins).
    pub id: Option<String>,
    /// True when the event consists only of comment lines (`: keep-alive`).
    pub comment_only: bool,
    /// False only for the unterminated tail returned by [`SseReframer::finish`]: the stream
    /// ended before the event's blank line.
    pub complete: bool,
}

// === impl SseEvent ===

impl SseEvent {
    /// `data == Some("[DONE]")` (trimmed).
    pub fn is_done(&self) -> bool {
        self.data.as_deref().is_some_and(|d| d.trim() == "[DONE]")
    }

    /// Parse `data` as JSON (None when absent, [DONE], or not JSON).
    pub fn json(&self) -> Option<serde_json::Value> {
        let data = self.data.as_deref()?;
        if self.is_done() {
            return None;
        }
        serde_json::from_str(data).ok()
    }

    /// True when the event carries nothing the guard reads: no data, event or id, and not a
    /// comment — a stray blank line, or only ignored fields such as `retry:`.
    pub fn is_empty(&self) -> bool {
        self.data.is_none() && self.event.is_none() && self.id.is_none() && !self.comment_only
    }

    /// A new `data: <payload>\n\n` event. A payload containing line breaks (LF, CRLF or CR)
    /// becomes several data lines, so the event parses back to the payload with `\n` breaks.
    pub fn data_event(payload: &str) -> Bytes {
        let mut buf = BytesMut::with_capacity(payload.len() + 8);
        let mut rest = payload.as_bytes();
        loop {
            buf.extend_from_slice(b"data: ");
            match memchr2(b'\n', b'\r', rest) {
                Some(i) => {
                    buf.extend_from_slice(&rest[..i]);
                    buf.extend_from_slice(b"\n");
                    let crlf = rest[i] == b'\r' && rest.get(i + 1) == Some(&b'\n');
                    rest = &rest[i + 1 + usize::from(crlf)..];
                }
                None => {
                    buf.extend_from_slice(rest);
                    buf.extend_from_slice(b"\n\n");
                    return buf.freeze();
                }
            }
        }
    }
}

/// Why the re-framer stopped.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum SseError {
    /// An event grew past the configured limit without ending.
    #[error("SSE event exceeds {limit} bytes")]
    EventTooLarge {
        /// The configured `max_event_bytes`.
        limit: usize,
    },
}

/// The fields of the event being read, filled line by line.
#[derive(Debug, Default)]
struct Fields {
    data: Option<Vec<u8>>,
    event: Option<String>,
    id: Option<String>,
    lines: usize,
    comments: usize,
}

// === impl Fields ===

impl Fields {
    /// One line, without its terminator.
    fn line(&mut self, line: &[u8]) {
        self.lines += 1;
        if line.first() == Some(&b':') {
            self.comments += 1;
            return;
        }
        let (name, value) = match memchr(b':', line) {
            Some(i) => {
                let value = &line[i + 1..];
                (&line[..i], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &[][..]),
        };
        match name {
            b"data" => match &mut self.data {
                Some(data) => {
                    data.push(b'\n');
                    data.extend_from_slice(value);
                }
                None => self.data = Some(value.to_vec()),
            },
            b"event" => self.event = Some(lossy(value)),
            b"id" if !value.contains(&0) => self.id = Some(lossy(value)),
            _ => {}
        }
    }

    /// The event so far, leaving `self` empty for the next one.
    fn take(&mut self, raw: Bytes, complete: bool) -> SseEvent {
        let fields = std::mem::take(self);
        SseEvent {
            raw,
            data: fields
                .data
                .map(|d| String::from_utf8(d).unwrap_or_else(|e| lossy(e.as_bytes()))),
            event: fields.event,
            id: fields.id,
            comment_only: fields.lines > 0 && fields.lines == fields.comments,
            complete,
        }
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Incremental re-framer: feed arbitrary chunks, get complete events.
#[derive(Debug)]
pub struct SseReframer {
    /// Bytes of events not yet emitted; always starts at an event boundary.
    buf: BytesMut,
    /// Start of the first line not yet parsed.
    line_start: usize,
    /// Where the terminator search resumes (everything before it holds none).
    search_from: usize,
    /// The last parsed line ended in a CR at the end of `buf`; an LF next belongs to it.
    after_cr: bool,
    /// That CR ended a blank line: the event is complete, waiting only for its `raw` end.
    held: bool,
    /// No byte parsed yet (a BOM may still be arriving).
    at_start: bool,
    fields: Fields,
    max_event_bytes: usize,
    failed: Option<SseError>,
}

// === impl SseReframer ===

impl Default for SseReframer {
    fn default() -> Self {
        Self::new()
    }
}

impl SseReframer {
    /// A re-framer with the default limit of [`DEFAULT_MAX_EVENT_BYTES`] per event.
    pub fn new() -> Self {
        Self::with_limit(DEFAULT_MAX_EVENT_BYTES)
    }

    /// A re-framer refusing any event longer than `max_event_bytes` (its `raw` length).
    pub fn with_limit(max_event_bytes: usize) -> Self {
        Self {
            buf: BytesMut::new(),
            line_start: 0,
            search_from: 0,
            after_cr: false,
            held: false,
            at_start: true,
            fields: Fields::default(),
            max_event_bytes,
            failed: None,
        }
    }

    /// Feed a chunk; complete events are appended to `out` (no allocation per call beyond the
    /// events, except when the buffer needs a new slab).
    ///
    /// # Errors
    /// [`SseError::EventTooLarge`] when an event (complete or still growing) exceeds the limit.
    /// Events completed before it in the same chunk are still appended. The stream cannot be
    /// re-synchronised after that, so every later call fails the same way and
    /// [`finish`](Self::finish) returns None.
    pub fn push(&mut self, chunk: &[u8], out: &mut impl Extend<SseEvent>) -> Result<(), SseError> {
        if let Some(error) = &self.failed {
            return Err(error.clone());
        }
        if self.buf.capacity() - self.buf.len() < chunk.len() {
            self.buf.reserve(chunk.len().max(SLAB_BYTES));
        }
        self.buf.extend_from_slice(chunk);
        match self.scan(out) {
            Ok(()) => Ok(()),
            Err(error) => {
                self.buf = BytesMut::new();
                self.fields = Fields::default();
                self.failed = Some(error.clone());
                Err(error)
            }
        }
    }

    /// End of stream: an unterminated trailing event (bytes after the last blank line), if any,
    /// with `complete == false`. It can also be a complete event held back only to see whether
    /// an LF followed its final CR (`complete == true`). Resets the re-framer for a new stream.
    pub fn finish(&mut self) -> Option<SseEvent> {
        let limit = self.max_event_bytes;
        let mut state = std::mem::replace(self, Self::with_limit(limit));
        if state.failed.is_some() || state.buf.is_empty() {
            return None;
        }
        if state.held {
            let raw = state.buf.split().freeze();
            return Some(state.fields.take(raw, true));
        }
        let tail = &state.buf[state.line_start..];
        if !tail.is_empty() {
            state.fields.line(tail);
        }
        let raw = state.buf.split().freeze();
        Some(state.fields.take(raw, false))
    }

    /// Bytes buffered but not yet emitted as part of a complete event.
    pub fn buffered(&self) -> usize {
        self.buf.len()
    }

    /// Parse every complete line in `buf`, emitting events at blank lines.
    fn scan(&mut self, out: &mut impl Extend<SseEvent>) -> Result<(), SseError> {
        if self.at_start {
            let len = self.buf.len().min(BOM.len());
            // Wait while the buffer could still be the start of a BOM.
            if self.buf[..len] != BOM[..len] || len == BOM.len() {
                if self.buf.starts_with(BOM) {
                    self.line_start = BOM.len();
                    self.search_from = BOM.len();
                }
                self.at_start = false;
            }
        }
        if !self.at_start {
            self.scan_lines(out)?;
        }
        if self.buf.len() > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        Ok(())
    }

    fn scan_lines(&mut self, out: &mut impl Extend<SseEvent>) -> Result<(), SseError> {
        loop {
            if self.after_cr {
                let Some(&next) = self.buf.get(self.line_start) else {
                    break;
                };
                if next == b'\n' {
                    self.line_start += 1;
                    self.search_from = self.line_start;
                }
                self.after_cr = false;
                if self.held {
                    self.held = false;
                    self.emit(out)?;
                }
            }
            let from = self.search_from;
            let Some(i) = memchr2(b'\n', b'\r', &self.buf[from..]) else {
                self.search_from = self.buf.len();
                break;
            };
            let end = from + i;
            let line = self.line_start..end;
            let mut next = end + 1;
            if self.buf[end] == b'\r' {
                match self.buf.get(next) {
                    Some(b'\n') => next += 1,
                    Some(_) => {}
                    None => self.after_cr = true,
                }
            }
            self.line_start = next;
            self.search_from = next;
            if line.is_empty() {
                if self.after_cr {
                    self.held = true;
                } else {
                    self.emit(out)?;
                }
            } else {
                self.fields.line(&self.buf[line]);
            }
        }
        Ok(())
    }

    /// Cut the event ending at `line_start` off the buffer.
    fn emit(&mut self, out: &mut impl Extend<SseEvent>) -> Result<(), SseError> {
        let len = self.line_start;
        if len > self.max_event_bytes {
            return Err(SseError::EventTooLarge {
                limit: self.max_event_bytes,
            });
        }
        let raw = self.buf.split_to(len).freeze();
        self.line_start = 0;
        self.search_from = 0;
        out.extend([self.fields.take(raw, true)]);
        Ok(())
    }
}
