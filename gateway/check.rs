//! What the gateway will enforce, per model and pool, and where the configuration is
//! dangerous (I4): a context window larger than the smallest KV pool on the path is the
//! incident's configuration. Printed by `kvgate check` and logged at start-up.
//!
//! The input limit follows SGLang: an engine refuses inputs of `max_req_input_len` tokens or
//! more, with `max_req_input_len = min(context_length - 1, pool - 1) - 5`.

use std::fmt::{self, Write as _};

use crate::config::Config;
use crate::routing::{Discovery, Pool, PoolWorkers, Router, Worker};

/// SGLang's input limit for a worker whose context length is `context` and pool `pool`.
pub fn sglang_max_req_input_len(context: u64, pool: u64) -> u64 {
    context
        .saturating_sub(1)
        .min(pool.saturating_sub(1))
        .saturating_sub(5)
}

/// The limits of one pool.
#[derive(Debug, Clone)]
pub struct PoolLimits {
    pub pool: String,
    pub description: String,
    /// The smallest input limit of any prefill-side worker (prompt must be **below** it).
    pub prefill_input_limit: Option<u64>,
    /// The smallest KV pool of any decode-side worker (prompt + max new tokens must fit).
    pub decode_pool: Option<u64>,
    /// The smallest KV pool of any prefill-side worker.
    pub prefill_pool: Option<u64>,
    /// The largest prompt the pool admits.
    pub max_prompt_tokens: Option<u64>,
    pub workers: Vec<String>,
    pub ineligible: Vec<String>,
}

/// The report for the whole config.
#[derive(Debug, Clone)]
pub struct CapacityReport {
    models: Vec<(String, u64, Vec<PoolLimits>)>,
    warnings: Vec<String>,
}

impl CapacityReport {
    /// Compute the report from config and the live (possibly discovered) pools.
    pub fn build(config: &Config, router: &Router) -> Self {
        let mut models = Vec::new();
        let mut warnings = Vec::new();
        for model in &config.models {
            let window = model.context_window;
            let mut pools = Vec::new();
            for pool in router.pools_of(&model.name) {
                let limits = pool_limits(pool, window);
                if let Some(smallest) = limits.prefill_pool {
                    if window > smallest {
                        warnings.push(format!(
                            "model `{}`: context window {window} is larger than the smallest prefill KV pool {smallest} of pool `{}` — the incident's configuration. kvgate refuses prompts over {} tokens here; size the KV pool to the context window or lower context_window.",
                            model.name,
                            pool.name,
                            limits.max_prompt_tokens.unwrap_or(0)
                        ));
                    }
                }
                for reason in &limits.ineligible {
                    warnings.push(format!("pool `{}`: {reason}", pool.name));
                }
                pools.push(limits);
            }
            models.push((model.name.clone(), window, pools));
        }
        Self { models, warnings }
    }

    /// Configuration mismatches and workers that cannot serve.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The limits of a pool, by name.
    pub fn pool(&self, name: &str) -> Option<&PoolLimits> {
        self.models
            .iter()
            .flat_map(|(_, _, pools)| pools)
            .find(|p| p.pool == name)
    }
}

fn pool_limits(pool: &Pool, window: u64) -> PoolLimits {
    let (prefill_side, decode_side): (&[std::sync::Arc<Worker>], &[std::sync::Arc<Worker>]) =
        match &pool.workers {
            PoolWorkers::Unified(ws) => (ws, ws),
            PoolWorkers::Disaggregated { prefill, decode } => (prefill, decode),
        };
    // "Smallest" is over every worker the request could land on, so the answer never
    // depends on which worker is picked; a worker of unknown capacity serves nothing (I3).
    let eligible = |ws: &[std::sync::Arc<Worker>]| {
        ws.iter()
            .filter(|w| w.is_eligible())
            .cloned()
            .collect::<Vec<_>>()
    };
    let prefill_eligible = eligible(prefill_side);
    let decode_eligible = eligible(decode_side);
    let prefill_input_limit = prefill_eligible
        .iter()
        .filter_map(|w| worker_input_limit(w, window))
        .min();
    let prefill_pool = prefill_eligible.iter().filter_map(|w| w.kv_tokens()).min();
    let decode_pool = decode_eligible.iter().filter_map(|w| w.kv_tokens()).min();
    let max_prompt_tokens =
        prefill_input_limit.map(|limit| limit.saturating_sub(1).min(window.saturating_sub(1)));
    let workers = pool
        .all_workers()
        .map(|w| describe_worker(w, window))
        .collect();
    let ineligible = pool
        .all_workers()
        .filter_map(|w| {
            w.ineligibility()
                .map(|r| format!("{} {} {}", w.role.as_str(), w.authority, r))
        })
        .collect();
    let mode = match pool.workers {
        PoolWorkers::Unified(_) => "unified",
        PoolWorkers::Disaggregated { .. } => "disaggregated",
    };
    PoolLimits {
        pool: pool.name.to_string(),
        description: format!(
            "{:?} engine, {mode}, weight {}{}",
            pool.engine,
            pool.weight,
            pool.version
                .as_deref()
                .map(|v| format!(", version {v}"))
                .unwrap_or_default()
        )
        .to_lowercase(),
        prefill_input_limit,
        decode_pool,
        prefill_pool,
        max_prompt_tokens,
        workers,
        ineligible,
    }
}

fn worker_input_limit(w: &Worker, window: u64) -> Option<u64> {
    let kv = w.kv_tokens()?;
    let context = w
        .discovered_context_length()
        .map_or(window, |c| c.min(window));
    let derived = sglang_max_req_input_len(context, kv);
    Some(
        w.discovered_max_req_input_len()
            .map_or(derived, |d| d.min(derived)),
    )
}

fn describe_worker(w: &Worker, window: u64) -> String {
    let source = match (w.configured_kv_tokens(), w.discovery()) {
        (Some(c), Discovery::Found(info)) => match info.max_total_num_tokens {
            Some(d) if d != c => format!("configured {c}, discovered {d}: enforcing {}", c.min(d)),
            Some(_) => format!("configured {c}, discovered the same"),
            None => format!("configured {c}"),
        },
        (Some(c), _) => format!("configured {c}"),
        (None, Discovery::Found(info)) => match info.max_total_num_tokens {
            Some(d) => format!("discovered {d}"),
            None => "unknown".into(),
        },
        (None, _) => "unknown".into(),
    };
    let mut line = format!(
        "{:<8} {:<24} kv_tokens {source}",
        w.role.as_str(),
        w.authority
    );
    if let Some(limit) = worker_input_limit(w, window) {
        let _ = write!(line, "; max_req_input_len {limit}");
    }
    if let Some(reason) = w.ineligibility() {
        let _ = write!(line, "; NOT ELIGIBLE: {reason}");
    }
    line
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "unknown (serves nothing)".to_owned(), |v| v.to_string())
}

impl fmt::Display for CapacityReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (model, window, pools) in &self.models {
            writeln!(f, "model `{model}`: context window {window} tokens")?;
            for p in pools {
                writeln!(f, "  pool `{}` ({})", p.pool, p.description)?;
                for w in &p.workers {
                    writeln!(f, "    {w}")?;
                }
                writeln!(
                    f,
                    "    smallest prefill input limit: {} (prompts must be below it)",
                    opt(p.prefill_input_limit)
                )?;
                writeln!(
                    f,
                    "    smallest decode KV pool:      {} (prompt + max new tokens must fit)",
                    opt(p.decode_pool)
                )?;
                writeln!(
                    f,
                    "    enforced prompt limit:        {} tokens",
                    opt(p.max_prompt_tokens)
                )?;
            }
        }
        if self.warnings.is_empty() {
            writeln!(f, "no warnings")?;
        } else {
            for w in &self.warnings {
                writeln!(f, "WARNING: {w}")?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sglang_input_limit_matches_the_engine_formula() {
        // The incident: 1,048,576-token window, 681,280-token prefill pool.
        assert_eq!(sglang_max_req_input_len(1_048_576, 681_280), 681_274);
        assert_eq!(sglang_max_req_input_len(4096, 100_000), 4090);
        assert_eq!(sglang_max_req_input_len(3, 3), 0);
    }
}
