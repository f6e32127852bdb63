//! Leak-detector cost per KB of text: recording a prompt's fingerprints and scanning a
//! response, over real Qwen3 token ids (the README, then the gateway's own sources, as the
//! text), each beside a baseline measured in the same run — copying the ids, and hashing
//! every n-gram window the way the detector does — so the gap is the tables and locks.
//!
//! `cargo bench --bench fingerprint`

use criterion::{criterion_group, criterion_main, BatchSize, BenchmarkId, Criterion, Throughput};
use std::hint::black_box;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use kvgate::stack::isolate::leak::{FingerprintStore, LeakDetectorConfig};
use kvgate_tokenize::ModelTokenizer;

const NGRAM: usize = 8;

/// Real text of about `bytes` bytes, and its token ids (made once, outside every loop).
struct Sample {
    name: &'static str,
    bytes: usize,
    ids: Vec<u32>,
}

fn corpus(repo: &Path) -> String {
    let mut text = std::fs::read_to_string(repo.join("README.md")).unwrap();
    let mut sources: Vec<PathBuf> = Vec::new();
    let mut dirs = vec![repo.join("gateway")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().is_some_and(|e| e == "rs") {
                sources.push(path);
            }
        }
    }
    sources.sort();
    for path in sources {
        text.push_str(&std::fs::read_to_string(path).unwrap());
    }
    text
}

fn prefix(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn samples() -> (Vec<Sample>, Vec<u32>) {
    let repo = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let dir = repo.join("config/tokenizers/qwen3");
    let tokenizer = ModelTokenizer::from_dir(&dir).unwrap();
    let text = corpus(&repo);
    assert!(text.len() > 2 * 65536, "corpus too small: {}", text.len());
    let make = |name, bytes| {
        let text = prefix(&text, bytes);
        Sample {
            name,
            bytes: text.len(),
            ids: tokenizer.encode(text, false).unwrap(),
        }
    };
    // Unrelated text of another tenant, for stores that a response must miss.
    let mut start = text.len() - 65536;
    while !text.is_char_boundary(start) {
        start += 1;
    }
    let other = tokenizer.encode(&text[start..], false).unwrap();
    (vec![make("1KB", 1024), make("64KB", 65536)], other)
}

/// The detector's n-gram hash, inlined: the floor under both recording and scanning.
fn hash_windows(ids: &[u32]) -> u64 {
    let mut acc = 0u64;
    for window in ids.windows(NGRAM) {
        let mut h = 0x243f_6a88_85a3_08d3u64;
        for &id in window {
            h = (h.rotate_left(5) ^ u64::from(id)).wrapping_mul(0x517c_c1b7_2722_0a95);
        }
        h ^= h >> 33;
        h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
        h ^= h >> 33;
        acc ^= h;
    }
    acc
}

fn config() -> LeakDetectorConfig {
    LeakDetectorConfig {
        ngram: NGRAM,
        ..LeakDetectorConfig::default()
    }
}

fn record(c: &mut Criterion) {
    let (samples, _) = samples();
    let mut group = c.benchmark_group("record_prompt");
    for s in &samples {
        group.throughput(Throughput::Bytes(s.bytes as u64));
        group.bench_with_input(
            BenchmarkId::new("baseline_copy", s.name),
            &s.ids,
            |b, ids| b.iter(|| black_box(ids.to_vec())),
        );
        group.bench_with_input(
            BenchmarkId::new("baseline_hash", s.name),
            &s.ids,
            |b, ids| b.iter(|| black_box(hash_windows(ids))),
        );
        // New text: every n-gram is a fresh insert into tables that grow from empty.
        group.bench_with_input(BenchmarkId::new("fresh", s.name), &s.ids, |b, ids| {
            let now = Instant::now();
            b.iter_batched(
                || FingerprintStore::new(config()),
                |store| {
                    store.record_prompt("a", ids, now);
                    store
                },
                BatchSize::SmallInput,
            )
        });
        // The same prompt again (a chat's growing history): every n-gram is an update.
        group.bench_with_input(BenchmarkId::new("repeat", s.name), &s.ids, |b, ids| {
            let store = FingerprintStore::new(config());
            let now = Instant::now();
            store.record_prompt("a", ids, now);
            b.iter(|| store.record_prompt("a", black_box(ids), now))
        });
    }
    group.finish();
}

fn scan(c: &mut Criterion) {
    let (samples, other) = samples();
    let now = Instant::now();
    // The usual case: the store is full of other tenants' unrelated prompts, nothing hits.
    let unrelated = FingerprintStore::new(config());
    for (i, chunk) in other.chunks(512).enumerate() {
        unrelated.record_prompt(&format!("t{}", i % 8), chunk, now);
    }
    let mut group = c.benchmark_group("scan");
    for s in &samples {
        // The leak case: the response is another tenant's prompt, every n-gram hits.
        let leaked = FingerprintStore::new(config());
        leaked.record_prompt("a", &s.ids, now);
        group.throughput(Throughput::Bytes(s.bytes as u64));
        group.bench_with_input(
            BenchmarkId::new("baseline_hash", s.name),
            &s.ids,
            |b, ids| b.iter(|| black_box(hash_windows(ids))),
        );
        group.bench_with_input(BenchmarkId::new("miss", s.name), &s.ids, |b, ids| {
            b.iter(|| {
                let mut scanner = unrelated.scanner("b");
                scanner.feed(black_box(ids), now);
                scanner.suspicion()
            })
        });
        // A stream: one token per feed, as SSE deltas arrive.
        group.bench_with_input(
            BenchmarkId::new("miss_streamed", s.name),
            &s.ids,
            |b, ids| {
                b.iter(|| {
                    let mut scanner = unrelated.scanner("b");
                    for id in ids {
                        scanner.feed(std::slice::from_ref(id), now);
                    }
                    scanner.suspicion()
                })
            },
        );
        group.bench_with_input(BenchmarkId::new("leak", s.name), &s.ids, |b, ids| {
            b.iter(|| {
                let mut scanner = leaked.scanner("b");
                scanner.feed(black_box(ids), now);
                scanner.suspicion()
            })
        });
    }
    group.finish();
}

/// Scanning while another thread keeps recording prompts into the same store: what the
/// shard locks cost under contention (the machine has two cores, so one writer).
fn contended(c: &mut Criterion) {
    let (samples, other) = samples();
    let now = Instant::now();
    let store = FingerprintStore::new(config());
    store.record_prompt("a", &other, now);
    let s = &samples[0];
    let mut group = c.benchmark_group("scan_contended");
    group.throughput(Throughput::Bytes(s.bytes as u64));
    group.bench_function(BenchmarkId::new("alone", s.name), |b| {
        b.iter(|| {
            let mut scanner = store.scanner("b");
            scanner.feed(&s.ids, now);
            scanner.suspicion()
        })
    });
    group.bench_function(BenchmarkId::new("with_writer", s.name), |b| {
        let stop = Arc::new(AtomicBool::new(false));
        let writer = {
            let (store, stop, ids) = (store.clone(), Arc::clone(&stop), other.clone());
            std::thread::spawn(move || {
                let mut i = 0u64;
                while !stop.load(Ordering::Relaxed) {
                    let at = now + Duration::from_millis(i % 1000);
                    store.record_prompt("c", &ids[..4096.min(ids.len())], at);
                    i += 1;
                }
            })
        };
        b.iter(|| {
            let mut scanner = store.scanner("b");
            scanner.feed(&s.ids, now);
            scanner.suspicion()
        });
        stop.store(true, Ordering::Relaxed);
        writer.join().unwrap();
    });
    group.finish();
}

criterion_group!(benches, record, scan, contended);
criterion_main!(benches);
