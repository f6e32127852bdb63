//! OpenAI-compatible `/v1/chat/completions` and `/v1/completions` responses, as SGLang
//! serves them (including its `"abort"` finish reason and `matched_stop`). What each choice
//! says is decided in `answer.rs`; the streamed form is built in `openai_stream.rs`.

use serde_json::{json, Value};

use super::answer::{answers, Answer, Style};
use super::config::SimConfig;
use super::logprobs;
use super::openai_stream;
use super::reply::{unix_now, Reply};
use super::request::{Api, GenRequest};
use super::schedule::SampleResult;
use super::tool_call;

/// SGLang's OpenAI error object (`ErrorResponse`).
pub(crate) fn error_object(message: &str, status: u16) -> Value {
    let kind = match status {
        400 => "BadRequestError",
        404 => "NotFoundError",
        503 => "ServiceUnavailableError",
        s if s >= 500 => "InternalServerError",
        _ => "BadRequestError",
    };
    json!({"object": "error", "message": message, "type": kind, "param": null, "code": status})
}

/// The `usage` of a whole answer: each prompt counted once, whatever its `n`; every
/// choice's tokens. `prompt_tokens_details` holds the cached tokens only with
/// `--enable-cache-report`, as SGLang's `UsageProcessor` does; null otherwise.
pub(crate) fn usage(
    results: &[SampleResult],
    answers: &[Vec<Answer>],
    cache_report: bool,
) -> Value {
    let prompt: usize = results.iter().map(|r| r.prompt_tokens).sum();
    let completion: usize = answers.iter().flatten().map(|a| a.ids.len()).sum();
    let details = if cache_report {
        let cached: usize = results.iter().map(|r| r.cached_tokens).sum();
        json!({"cached_tokens": cached})
    } else {
        Value::Null
    };
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": details,
    })
}

/// The `logprobs` of a whole choice, when asked for.
fn choice_logprobs(req: &GenRequest, style: &Style, answer: &Answer) -> Value {
    let Some(k) = req.options.logprobs else {
        return Value::Null;
    };
    let entries = logprobs::entries(style.tokenizer, &answer.ids, k);
    let all = 0..entries.len();
    match req.api {
        Api::Chat => logprobs::chat(&entries, all),
        _ => logprobs::completion(&entries, all, k),
    }
}

fn choice(req: &GenRequest, style: &Style, index: usize, answer: &Answer) -> Value {
    let logprobs = choice_logprobs(req, style, answer);
    let mut choice = match req.api {
        Api::Chat => {
            let calls = answer
                .tool_call
                .as_ref()
                .map(|call| json!([tool_call::message_entry(call, 0)]));
            json!({
                "index": index,
                "message": {"role": "assistant", "content": answer.content, "reasoning_content": answer.reasoning, "tool_calls": calls},
                "logprobs": logprobs,
            })
        }
        _ => {
            json!({"index": index, "text": answer.content.as_deref().unwrap_or_default(), "logprobs": logprobs})
        }
    };
    if let Some(map) = choice.as_object_mut() {
        map.insert("finish_reason".into(), json!(answer.finish));
        map.insert("matched_stop".into(), answer.matched.clone());
    }
    choice
}

/// Builds the reply of a chat or completions request, and the tokens its choices take to
/// generate (the `n` choices of a prompt are generated side by side: one counts).
pub(crate) fn reply(
    req: &GenRequest,
    config: &SimConfig,
    results: &[SampleResult],
    style: &Style,
) -> (Reply, usize) {
    let answers = answers(req, results, style);
    let tokens = answers
        .iter()
        .filter_map(|choices| choices.first())
        .map(|a| a.ids.len())
        .sum();
    let model = config.model.as_str();
    let cache_report = config.enable_cache_report;
    if req.stream {
        let events = openai_stream::events(req, model, cache_report, results, &answers, style);
        return (Reply::Stream(events), tokens);
    }
    if let Some((status, message)) = results.iter().find_map(|r| r.finish.error_status()) {
        let body = error_object(message, status);
        return (Reply::Full { status, body }, tokens);
    }
    let n = req.options.n;
    let choices: Vec<Value> = answers
        .iter()
        .enumerate()
        .flat_map(|(s, choices)| {
            choices
                .iter()
                .enumerate()
                .map(move |(j, a)| choice(req, style, s * n + j, a))
        })
        .collect();
    let object = if req.api == Api::Chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    let body = json!({
        "id": req.id, "object": object, "created": unix_now(), "model": model,
        "choices": choices, "usage": usage(results, &answers, cache_report),
    });
    (Reply::Full { status: 200, body }, tokens)
}
