//! The response guard's cost: SSE re-framing plus every check, in MB/s, beside a plain copy
//! of the same bytes (the baseline, same run); and the added time to first byte of a stream
//! through the full stack, guard on versus guard off, against the same in-process engine.
//!
//! `cargo bench --bench guard`

mod common;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http_body_util::{BodyExt, Full};
use serde_json::json;
use std::sync::Arc;
use tower::{Service, ServiceExt};

use kvgate::runtime::Gateway;
use kvgate::stack::guard::check_stream::{StreamCheck, UsageRewrite};
use kvgate::stack::guard::inspect::{Expectation, Markers, Shape};
use kvgate::stack::guard::sse::SseReframer;

fn native_stream(events: usize) -> Vec<u8> {
    let mut out = Vec::new();
    let mut text = String::new();
    for i in 0..events {
        text.push_str(" word");
        let finish = if i + 1 == events {
            json!({"type": "length", "length": events})
        } else {
            json!(null)
        };
        let v = json!({"text": text, "meta_info": {"id": "abc", "finish_reason": finish, "prompt_tokens": 500, "completion_tokens": i + 1}, "index": 0});
        out.extend_from_slice(format!("data: {v}\n\n").as_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

fn openai_stream(events: usize) -> Vec<u8> {
    let mut out = Vec::new();
    for i in 0..events {
        let finish = if i + 1 == events {
            json!("length")
        } else {
            json!(null)
        };
        let v = json!({"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": 1, "model": "qwen3",
                       "choices": [{"index": 0, "delta": {"content": " word"}, "finish_reason": finish}],
                       "usage": {"prompt_tokens": 500, "completion_tokens": i + 1, "total_tokens": 501 + i}});
        out.extend_from_slice(format!("data: {v}\n\n").as_bytes());
    }
    out.extend_from_slice(b"data: [DONE]\n\n");
    out
}

fn checks(c: &mut Criterion) {
    let markers = Markers::from_config(&kvgate::config::GuardConfig {
        markers: vec!["[[PLACEHOLDER]]".into()],
        ..Default::default()
    });
    for (name, shape, stream) in [
        ("native", Shape::Native, native_stream(1000)),
        ("openai", Shape::OpenAi, openai_stream(1000)),
    ] {
        let mut group = c.benchmark_group(format!("guard_stream/{name}"));
        group.throughput(Throughput::Bytes(stream.len() as u64));
        let chunks: Vec<&[u8]> = stream.chunks(1024).collect();
        group.bench_function("baseline_copy_1k_chunks", |b| {
            b.iter(|| {
                chunks
                    .iter()
                    .map(|c| Bytes::copy_from_slice(c).len())
                    .sum::<usize>()
            })
        });
        group.bench_function("reframe_1k_chunks", |b| {
            b.iter(|| {
                let mut r = SseReframer::new();
                let mut out = Vec::new();
                for c in &chunks {
                    r.push(c, &mut out).unwrap();
                }
                out.len()
            })
        });
        group.bench_function("reframe_and_check_1k_chunks", |b| {
            b.iter(|| {
                let expect = Expectation {
                    prompt_tokens: Some(vec![500].into()),
                    tolerance: 0,
                };
                let mut check =
                    StreamCheck::new(shape, markers.clone(), expect, 1, UsageRewrite::default());
                let mut r = SseReframer::new();
                let mut events = Vec::new();
                let mut forwarded = 0;
                for c in &chunks {
                    r.push(c, &mut events).unwrap();
                    for e in events.drain(..) {
                        forwarded += check.event(&e).unwrap().map_or(0, |b| b.len());
                    }
                }
                check.end().unwrap();
                forwarded
            })
        });
        group.finish();
    }
}

fn ttfb(c: &mut Criterion) {
    let rt = common::runtime();
    let tokenizer = common::qwen3();
    let engine = common::engine(&rt, Arc::clone(&tokenizer));
    let stack_for = |guard: bool| {
        let text = format!(
            "[audit]\nsink = \"none\"\n{}[[pools]]\nname = \"u\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{{ url = \"http://{}\", kv_tokens = 65536 }}]\n[pools.guard]\nenabled = {guard}\n{}",
            common::qwen3_model(32768),
            engine.http_addr,
            common::bench_tenant()
        );
        let gateway = Gateway::new(common::config(&text)).unwrap();
        kvgate::build_stack::<Full<Bytes>>(gateway.shared(), &gateway.generation())
    };
    let body = Bytes::from(json!({"text": "The quick brown fox jumps over the lazy dog. ".repeat(10), "stream": true, "sampling_params": {"max_new_tokens": 16}}).to_string());
    let mut group = c.benchmark_group("guard_ttfb");
    for (name, guard) in [("guard_off_baseline", false), ("guard_on", true)] {
        let stack = stack_for(guard);
        group.bench_function(name, |b| {
            b.iter(|| {
                rt.block_on(async {
                    let req = common::generate(&body);
                    let mut svc = stack.clone();
                    let resp = svc.ready().await.unwrap().call(req).await.unwrap();
                    let mut body = resp.into_body();
                    // Time to first byte: the first data frame.
                    body.frame()
                        .await
                        .unwrap()
                        .ok()
                        .unwrap()
                        .into_data()
                        .ok()
                        .unwrap()
                        .len()
                })
            })
        });
    }
    group.finish();
}

criterion_group!(benches, checks, ttfb);
criterion_main!(benches);
