//! The guard's SSE re-framer on realistic engine streams, fed in 1 KiB and 16 KiB chunks,
//! against the floor of simply copying each chunk (`Bytes::copy_from_slice`, measured in the
//! same run). `reframe+json` adds what the guard will pay to parse every event's JSON.
//!
//! `cargo bench --bench sse`

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion, Throughput};
use serde_json::json;
use std::hint::black_box;
use std::time::Duration;

use kvgate::stack::guard::sse::{SseEvent, SseReframer};

const EVENTS: usize = 1000;
const WORDS: &[&str] = &[
    "the", " quick", " brown", " fox", " jumps", " over", " a", " lazy",
];

/// SGLang `/generate` streaming: cumulative text, meta_info on every event, then `[DONE]`.
fn sglang_stream() -> Vec<u8> {
    let mut out = Vec::new();
    let mut text = String::new();
    for i in 0..EVENTS {
        text.push_str(WORDS[i % WORDS.len()]);
        let event = json!({
            "text": text,
            "meta_info": {
                "id": "9d1c0b6e3f4a4b8f9c2d7e1a5b6c8d0f",
                "finish_reason": if i + 1 == EVENTS { json!({"type": "length", "length": EVENTS}) } else { json!(null) },
                "prompt_tokens": 812,
                "completion_tokens": i + 1,
                "cached_tokens": 512,
                "e2e_latency": 0.0123 * i as f64,
            },
        });
        out.extend_from_slice(&SseEvent::data_event(&event.to_string()));
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

/// OpenAI-compatible chat completion chunks (one token each), a usage chunk, then `[DONE]`.
fn openai_stream() -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..EVENTS {
        let event = json!({
            "id": "chatcmpl-9d1c0b6e3f4a4b8f",
            "object": "chat.completion.chunk",
            "created": 1_760_000_000,
            "model": "qwen3",
            "choices": [{
                "index": 0,
                "delta": {"content": WORDS[i % WORDS.len()]},
                "logprobs": null,
                "finish_reason": if i + 1 == EVENTS { json!("stop") } else { json!(null) },
            }],
        });
        out.extend_from_slice(&SseEvent::data_event(&event.to_string()));
    }
    let usage = json!({"id": "chatcmpl-9d1c0b6e3f4a4b8f", "object": "chat.completion.chunk",
        "choices": [], "usage": {"prompt_tokens": 812, "completion_tokens": EVENTS, "total_tokens": 812 + EVENTS}});
    out.extend_from_slice(&SseEvent::data_event(&usage.to_string()));
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

/// Re-frame the chunks the way the guard will: push, handle the events, drop them.
fn reframe(chunks: &[&[u8]], parse_json: bool) -> usize {
    let mut reframer = SseReframer::new();
    let mut out = Vec::with_capacity(64);
    let mut n = 0;
    for chunk in chunks {
        if reframer.push(chunk, &mut out).is_err() {
            return 0;
        }
        for event in out.drain(..) {
            if parse_json {
                n += usize::from(black_box(event.json()).is_some());
            }
            n += black_box(event).raw.len();
        }
    }
    n + reframer.finish().map_or(0, |e| e.raw.len())
}

fn copy(chunks: &[&[u8]]) -> usize {
    chunks
        .iter()
        .map(|c| black_box(Bytes::copy_from_slice(c)).len())
        .sum()
}

fn bench(c: &mut Criterion) {
    for (name, stream) in [("sglang", sglang_stream()), ("openai", openai_stream())] {
        let mut group = c.benchmark_group(format!("sse/{name}"));
        group.throughput(Throughput::Bytes(stream.len() as u64));
        group.sample_size(20);
        group.warm_up_time(Duration::from_secs(1));
        group.measurement_time(Duration::from_secs(3));
        for size in [1024, 16 * 1024] {
            let chunks: Vec<&[u8]> = stream.chunks(size).collect();
            let label = format!("{}KiB", size / 1024);
            assert_eq!(reframe(&chunks, false), stream.len());
            group.bench_with_input(BenchmarkId::new("copy", &label), &chunks, |b, chunks| {
                b.iter(|| copy(chunks))
            });
            group.bench_with_input(BenchmarkId::new("reframe", &label), &chunks, |b, chunks| {
                b.iter(|| reframe(chunks, false))
            });
            group.bench_with_input(
                BenchmarkId::new("reframe+json", &label),
                &chunks,
                |b, chunks| b.iter(|| reframe(chunks, true)),
            );
        }
        group.finish();
    }
}

criterion_group!(benches, bench);
criterion_main!(benches);
