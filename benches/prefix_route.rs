//! What prefix-aware routing (`[prefix_routing]`, on by default) adds to the request path,
//! each against its baseline in the same run:
//!
//! - admission of a ≈500-token chat to a pool of two workers, with prefix routing off (the
//!   baseline) and on: the same conversation again (its chain from the cache), a new
//!   conversation every time (render, the prompt's ids, the chain), and a conversation's
//!   next turn every time (its earlier messages seen before);
//! - the prompt's ids and chain against the exact count alone, for 2 KiB and 16 KiB texts
//!   (and the plain `encode` for reference);
//! - a pool's prefix index: one request's lookup over 4 workers and insert, for prompts of
//!   32 and 256 blocks, in a warm index of 200k blocks; and the same from 2 threads at once,
//!   sharded (16 locks) against one lock.
//!
//! `cargo bench --bench prefix_route` (each group alone: `cargo bench --bench prefix_route --
//! prefix_admission`, …).

mod common;

// The gateway binary's allocator: under glibc's, the order the groups ran in moved the
// admission numbers by 30 % (fragmentation left by the gateways built before).
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate::fleet::{Candidate, PrefixIndex};
use kvgate::runtime::Gateway;
use kvgate::stack::api::{parse_inference, Endpoint, ModelCatalog};
use kvgate::stack::routing::blocks::{chain, seeded};

/// Admission of `[pools]` with two workers and `[prefix_routing] enabled = on`.
fn admission(on: bool) -> (Arc<kvgate::stack::admission::AdmissionState>, ModelCatalog) {
    let text = format!(
        "[audit]\nsink = \"none\"\n[server]\nallow_anonymous = true\n[prefix_routing]\nenabled = {on}\n{}[[pools]]\nname = \"u\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"unified\"\nworkers = [{{ url = \"http://127.0.0.1:1\", kv_tokens = 65536 }}, {{ url = \"http://127.0.0.1:2\", kv_tokens = 65536 }}]\n",
        common::qwen3_model(40960)
    );
    let config = common::config(&text);
    let catalog = ModelCatalog::from_config(&config);
    let gateway = Gateway::new(config).unwrap();
    (gateway.generation().admission.clone(), catalog)
}

fn chat_admission(c: &mut Criterion) {
    let rt = common::runtime();
    let user = "Explain how a paged KV cache works in an inference engine, and why a gateway should check prompt lengths. ".repeat(22);
    let body = |tail: u64| {
        bytes::Bytes::from(
            json!({"model": "qwen3", "max_tokens": 256, "messages": [
                {"role": "system", "content": "You are a helpful assistant."},
                {"role": "user", "content": format!("{user} (question {tail})")}]})
            .to_string(),
        )
    };
    // A 10-turn conversation (≈ 600 tokens) whose next question is new each time: the
    // earlier messages' segments are cached, as for a real conversation's next turn.
    let history: Vec<serde_json::Value> = (0..10)
        .flat_map(|i| {
            [
                json!({"role": "user", "content": format!("Turn {i}: what does the gateway check before sending a prompt to an engine whose KV pool is smaller than the window?")}),
                json!({"role": "assistant", "content": format!("Answer {i}: it counts the prompt exactly and refuses it when it does not fit the smallest KV pool on its path.")}),
            ]
        })
        .collect();
    let next_turn = |tail: u64| {
        let mut messages = history.clone();
        messages.push(json!({"role": "user", "content": format!("And question {tail}?")}));
        bytes::Bytes::from(
            json!({"model": "qwen3", "max_tokens": 256, "messages": messages}).to_string(),
        )
    };
    let mut group = c.benchmark_group("prefix_admission_chat_500_tokens");
    for (name, on, kind) in [
        ("off_same_chat", false, 0),
        ("on_same_chat", true, 0),
        ("off_new_chat_each_time", false, 1),
        ("on_new_chat_each_time", true, 1),
        ("off_next_turn_each_time", false, 2),
        ("on_next_turn_each_time", true, 2),
    ] {
        let (state, catalog) = admission(on);
        let counter = AtomicU64::new(0);
        let same = body(0);
        group.bench_function(name, |b| {
            b.iter(|| {
                let n = counter.fetch_add(1, Ordering::Relaxed) + 1;
                let bytes = match kind {
                    0 => same.clone(),
                    1 => body(n),
                    _ => next_turn(n),
                };
                rt.block_on(async {
                    let mut parsed =
                        parse_inference(Endpoint::ChatCompletions, &bytes, &catalog).unwrap();
                    let (count, _, blocks) =
                        kvgate::stack::admission::admit(&state, &mut parsed, None, None)
                            .await
                            .unwrap();
                    let blocks = match blocks {
                        Some(b) => b.0.chain().await.map_or(0, |c| c.len()),
                        None => 0,
                    };
                    (count.prompt_total(), blocks)
                })
            })
        });
    }
    group.finish();

    // The tokenizer alone on the next-turn chats: the exact count against the ids.
    let tok = common::qwen3();
    let rendered = |tail: u64| {
        let mut messages = history.clone();
        messages.push(json!({"role": "user", "content": format!("And question {tail}?")}));
        tok.apply_chat_template(&serde_json::Value::Array(messages), None, true)
            .unwrap()
    };
    let turns: Vec<String> = (0..1000).map(rendered).collect();
    let mut group = c.benchmark_group("prefix_next_turn_tokenizer");
    let next = AtomicU64::new(0);
    group.bench_function("count_rendered_chat_baseline", |b| {
        b.iter(|| {
            let t = &turns[(next.fetch_add(1, Ordering::Relaxed) % 1000) as usize];
            tok.count_rendered_chat(t).unwrap()
        })
    });
    group.bench_function("ids_rendered_chat", |b| {
        b.iter(|| {
            let t = &turns[(next.fetch_add(1, Ordering::Relaxed) % 1000) as usize];
            tok.ids_rendered_chat(t).unwrap().len()
        })
    });
    group.finish();
}

fn text_ids(c: &mut Criterion) {
    let tok = common::qwen3();
    let unit = "The quick brown fox jumps over the lazy dog; fn main() { println!(\"{}\", 42); } 你好世界 — naïve café, 3.14159.\n";
    for kib in [2usize, 16] {
        let text = unit.repeat(kib * 1024 / unit.len());
        let mut group = c.benchmark_group(format!("prefix_text_{kib}KiB"));
        group.bench_function("count_fast_baseline", |b| {
            b.iter(|| tok.count_fast(&text, true).unwrap())
        });
        group.bench_function("ids_fast_plus_chain", |b| {
            b.iter(|| chain(&tok.ids_fast(&text, true).unwrap(), 16).len())
        });
        group.bench_function("plain_encode_reference", |b| {
            b.iter(|| tok.encode(&text, true).unwrap().len())
        });
        group.finish();
    }
}

/// Keys of `n` blocks of prompt number `p` (prompts share their first half with prompt 0).
fn prompt_keys(p: u64, n: usize) -> Vec<u64> {
    let ids: Vec<u32> = (0..n * 16)
        .map(|i| {
            if i < n * 8 {
                i as u32
            } else {
                (i as u64 * 31 + p * 7919) as u32
            }
        })
        .collect();
    seeded(&chain(&ids, 16), 42)
}

fn warm(index: &PrefixIndex) {
    let now = Instant::now();
    for p in 0..2000u64 {
        let worker = Candidate {
            slot: (p % 4) as usize,
            epoch: 0,
        };
        index.insert(&prompt_keys(p + 1_000_000, 100), worker, now);
    }
}

fn index_ops(c: &mut Criterion) {
    let workers: Vec<Candidate> = (0..4).map(|slot| Candidate { slot, epoch: 0 }).collect();
    let index = PrefixIndex::new(4, 262_144, Duration::from_secs(600));
    warm(&index);
    let mut group = c.benchmark_group("prefix_index_one_request");
    for blocks in [32usize, 256] {
        let prompts: Vec<Vec<u64>> = (0..64).map(|p| prompt_keys(p, blocks)).collect();
        let next = AtomicU64::new(0);
        group.bench_function(
            format!("lookup_4_workers_and_insert_{blocks}_blocks"),
            |b| {
                b.iter(|| {
                    let p = next.fetch_add(1, Ordering::Relaxed);
                    let keys = &prompts[(p % 64) as usize];
                    let now = Instant::now();
                    let held = index.longest(keys, &workers, now);
                    index.insert(keys, workers[(p % 4) as usize], now);
                    held
                })
            },
        );
    }
    group.finish();

    let mut group = c.benchmark_group("prefix_index_two_threads_256_blocks");
    for (name, shards) in [("one_lock", 1usize), ("sixteen_shards", 16)] {
        let index = Arc::new(PrefixIndex::with_shards(
            4,
            262_144,
            Duration::from_secs(600),
            shards,
        ));
        warm(&index);
        let prompts: Arc<Vec<Vec<u64>>> = Arc::new((0..64).map(|p| prompt_keys(p, 256)).collect());
        let workers = workers.clone();
        group.bench_function(name, |b| {
            b.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..2u64 {
                        let (index, prompts, workers) = (&index, &prompts, &workers);
                        s.spawn(move || {
                            for i in 0..iters {
                                let keys = &prompts[((i * 2 + t) % 64) as usize];
                                let now = Instant::now();
                                std::hint::black_box(index.longest(keys, workers, now));
                                index.insert(keys, workers[(i % 4) as usize], now);
                            }
                        });
                    }
                });
                // Per request: two threads each did `iters`.
                start.elapsed() / 2
            })
        });
    }
    group.finish();
}

criterion_group!(benches, chat_admission, text_ids, index_ops);
criterion_main!(benches);
