//! `[tracing]`: OpenTelemetry trace export (OTLP/HTTP JSON). Off unless `otlp_endpoint` is
//! set; W3C `traceparent` headers from clients are forwarded to engines either way.

use serde::Deserialize;
use std::time::Duration;

use super::invalid::Invalid;

/// `[tracing]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct TracingConfig {
    /// The collector's OTLP/HTTP base URL, e.g. `http://127.0.0.1:4318` (spans are POSTed to
    /// `/v1/traces` under it). Unset: no spans are recorded or exported.
    pub otlp_endpoint: Option<String>,
    /// `service.name` of the exported resource.
    pub service_name: String,
    /// Share of new traces recorded (0.0 to 1.0). A client's `traceparent` decides for its
    /// own trace (its sampled flag), as OpenTelemetry's parent-based sampler does.
    pub sample_ratio: f64,
    /// Longest a finished span waits before it is sent.
    #[serde(with = "humantime_serde")]
    pub export_interval: Duration,
    /// Spans sent in one export request at most.
    pub max_batch_spans: usize,
    /// Spans waiting for export at most; further spans are dropped and counted
    /// (`kvgate_trace_spans_dropped_total`), never waited for.
    pub max_queue_spans: usize,
    /// How long one export request may take.
    #[serde(with = "humantime_serde")]
    pub export_timeout: Duration,
}

impl Default for TracingConfig {
    fn default() -> Self {
        Self {
            otlp_endpoint: None,
            service_name: "kvgate".into(),
            sample_ratio: 1.0,
            export_interval: Duration::from_secs(1),
            max_batch_spans: 512,
            max_queue_spans: 8192,
            export_timeout: Duration::from_secs(5),
        }
    }
}

impl TracingConfig {
    /// The URL spans are POSTed to, when export is on.
    pub fn traces_url(&self) -> Option<String> {
        let endpoint = self.otlp_endpoint.as_deref()?.trim_end_matches('/');
        Some(if endpoint.ends_with("/v1/traces") {
            endpoint.to_owned()
        } else {
            format!("{endpoint}/v1/traces")
        })
    }
}

impl TracingConfig {
    /// The rules of `[tracing]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        let fail = |key: &str, reason: String| Err(Invalid::new(format!("tracing.{key}"), reason));
        if let Some(endpoint) = &self.otlp_endpoint {
            let uri = endpoint.parse::<http::Uri>();
            let ok = uri
                .as_ref()
                .map(|u| u.scheme_str() == Some("http") && u.authority().is_some())
                .unwrap_or(false);
            if !ok {
                return fail(
                "otlp_endpoint",
                format!(
                    "`{endpoint}` is not an http:// URL with a host, e.g. \"http://127.0.0.1:4318\" \
                     (https is not supported: run an OpenTelemetry Collector beside kvgate)"
                ),
            );
            }
        }
        if self.service_name.trim().is_empty() {
            return fail("service_name", "must not be empty, e.g. \"kvgate\"".into());
        }
        if !(0.0..=1.0).contains(&self.sample_ratio) {
            return fail(
                "sample_ratio",
                "must be between 0.0 and 1.0 (a share of new traces)".into(),
            );
        }
        if self.export_interval.is_zero() {
            return fail("export_interval", "must be above 0, e.g. \"1s\"".into());
        }
        if self.max_batch_spans == 0 {
            return fail("max_batch_spans", "must be at least 1, e.g. 512".into());
        }
        if self.max_queue_spans < self.max_batch_spans {
            return fail(
                "max_queue_spans",
                "must be at least tracing.max_batch_spans".into(),
            );
        }
        if self.export_timeout.is_zero() {
            return fail("export_timeout", "must be above 0, e.g. \"5s\"".into());
        }
        Ok(())
    }
}
