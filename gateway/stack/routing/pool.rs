//! Engine pools: the workers of one model behind one engine version, with a traffic weight.

use std::sync::atomic::AtomicUsize;
use std::sync::Arc;

use super::{pick, Role, Worker, WorkerLoad};
use crate::config::{EngineKind, PoolConfig, PoolMode};
use crate::load::InFlightLimit;
use crate::stack::api::Endpoint;

/// The workers of a pool, by mode.
#[derive(Debug)]
pub enum PoolWorkers {
    /// One worker serves a request.
    Unified(Vec<Arc<Worker>>),
    /// A prefill and a decode worker serve a request together.
    Disaggregated {
        prefill: Vec<Arc<Worker>>,
        decode: Vec<Arc<Worker>>,
    },
}

/// One `[[pools]]` entry, live.
#[derive(Debug)]
pub struct Pool {
    pub name: Arc<str>,
    pub model: String,
    pub engine: EngineKind,
    pub weight: u32,
    pub version: Option<String>,
    /// The `model` value sent to the engines.
    pub served_model: String,
    pub workers: PoolWorkers,
    /// Only these tenants may use the pool (None: all).
    pub tenants: Option<std::collections::HashSet<String>>,
    /// `max_in_flight`: requests at once on this pool.
    pub in_flight: Option<InFlightLimit>,
    cursors: [AtomicUsize; 2],
}

/// The workers chosen for one request; their loads end with the response body.
#[derive(Debug)]
pub enum Target {
    Unified(WorkerLoad),
    Disaggregated {
        prefill: WorkerLoad,
        decode: WorkerLoad,
    },
}

impl Pool {
    /// Build a pool from validated config.
    pub fn new(config: &PoolConfig) -> Self {
        let name: Arc<str> = Arc::from(config.name.as_str());
        let build = |list: &[crate::config::WorkerConfig], role| {
            list.iter()
                .map(|w| Arc::new(Worker::new(name.clone(), role, w)))
                .collect::<Vec<_>>()
        };
        let workers = match config.mode {
            PoolMode::Unified => PoolWorkers::Unified(build(&config.workers, Role::Unified)),
            PoolMode::Disaggregated => PoolWorkers::Disaggregated {
                prefill: build(&config.prefill, Role::Prefill),
                decode: build(&config.decode, Role::Decode),
            },
        };
        Self {
            name: name.clone(),
            model: config.model.clone(),
            engine: config.engine,
            weight: config.weight,
            version: config.version.clone(),
            served_model: config
                .served_model
                .clone()
                .unwrap_or_else(|| config.model.clone()),
            workers,
            tenants: (!config.tenants.is_empty()).then(|| config.tenants.iter().cloned().collect()),
            in_flight: config.max_in_flight.map(InFlightLimit::new),
            cursors: [AtomicUsize::new(0), AtomicUsize::new(0)],
        }
    }

    /// Whether `tenant` (pinned to `pinned` pools, if any) may use this pool.
    pub fn serves_tenant(
        &self,
        tenant: &str,
        pinned: Option<&std::collections::HashSet<String>>,
    ) -> bool {
        self.tenants.as_ref().is_none_or(|t| t.contains(tenant))
            && pinned.is_none_or(|p| p.contains(&*self.name))
    }

    /// Every worker with its role.
    pub fn all_workers(&self) -> impl Iterator<Item = &Arc<Worker>> {
        let (a, b): (&[Arc<Worker>], &[Arc<Worker>]) = match &self.workers {
            PoolWorkers::Unified(w) => (w, &[]),
            PoolWorkers::Disaggregated { prefill, decode } => (prefill, decode),
        };
        a.iter().chain(b.iter())
    }

    /// Why this pool cannot take a request for `endpoint` now (None: it can). Admission
    /// and routing both filter pools with it.
    pub fn refusal_for(&self, endpoint: Endpoint) -> Option<String> {
        if endpoint.needs_sglang() && self.engine != EngineKind::Sglang {
            return Some(format!(
                "pool `{}` is not an SGLang pool (/generate)",
                self.name
            ));
        }
        self.ineligibility()
    }

    /// Whether the pool can take a request now, or why not.
    pub fn ineligibility(&self) -> Option<String> {
        let none_eligible = |ws: &[Arc<Worker>], role: &str| {
            (!ws.iter().any(|w| w.is_eligible())).then(|| {
                let reasons: Vec<String> = ws
                    .iter()
                    .filter_map(|w| w.ineligibility().map(|r| format!("{}: {r}", w.authority)))
                    .collect();
                format!(
                    "pool `{}` has no eligible {role} worker ({})",
                    self.name,
                    reasons.join("; ")
                )
            })
        };
        if self.weight == 0 {
            return Some(format!("pool `{}` has weight 0", self.name));
        }
        match &self.workers {
            PoolWorkers::Unified(ws) => none_eligible(ws, "unified"),
            PoolWorkers::Disaggregated { prefill, decode } => {
                none_eligible(prefill, "prefill").or_else(|| none_eligible(decode, "decode"))
            }
        }
    }

    /// Another eligible worker of a unified pool than `failed` (a retry after a connect
    /// failure), least outstanding first.
    pub fn pick_other_unified(&self, failed: &Worker) -> Option<Target> {
        let PoolWorkers::Unified(ws) = &self.workers else {
            return None;
        };
        let others: Vec<Arc<Worker>> = ws
            .iter()
            .filter(|w| w.authority != failed.authority)
            .cloned()
            .collect();
        let w = pick::least_outstanding(&others, &self.cursors[0])?;
        Some(Target::Unified(w.start_request()))
    }

    /// Choose the workers for one request (least outstanding, round-robin on ties).
    pub fn pick(&self) -> Option<Target> {
        match &self.workers {
            PoolWorkers::Unified(ws) => {
                let w = pick::least_outstanding(ws, &self.cursors[0])?;
                Some(Target::Unified(w.start_request()))
            }
            PoolWorkers::Disaggregated { prefill, decode } => {
                let p = pick::least_outstanding(prefill, &self.cursors[0])?;
                let d = pick::least_outstanding(decode, &self.cursors[1])?;
                Some(Target::Disaggregated {
                    prefill: p.start_request(),
                    decode: d.start_request(),
                })
            }
        }
    }
}
