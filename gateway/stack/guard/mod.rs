//! The response guard (I1): an aborted, refused or placeholder result never reaches a client
//! as a success.
//!
//! Sits right above dispatch, so it sees every engine answer, the prefill leg of PD requests
//! included. Non-streaming answers are checked whole ([`inspect::check_answer`]); streams are
//! re-framed and checked event by event ([`check_stream::StreamCheck`]), with the status line
//! held until the first event has been checked. A trip becomes kvgate's JSON error (status
//! mapping in `GatewayError`), or — once a stream is under way — an SSE error event that ends
//! the stream without `[DONE]`. Every trip is one audit line and one
//! `kvgate_guard_trips_total{reason,pool}`; every stream's outcome is counted once (I6).
//! Trips, leak suspicions and stream outcomes are also counted in the status page's
//! recent [`Activity`].
//!
//! Reads: `InferenceRequest`, `RoutePlan`, `TokenCount`, `AuthContext`; the response
//! extensions `PrefillAnswer` and `ServedBy` from dispatch.

pub mod check_stream;
pub mod inspect;
pub mod leak;
pub mod sse;
mod stream;
mod strip_key;

use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use serde_json::{Map, Value};
use std::collections::HashMap;
use std::sync::Arc;

use crate::activity::Activity;
use crate::audit::AuditLog;
use crate::body;
use crate::config::{Config, GuardConfig, LeakMode};
use crate::error::GatewayError;
use crate::metrics;
use crate::stack::admission::TokenCount;
use crate::stack::api::{Endpoint, InferenceRequest};
use crate::stack::auth::AuthContext;
use crate::stack::isolate::{FingerprintJob, IsolationState};
use crate::stack::observe::RequestSignals;
use crate::stack::rate_limit::UsageCell;
use crate::stack::routing::{RoutePlan, ServedBy};
use crate::stack::stage::{Next, Stage, StageFuture, StageLayer};
use check_stream::{StreamCheck, UsageRewrite};
use inspect::{Expectation, Markers, Shape, Trip};
use leak::LeakScan;
use stream::GuardedStream;

/// The prefill worker's whole answer in a PD request (a response extension set by
/// dispatch), with its buffer reservation, held until the guard has checked it.
#[derive(Debug, Clone)]
pub struct PrefillAnswer(pub bytes::Bytes, pub Arc<crate::load::BufferPermit>);

/// A non-streamed answer's bytes (a response extension set by dispatch): the guard checks
/// these and passes the body on untouched, so what the body holds until the client has it
/// (worker loads, the buffer budget's reservation) stays held.
#[derive(Debug, Clone)]
pub struct BufferedAnswer(pub bytes::Bytes);

/// Marks a response whose outcome is counted when its stream ends, not at the headers.
#[derive(Debug, Clone, Copy)]
pub struct OutcomeAtStreamEnd;

#[derive(Debug)]
struct PoolGuard {
    config: GuardConfig,
    markers: Markers,
}

/// Shared state of the guard.
#[derive(Debug)]
pub struct GuardState {
    pools: HashMap<String, PoolGuard>,
    sinks: Arc<Sinks>,
    isolation: Arc<IsolationState>,
}

/// Where trips and outcomes go. One `Arc` for both, so each request's report clones one
/// pointer, as it did when the audit log was the only sink.
#[derive(Debug)]
struct Sinks {
    audit: AuditLog,
    /// The gateway's recent counts (status page).
    activity: Arc<Activity>,
}

impl GuardState {
    /// Per-pool rules from the config; trips and outcomes are counted in `activity`.
    pub fn from_config(
        config: &Config,
        audit: AuditLog,
        isolation: Arc<IsolationState>,
        activity: Arc<Activity>,
    ) -> Self {
        let pools = config
            .pools
            .iter()
            .map(|p| {
                let guard = PoolGuard {
                    markers: Markers::from_config(&p.guard),
                    config: p.guard.clone(),
                };
                (p.name.clone(), guard)
            })
            .collect();
        Self {
            pools,
            sinks: Arc::new(Sinks { audit, activity }),
            isolation,
        }
    }
}

/// The request's facts every guard audit line carries, kept as read: most answers write no
/// guard line, so the line's fields are only built when one is written.
#[derive(Debug, Default)]
struct ReportFacts {
    endpoint: &'static str,
    tenant: Option<Arc<str>>,
    request_id: Option<String>,
    client_request_id: Option<String>,
    trace: Option<Arc<crate::telemetry::RequestTrace>>,
    worker: Option<String>,
    prefill_worker: Option<String>,
}

impl ReportFacts {
    fn fields(&self, pool: &str) -> Map<String, Value> {
        let mut fields = Map::new();
        fields.insert("pool".into(), Value::from(pool));
        fields.insert("endpoint".into(), Value::from(self.endpoint));
        let optional = [
            ("tenant", self.tenant.as_deref().map(str::to_owned)),
            ("request_id", self.request_id.clone()),
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
    /// The request's signals for its pool's window (rollouts count trips and leaks).
    signals: Option<Arc<RequestSignals>>,
}

impl TripReport {
    /// The gateway's id of the request (error events carry it).
    pub fn request_id(&self) -> Option<&str> {
        self.facts.request_id.as_deref()
    }

    /// Record `trip` once and return the error the client gets.
    pub fn record(&self, trip: &Trip) -> GatewayError {
        ::metrics::counter!(metrics::GUARD_TRIPS_TOTAL, "reason" => trip.reason(), "pool" => self.pool.clone())
            .increment(1);
        if let Some(signals) = &self.signals {
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

    /// A suspected leak: an audit line (no text, no other tenant's name) and the metric.
    pub fn leak(&self, suspicion: crate::stack::isolate::leak::LeakSuspicion) {
        ::metrics::counter!(metrics::LEAK_SUSPECTED_TOTAL, "pool" => self.pool.clone())
            .increment(1);
        if let Some(signals) = &self.signals {
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
        let extra = [
            ("outcome", Value::from(outcome)),
            ("stream", Value::from(true)),
        ];
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

/// The guard stage.
#[derive(Debug, Clone)]
pub struct Guard {
    state: Arc<GuardState>,
}

/// The guard stage as a layer.
pub type GuardLayer = StageLayer<Guard>;

impl Guard {
    /// Guard with `state`.
    pub fn layer(state: Arc<GuardState>) -> GuardLayer {
        StageLayer::new(Guard { state })
    }
}

/// Ask OpenAI-format engines for usage in the stream (to cross-check the prompt count as
/// early as the first chunk) and remember what the client did not ask for.
fn request_stream_usage(parsed: &mut InferenceRequest) -> UsageRewrite {
    parsed.directives.stream_usage = true;
    UsageRewrite {
        strip_final_usage: !parsed.client_stream_option("include_usage"),
        strip_chunk_usage: !parsed.client_stream_option("continuous_usage_stats"),
    }
}

// === impl Guard ===

impl Stage for Guard {
    fn handle(&self, mut request: Request<bytes::Bytes>, next: Next) -> StageFuture {
        let state = self.state.clone();
        Box::pin(async move {
            let pool = request
                .extensions()
                .get::<RoutePlan>()
                .map(|p| p.pool.name.to_string())
                .unwrap_or_default();
            let leak_mode = state
                .isolation
                .request_leak_mode(&pool, request.extensions().get::<AuthContext>());
            let Some(pool_guard) = state
                .pools
                .get(&pool)
                .filter(|g| g.config.enabled || leak_mode.is_on())
            else {
                return next.oneshot(request).await;
            };
            // Checks off (only to test other defences): the leak scan alone still runs.
            let checks = pool_guard.config.enabled;
            let job = request.extensions().get::<FingerprintJob>().cloned();
            let parsed = request
                .extensions_mut()
                .get_mut::<InferenceRequest>()
                .ok_or_else(|| GatewayError::Internal("the guard ran before parsing".into()))?;
            let shape = if parsed.endpoint == Endpoint::Generate {
                Shape::Native
            } else {
                Shape::OpenAi
            };
            let (stream, batch, endpoint) = (parsed.stream, parsed.batch, parsed.endpoint);
            let rewrite = if checks && stream && shape == Shape::OpenAi {
                request_stream_usage(parsed)
            } else {
                UsageRewrite::default()
            };
            let tolerance = if parsed.token_id_input() {
                0
            } else {
                pool_guard.config.prompt_tokens_tolerance
            };
            let count = request.extensions().get::<TokenCount>().cloned();
            let signals = request.extensions().get::<Arc<RequestSignals>>().cloned();
            let usage = request.extensions().get::<UsageCell>().cloned();
            let tenant = request
                .extensions()
                .get::<AuthContext>()
                .map(|a| a.tenant.clone());
            let header = |name: &str| {
                request
                    .headers()
                    .get(name)
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_owned)
            };
            let mut facts = ReportFacts {
                endpoint: endpoint.label(),
                tenant: tenant.clone(),
                request_id: header("x-request-id"),
                client_request_id: header("x-client-request-id"),
                trace: request
                    .extensions()
                    .get::<Arc<crate::telemetry::RequestTrace>>()
                    .cloned(),
                worker: None,
                prefill_worker: None,
            };

            let mut response = next.oneshot(request).await?;
            if let Some(served) = response.extensions().get::<ServedBy>() {
                facts.worker = Some(served.worker.authority.clone());
                facts.prefill_worker = served.prefill.as_ref().map(|p| p.authority.clone());
                // The outcome counts for these workers' outlier ejection.
                if let Some(signals) = &signals {
                    signals.served_by(served.clone());
                }
            }
            let report = TripReport {
                sinks: state.sinks.clone(),
                facts: Arc::new(facts),
                pool: pool.clone(),
                signals,
            };
            let leak = match (leak_mode, &tenant) {
                (LeakMode::Off, _) | (_, None) => None,
                (mode, Some(tenant)) => {
                    // The tenant's own prompt must be on record before its answer is read.
                    if let Some(FingerprintJob(job)) = job {
                        job.await;
                    }
                    let on_suspect: leak::OnSuspect = {
                        let report = report.clone();
                        Arc::new(move |s| report.leak(s))
                    };
                    Some(LeakScan::new(
                        state.isolation.store.scanner(tenant),
                        mode,
                        on_suspect,
                    ))
                }
            };
            // The gateway's own exact count (waits for the background count if admission
            // settled on the byte bound).
            let expect = Expectation {
                prompt_tokens: match (&count, checks) {
                    (Some(c), true) => c.exact().await,
                    _ => None,
                },
                tolerance,
            };
            if let Some(PrefillAnswer(prefill, _held)) =
                response.extensions_mut().remove::<PrefillAnswer>()
            {
                if checks {
                    if let Err(trip) = inspect::check_prefill(shape, &prefill, &expect) {
                        if let Some(signals) = &report.signals {
                            signals.blame_prefill();
                        }
                        return Err(report.record(&trip).into());
                    }
                }
            }
            let (mut parts, body) = response.into_parts();
            if !stream {
                let (bytes, body) = match parts.extensions.remove::<BufferedAnswer>() {
                    Some(BufferedAnswer(bytes)) => (bytes, body),
                    None => {
                        let bytes = body
                            .collect()
                            .await
                            .map_err(|e| {
                                GatewayError::Internal(format!("reading a buffered answer: {e}"))
                            })?
                            .to_bytes();
                        (bytes.clone(), body::full(bytes))
                    }
                };
                // Parsed once: the checks, the leak scan and the usage all read this.
                let answer = inspect::Answer::parse(&bytes, shape);
                if checks {
                    if let Err(trip) = answer.check(shape, &pool_guard.markers, &expect) {
                        return Err(report.record(&trip).into());
                    }
                }
                if let Some(mut leak) = leak {
                    for text in answer.texts(shape) {
                        if let Err(trip) = leak.push(text, true) {
                            return Err(report.record(&trip).into());
                        }
                    }
                }
                if let (Some(cell), Some(total)) = (&usage, answer.usage(shape)) {
                    cell.set(total);
                }
                return Ok(Response::from_parts(parts, body));
            }
            let mut check =
                StreamCheck::new(shape, pool_guard.markers.clone(), expect, batch, rewrite)
                    .with_leak_scan(leak);
            if !checks {
                check = check.without_checks();
            }
            let mut guarded = GuardedStream::new(body, check, report.clone()).with_usage(usage);
            if let Err(trip) = guarded.prime(pool_guard.config.first_event_timeout).await {
                return Err(report.record(&trip).into());
            }
            parts.extensions.insert(OutcomeAtStreamEnd);
            Ok(Response::from_parts(parts, guarded.into_body()))
        })
    }
}
