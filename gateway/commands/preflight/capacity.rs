//! The targets of preflight (a unified worker, or a prefill/decode pair), the token budget
//! all probes share, and what the targets' workers report about their capacity against the
//! model's window — the incident's mismatch named.

use super::report::{Finding, Verdict, WorkerCapacity};
use crate::config::EngineKind;
use crate::fleet::{Discovery, Worker};
use crate::stack::admission::worker_input_limit;

/// One worker, or a prefill/decode pair.
pub enum Target<'a> {
    Unified(&'a Worker),
    Pair {
        prefill: &'a Worker,
        decode: &'a Worker,
    },
}

impl Target<'_> {
    pub fn describe(&self) -> String {
        match self {
            Target::Unified(w) => w.authority.clone(),
            Target::Pair { prefill, decode } => {
                format!(
                    "prefill {} → decode {}",
                    prefill.authority, decode.authority
                )
            }
        }
    }

    pub(super) fn workers(&self) -> Vec<&Worker> {
        match self {
            Target::Unified(w) => vec![w],
            Target::Pair { prefill, decode } => vec![prefill, decode],
        }
    }
}

/// The prompt tokens all probes may still send.
pub struct TokenBudget {
    pub limit: u64,
    pub spent: u64,
}

impl TokenBudget {
    pub(super) fn take(&mut self, tokens: u64) -> bool {
        if self.spent.saturating_add(tokens) > self.limit {
            return false;
        }
        self.spent += tokens;
        true
    }
}

/// The capacity of the target's workers, and the findings about it.
pub fn capacity(
    target: &Target<'_>,
    engine: EngineKind,
    window: u64,
) -> (Vec<WorkerCapacity>, Vec<Finding>, Option<u64>) {
    let mut workers = Vec::new();
    let mut findings = Vec::new();
    let mut limit: Option<u64> = None;
    for w in target.workers() {
        let (info, discovery_error) = match w.discovery() {
            Discovery::Found(info) => (Some(info), None),
            Discovery::Failed(e) => (None, Some(e)),
            Discovery::Pending => (None, Some("not probed".to_owned())),
        };
        let input_limit = worker_input_limit(w, engine, window);
        if let Some(l) = input_limit {
            limit = Some(limit.map_or(l, |m| m.min(l)));
        }
        let kv = w.kv_tokens();
        if let Some(kv) = kv {
            if window > kv {
                findings.push(Finding {
                    verdict: Verdict::Warn,
                    detail: format!(
                        "{} {}: the model's context window {window} > KV pool {kv} tokens (max input {}) — the incident's mismatch; kvgate refuses longer prompts, so clients get less than the configured window. Size the KV pool to the window or lower context_window.",
                        w.role.as_str(),
                        w.authority,
                        input_limit.map_or_else(|| "?".to_owned(), |l| l.to_string())
                    ),
                });
            }
        }
        if let Some(ctx) = info.as_ref().and_then(|i| i.context_length) {
            if ctx < window {
                findings.push(Finding {
                    verdict: Verdict::Warn,
                    detail: format!(
                        "{} {}: the engine's context_length {ctx} < the model's context window {window}",
                        w.role.as_str(),
                        w.authority
                    ),
                });
            }
        }
        if input_limit.is_none() {
            findings.push(Finding {
                verdict: Verdict::Fail,
                detail: format!(
                    "{} {}: no input limit known ({}); set kv_tokens for it or let /get_server_info answer",
                    w.role.as_str(),
                    w.authority,
                    discovery_error.as_deref().unwrap_or("the engine reports no KV pool")
                ),
            });
        }
        if let Some(reason) = w.ineligibility() {
            findings.push(Finding {
                verdict: Verdict::Warn,
                detail: format!(
                    "{} {}: kvgate will not send it traffic: {reason}",
                    w.role.as_str(),
                    w.authority
                ),
            });
        }
        workers.push(WorkerCapacity {
            role: w.role.as_str(),
            worker: w.authority.clone(),
            version: w.version(),
            context_length: info.as_ref().and_then(|i| i.context_length),
            max_total_num_tokens: info.as_ref().and_then(|i| i.max_total_num_tokens),
            max_req_input_len: info.as_ref().and_then(|i| i.max_req_input_len),
            input_limit,
            discovery_error,
            ineligible: w.ineligibility(),
        });
    }
    if findings.iter().all(|f| f.verdict == Verdict::Pass) {
        findings.push(Finding {
            verdict: Verdict::Pass,
            detail: format!(
                "input limit {} within the model's context window {window}",
                limit.map_or_else(|| "?".to_owned(), |l| l.to_string())
            ),
        });
    }
    (workers, findings, limit)
}
