//! What an OpenAI choice says, before it is JSON: its generated tokens, its text (thought,
//! content) or tool call, how it finished, and the pieces a stream sends it in.
//!
//! The engine's generated ids (the end of the request's KV content, see `schedule.rs`) are
//! the answer of a plain request. The request's options reshape it as a model would:
//!
//! - a forced tool call (`tool_choice`) is the constrained JSON the engine generates
//!   instead, answered as `tool_calls` (plain text, cut, when it does not fit `max_tokens`);
//! - a `response_format` answer is a JSON document, and an answer to a tool's result says
//!   what the tool returned, so a tool loop ends;
//! - thinking puts a short thought before the answer; the budget of `max_tokens` then
//!   keeps the end of the generated ids (a plain answer still ends with the end of the KV
//!   content) and the start of the others;
//! - stop strings end the text at the first of them.
//!
//! `completion_tokens` is always the number of ids the answer represents. Failed samples
//! (aborts, errors) and a prefill's answer (discarded by the router) stay plain.

use serde_json::{json, Value};

use super::json_value::{fit, python_dumps};
use super::options::Format;
use super::reasoning::{split, Thinking, ThinkingTemplate, THOUGHT};
use super::reply::{delta, finish_str, matched_stop, text, text_steps};
use super::request::{Api, GenRequest};
use super::schedule::{Finish, SampleResult};
use super::stop;
use super::tool_call::{self, Made, ToolCall};
use kvgate_tokenize::ModelTokenizer;

/// How this engine answers: its tokenizer and what it does with thinking.
pub(crate) struct Style<'a> {
    pub(crate) tokenizer: &'a ModelTokenizer,
    pub(crate) template: ThinkingTemplate,
    /// `--reasoning-parser` is set.
    pub(crate) reasoning_parser: bool,
    /// Answer every sample plainly (a prefill worker).
    pub(crate) plain: bool,
}

/// A part of a choice a stream sends in one chunk.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Delta {
    Reasoning(String),
    Content(String),
    /// A tool call's id, type and name.
    ToolHead,
    /// A fragment of a tool call's arguments.
    ToolArgs(String),
}

/// One chunk of a streamed choice.
#[derive(Clone, Debug)]
pub(crate) struct Piece {
    pub(crate) delta: Delta,
    /// Tokens generated once it is sent.
    pub(crate) upto: usize,
    /// It is the first chunk after a newly generated token (the stream waits before it).
    pub(crate) token: bool,
}

/// One choice.
#[derive(Clone, Debug)]
pub(crate) struct Answer {
    /// The generated tokens it represents (`completion_tokens`).
    pub(crate) ids: Vec<u32>,
    pub(crate) reasoning: Option<String>,
    /// The text; `None` for a tool call.
    pub(crate) content: Option<String>,
    pub(crate) tool_call: Option<ToolCall>,
    pub(crate) pieces: Vec<Piece>,
    pub(crate) finish: &'static str,
    pub(crate) matched: Value,
}

/// Generated ids and which end of them `max_tokens` keeps after a thought.
enum Body {
    /// The engine's own generated ids (the end of the KV content): their end is kept.
    Tail(Vec<u32>),
    /// A made-up text's ids: their start is kept.
    Head(Vec<u32>),
}

/// The `n` choices of each sample of `req`.
pub(crate) fn answers(
    req: &GenRequest,
    results: &[SampleResult],
    style: &Style,
) -> Vec<Vec<Answer>> {
    results
        .iter()
        .map(|r| (0..req.options.n).map(|_| answer(req, r, style)).collect())
        .collect()
}

fn answer(req: &GenRequest, r: &SampleResult, style: &Style) -> Answer {
    let tokenizer = style.tokenizer;
    let finish = (finish_str(&r.finish), matched_stop(&r.finish));
    let output = r.output_ids.clone();
    let reshaped = !style.plain && matches!(r.finish, Finish::Stop { .. } | Finish::Length { .. });
    if !reshaped {
        let max = output.len();
        return text_answer(
            style,
            req.stream,
            Thinking::Off,
            Body::Tail(output),
            max,
            &[],
            finish,
        );
    }
    let max = match r.finish {
        Finish::Length { length } => length,
        _ => req.max_new_tokens,
    };
    let options = &req.options;
    if req.api != Api::Chat {
        return text_answer(
            style,
            req.stream,
            Thinking::Off,
            Body::Tail(output),
            max,
            &options.stop,
            finish,
        );
    }
    // A made-up text ends as the model ends it: with EOS.
    let eos = ("stop", json!(tokenizer.eos_token_id()));
    let encode = |text: &str| tokenizer.encode(text, false).unwrap_or_default();
    if let Some(tool) = &options.tool {
        let made = tool_call::make(tokenizer, tool);
        if made.ids.len() <= max {
            return tool_answer(made);
        }
        return text_answer(
            style,
            req.stream,
            Thinking::Off,
            Body::Head(made.ids),
            max,
            &[],
            eos,
        );
    }
    let thinking = Thinking::of(style.template, style.reasoning_parser, options);
    let body = match (&options.format, &options.tool_result) {
        (Some(format), _) => Body::Head(encode(&python_dumps(&document(format)))),
        (None, Some(result)) => Body::Head(encode(&about_tool_result(result))),
        (None, None) => {
            return text_answer(
                style,
                req.stream,
                thinking,
                Body::Tail(output),
                max,
                &options.stop,
                finish,
            )
        }
    };
    text_answer(style, req.stream, thinking, body, max, &options.stop, eos)
}

/// The JSON document of a `response_format`.
fn document(format: &Format) -> Value {
    match format {
        Format::JsonSchema(schema) => fit(schema),
        Format::JsonObject => fit(&json!({
            "type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"],
        })),
    }
}

/// An answer to a tool's result: it says what the tool returned.
fn about_tool_result(result: &str) -> String {
    let result: String = result.chars().take(200).collect();
    format!("The tool returned: {}. That is the answer.", result.trim())
}

fn tool_answer(made: Made) -> Answer {
    let mut pieces = vec![Piece {
        delta: Delta::ToolHead,
        upto: made.head_tokens,
        token: true,
    }];
    pieces.extend(made.fragments.into_iter().map(|(fragment, upto)| Piece {
        delta: Delta::ToolArgs(fragment),
        upto,
        token: true,
    }));
    Answer {
        ids: made.ids,
        reasoning: None,
        content: None,
        tool_call: Some(made.call),
        pieces,
        finish: "tool_calls",
        matched: Value::Null,
    }
}

/// The longest prefix of `text` of at most `bytes` bytes that ends on a character.
fn prefix(text: &str, bytes: usize) -> &str {
    let mut n = bytes.min(text.len());
    while !text.is_char_boundary(n) {
        n -= 1;
    }
    text.get(..n).unwrap_or_default()
}

/// A text answer: an optional thought, then `body`, within `max` tokens, cut at a stop.
fn text_answer(
    style: &Style,
    stream: bool,
    thinking: Thinking,
    body: Body,
    max: usize,
    stops: &[String],
    finish: (&'static str, Value),
) -> Answer {
    let tokenizer = style.tokenizer;
    let mut ids = match thinking {
        Thinking::Off => Vec::new(),
        Thinking::Inline | Thinking::Separate => {
            tokenizer.encode(THOUGHT, false).unwrap_or_default()
        }
    };
    ids.truncate(max);
    let room = max - ids.len();
    let fits = match body {
        Body::Tail(body) => {
            ids.extend(
                body.get(body.len().saturating_sub(room)..)
                    .unwrap_or_default(),
            );
            body.len() <= room
        }
        Body::Head(body) => {
            ids.extend(body.iter().take(room));
            body.len() <= room
        }
    };
    let (mut finish, mut matched) = if fits {
        finish
    } else {
        ("length", Value::Null)
    };
    let mut cut = usize::MAX;
    if let Some(stopped) = stop::find(tokenizer, &ids, stops) {
        ids.truncate(stopped.tokens);
        (finish, matched, cut) = ("stop", json!(stopped.matched), stopped.cut);
    }
    let separate = thinking == Thinking::Separate;
    let pieces = if stream {
        text_pieces(tokenizer, &ids, cut, separate)
    } else {
        Vec::new()
    };
    let full = text(tokenizer, &ids);
    let full = prefix(&full, cut);
    let (reasoning, content) = if separate { split(full) } else { ("", full) };
    Answer {
        reasoning: (!reasoning.is_empty()).then(|| reasoning.to_string()),
        content: Some(content.to_string()),
        tool_call: None,
        ids,
        pieces,
        finish,
        matched,
    }
}

/// The stream pieces of a text answer: per generated token, what its text adds to the
/// reasoning and to the content (cut at `cut` bytes).
fn text_pieces(tokenizer: &ModelTokenizer, ids: &[u32], cut: usize, separate: bool) -> Vec<Piece> {
    let mut pieces = Vec::new();
    let (mut sent_reasoning, mut sent_content) = (String::new(), String::new());
    for (k, step) in text_steps(tokenizer, ids) {
        let step = prefix(&step, cut);
        let (reasoning, content) = if separate { split(step) } else { ("", step) };
        let mut token = true;
        let r = delta(&sent_reasoning, reasoning);
        if !r.is_empty() {
            pieces.push(Piece {
                delta: Delta::Reasoning(r.to_string()),
                upto: k,
                token,
            });
            token = false;
        }
        let c = delta(&sent_content, content);
        // Plain streams send every token's step, an empty one too, as they always did.
        if !c.is_empty() || (!separate && token) {
            pieces.push(Piece {
                delta: Delta::Content(c.to_string()),
                upto: k,
                token,
            });
        }
        (sent_reasoning, sent_content) = (reasoning.to_string(), content.to_string());
    }
    pieces
}
