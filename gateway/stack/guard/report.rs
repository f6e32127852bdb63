//! How the guard reports: every trip is one audit line, one
//! `kvgate_guard_trips_total{reason,pool}`, a count in the status page's recent
//! [`Activity`] and a signal for its pool's window; every suspected leak and every stream's
//! outcome likewise (I6). [`trip_error`] is the one mapping from a trip to the client's
//! error.

use http::StatusCode;
use serde_json::{Map, Value};
use std::sync::Arc;
use std::time::Instant;

use super::inspect::Trip;
use super::plan::ReportFacts;
use crate::accounting::{Outcome, TokenUsage};
use crate::activity::Activity;
use crate::audit::AuditLog;
use crate::error::GatewayError;
use crate::metrics;
use crate::stack::isolate::leak::LeakSuspicion;
use crate::stack::request_id::RequestId;
use crate::stack::routing::ServedBy;

/// Where trips and outcomes go. One `Arc` for both, so each request's report clones one
/// pointer, as it did when the audit log was the only sink.
#[derive(Debug)]
pub(super) struct Sinks {
    audit: AuditLog,
    /// The gateway's recent counts (status page).
    activity: Arc<Activity>,
}

impl Sinks {
    pub(super) fn new(audit: AuditLog, activity: Arc<Activity>) -> Self {
        Self { audit, activity }
    }
}

// === impl ReportFacts ===

impl ReportFacts {
    /// The fields every guard audit line carries (built only when a line is written).
    fn fields(&self, pool: &str) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("pool".into(), Value::from(pool));
        fields.insert("endpoint".into(), Value::from(self.endpoint));
        let optional = [
            ("tenant", self.tenant.as_deref().map(str::to_owned)),
            (
                "request_id",
                self.request_id.as_ref().map(|id| id.as_str().to_owned()),
            ),
            ("client_request_id", self.client_request_id.clone()),
            ("trace_id", self.trace.as_ref().map(|t| t.trace_id_hex())),
            ("worker", self.worker.clone()),
            ("prefill_worker", self.prefill_worker.clone()),
        ];
        for (key, value) in optional {
            if let Some(value) = value {
                fields.insert(key.into(), Value::from(value));
            }
        }
        fields
    }
}

/// Where a trip is reported: audit line, metric, and the client's error.
#[derive(Debug, Clone)]
pub struct TripReport {
    sinks: Arc<Sinks>,
    /// The request's facts every line carries (shared: the report is cloned per request).
    facts: Arc<ReportFacts>,
    pool: String,
}

// === impl TripReport ===

impl TripReport {
    /// The report of one request to `pool`, with the workers that served it (`served`, a
    /// response extension from dispatch), which its pool's window is told of.
    pub(super) fn new(
        sinks: Arc<Sinks>,
        pool: String,
        mut facts: ReportFacts,
        served: Option<&ServedBy>,
    ) -> Self {
        if let Some(served) = served {
            facts.worker = Some(served.worker.authority.clone());
            facts.prefill_worker = served.prefill.as_ref().map(|p| p.authority.clone());
            // The outcome counts for these workers' outlier ejection.
            if let Some(signals) = &facts.signals {
                signals.served_by(served.clone());
            }
        }
        Self {
            sinks,
            facts: Arc::new(facts),
            pool,
        }
    }

    /// The gateway's id of the request (error events carry it).
    pub fn request_id(&self) -> Option<&str> {
        self.facts.request_id.as_ref().map(RequestId::as_str)
    }

    /// The engine reported `usage` (the tenant's account).
    pub(super) fn usage(&self, usage: TokenUsage) {
        if let Some(ledger) = &self.facts.ledger {
            ledger.usage(usage);
        }
    }

    /// Whether the request has an account to fill in.
    pub(super) fn accounts(&self) -> bool {
        self.facts.ledger.is_some()
    }

    /// A stream's first and last events went to the client at these instants.
    pub(super) fn token_times(&self, first: Instant, last: Instant) {
        if let Some(ledger) = &self.facts.ledger {
            ledger.token_times(first, last);
        }
    }

    /// Record `trip` once and return the error the client gets.
    pub fn record(&self, trip: &Trip) -> GatewayError {
        if let Some(ledger) = &self.facts.ledger {
            ledger.outcome(Outcome::GuardTrip);
        }
        ::metrics::counter!(metrics::GUARD_TRIPS_TOTAL, "reason" => trip.reason(), "pool" => self.pool.clone())
            .increment(1);
        if let Some(signals) = &self.facts.signals {
            signals.trip(trip.reason());
        }
        self.sinks.activity.trip(trip.reason());
        let mut extra = vec![("reason", Value::from(trip.reason()))];
        match trip {
            Trip::PromptTokens {
                sample,
                expected,
                reported,
            } => {
                extra.push(("sample", Value::from(*sample)));
                extra.push(("prompt_tokens_counted", Value::from(*expected)));
                extra.push(("prompt_tokens_reported", Value::from(*reported)));
            }
            Trip::Aborted { status, .. } | Trip::ErrorIn2xx { status, .. } => {
                extra.push(("engine_status", Value::from(*status)));
            }
            _ => {}
        }
        self.sinks
            .audit
            .record_with("guard_trip", &self.facts.fields(&self.pool), &extra);
        trip_error(trip, &self.pool)
    }

    /// The prefill worker's answer tripped: its pool's window blames the prefill worker.
    pub(super) fn blame_prefill(&self) {
        if let Some(signals) = &self.facts.signals {
            signals.blame_prefill();
        }
    }

    /// A suspected leak: an audit line (no text, no other tenant's name) and the metric.
    pub fn leak(&self, suspicion: LeakSuspicion) {
        ::metrics::counter!(metrics::LEAK_SUSPECTED_TOTAL, "pool" => self.pool.clone())
            .increment(1);
        if let Some(signals) = &self.facts.signals {
            signals.leak();
        }
        self.sinks.activity.leak();
        let extra = [
            ("owner_tenants", Value::from(suspicion.owner_tenants)),
            ("matched_ngrams", Value::from(suspicion.matched_ngrams)),
        ];
        self.sinks
            .audit
            .record_with("leak_suspected", &self.facts.fields(&self.pool), &extra);
    }

    /// Count a stream's outcome and write its audit line.
    pub fn outcome(&self, outcome: &'static str) {
        metrics::per_request::outcome(outcome).increment(1);
        match outcome {
            "success" => self.sinks.activity.admit(),
            other => self.sinks.activity.refuse(other),
        }
        let mut extra = vec![
            ("outcome", Value::from(outcome)),
            ("stream", Value::from(true)),
        ];
        if let Some(ledger) = &self.facts.ledger {
            ledger.outcome(Outcome::of_stream_end(outcome));
            ledger.snapshot().audit_fields(&mut extra);
            ledger.settle();
        }
        self.sinks
            .audit
            .record_with("request", &self.facts.fields(&self.pool), &extra);
    }
}

/// The one mapping from a trip to the client's error (statuses chosen in `GatewayError`).
pub fn trip_error(trip: &Trip, pool: &str) -> GatewayError {
    let pool = pool.to_owned();
    match trip {
        Trip::Aborted { status, message } | Trip::ErrorIn2xx { status, message } => {
            GatewayError::UpstreamAborted {
                pool,
                status: status.and_then(|s| StatusCode::from_u16(s).ok()),
                message: message.clone(),
            }
        }
        Trip::PromptTokens {
            sample,
            expected,
            reported,
        } => GatewayError::PromptCountMismatch {
            pool,
            sample: *sample,
            gateway: *expected,
            engine: *reported,
        },
        Trip::PlaceholderMarker => GatewayError::UpstreamIntegrity {
            pool,
            reason: "the answer matched a placeholder marker".into(),
        },
        Trip::LeakSuspected { .. } => GatewayError::UpstreamIntegrity {
            pool,
            reason: "the answer holds fragments of another tenant's recent prompts".into(),
        },
        Trip::EmptyResult { detail } | Trip::Truncated { detail } => {
            GatewayError::UpstreamIntegrity {
                pool,
                reason: (*detail).to_owned(),
            }
        }
        Trip::Unparsable { detail } => GatewayError::UpstreamProtocol {
            pool,
            role: "serving",
            detail: (*detail).to_owned(),
        },
        Trip::Stalled { timeout } => GatewayError::UpstreamTimeout {
            pool,
            role: "serving",
            worker: String::new(),
            timeout: *timeout,
        },
    }
}
