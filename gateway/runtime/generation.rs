//! Building a [`Generation`] from a config: at start-up from nothing, on reload from the
//! running one — taking over unchanged pools (and their workers' state), unchanged
//! rollouts, the leak detector's memory and the salt secret — and saying what changed.

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use tokio::sync::Semaphore;

use super::app::{load_tokenizer, StartError};
use super::live::Generation;
use crate::activity::Activity;
use crate::audit::AuditLog;
use crate::config::Config;
use crate::fleet::Fleet;
use crate::load::InFlightLimit;
use crate::rollout::Rollouts;
use crate::stack::admission::{AdmissionState, ModelAdmission};
use crate::stack::api::read_body::BodyLimits;
use crate::stack::api::ModelCatalog;
use crate::stack::auth::ApiKeys;
use crate::stack::dispatch::DispatchLimits;
use crate::stack::guard::GuardState;
use crate::stack::isolate::IsolationState;
use crate::stack::rate_limit::limiter::Limiter;
use crate::telemetry::Telemetry;
use crate::upstream::Upstream;
use crate::StackParts;

/// What every generation of one process shares.
#[derive(Debug, Clone)]
pub(crate) struct Process {
    pub audit: AuditLog,
    /// This replica's name in rollout decisions and audit lines.
    pub replica: String,
    /// Bounds concurrent exact counts on the blocking pool (per process).
    pub count_permits: Arc<Semaphore>,
    /// Recent outcomes for the status page.
    pub activity: Arc<Activity>,
}

/// The parts of a data thread's stack that no reload changes: limits, the audit log, the
/// engine client, body and buffer ceilings.
#[derive(Debug, Clone)]
pub(crate) struct FixedParts {
    pub limiter: Limiter,
    pub audit: AuditLog,
    pub activity: Arc<Activity>,
    pub upstream: Upstream,
    pub body: BodyLimits,
    pub limits: DispatchLimits,
    pub in_flight: InFlightLimit,
    pub max_header_value_bytes: usize,
    pub max_header_bytes: usize,
    pub telemetry: Telemetry,
}

impl FixedParts {
    /// The stack's parts for `generation`.
    pub fn of(&self, generation: &Generation) -> StackParts {
        StackParts {
            keys: generation.keys.clone(),
            catalog: generation.catalog.clone(),
            fleet: generation.fleet.clone(),
            rollouts: generation.rollouts.clone(),
            admission: generation.admission.clone(),
            guard: generation.guard.clone(),
            isolation: generation.isolation.clone(),
            limiter: self.limiter.clone(),
            audit: self.audit.clone(),
            activity: self.activity.clone(),
            upstream: self.upstream.clone(),
            body: self.body.clone(),
            limits: self.limits.clone(),
            in_flight: self.in_flight.clone(),
            max_header_value_bytes: self.max_header_value_bytes,
            max_header_bytes: self.max_header_bytes,
            telemetry: self.telemetry.clone(),
        }
    }
}

/// Build a generation of `config`; `previous` is the running one on a reload.
pub(crate) fn build(
    config: Config,
    previous: Option<&Generation>,
    process: &Process,
) -> Result<Generation, StartError> {
    let fleet = Arc::new(Fleet::reusing(
        &config,
        previous.map(|p| (&*p.config, &*p.fleet)),
    ));
    let mut models = HashMap::new();
    for model in &config.models {
        let tokenizer =
            load_tokenizer(&model.tokenizer, model.chat_template.as_deref()).map_err(|source| {
                StartError::Tokenizer {
                    model: model.name.clone(),
                    source,
                }
            })?;
        models.insert(
            model.name.clone(),
            ModelAdmission {
                tokenizer,
                context_window: model.context_window,
                default_max_new_tokens: model.default_max_new_tokens,
            },
        );
    }
    let tokenizers = models
        .iter()
        .map(|(name, m)| (name.clone(), m.tokenizer.clone()))
        .collect();
    let admission = Arc::new(AdmissionState {
        models,
        fleet: fleet.clone(),
        permits: process.count_permits.clone(),
    });
    let isolation = Arc::new(match previous {
        Some(p) => p.isolation.reconfigured(&config, tokenizers),
        None => IsolationState::new(&config, tokenizers),
    });
    let guard = Arc::new(GuardState::from_config(
        &config,
        process.audit.clone(),
        isolation.clone(),
        process.activity.clone(),
    ));
    let rollouts = Arc::new(Rollouts::reusing(
        &config,
        &fleet,
        &process.replica,
        &process.audit,
        previous.map(|p| &*p.rollouts),
    ));
    Ok(Generation {
        number: 0,
        keys: ApiKeys::from_config(&config),
        catalog: ModelCatalog::from_config(&config),
        config: Arc::new(config),
        fleet,
        rollouts,
        admission,
        guard,
        isolation,
    })
}

/// What a reload changed, for its log line and the admin port's answer.
#[derive(Debug, Default)]
pub struct Changes {
    /// Pools taken over with their state.
    pub kept: Vec<String>,
    /// Pools built afresh: new, or changed.
    pub rebuilt: Vec<String>,
    pub removed: Vec<String>,
    /// Sections that differ from the running ones but apply only at start.
    pub restart_required: Vec<&'static str>,
}

impl Changes {
    /// Compare the running generation with the next one.
    pub fn between(old: &Generation, new: &Generation) -> Self {
        let mut changes = Self::default();
        for pool in new.fleet.pools() {
            match old.fleet.pool(&pool.name) {
                Some(o) if Arc::ptr_eq(o, pool) => changes.kept.push(pool.name.to_string()),
                _ => changes.rebuilt.push(pool.name.to_string()),
            }
        }
        for pool in old.fleet.pools() {
            if new.fleet.pool(&pool.name).is_none() {
                changes.removed.push(pool.name.to_string());
            }
        }
        let (a, b) = (&old.config, &new.config);
        for (section, differs) in [
            ("server", a.server != b.server),
            ("upstream", a.upstream != b.upstream),
            ("limits", a.limits != b.limits),
            ("audit", a.audit != b.audit),
            ("isolation", a.isolation != b.isolation),
            ("admission", a.admission != b.admission),
            ("tracing", a.tracing != b.tracing),
        ] {
            if differs {
                changes.restart_required.push(section);
            }
        }
        changes
    }

    /// For the admin port's reload answer.
    pub fn to_json(&self) -> Value {
        json!({
            "pools_kept": self.kept,
            "pools_rebuilt": self.rebuilt,
            "pools_removed": self.removed,
            "restart_required": self.restart_required,
        })
    }
}
