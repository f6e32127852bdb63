//! OpenAI-compatible `/v1/chat/completions` and `/v1/completions` responses, as SGLang
//! serves them (including its `"abort"` finish reason and `matched_stop`).

use serde_json::{json, Value};

use super::config::SimConfig;
use super::reply::{delta, finish_str, matched_stop, text, text_steps, unix_now, Event, Reply};
use super::request::{Api, GenRequest};
use super::schedule::{Finish, SampleResult};
use kvgate_tokenize::ModelTokenizer;

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

/// The `usage` of a whole answer. `prompt_tokens_details` holds the cached tokens only with
/// `--enable-cache-report`, as SGLang's `UsageProcessor` does; null otherwise.
fn usage(results: &[SampleResult], cache_report: bool) -> Value {
    let prompt: usize = results.iter().map(|r| r.prompt_tokens).sum();
    let completion: usize = results.iter().map(|r| r.output_ids.len()).sum();
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

/// Builds the reply of a chat or completions request.
pub(crate) fn reply(
    req: &GenRequest,
    config: &SimConfig,
    results: &[SampleResult],
    tokenizer: &ModelTokenizer,
) -> Reply {
    let model = config.model.as_str();
    let cache_report = config.enable_cache_report;
    if req.stream {
        return Reply::Stream(stream(req, model, cache_report, results, tokenizer));
    }
    if let Some((status, message)) = results.iter().find_map(|r| r.finish.error_status()) {
        return Reply::Full {
            status,
            body: error_object(message, status),
        };
    }
    let choices: Vec<Value> = results
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let text = text(tokenizer, &r.output_ids);
            let mut choice = match req.api {
                Api::Chat => json!({
                    "index": index,
                    "message": {"role": "assistant", "content": text, "reasoning_content": null, "tool_calls": null},
                    "logprobs": null,
                }),
                _ => json!({"index": index, "text": text, "logprobs": null}),
            };
            if let Some(map) = choice.as_object_mut() {
                map.insert("finish_reason".into(), json!(finish_str(&r.finish)));
                map.insert("matched_stop".into(), matched_stop(&r.finish));
            }
            choice
        })
        .collect();
    let object = if req.api == Api::Chat {
        "chat.completion"
    } else {
        "text_completion"
    };
    Reply::Full {
        status: 200,
        body: json!({
            "id": req.id, "object": object, "created": unix_now(), "model": model,
            "choices": choices, "usage": usage(results, cache_report),
        }),
    }
}

fn stream(
    req: &GenRequest,
    model: &str,
    cache_report: bool,
    results: &[SampleResult],
    tokenizer: &ModelTokenizer,
) -> Vec<Event> {
    let chat = req.api == Api::Chat;
    let object = if chat {
        "chat.completion.chunk"
    } else {
        "text_completion"
    };
    let created = unix_now();
    let chunk = |index: usize, piece: Value, finish: Value, matched: Value, sent_tokens: usize| {
        let mut choice = if chat {
            json!({"index": index, "delta": piece, "logprobs": null, "finish_reason": finish})
        } else {
            json!({"index": index, "text": piece, "logprobs": null, "finish_reason": finish})
        };
        if !finish.is_null() {
            if let Some(map) = choice.as_object_mut() {
                map.insert("matched_stop".into(), matched);
            }
        }
        let mut event = json!({"id": req.id, "object": object, "created": created, "model": model, "choices": [choice]});
        if req.continuous_usage {
            if let (Some(map), Some(r)) = (event.as_object_mut(), results.get(index)) {
                map.insert(
                    "usage".into(),
                    json!({"prompt_tokens": r.prompt_tokens, "completion_tokens": sent_tokens,
                           "total_tokens": r.prompt_tokens + sent_tokens}),
                );
            }
        }
        event
    };
    let mut events = Vec::new();
    let mut failed = false;
    'samples: for (index, r) in results.iter().enumerate() {
        // Errors raised in the engine (ValueError / HTTPException) become one error event.
        let status_error = match &r.finish {
            Finish::Rejected { message, status } => Some((message, *status, false)),
            Finish::Abort(info) => info.status_code.map(|s| (&info.message, s, true)),
            _ => None,
        };
        if let Some((message, status, _)) = status_error {
            events.push(Event::json(
                false,
                &json!({"error": error_object(message, status)}),
            ));
            failed = true;
            break;
        }
        if chat {
            events.push(Event::json(
                false,
                &chunk(
                    index,
                    json!({"role": "assistant", "content": ""}),
                    Value::Null,
                    Value::Null,
                    0,
                ),
            ));
        }
        let mut sent = String::new();
        for (step, (_, text)) in text_steps(tokenizer, &r.output_ids).into_iter().enumerate() {
            let piece = delta(&sent, &text).to_string();
            sent = text;
            let piece = if chat {
                json!({"content": piece})
            } else {
                json!(piece)
            };
            events.push(Event::json(
                true,
                &chunk(index, piece, Value::Null, Value::Null, step + 1),
            ));
        }
        if let Finish::Error { message } = &r.finish {
            events.push(Event::json(
                false,
                &json!({"error": error_object(message, 500)}),
            ));
            failed = true;
            break 'samples;
        }
        let empty = if chat { json!({}) } else { json!("") };
        events.push(Event::json(
            false,
            &chunk(
                index,
                empty,
                json!(finish_str(&r.finish)),
                matched_stop(&r.finish),
                r.output_ids.len(),
            ),
        ));
    }
    if req.include_usage && !failed {
        let usage = json!({
            "id": req.id, "object": object, "created": created, "model": model,
            "choices": [], "usage": usage(results, cache_report),
        });
        events.push(Event::json(false, &usage));
    }
    events.push(Event::done());
    events
}
