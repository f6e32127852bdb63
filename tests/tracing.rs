//! OpenTelemetry: W3C trace context from clients to engines, and spans exported as OTLP/JSON
//! to an in-process collector (a hyper server on 127.0.0.1:0 that keeps what it receives).

mod support;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use serde_json::{json, Value};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::Notify;

use kvgate::runtime::RunningGateway;

use kvgate_sim::{RunningSim, SimFault, SimRole};
use support::*;

const WINDOW: u64 = 40960;
const CLIENT_TRACE: &str = "4bf92f3577b34da6a3ce929d0e0e4736";
const CLIENT_SPAN: &str = "00f067aa0ba902b7";

/// An OTLP/HTTP collector: keeps every span POSTed to `/v1/traces`.
#[derive(Clone, Default)]
struct Collector {
    spans: Arc<Mutex<Vec<Value>>>,
    arrived: Arc<Notify>,
}

impl Collector {
    async fn start() -> (Self, SocketAddr) {
        let collector = Self::default();
        let listener = bind().await;
        let addr = listener.local_addr().unwrap();
        let this = collector.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                let this = this.clone();
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(move |req: Request<Incoming>| {
                        let this = this.clone();
                        async move { Ok::<_, hyper::Error>(this.receive(req).await) }
                    });
                    let _ = hyper::server::conn::http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (collector, addr)
    }

    async fn receive(&self, req: Request<Incoming>) -> Response<Full<Bytes>> {
        let ok = req.method() == http::Method::POST
            && req.uri().path() == "/v1/traces"
            && req.headers()["content-type"] == "application/json";
        let body = req.into_body().collect().await.unwrap().to_bytes();
        if !ok {
            let mut response = Response::new(Full::new(Bytes::new()));
            *response.status_mut() = StatusCode::NOT_FOUND;
            return response;
        }
        let export: Value = serde_json::from_slice(&body).expect("OTLP/JSON");
        let mut spans = self.spans.lock().unwrap();
        for resource in export["resourceSpans"].as_array().unwrap() {
            let service = &resource["resource"]["attributes"][0];
            assert_eq!(service["key"], "service.name");
            assert_eq!(service["value"]["stringValue"], "kvgate-test");
            for scope in resource["scopeSpans"].as_array().unwrap() {
                spans.extend(scope["spans"].as_array().unwrap().iter().cloned());
            }
        }
        self.arrived.notify_waiters();
        Response::new(Full::new(Bytes::from_static(b"{}")))
    }

    /// Waits until the spans of `trace` hold every name in `names`; returns those spans.
    async fn wait_for(&self, trace: &str, names: &[&str]) -> Vec<Value> {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            let arrived = self.arrived.notified();
            let spans: Vec<Value> = self
                .spans
                .lock()
                .unwrap()
                .iter()
                .filter(|s| s["traceId"] == trace)
                .cloned()
                .collect();
            let all = names
                .iter()
                .all(|n| spans.iter().filter(|s| s["name"] == *n).count() >= count(names, n));
            if all {
                return spans;
            }
            if tokio::time::timeout_at(deadline, arrived).await.is_err() {
                panic!("spans {names:?} of {trace} did not arrive; got {spans:#?}");
            }
        }
    }
}

fn count(names: &[&str], name: &str) -> usize {
    names.iter().filter(|n| **n == name).count()
}

fn tracing_section(collector: SocketAddr) -> String {
    format!(
        "[tracing]\notlp_endpoint = \"http://{collector}\"\nservice_name = \"kvgate-test\"\nexport_interval = \"20ms\"\n"
    )
}

fn chat() -> Value {
    json!({"model": "qwen3", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 8})
}

fn attr<'a>(span: &'a Value, key: &str) -> Option<&'a Value> {
    span["attributes"]
        .as_array()?
        .iter()
        .find(|a| a["key"] == key)
        .map(|a| &a["value"])
}

fn attr_str<'a>(span: &'a Value, key: &str) -> &'a str {
    attr(span, key)
        .and_then(|v| v["stringValue"].as_str())
        .unwrap_or_else(|| panic!("{key} missing on {span:#}"))
}

fn named<'a>(spans: &'a [Value], name: &str) -> Vec<&'a Value> {
    spans.iter().filter(|s| s["name"] == name).collect()
}

/// The one `traceparent` an engine received on its generation route, split in its parts.
fn received_traceparent(engine: &RunningSim) -> Option<(String, String, String, String)> {
    let got = generations(engine);
    assert_eq!(got.len(), 1, "one generation request");
    let value = got[0]
        .headers
        .get("traceparent")?
        .to_str()
        .unwrap()
        .to_owned();
    let parts: Vec<&str> = value.split('-').collect();
    assert_eq!(parts.len(), 4, "{value}");
    Some((
        parts[0].to_owned(),
        parts[1].to_owned(),
        parts[2].to_owned(),
        parts[3].to_owned(),
    ))
}

fn client_traceparent(flags: &str) -> String {
    format!("00-{CLIENT_TRACE}-{CLIENT_SPAN}-{flags}")
}

/// A gateway over `pools` that exports its spans to the collector at `collector`.
async fn traced_gateway(pools: &str, collector: SocketAddr) -> RunningGateway {
    let config = format!(
        "{}\n{}",
        config_with_pools(WINDOW, pools),
        tracing_section(collector)
    );
    gateway(&config).await
}

#[tokio::test]
async fn spans_arrive_under_the_clients_trace_and_the_engine_continues_it() {
    let (collector, collector_addr) = Collector::start().await;
    let unified = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let pools = unified_pool("u", &[worker(&unified, None)]);
    let gw = traced_gateway(&pools, collector_addr).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let traceparent = client_traceparent("01");
    let reply = post_with(
        &url,
        Some(KEY),
        &[("traceparent", &traceparent), ("tracestate", "vendor=abc")],
        &chat(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let request_id = reply.headers["x-request-id"].to_str().unwrap().to_owned();

    let spans = collector
        .wait_for(
            CLIENT_TRACE,
            &[
                "request",
                "admission",
                "rate_limit",
                "route",
                "guard",
                "upstream",
            ],
        )
        .await;
    let server = named(&spans, "request");
    assert_eq!(server.len(), 1);
    let server = server[0];
    assert_eq!(
        server["parentSpanId"], CLIENT_SPAN,
        "the client's span is the parent"
    );
    assert_eq!(server["kind"], 2, "SPAN_KIND_SERVER");
    assert_eq!(server["traceState"], "vendor=abc");
    assert_eq!(attr_str(server, "kvgate.request_id"), request_id);
    assert_eq!(attr_str(server, "kvgate.tenant"), "t1");
    assert_eq!(attr_str(server, "kvgate.model"), "qwen3");
    assert_eq!(attr_str(server, "kvgate.pool"), "u");
    assert_eq!(
        attr_str(server, "kvgate.worker"),
        unified.http_addr.to_string()
    );
    assert_eq!(
        attr(server, "http.response.status_code").unwrap()["intValue"],
        "200"
    );
    let server_id = server["spanId"].as_str().unwrap();
    for stage in ["admission", "rate_limit", "route", "guard", "upstream"] {
        for span in named(&spans, stage) {
            assert_eq!(
                span["parentSpanId"], server_id,
                "{stage} is a child of the server span"
            );
        }
    }
    let admission = named(&spans, "admission")[0];
    let tokens: i64 = attr(admission, "kvgate.prompt_tokens").unwrap()["intValue"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(tokens > 0);
    let upstream = named(&spans, "upstream")[0];
    assert_eq!(upstream["kind"], 3, "SPAN_KIND_CLIENT");
    assert_eq!(attr_str(upstream, "kvgate.role"), "unified");
    assert_eq!(attr_str(upstream, "kvgate.outcome"), "ok");

    // The engine continues the client's trace, under the gateway's upstream span.
    let (version, trace, parent, flags) = received_traceparent(&unified).expect("traceparent");
    assert_eq!((version.as_str(), flags.as_str()), ("00", "01"));
    assert_eq!(trace, CLIENT_TRACE);
    assert_eq!(parent, upstream["spanId"].as_str().unwrap());
    let got = generations(&unified);
    assert_eq!(got[0].headers["tracestate"], "vendor=abc");

    // Audit lines name the request and its trace.
    let line = gw
        .audit()
        .recent()
        .into_iter()
        .find(|l| l["event"] == "request" && l["request_id"] == request_id.as_str())
        .expect("the request's audit line");
    assert_eq!(line["trace_id"], CLIENT_TRACE);
    gw.shutdown().await;
}

#[tokio::test]
async fn both_pd_legs_get_a_traceparent_naming_their_own_span() {
    let (collector, collector_addr) = Collector::start().await;
    let prefill = engine(SimRole::Prefill, SimFault::None, 40960, WINDOW as usize).await;
    let decode = engine(SimRole::Decode, SimFault::None, 40960, WINDOW as usize).await;
    let pools = pd_pool("pd", &[worker(&prefill, None)], &[worker(&decode, None)]);
    let gw = traced_gateway(&pools, collector_addr).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let traceparent = client_traceparent("01");
    let reply = post_with(&url, Some(KEY), &[("traceparent", &traceparent)], &chat()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());

    let spans = collector
        .wait_for(CLIENT_TRACE, &["request", "route", "upstream", "upstream"])
        .await;
    let server_id = named(&spans, "request")[0]["spanId"]
        .as_str()
        .unwrap()
        .to_owned();
    let route = named(&spans, "route")[0];
    assert_eq!(
        attr_str(route, "kvgate.prefill_worker"),
        prefill.http_addr.to_string()
    );
    assert_eq!(
        attr_str(route, "kvgate.decode_worker"),
        decode.http_addr.to_string()
    );
    let legs = named(&spans, "upstream");
    for (engine, role) in [(&prefill, "prefill"), (&decode, "decode")] {
        let leg = legs
            .iter()
            .find(|s| attr_str(s, "kvgate.role") == role)
            .unwrap_or_else(|| panic!("no {role} span"));
        assert_eq!(leg["parentSpanId"], server_id.as_str());
        let (_, trace, parent, _) = received_traceparent(engine).expect("traceparent");
        assert_eq!(trace, CLIENT_TRACE, "{role}");
        assert_eq!(parent, leg["spanId"].as_str().unwrap(), "{role}");
    }
    gw.shutdown().await;
}

#[tokio::test]
async fn without_a_client_traceparent_export_starts_a_new_trace() {
    let (collector, collector_addr) = Collector::start().await;
    let unified = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let pools = unified_pool("u", &[worker(&unified, None)]);
    let gw = traced_gateway(&pools, collector_addr).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let reply = post(&url, Some(KEY), &chat()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (_, trace, parent, flags) = received_traceparent(&unified).expect("traceparent");
    assert_eq!(flags, "01");
    let spans = collector.wait_for(&trace, &["request", "upstream"]).await;
    let server = named(&spans, "request")[0];
    assert!(server.get("parentSpanId").is_none(), "a root span");
    assert_eq!(named(&spans, "upstream")[0]["spanId"], parent.as_str());
    gw.shutdown().await;
}

#[tokio::test]
async fn with_export_off_a_client_traceparent_is_still_propagated() {
    let unified = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let pools = unified_pool("u", &[worker(&unified, None)]);
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let traceparent = client_traceparent("00");
    let reply = post_with(&url, Some(KEY), &[("traceparent", &traceparent)], &chat()).await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    let (version, trace, parent, flags) = received_traceparent(&unified).expect("traceparent");
    assert_eq!(version, "00");
    assert_eq!(trace, CLIENT_TRACE, "the client's trace continues");
    assert_ne!(
        parent, CLIENT_SPAN,
        "a child span of the client's, not the client's own"
    );
    assert_eq!(parent.len(), 16);
    assert_eq!(flags, "00", "the client's flags are kept");
    gw.shutdown().await;
}

#[tokio::test]
async fn a_malformed_traceparent_is_ignored() {
    let unified = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let pools = unified_pool("u", &[worker(&unified, None)]);
    let gw = gateway(&config_with_pools(WINDOW, &pools)).await;
    let url = format!("http://{}/v1/chat/completions", gw.data_addr());
    let bad = format!("00-{}-{CLIENT_SPAN}-01", CLIENT_TRACE.to_uppercase());
    let reply = post_with(
        &url,
        Some(KEY),
        &[("traceparent", &bad), ("tracestate", "vendor=abc")],
        &chat(),
    )
    .await;
    assert_eq!(reply.status, 200, "{}", reply.text());
    assert!(
        received_traceparent(&unified).is_none(),
        "nothing is forwarded"
    );
    assert!(generations(&unified)[0].headers.get("tracestate").is_none());
    gw.shutdown().await;
}
