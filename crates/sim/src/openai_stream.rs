//! The streamed form of an OpenAI answer, as SGLang sends it: per prompt, a role chunk for
//! each of its `n` choices (chat), the choices' pieces interleaved token by token (each
//! with the logprobs of the tokens it adds, when asked for, and running usage with
//! `continuous_usage_stats`), a finish chunk for each, then the usage chunk
//! (`include_usage`) and `[DONE]`. Errors raised in the engine end the stream with one
//! `data: {"error": ...}` event.

use serde_json::{json, Value};

use super::answer::{Answer, Delta, Piece, Style};
use super::logprobs::{self, Entry};
use super::openai::{error_object, usage};
use super::reply::{unix_now, Event};
use super::request::{Api, GenRequest};
use super::schedule::{Finish, SampleResult};
use super::tool_call;

/// What every chunk of one response shares.
struct Chunks<'a> {
    req: &'a GenRequest,
    model: &'a str,
    created: u64,
    chat: bool,
}

impl Chunks<'_> {
    fn object(&self) -> &'static str {
        if self.chat {
            "chat.completion.chunk"
        } else {
            "text_completion"
        }
    }

    /// One choice's chunk; `usage` is `(prompt, completion)` tokens so far.
    fn chunk(
        &self,
        index: usize,
        piece: Value,
        logprobs: Value,
        finish: Option<(&str, &Value)>,
        usage: (usize, usize),
    ) -> Value {
        let finish_reason = finish.map_or(Value::Null, |(f, _)| json!(f));
        let mut choice = if self.chat {
            json!({"index": index, "delta": piece, "logprobs": logprobs, "finish_reason": finish_reason})
        } else {
            json!({"index": index, "text": piece, "logprobs": logprobs, "finish_reason": finish_reason})
        };
        if let (Some((_, matched)), Some(map)) = (finish, choice.as_object_mut()) {
            map.insert("matched_stop".into(), matched.clone());
        }
        let mut event = json!({"id": self.req.id, "object": self.object(), "created": self.created, "model": self.model, "choices": [choice]});
        if self.req.continuous_usage {
            if let Some(map) = event.as_object_mut() {
                let (prompt, completion) = usage;
                map.insert(
                    "usage".into(),
                    json!({"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}),
                );
            }
        }
        event
    }

    /// The delta (chat) or text (completions) of a piece.
    fn piece(&self, delta: &Delta, answer: &Answer) -> Value {
        match (self.chat, delta) {
            (true, Delta::Reasoning(text)) => json!({"reasoning_content": text}),
            (true, Delta::Content(text)) => json!({"content": text}),
            (true, Delta::ToolHead) => answer
                .tool_call
                .as_ref()
                .map_or(json!({}), |call| tool_call::head_delta(call, 0)),
            (true, Delta::ToolArgs(fragment)) => tool_call::arguments_delta(fragment, 0),
            (false, Delta::Content(text)) => json!(text),
            (false, _) => json!(""),
        }
    }

    fn logprobs(&self, entries: Option<&Vec<Entry>>, from: usize, to: usize) -> Value {
        match (entries, self.req.options.logprobs) {
            (Some(entries), Some(k)) if from < to => {
                if self.chat {
                    logprobs::chat(entries, from..to)
                } else {
                    logprobs::completion(entries, from..to, k)
                }
            }
            _ => Value::Null,
        }
    }
}

/// A choice's pieces grouped by the token that produced them.
fn steps(pieces: &[Piece]) -> Vec<&[Piece]> {
    let mut out = Vec::new();
    let mut start = 0;
    for (i, piece) in pieces.iter().enumerate() {
        if piece.token && i > start {
            out.push(pieces.get(start..i).unwrap_or_default());
            start = i;
        }
    }
    if start < pieces.len() {
        out.push(pieces.get(start..).unwrap_or_default());
    }
    out
}

/// The SSE events of a streamed chat or completions answer.
pub(crate) fn events(
    req: &GenRequest,
    model: &str,
    cache_report: bool,
    results: &[SampleResult],
    answers: &[Vec<Answer>],
    style: &Style,
) -> Vec<Event> {
    let c = Chunks {
        req,
        model,
        created: unix_now(),
        chat: req.api == Api::Chat,
    };
    let n = req.options.n;
    let mut events = Vec::new();
    let mut failed = false;
    for (s, (r, choices)) in results.iter().zip(answers).enumerate() {
        // Errors raised in the engine (ValueError / HTTPException) become one error event.
        let status_error = match &r.finish {
            Finish::Rejected { message, status } => Some((message, *status)),
            Finish::Abort(info) => info.status_code.map(|s| (&info.message, s)),
            _ => None,
        };
        if let Some((message, status)) = status_error {
            events.push(Event::json(
                false,
                &json!({"error": error_object(message, status)}),
            ));
            failed = true;
            break;
        }
        let index = |j: usize| s * n + j;
        if c.chat {
            for j in 0..choices.len() {
                let role = json!({"role": "assistant", "content": ""});
                events.push(Event::json(
                    false,
                    &c.chunk(index(j), role, Value::Null, None, (r.prompt_tokens, 0)),
                ));
            }
        }
        let entries: Vec<Option<Vec<Entry>>> = choices
            .iter()
            .map(|a| {
                req.options
                    .logprobs
                    .map(|k| logprobs::entries(style.tokenizer, &a.ids, k))
            })
            .collect();
        let grouped: Vec<Vec<&[Piece]>> = choices.iter().map(|a| steps(&a.pieces)).collect();
        let rounds = grouped.iter().map(Vec::len).max().unwrap_or(0);
        let mut sent = vec![0; choices.len()];
        for round in 0..rounds {
            // The choices of a prompt are generated side by side: one token's wait each round.
            let mut token = true;
            for (j, answer) in choices.iter().enumerate() {
                let step = grouped
                    .get(j)
                    .and_then(|g| g.get(round))
                    .copied()
                    .unwrap_or_default();
                for piece in step {
                    let from = sent.get(j).copied().unwrap_or(0);
                    let lp = c.logprobs(entries.get(j).and_then(Option::as_ref), from, piece.upto);
                    if let Some(slot) = sent.get_mut(j) {
                        *slot = from.max(piece.upto);
                    }
                    let chunk = c.chunk(
                        index(j),
                        c.piece(&piece.delta, answer),
                        lp,
                        None,
                        (r.prompt_tokens, piece.upto),
                    );
                    events.push(Event::json(token, &chunk));
                    token = false;
                }
            }
        }
        if let Finish::Error { message } = &r.finish {
            events.push(Event::json(
                false,
                &json!({"error": error_object(message, 500)}),
            ));
            failed = true;
            break;
        }
        for (j, answer) in choices.iter().enumerate() {
            let empty = if c.chat { json!({}) } else { json!("") };
            // Tokens not sent with a piece yet (a stop's last token) bring their logprobs here.
            let from = sent.get(j).copied().unwrap_or(0);
            let lp = c.logprobs(
                entries.get(j).and_then(Option::as_ref),
                from,
                answer.ids.len(),
            );
            let finish = Some((answer.finish, &answer.matched));
            let chunk = c.chunk(
                index(j),
                empty,
                lp,
                finish,
                (r.prompt_tokens, answer.ids.len()),
            );
            events.push(Event::json(false, &chunk));
        }
    }
    if req.include_usage && !failed {
        let usage = json!({
            "id": req.id, "object": c.object(), "created": c.created, "model": model,
            "choices": [], "usage": usage(results, answers, cache_report),
        });
        events.push(Event::json(false, &usage));
    }
    events.push(Event::done());
    events
}
