//! Count + admission of a small chat request (≈500 tokens), next to what an exact count
//! with the plain `encode` path costs for the same rendered prompt (baseline, same run).
//!
//! `cargo bench --bench admission`

mod common;

use criterion::{criterion_group, criterion_main, Criterion};
use serde_json::json;

use kvgate::runtime::Gateway;
use kvgate::stack::api::{parse_inference, Endpoint, ModelCatalog};

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let text = format!(
        "[audit]\nsink = \"none\"\n[server]\nallow_anonymous = true\n{}[[pools]]\nname = \"pd\"\nmodel = \"qwen3\"\nengine = \"sglang\"\nmode = \"disaggregated\"\nprefill = [{{ url = \"http://127.0.0.1:1\", kv_tokens = 32768, bootstrap_port = 2 }}]\ndecode = [{{ url = \"http://127.0.0.1:3\", kv_tokens = 49152 }}]\n",
        common::qwen3_model(40960)
    );
    let config = common::config(&text);
    let catalog = ModelCatalog::from_config(&config);
    let gateway = Gateway::new(config).unwrap();
    let state = gateway.generation().admission.clone();
    let tokenizer = common::qwen3();

    let user = "Explain how a paged KV cache works in an inference engine, and why a gateway should check prompt lengths. ".repeat(22);
    let body = json!({"model": "qwen3", "max_tokens": 256, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": user}]})
    .to_string();
    let body = bytes::Bytes::from(body);
    let messages = json!([{"role": "system", "content": "You are a helpful assistant."}, {"role": "user", "content": user}]);
    let rendered = tokenizer
        .apply_chat_template(&messages, None, true)
        .unwrap();
    eprintln!(
        "chat prompt: {} tokens, {} bytes",
        tokenizer.count(&rendered, false).unwrap(),
        rendered.len()
    );

    let mut group = c.benchmark_group("admission_chat_500_tokens");
    group.bench_function("baseline_render_plus_plain_encode", |b| {
        b.iter(|| {
            let r = tokenizer
                .apply_chat_template(&messages, None, true)
                .unwrap();
            tokenizer.encode(&r, false).unwrap().len()
        })
    });
    group.bench_function("render_only", |b| {
        b.iter(|| {
            tokenizer
                .apply_chat_template(&messages, None, true)
                .unwrap()
                .len()
        })
    });
    group.bench_function("parse_count_admit", |b| {
        b.iter(|| {
            rt.block_on(async {
                let mut parsed =
                    parse_inference(Endpoint::ChatCompletions, &body, &catalog).unwrap();
                let (count, pools, _blocks) =
                    kvgate::stack::admission::admit(&state, &mut parsed, None, None)
                        .await
                        .unwrap();
                (count.prompt_total(), pools.0.len())
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
