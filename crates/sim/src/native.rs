//! SGLang's native `/generate` responses, plain and streamed.

use serde_json::{json, Value};

use super::reply::{ends_with_token, finish_json, text, text_steps, Event, Reply};
use super::request::GenRequest;
use super::schedule::{Finish, SampleResult};
use kvgate_tokenize::ModelTokenizer;

/// `/generate`'s error body (`{"error": {"message"}}`).
pub(crate) fn error_body(message: &str) -> Value {
    json!({"error": {"message": message}})
}

fn meta_info(result: &SampleResult, completion: usize, finish: Value, e2e: f64) -> Value {
    json!({
        "id": result.rid,
        "finish_reason": finish,
        "prompt_tokens": result.prompt_tokens,
        "completion_tokens": completion,
        "cached_tokens": result.cached_tokens,
        "e2e_latency": e2e,
    })
}

/// Builds the `/generate` reply for the results of `req`.
pub(crate) fn reply(
    req: &GenRequest,
    results: &[SampleResult],
    tokenizer: &ModelTokenizer,
    e2e: f64,
) -> Reply {
    if req.stream {
        return Reply::Stream(stream(results, tokenizer, e2e));
    }
    // Like the tokenizer manager: an abort with a status raises, and the whole request fails.
    if let Some((status, message)) = results.iter().find_map(|r| r.finish.error_status()) {
        return Reply::Full {
            status,
            body: error_body(message),
        };
    }
    let items: Vec<Value> = results
        .iter()
        .map(|r| {
            json!({
                "text": text(tokenizer, &r.output_ids),
                "meta_info": meta_info(r, r.output_ids.len(), finish_json(&r.finish), e2e),
            })
        })
        .collect();
    let body = if req.is_batch {
        Value::Array(items)
    } else {
        items.into_iter().next().unwrap_or(Value::Null)
    };
    Reply::Full { status: 200, body }
}

fn stream(results: &[SampleResult], tokenizer: &ModelTokenizer, e2e: f64) -> Vec<Event> {
    let mut events = Vec::new();
    for (index, r) in results.iter().enumerate() {
        if let Finish::Rejected { message, .. } = &r.finish {
            // `stream_results` catches the ValueError, sends it as an event and ends.
            events.push(Event::json(false, &error_body(message)));
            break;
        }
        let n = r.output_ids.len();
        let last_carries = ends_with_token(r);
        for (k, text) in text_steps(tokenizer, &r.output_ids) {
            let finish = if k == n && last_carries {
                finish_json(&r.finish)
            } else {
                Value::Null
            };
            let event =
                json!({"text": text, "meta_info": meta_info(r, k, finish, e2e), "index": index});
            events.push(Event::json(true, &event));
        }
        if last_carries {
            continue;
        }
        if let Finish::Error { message } = &r.finish {
            events.push(Event::json(false, &error_body(message)));
            break;
        }
        let event = json!({
            "text": text(tokenizer, &r.output_ids),
            "meta_info": meta_info(r, n, finish_json(&r.finish), e2e),
            "index": index,
        });
        events.push(Event::json(false, &event));
    }
    events.push(Event::done());
    events
}
