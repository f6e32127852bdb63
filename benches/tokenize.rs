//! Plain `encode` against the count-only fast path, on the real Qwen3 (and DeepSeek-V3)
//! tokenizers: ~8 KiB, ~1 MiB and 1,000,000-token prompts, a ~500-token chat (render +
//! count), re-counting a 500k-token conversation after one appended message, and a chat
//! prepared by each engine's rules against rendered as sent.
//!
//! Texts are built from the fixture corpus (`tests/fixtures/tokenize/text_cases.jsonl`:
//! prose, code, CJK, emoji, whitespace, digits, URLs, …) repeated to size.

use std::hint::black_box;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use kvgate_tokenize::{ChatRequest, ChatRules, CountConfig, ModelTokenizer};
use serde_json::{json, Value};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn load(model: &str, config: CountConfig) -> ModelTokenizer {
    let dir = root().join("config/tokenizers").join(model);
    ModelTokenizer::from_files_with(
        &dir.join("tokenizer.json"),
        Some(&dir.join("tokenizer_config.json")),
        config,
    )
    .expect("tokenizer files ship with the repository")
}

/// Every distinct fixture text of one model, joined by newlines.
fn corpus() -> String {
    let raw = std::fs::read_to_string(root().join("tests/fixtures/tokenize/text_cases.jsonl"))
        .expect("fixtures");
    let mut out = String::new();
    for line in raw.lines() {
        let v: Value = serde_json::from_str(line).expect("json line");
        if v["model"] == "qwen3" && v["add_special_tokens"] == false {
            out.push_str(v["text"].as_str().unwrap_or_default());
            out.push('\n');
        }
    }
    out
}

/// The longest prefix of `text` of at most `bytes` bytes.
fn prefix(text: &str, bytes: usize) -> &str {
    let mut end = bytes.min(text.len());
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

fn repeat_to_bytes(corpus: &str, bytes: usize) -> String {
    let mut s = corpus.repeat(bytes / corpus.len() + 1);
    let end = prefix(&s, bytes).len();
    s.truncate(end);
    s
}

/// `corpus` repeated and cut so that it has (just over) `tokens` Qwen3 tokens.
fn repeat_to_tokens(tok: &ModelTokenizer, corpus: &str, tokens: usize) -> String {
    let per = tok.count_fast(corpus, false).expect("count");
    let mut s = corpus.repeat(tokens / per);
    let mut lines = corpus.lines().cycle();
    while tok.count_fast(&s, false).expect("count") < tokens {
        for _ in 0..64 {
            s.push_str(lines.next().unwrap_or_default());
            s.push('\n');
        }
    }
    s
}

fn sizes(c: &mut Criterion) {
    let qwen = load("qwen3", CountConfig::default());
    let corpus = corpus();
    let cases = [
        ("8KiB", repeat_to_bytes(&corpus, 8 * 1024)),
        ("1MiB", repeat_to_bytes(&corpus, 1024 * 1024)),
        ("1M_tokens", repeat_to_tokens(&qwen, &corpus, 1_000_000)),
    ];
    // One cold-cache measurement per size, from a fresh tokenizer: the first count ever.
    for (name, text) in &cases {
        let fresh = load("qwen3", CountConfig::default());
        let t = Instant::now();
        let n = fresh.count_fast(text, true).expect("count");
        let cold = t.elapsed();
        let t = Instant::now();
        let m = fresh.count(text, true).expect("count");
        let plain = t.elapsed();
        assert_eq!(n, m, "fast and plain counts differ on {name}");
        eprintln!(
            "qwen3 {name}: {} bytes, {n} tokens; first (cold-cache) count_fast {cold:?}, encode {plain:?}",
            text.len()
        );
    }
    for (name, text) in &cases {
        let mut g = c.benchmark_group(format!("qwen3/{name}"));
        g.throughput(Throughput::Bytes(text.len() as u64));
        if text.len() > 100_000 {
            g.sample_size(10)
                .warm_up_time(Duration::from_secs(1))
                .measurement_time(Duration::from_secs(if text.len() > 2_000_000 {
                    20
                } else {
                    6
                }));
        }
        g.bench_function("encode", |b| {
            b.iter(|| qwen.encode(black_box(text), true).expect("encode").len())
        });
        g.bench_function("count_fast", |b| {
            b.iter(|| qwen.count_fast(black_box(text), true).expect("count"))
        });
        g.finish();
    }
    let deepseek = load("deepseek_v3", CountConfig::default());
    let text = &cases[1].1;
    let mut g = c.benchmark_group("deepseek_v3/1MiB");
    g.throughput(Throughput::Bytes(text.len() as u64))
        .sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(6));
    g.bench_function("encode", |b| {
        b.iter(|| {
            deepseek
                .encode(black_box(text), true)
                .expect("encode")
                .len()
        })
    });
    g.bench_function("count_fast", |b| {
        b.iter(|| deepseek.count_fast(black_box(text), true).expect("count"))
    });
    g.finish();
}

fn message(role: &str, words: &[&str], i: usize, len: usize) -> Value {
    let content: Vec<&str> = words
        .iter()
        .cycle()
        .skip(i * 7)
        .take(len)
        .copied()
        .collect();
    json!({"role": role, "content": format!("[{i}] {}", content.join(" "))})
}

fn chats(c: &mut Criterion) {
    let qwen = load("qwen3", CountConfig::default());
    let corpus = corpus();
    let words: Vec<&str> = corpus.split_whitespace().take(20_000).collect();
    // ~500 tokens: a system prompt and three turns.
    let chat = Value::Array(vec![
        message("system", &words, 0, 60),
        message("user", &words, 1, 120),
        message("assistant", &words, 2, 120),
        message("user", &words, 3, 80),
    ]);
    let rendered = qwen.apply_chat_template(&chat, None, true).expect("render");
    let n = qwen.count(&rendered, false).expect("count");
    eprintln!("chat: {} bytes, {n} tokens", rendered.len());
    let mut g = c.benchmark_group("qwen3/chat_500_tokens");
    g.throughput(Throughput::Bytes(rendered.len() as u64));
    g.bench_function("render+encode", |b| {
        b.iter(|| {
            let r = qwen
                .apply_chat_template(black_box(&chat), None, true)
                .expect("render");
            qwen.encode(&r, false).expect("encode").len()
        })
    });
    g.bench_function("render+count_rendered_chat", |b| {
        b.iter(|| {
            let r = qwen
                .apply_chat_template(black_box(&chat), None, true)
                .expect("render");
            qwen.count_rendered_chat(&r).expect("count")
        })
    });
    g.bench_function("render_only", |b| {
        b.iter(|| {
            qwen.apply_chat_template(black_box(&chat), None, true)
                .expect("render")
        })
    });
    g.finish();

    // A 500k-token conversation, counted once (as the previous request would have).
    let mut messages = Vec::new();
    let mut i = 0;
    let mut history = String::new();
    while i % 64 != 0 || qwen.count_fast(&history, false).expect("count") < 500_000 {
        let role = if i % 2 == 0 { "user" } else { "assistant" };
        messages.push(message(role, &words, i, 150));
        i += 1;
        if i % 64 == 0 {
            history = qwen
                .apply_chat_template(&Value::Array(messages.clone()), None, false)
                .expect("render");
        }
    }
    // The previous request: the conversation so far, counted once (fills the segment cache).
    let previous = qwen
        .apply_chat_template(&Value::Array(messages.clone()), None, true)
        .expect("render");
    let base_tokens = qwen.count_rendered_chat(&previous).expect("count");
    // This request appends one user message. Qwen3's template also re-renders the last
    // assistant turn (its empty think block goes once a later query exists), so one old
    // segment changes too; the segment cache absorbs that after the first iteration.
    let content = |k: usize| {
        message("user", &words, i + k, 150)["content"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let suffix = "<|im_end|>\n<|im_start|>assistant\n";
    let mut with_new = messages.clone();
    with_new.push(message("user", &words, i, 150));
    let full = qwen
        .apply_chat_template(&Value::Array(with_new), None, true)
        .expect("render");
    let head = full
        .strip_suffix(&format!("{}{suffix}", content(0)))
        .expect("the new message renders last")
        .to_string();
    let appended = |k: usize| format!("{head}{}{suffix}", content(k));
    assert_eq!(appended(0), full);
    let new_tokens = qwen.count(&full, false).expect("count") - base_tokens;
    eprintln!(
        "conversation: {} bytes, {base_tokens} tokens, {} messages; +1 message: {} tokens ({new_tokens} more)",
        previous.len(),
        messages.len(),
        qwen.count(&full, false).expect("count"),
    );
    let fresh = load("qwen3", CountConfig::default());
    let t = Instant::now();
    let cold = fresh.count_rendered_chat(&full).expect("count");
    eprintln!(
        "conversation first count (fresh tokenizer): {:?} for {cold} tokens",
        t.elapsed()
    );
    let t = Instant::now();
    let after = qwen.count_rendered_chat(&appended(1)).expect("count");
    eprintln!(
        "first re-count after appending (one-shot): {:?} for {after} tokens",
        t.elapsed()
    );
    let mut g = c.benchmark_group("qwen3/append_to_500k_conversation");
    g.throughput(Throughput::Bytes(full.len() as u64));
    let mut k = 2;
    g.bench_function("count_rendered_chat", |b| {
        b.iter_batched(
            || {
                k += 1;
                appended(k)
            },
            |text| qwen.count_rendered_chat(&text).expect("count"),
            BatchSize::PerIteration,
        )
    });
    g.sample_size(10)
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(10));
    g.bench_function("encode", |b| {
        b.iter(|| qwen.encode(black_box(&full), false).expect("encode").len())
    });
    g.finish();
}

/// The cost of preparing a chat as the engine does (`kvgate_tokenize::prepare`) against
/// rendering the client's messages as they are (what kvgate did before): a plain chat and
/// the OpenAI SDK's tool loop with two tools, each rendered and counted.
fn preparation(c: &mut Criterion) {
    let tok = load("qwen3", CountConfig::default());
    let tools = json!([
        {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
         "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}}, "required": ["city"]}}},
        {"type": "function", "function": {"name": "get_time", "description": "Time in a zone",
         "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}, "required": ["tz"]}}}]);
    let bodies = [
        (
            "plain",
            json!({"messages": [
            {"role": "system", "content": "You are a helpful assistant. Answer briefly and cite sources."},
            {"role": "user", "content": "What does a KV cache page hold, and why does its size matter for long prompts?"}]}),
        ),
        (
            "tool_loop",
            json!({"tools": tools, "messages": [
            {"role": "user", "content": "What is the weather in Paris and the time there?"},
            {"role": "assistant", "content": "", "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
                {"id": "call_2", "type": "function", "function": {"name": "get_time", "arguments": {"tz": "Europe/Paris"}}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "{\"temperature\": 21}"},
            {"role": "tool", "tool_call_id": "call_2", "content": "{\"time\": \"14:02\"}"}]}),
        ),
    ];
    for (name, body) in bodies {
        let map = body.as_object().expect("an object").clone();
        let mut g = c.benchmark_group(format!("qwen3/prepare/{name}"));
        g.bench_function("as_sent", |b| {
            b.iter(|| {
                let rendered = tok
                    .apply_chat_template(&map["messages"], map.get("tools"), true)
                    .unwrap();
                black_box(tok.count_rendered_chat(&rendered).unwrap())
            })
        });
        for rules in [ChatRules::Sglang, ChatRules::Vllm, ChatRules::LlamaCpp] {
            g.bench_function(rules.as_str(), |b| {
                b.iter(|| {
                    let request = ChatRequest::from_body(&map).unwrap();
                    let prompt = tok.chat_prompt(rules, &request).unwrap();
                    black_box(tok.count_chat_prompt(&prompt).unwrap())
                })
            });
        }
        g.finish();
    }
}

criterion_group!(benches, sizes, chats, preparation);
criterion_main!(benches);
