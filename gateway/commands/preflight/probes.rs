//! The probes of one target (a unified worker, or a prefill/decode pair): isolation between
//! two probe tenants (`isolation`), and boundary prompts around the worker's input limit —
//! sent straight to the engine with the body dispatch would build (the same `engine_body`,
//! so PD pairs get the bootstrap fields the gateway sends). Every prompt carries a nonce of
//! its own; once all ran, every answer is held against every other probe's prompt (`cross`).
//!
//! Isolation runs first, while the engine's KV pool still holds nothing of the boundary
//! probes.

use bytes::Bytes;
use http::HeaderValue;
use serde_json::{Map, Value};
use std::sync::{Arc, Mutex, PoisonError};
use tokio::time::Instant;

use super::answer::Observed;
use super::capacity::{Target, TokenBudget};
use super::cross::{self, Sent};
use super::prompt::{Prompt, PromptMaker};
use super::report::{ProbeResult, Verdict};
use super::verdict::{judge, Exchange, Expect};
use crate::config::{EngineKind, IsolationConfig, PreflightConfig};
use crate::fleet::{Pool, Worker};
use crate::secure_random;
use crate::stack::api::{Endpoint, EngineDirectives, InferenceRequest};
use crate::stack::dispatch::build_engine_body;
use crate::stack::guard::inspect::{Expectation, Markers, Shape};
use crate::stack::isolate::CacheSalter;
use crate::upstream::{read_body, Replay, Upstream};

/// Largest answer a probe reads.
const MAX_ANSWER_BYTES: usize = 8 << 20;

/// Everything a target's probes need.
pub struct Prober<'a> {
    pub upstream: &'a Upstream,
    pub pool: &'a Pool,
    pub target: Target<'a>,
    pub prompts: &'a PromptMaker<'a>,
    pub markers: &'a Markers,
    /// The pool's `prompt_tokens_tolerance` for chat; token ids are compared exactly.
    pub chat_tolerance: u64,
    pub window: u64,
    pub settings: &'a PreflightConfig,
    /// Salts for the two probe tenants, when the pool sends cache salts.
    pub salts: Option<(String, String)>,
    /// `[isolation]`: the n-gram test's `ngram` and `min_matches` for the cross-probe check.
    pub leak: &'a IsolationConfig,
    /// What each probe sent, for the cross-probe check.
    pub sent: Mutex<Vec<Sent>>,
}

impl Prober<'_> {
    fn endpoints(&self) -> Vec<Endpoint> {
        let mut e = Vec::new();
        if self.pool.engine == EngineKind::Sglang {
            e.push(Endpoint::Generate);
        }
        if self.prompts.has_chat() {
            e.push(Endpoint::ChatCompletions);
        }
        e
    }

    /// The new tokens a boundary probe of `tokens` asks for. vLLM refuses a prompt whose
    /// explicit `max_tokens` would run past its context, so an OpenAI-style probe below the
    /// limit asks for no more than fits (at least 1); SGLang judges the prompt alone.
    fn max_new_tokens(&self, tokens: u64, limit: u64) -> u64 {
        let configured = self.settings.max_new_tokens;
        match self.pool.engine {
            EngineKind::Sglang => configured,
            EngineKind::Openai => configured.min(limit.saturating_sub(tokens).max(1)),
        }
    }

    /// A prompt of `tokens` with a nonce of its own.
    pub(super) fn prompt(&self, endpoint: Endpoint, tokens: u64) -> Result<Prompt, String> {
        match endpoint {
            Endpoint::Generate => self.prompts.generate(tokens),
            _ => self.prompts.chat(tokens),
        }
        .map_err(|e| e.to_string())
    }

    /// Every probe of the target, in order: isolation, then the boundaries, then the
    /// shared-cache check (`shared_cache`); then the cross-probe check over all answers.
    pub async fn run(&self, limit: u64, budget: &mut TokenBudget) -> Vec<ProbeResult> {
        let mut results = Vec::new();
        let endpoints = self.endpoints();
        // Isolation on the first route the engine speaks (the native one where there is one).
        if let Some(&endpoint) = endpoints.first() {
            results.extend(self.isolation(endpoint, limit, budget).await);
        }
        let mut sizes = vec![
            (limit.saturating_sub(1), "limit - 1", Expect::Accept),
            (limit, "limit", Expect::Refuse),
            (limit + 1, "limit + 1", Expect::Refuse),
        ];
        if self.window > limit + 1 {
            sizes.push((self.window, "model context window", Expect::Refuse));
        }
        for (tokens, name, expect) in sizes {
            for &endpoint in &endpoints {
                for stream in [false, true] {
                    let prompt = match self.prompt(endpoint, tokens) {
                        Ok(p) => p,
                        Err(e) => {
                            results.push(failed_to_build(
                                "boundary", endpoint, stream, name, tokens, &e,
                            ));
                            continue;
                        }
                    };
                    let r = self
                        .probe(
                            "boundary",
                            name.to_owned(),
                            endpoint,
                            stream,
                            prompt,
                            expect,
                            limit,
                            None,
                            self.max_new_tokens(tokens, limit),
                            budget,
                        )
                        .await;
                    results.push(r);
                }
            }
        }
        // Last, so its prompts (which B rightly gets echoed from A's) disturb no other probe.
        if let Some(&endpoint) = endpoints.first() {
            results.extend(self.shared_cache(endpoint, limit, budget).await);
        }
        let sent = std::mem::take(&mut *self.sent.lock().unwrap_or_else(PoisonError::into_inner));
        cross::check(&mut results, &sent, self.leak);
        results
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) async fn probe(
        &self,
        kind: &'static str,
        name: String,
        endpoint: Endpoint,
        stream: bool,
        prompt: Prompt,
        expect: Expect,
        limit: u64,
        salt: Option<String>,
        max_new: u64,
        budget: &mut TokenBudget,
    ) -> ProbeResult {
        let tokens = prompt.tokens;
        let mut result = ProbeResult {
            kind,
            name,
            endpoint: endpoint.path(),
            stream,
            prompt_tokens: tokens,
            expect: expect.as_str(),
            verdict: Verdict::Skipped,
            detail: String::new(),
            evidence: None,
            prefill_evidence: None,
        };
        if !budget.take(tokens) {
            result.detail = format!(
                "over the token budget ({} of {} spent)",
                budget.spent, budget.limit
            );
            return result;
        }
        self.sent
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Sent {
                label: cross::label(&result),
                nonce: prompt.nonce,
                text: prompt.text,
            });
        let tolerance = if endpoint == Endpoint::Generate {
            0
        } else {
            self.chat_tolerance
        };
        let expectation = Expectation {
            prompt_tokens: Some(Arc::from(vec![tokens])),
            tolerance,
        };
        let exchange = self
            .exchange(endpoint, stream, prompt.fields, salt, max_new, &expectation)
            .await;
        let (verdict, detail) = judge(&exchange, expect, tokens, limit);
        result.verdict = verdict;
        result.detail = detail;
        result.evidence = Some(exchange.answer);
        result.prefill_evidence = exchange.prefill;
        result
    }

    pub(super) async fn exchange(
        &self,
        endpoint: Endpoint,
        stream: bool,
        prompt: Map<String, Value>,
        salt: Option<String>,
        max_new: u64,
        expect: &Expectation,
    ) -> Exchange {
        let mut fields = prompt;
        match endpoint {
            Endpoint::Generate => {
                fields.insert(
                    "sampling_params".into(),
                    serde_json::json!({ "max_new_tokens": max_new, "temperature": 0 }),
                );
            }
            _ => {
                fields.insert("max_tokens".into(), Value::from(max_new));
                fields.insert("temperature".into(), Value::from(0));
            }
        }
        fields.insert("stream".into(), Value::Bool(stream));
        let request = InferenceRequest::from_fields(
            endpoint,
            self.pool.model.clone(),
            stream,
            1,
            fields,
            EngineDirectives {
                default_max_new_tokens: None,
                cache_salt: salt,
                stream_usage: stream && endpoint != Endpoint::Generate,
                response_id: None,
            },
        );
        // UUID-shaped: llama-cpp-python's server answers a bodiless 400 to any other
        // `x-request-id`. The probe stays recognisable by its prompt's nonce and the report.
        let rid = secure_random::uuid_v4();
        let prefill = match &self.target {
            Target::Pair { prefill, .. } => Some(*prefill),
            Target::Unified(_) => None,
        };
        let body = match build_engine_body(request, self.pool, prefill, &rid) {
            Ok(b) => b,
            Err(e) => {
                return Exchange {
                    answer: Observed::unanswered(format!("building the body: {e}")),
                    prefill: None,
                }
            }
        };
        let shape = if endpoint == Endpoint::Generate {
            Shape::Native
        } else {
            Shape::OpenAi
        };
        let path = endpoint.path();
        let deadline = Instant::now() + self.settings.probe_timeout;
        match &self.target {
            Target::Unified(w) => Exchange {
                answer: self
                    .send(
                        w,
                        path,
                        body,
                        &rid,
                        (deadline, Replay::StaleConnection),
                        stream,
                        shape,
                        expect,
                    )
                    .await,
                prefill: None,
            },
            Target::Pair { prefill, decode } => {
                // Both legs at once, as dispatch sends them: the decode side waits for the
                // prefill side's KV under the shared bootstrap room.
                let (p, d) = tokio::join!(
                    self.send(
                        prefill,
                        path,
                        body.clone(),
                        &rid,
                        (deadline, Replay::Never),
                        stream,
                        shape,
                        expect
                    ),
                    self.send(
                        decode,
                        path,
                        body,
                        &rid,
                        (deadline, Replay::Never),
                        stream,
                        shape,
                        expect
                    ),
                );
                Exchange {
                    answer: d,
                    prefill: Some(p),
                }
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    async fn send(
        &self,
        worker: &Worker,
        path: &str,
        body: Bytes,
        rid: &str,
        (deadline, replay): (Instant, Replay),
        stream: bool,
        shape: Shape,
        expect: &Expectation,
    ) -> Observed {
        let request_id = HeaderValue::from_str(rid).ok();
        let response = match self
            .upstream
            .post_json(
                worker,
                path,
                body,
                request_id.as_ref(),
                None,
                deadline,
                replay,
            )
            .await
        {
            Ok(r) => r,
            Err(e) => return Observed::unanswered(e.to_string()),
        };
        let status = response.status().as_u16();
        match read_body(
            worker,
            response.into_body(),
            MAX_ANSWER_BYTES,
            deadline,
            None,
        )
        .await
        {
            Ok(bytes) => Observed::read(status, &bytes, stream, shape, self.markers, expect),
            Err(e) => {
                let mut o = Observed::unanswered(e.to_string());
                o.status = status;
                o
            }
        }
    }
}

pub(super) fn failed_to_build(
    kind: &'static str,
    endpoint: Endpoint,
    stream: bool,
    name: &str,
    tokens: u64,
    e: &str,
) -> ProbeResult {
    ProbeResult {
        kind,
        name: name.into(),
        endpoint: endpoint.path(),
        stream,
        prompt_tokens: tokens,
        expect: "-",
        verdict: Verdict::Fail,
        detail: format!("the probe prompt could not be built: {e}"),
        evidence: None,
        prefill_evidence: None,
    }
}

/// Salts for the two probe tenants, derived like the gateway's (an HMAC of the tenant name)
/// under a secret of this run, so they differ from each other and from every real tenant's.
pub fn probe_salts() -> (String, String) {
    let mut secret = [0u8; 32];
    secure_random::fill(&mut secret);
    let salter = CacheSalter::new(&secret);
    (
        salter.salt("kvgate-preflight-tenant-a"),
        salter.salt("kvgate-preflight-tenant-b"),
    )
}
