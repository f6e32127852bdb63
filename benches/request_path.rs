//! The in-process request path: parse → route → dispatch to an in-process simulated engine
//! over loopback, against the same request sent straight to the engine (the baseline,
//! measured in the same run). The gap is what the gateway adds.
//!
//! `cargo bench --bench request_path`

mod common;

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use http::Request;
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::{connect::HttpConnector, Client};
use hyper_util::rt::TokioExecutor;
use serde_json::json;
use tower::{Service, ServiceExt};

use kvgate::runtime::Gateway;
use kvgate::stack::api::{parse_inference, Endpoint, ModelCatalog};

fn bench(c: &mut Criterion) {
    let rt = common::runtime();
    let engine = common::engine(&rt, common::qwen3());
    let text = format!(
        r#"
{}[[pools]]
name = "u"
model = "qwen3"
engine = "sglang"
mode = "unified"
workers = [{{ url = "http://{}", kv_tokens = 65536 }}]
{}"#,
        common::qwen3_model(32768),
        engine.http_addr,
        common::bench_tenant()
    );
    let config = common::config(&text);
    let catalog = ModelCatalog::from_config(&config);
    let gateway = Gateway::new(config).unwrap();
    rt.block_on(kvgate::fleet::discover_all(
        &gateway.fleet(),
        gateway.upstream(),
    ));
    let stack = kvgate::build_stack::<Full<Bytes>>(gateway.shared(), &gateway.generation());

    let body = json!({"text": "The quick brown fox jumps over the lazy dog. ".repeat(20), "sampling_params": {"max_new_tokens": 4}}).to_string();
    let body = Bytes::from(body);

    let mut group = c.benchmark_group("request_path");
    group.throughput(Throughput::Bytes(body.len() as u64));
    group.bench_function("parse_only", |b| {
        b.iter(|| parse_inference(Endpoint::Generate, &body, &catalog).unwrap())
    });

    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build(HttpConnector::new());
    let direct_url = format!("http://{}/generate", engine.http_addr);
    group.bench_function("baseline_direct_to_engine", |b| {
        b.iter(|| {
            rt.block_on(async {
                let req = Request::post(&direct_url)
                    .header("content-type", "application/json")
                    .body(Full::new(body.clone()))
                    .unwrap();
                let resp = client.request(req).await.unwrap();
                resp.into_body().collect().await.unwrap().to_bytes()
            })
        })
    });
    group.bench_function("through_gateway_stack", |b| {
        b.iter(|| {
            rt.block_on(async {
                let req = common::generate(&body);
                let mut svc = stack.clone();
                let resp = svc.ready().await.unwrap().call(req).await.unwrap();
                assert!(resp.status().is_success());
                resp.into_body().collect().await.ok().unwrap().to_bytes()
            })
        })
    });
    group.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
