//! What the gateway will enforce, per model and pool, and where the configuration is
//! dangerous (I4): a context window larger than the smallest KV pool on the path is the
//! incident's configuration. Printed by `kvgate check` and logged at start-up.
//!
//! The numbers come from the admission layer ([`PoolBudget`]): what is printed is what is
//! enforced.

use std::fmt::{self, Write as _};

use crate::config::{Config, EngineKind};
use crate::fleet::{Discovery, Fleet, Pool, PoolWorkers, Worker};
use crate::stack::admission::{worker_input_limit, PoolBudget};

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
    /// The warnings that are configuration mismatches (a window larger than a KV pool),
    /// not workers briefly out.
    mismatches: Vec<String>,
}

impl CapacityReport {
    /// Compute the report from config and the live (possibly discovered) pools.
    pub fn build(config: &Config, fleet: &Fleet) -> Self {
        let mut models = Vec::new();
        let mut warnings = Vec::new();
        let mut mismatches = Vec::new();
        for model in &config.models {
            let window = model.context_window;
            let mut pools = Vec::new();
            for pool in fleet.pools_of(&model.name) {
                let limits = pool_limits(pool, window);
                if let Some(smallest) = limits.prefill_pool {
                    if window > smallest {
                        mismatches.push(format!(
                            "model `{}`: context window {window} is larger than the smallest prefill KV pool {smallest} of pool `{}` — the incident's configuration. kvgate refuses prompts over {} tokens here; size the KV pool to the context window or lower context_window.",
                            model.name,
                            pool.name,
                            limits.max_prompt_tokens.unwrap_or(0)
                        ));
                        warnings.extend(mismatches.last().cloned());
                    }
                }
                for reason in &limits.ineligible {
                    warnings.push(format!("pool `{}`: {reason}", pool.name));
                }
                for w in pool.all_workers() {
                    if let (_, Some(d)) = w.cache_tiers() {
                        warnings.push(format!(
                            "pool `{}`: {} {}: {d}",
                            pool.name,
                            w.role.as_str(),
                            w.authority
                        ));
                    }
                    if let Some((configured, reported)) = w.version_mismatch() {
                        warnings.push(format!(
                            "pool `{}`: {} {} reports engine version {reported} but the pool's `version` says {configured}; kvgate uses what the engine reports",
                            pool.name,
                            w.role.as_str(),
                            w.authority
                        ));
                    }
                }
                pools.push(limits);
            }
            models.push((model.name.clone(), window, pools));
        }
        Self {
            models,
            warnings,
            mismatches,
        }
    }

    /// Configuration mismatches and workers that cannot serve.
    pub fn warnings(&self) -> &[String] {
        &self.warnings
    }

    /// The warnings that are a model's window larger than a pool's KV (I4), without the
    /// workers that cannot serve right now.
    pub fn mismatches(&self) -> &[String] {
        &self.mismatches
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
    // The admission layer's own numbers: what is printed is what is enforced.
    let budget = PoolBudget::of(pool, window);
    let prefill_input_limit = budget.prefill_input_limit.as_ref().map(|b| b.tokens);
    let prefill_pool = budget.prefill_pool.as_ref().map(|b| b.tokens);
    let decode_pool = budget.decode_pool.as_ref().map(|b| b.tokens);
    let max_prompt_tokens = budget.max_prompt_tokens();
    let workers = pool
        .all_workers()
        .map(|w| describe_worker(w, pool.engine, window))
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
            pool.weight(),
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

fn describe_worker(w: &Worker, engine: EngineKind, window: u64) -> String {
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
    if let Some(limit) = worker_input_limit(w, engine, window) {
        let name = match engine {
            EngineKind::Sglang => "max_req_input_len",
            EngineKind::Openai => "input limit",
        };
        let _ = write!(line, "; {name} {limit}");
    }
    let _ = write!(
        line,
        "; version {}",
        w.version().as_deref().unwrap_or("unknown")
    );
    let (tiers, _) = w.cache_tiers();
    if !tiers.is_empty() {
        let names: Vec<String> = tiers
            .iter()
            .map(|t| {
                let salted = if t.salted { "salted" } else { "NOT salted" };
                format!("{} ({salted}, {})", t.kind.as_str(), t.source.as_str())
            })
            .collect();
        let _ = write!(line, "; cache tiers {}", names.join(", "));
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
