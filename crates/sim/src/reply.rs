//! What a finished generation turns into: a JSON answer or a list of SSE events.

use bytes::Bytes;
use serde_json::{json, Value};

use super::schedule::{Finish, SampleResult};
use kvgate_tokenize::ModelTokenizer;

/// One server-sent event, ready to write.
#[derive(Clone, Debug)]
pub(crate) struct Event {
    /// Whether the engine spends one `token_latency` before this event (a generated token).
    pub(crate) token: bool,
    pub(crate) data: Bytes,
}

impl Event {
    /// `data: <json>\n\n`.
    pub(crate) fn json(token: bool, value: &Value) -> Self {
        Self {
            token,
            data: Bytes::from(format!("data: {value}\n\n")),
        }
    }

    /// `data: [DONE]\n\n`.
    pub(crate) fn done() -> Self {
        Self {
            token: false,
            data: Bytes::from_static(b"data: [DONE]\n\n"),
        }
    }
}

/// A response before it becomes HTTP.
pub(crate) enum Reply {
    Full { status: u16, body: Value },
    Stream(Vec<Event>),
}

/// SGLang's `finish_reason` object.
pub(crate) fn finish_json(finish: &Finish) -> Value {
    match finish {
        Finish::Stop { matched } => json!({"type": "stop", "matched": matched}),
        Finish::Length { length } => json!({"type": "length", "length": length}),
        Finish::Abort(info) => json!({
            "type": "abort", "message": info.message,
            "status_code": info.status_code, "err_type": info.err_type,
        }),
        Finish::Rejected { message, status } => json!({
            "type": "abort", "message": message, "status_code": status, "err_type": null,
        }),
        Finish::Error { message } => json!({
            "type": "abort", "message": message, "status_code": 500, "err_type": null,
        }),
    }
}

/// OpenAI's `finish_reason` string (SGLang adds `"abort"`).
pub(crate) fn finish_str(finish: &Finish) -> &'static str {
    match finish {
        Finish::Stop { .. } => "stop",
        Finish::Length { .. } => "length",
        Finish::Abort(_) | Finish::Rejected { .. } | Finish::Error { .. } => "abort",
    }
}

/// SGLang's `matched_stop` of an OpenAI choice.
pub(crate) fn matched_stop(finish: &Finish) -> Value {
    match finish {
        Finish::Stop { matched } => json!(matched),
        _ => Value::Null,
    }
}

/// Text of a sample's output.
pub(crate) fn text(tokenizer: &ModelTokenizer, ids: &[u32]) -> String {
    tokenizer.decode(ids, true).unwrap_or_default()
}

/// Cumulative text after each generated token, as `(tokens so far, text)`. Steps that end
/// inside a multi-byte character are held back, as SGLang's incremental detokenizer does.
pub(crate) fn text_steps(tokenizer: &ModelTokenizer, ids: &[u32]) -> Vec<(usize, String)> {
    (1..=ids.len())
        .filter_map(|k| {
            let text = text(tokenizer, ids.get(..k).unwrap_or_default());
            (k == ids.len() || !text.ends_with('\u{FFFD}')).then_some((k, text))
        })
        .collect()
}

/// The part of `text` not yet sent, given what was sent before.
pub(crate) fn delta<'a>(sent: &str, text: &'a str) -> &'a str {
    text.strip_prefix(sent).unwrap_or(text)
}

/// Whether the last token event carries the finish reason (a normal end), rather than a
/// separate final event (an abort or error after the tokens).
pub(crate) fn ends_with_token(result: &SampleResult) -> bool {
    !result.output_ids.is_empty()
        && matches!(result.finish, Finish::Stop { .. } | Finish::Length { .. })
}

/// Seconds since the Unix epoch, for OpenAI's `created`.
pub(crate) fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
