//! The span exporter: finished spans go into a bounded queue ([`Exporter::send`] never
//! waits: a full queue drops the span and counts it in `kvgate_trace_spans_dropped_total`),
//! and one background task per gateway ([`ExportTask::run`]) batches them and POSTs each
//! batch as OTLP/JSON to the collector's `/v1/traces`, off the request path.
//!
//! The HTTP client is hyper's pooled client, as for engines (`crate::upstream`), plain HTTP
//! only: a collector is usually an agent beside the gateway. A batch the collector refuses
//! or does not answer in `export_timeout` is dropped and counted, never retried, so a dead
//! collector costs one bounded request per batch and no memory growth.

use bytes::Bytes;
use http::{header, Method, Request};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::future::Future;
use std::time::Duration;
use tokio::sync::mpsc;

use super::otlp_json;
use super::span_data::SpanData;
use crate::config::TracingConfig;
use crate::error::error_chain;
use crate::metrics;

/// The request path's handle: hands finished spans to the export task.
#[derive(Debug, Clone)]
pub struct Exporter {
    queue: mpsc::Sender<SpanData>,
}

impl Exporter {
    /// Queue a finished span; dropped (and counted) when the queue is full or closed.
    pub fn send(&self, span: SpanData) {
        if self.queue.try_send(span).is_err() {
            ::metrics::counter!(metrics::TRACE_SPANS_DROPPED_TOTAL).increment(1);
        }
    }
}

/// The background task that exports queued spans.
pub struct ExportTask {
    queue: mpsc::Receiver<SpanData>,
    client: Client<HttpConnector, Full<Bytes>>,
    url: http::Uri,
    service_name: String,
    interval: Duration,
    max_batch: usize,
    timeout: Duration,
    /// The last export failed: logged once when it starts and once when it ends.
    failing: bool,
}

impl std::fmt::Debug for ExportTask {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExportTask")
            .field("url", &self.url)
            .finish()
    }
}

/// The exporter and its task, when `[tracing] otlp_endpoint` is set (and valid: the
/// config was validated at load).
pub fn exporter(config: &TracingConfig) -> Option<(Exporter, ExportTask)> {
    let url = config.traces_url()?.parse::<http::Uri>().ok()?;
    let (tx, rx) = mpsc::channel(config.max_queue_spans.max(1));
    let mut connector = HttpConnector::new();
    connector.set_connect_timeout(Some(config.export_timeout));
    connector.set_nodelay(true);
    let client = Client::builder(TokioExecutor::new()).build(connector);
    Some((
        Exporter { queue: tx },
        ExportTask {
            queue: rx,
            client,
            url,
            service_name: config.service_name.clone(),
            interval: config.export_interval,
            max_batch: config.max_batch_spans.max(1),
            timeout: config.export_timeout,
            failing: false,
        },
    ))
}

impl ExportTask {
    /// Export until `stop` resolves (then what is queued is sent once more) or every
    /// [`Exporter`] is gone.
    pub async fn run(mut self, stop: impl Future<Output = ()>) {
        let mut stop = std::pin::pin!(stop);
        loop {
            let mut batch = Vec::new();
            // Wait for a first span, then for more until the batch is full or the interval
            // since that first span has passed.
            let first = tokio::select! {
                span = self.queue.recv() => span,
                () = &mut stop => break,
            };
            let Some(first) = first else {
                return;
            };
            batch.push(first);
            let deadline = tokio::time::Instant::now() + self.interval;
            while batch.len() < self.max_batch {
                tokio::select! {
                    span = self.queue.recv() => match span {
                        Some(span) => batch.push(span),
                        None => break,
                    },
                    () = tokio::time::sleep_until(deadline) => break,
                }
            }
            self.export(&batch).await;
        }
        // Stopping: flush what is queued now, in batches, then end.
        let mut batch = Vec::new();
        while let Ok(span) = self.queue.try_recv() {
            batch.push(span);
            if batch.len() == self.max_batch {
                self.export(&batch).await;
                batch.clear();
            }
        }
        if !batch.is_empty() {
            self.export(&batch).await;
        }
    }

    async fn export(&mut self, batch: &[SpanData]) {
        let body = otlp_json::encode(&self.service_name, batch);
        let request = Request::builder()
            .method(Method::POST)
            .uri(self.url.clone())
            .header(header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(body)));
        let Ok(request) = request else {
            return self.failed(batch.len(), "error", "building the request failed");
        };
        let exchange = async {
            let response = self.client.request(request).await?;
            let status = response.status();
            // Read the answer to its end so the connection goes back to the pool.
            let _ = response.into_body().collect().await;
            Ok::<_, hyper_util::client::legacy::Error>(status)
        };
        match tokio::time::timeout(self.timeout, exchange).await {
            Ok(Ok(status)) if status.is_success() => {
                ::metrics::counter!(metrics::TRACE_EXPORTS_TOTAL, "outcome" => "ok").increment(1);
                if self.failing {
                    self.failing = false;
                    tracing::info!(url = %self.url, "span export works again");
                }
            }
            Ok(Ok(status)) => self.failed(batch.len(), "error", &format!("status {status}")),
            Ok(Err(error)) => self.failed(batch.len(), "error", &error_chain(&error)),
            Err(_) => self.failed(batch.len(), "timeout", "no answer within export_timeout"),
        }
    }

    /// Count a lost batch; warn on the first failure after a success, not on every batch.
    fn failed(&mut self, spans: usize, outcome: &'static str, detail: &str) {
        ::metrics::counter!(metrics::TRACE_EXPORTS_TOTAL, "outcome" => outcome).increment(1);
        ::metrics::counter!(metrics::TRACE_SPANS_DROPPED_TOTAL).increment(spans as u64);
        if !self.failing {
            self.failing = true;
            tracing::warn!(url = %self.url, detail, "span export failed; dropping batches until the collector answers");
        }
    }
}
