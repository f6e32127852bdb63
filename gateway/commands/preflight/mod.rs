//! `kvgate preflight`: prove a deployment safe against the incident's class before it takes
//! traffic. For every worker (unified) or prefill/decode pair, straight to the engine (not
//! through admission), within a token budget:
//!
//! - capacity: the engine's context length, KV pool and max input against the model's
//!   window, naming the incident's mismatch;
//! - isolation: probe tenant A plants a nonce in a long prompt, probe tenant B then sends
//!   an over-limit prompt, a short one, one at the limit − 1 and a long one; A's nonce in
//!   B's answers is a FAIL;
//! - boundaries: prompts at the limit − 1 (must be served, counted exactly), the limit,
//!   the limit + 1 and the model's window (must get a clear error), streaming and not,
//!   `/generate` and chat where the engine speaks them;
//! - cross-probe: every prompt carries a nonce of its own, and an answer holding another
//!   probe's nonce or prompt text (the leak detector's n-gram test) is a FAIL naming both;
//! - shared cache (pools that keep tenants apart): two probe tenants of different salts send
//!   the same long prompt; the second must get no cache hit, by the engine's cached tokens
//!   and by its time to first token against a cold prefill (issue 40).
//!
//! A worker that does not answer at all is reported once as unreachable and not probed.
//!
//! Files: `capacity` (targets, budget, capacity findings), `prompt` (exact-count prompts
//! with nonces), `answer` (reading an answer), `probes` (what is sent), `isolation` (the
//! isolation probes), `verdict` (how one answer is judged), `cross` (answers against other
//! probes' prompts), `shared_cache` (the shared-cache check), `reach` (whether a worker
//! answers at all), `report` (verdicts, text, JSON, exit code).

mod answer;
mod capacity;
mod cross;
mod isolation;
mod probes;
mod prompt;
mod reach;
mod report;
mod shared_cache;
mod verdict;

pub use answer::Observed;
pub use report::{Finding, PreflightReport, ProbeResult, TargetReport, Verdict, WorkerCapacity};

use std::sync::Arc;

use crate::config::Config;
use crate::fleet::{discover_all, Fleet, Pool, PoolWorkers, Worker};
use crate::runtime::load_tokenizer;
use crate::stack::guard::inspect::Markers;
use crate::upstream::Upstream;
use capacity::{capacity, Target, TokenBudget};
use probes::{probe_salts, Prober};
use prompt::PromptMaker;

/// What to probe.
#[derive(Debug, Clone, Default)]
pub struct PreflightOptions {
    /// Only these pools (empty: all).
    pub pools: Vec<String>,
    /// Overrides `preflight.token_budget`.
    pub token_budget: Option<u64>,
}

/// Why preflight could not run at all.
#[derive(Debug, thiserror::Error)]
pub enum PreflightError {
    #[error("--pool {0}: no such pool in the config (pools: {1})")]
    UnknownPool(String, String),
    #[error("--token-budget must be above 0")]
    ZeroBudget,
    #[error("model `{model}`: cannot load its tokenizer: {detail}")]
    Tokenizer { model: String, detail: String },
    #[error("TLS to engines: {0}")]
    Tls(crate::tls::TlsError),
}

/// Run every probe of the selected pools and report.
pub async fn run(
    config: &Config,
    options: &PreflightOptions,
) -> Result<PreflightReport, PreflightError> {
    let fleet = Fleet::from_config(config);
    for name in &options.pools {
        if fleet.pool(name).is_none() {
            let known: Vec<&str> = fleet.pools().iter().map(|p| &*p.name).collect();
            return Err(PreflightError::UnknownPool(name.clone(), known.join(", ")));
        }
    }
    let limit = options
        .token_budget
        .unwrap_or(config.preflight.token_budget);
    if limit == 0 {
        return Err(PreflightError::ZeroBudget);
    }
    let tls = crate::tls::EngineTls::from_config(config).map_err(PreflightError::Tls)?;
    let upstream = Upstream::new(&config.upstream, &tls);
    discover_all(&fleet, &upstream).await;
    let mut budget = TokenBudget { limit, spent: 0 };
    let mut targets = Vec::new();
    for pool in fleet.pools() {
        if !options.pools.is_empty() && !options.pools.iter().any(|n| *n == *pool.name) {
            continue;
        }
        targets.extend(probe_pool(config, pool, &upstream, &mut budget).await?);
    }
    Ok(PreflightReport::new(limit, budget.spent, targets))
}

async fn probe_pool(
    config: &Config,
    pool: &Arc<Pool>,
    upstream: &Upstream,
    budget: &mut TokenBudget,
) -> Result<Vec<TargetReport>, PreflightError> {
    let Some(model) = config.models.iter().find(|m| m.name == pool.model) else {
        // Validation guarantees every pool's model exists; nothing to probe otherwise.
        return Ok(Vec::new());
    };
    let tokenizer =
        load_tokenizer(&model.tokenizer, model.chat_template.as_deref()).map_err(|e| {
            PreflightError::Tokenizer {
                model: model.name.clone(),
                detail: e.to_string(),
            }
        })?;
    let prompts =
        PromptMaker::new(&tokenizer, pool.chat_rules).map_err(|e| PreflightError::Tokenizer {
            model: model.name.clone(),
            detail: e.to_string(),
        })?;
    let pool_config = config.pools.iter().find(|p| *p.name == *pool.name);
    let guard = pool_config.map(|p| p.guard.clone()).unwrap_or_default();
    let markers = Markers::from_config(&guard);
    let salts = pool_config.is_some_and(|p| p.cache_salt).then(probe_salts);
    let mut reports = Vec::new();
    for target in targets(pool) {
        let unreachable =
            reach::unreachable(&target, upstream, config.preflight.probe_timeout).await;
        let (workers, mut findings, limit) = capacity(&target, pool.engine, model.context_window);
        let mode = match target {
            Target::Unified(_) => "unified",
            Target::Pair { .. } => "disaggregated",
        };
        let described = target.describe();
        let probes = if !unreachable.is_empty() {
            // Nothing was sent: what discovery could not read says nothing new.
            findings.clear();
            Vec::new()
        } else {
            let prober = Prober {
                upstream,
                pool,
                target,
                prompts: &prompts,
                markers: &markers,
                chat_tolerance: guard.prompt_tokens_tolerance,
                window: model.context_window,
                settings: &config.preflight,
                salts: salts.clone(),
                leak: &config.isolation,
                sent: Default::default(),
            };
            match limit {
                Some(limit) => prober.run(limit, budget).await,
                None => Vec::new(),
            }
        };
        reports.push(TargetReport {
            pool: pool.name.to_string(),
            model: model.name.clone(),
            mode,
            target: described,
            model_context_window: model.context_window,
            input_limit: limit,
            workers,
            capacity: findings,
            probes,
            unreachable,
        });
    }
    Ok(reports)
}

/// Every worker of a unified pool; for a disaggregated pool, pairs that cover every
/// prefill and every decode worker at least once.
fn targets(pool: &Pool) -> Vec<Target<'_>> {
    match &pool.workers {
        PoolWorkers::Unified(workers) => workers.iter().map(|w| Target::Unified(w)).collect(),
        PoolWorkers::Disaggregated { prefill, decode } => {
            let n = prefill.len().max(decode.len());
            if prefill.is_empty() || decode.is_empty() {
                return Vec::new();
            }
            (0..n)
                .map(|i| Target::Pair {
                    prefill: pick(prefill, i),
                    decode: pick(decode, i),
                })
                .collect()
        }
    }
}

fn pick(workers: &[Arc<Worker>], i: usize) -> &Worker {
    &workers[i % workers.len()]
}
