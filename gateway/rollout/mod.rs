//! Canary rollouts of engine upgrades: a canary pool beside the stable pool of a model,
//! rolled back at once when it does measurably worse, promoted in steps when it does not.
//!
//! Every pool's sliding window of guard trips (by reason), engine failures, leak suspicions
//! and time to first byte is the fleet's (`fleet::SignalWindow`), fed once per request by the
//! observe stage; the rollouts read it, and look again after each request through
//! the fleet's [`OutcomeWatch`], which [`Rollouts`] implements.
//!
//! - `decide`: the rule: the canary's rate above the stable pool's by more than a margin,
//!   on at least `min_requests` canary requests.
//! - `controller`: one model's [`Rollout`]: phase, weights, audit lines, metrics.
//! - `shared`: replicas publish and read decisions in Redis (when `[limits]` uses it), so
//!   one replica's rollback holds for all.
//!
//! Each replica decides from its own traffic. Decisions survive `POST /reload` (for a
//! rollout whose settings and pools are unchanged: the reload keeps it whole) and, when
//! shared through Redis, a restart; the config file stays the source of truth for the
//! starting weights.

mod controller;
mod decide;
mod shared;

pub use controller::{Decision, Phase, Rollout};
pub use decide::{judge, Breach};
pub use shared::{sync_loop, SharedDecisions};

use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use crate::audit::AuditLog;
use crate::config::Config;
use crate::fleet::{Fleet, OutcomeWatch, Pool, Rates};

/// Every rollout of the config, by model and by canary pool.
#[derive(Debug, Default)]
pub struct Rollouts {
    list: Vec<Arc<Rollout>>,
    by_canary: HashMap<String, Arc<Rollout>>,
}

impl Rollouts {
    /// The rollouts of `config` over `fleet`'s live pools; `replica` names this gateway in
    /// shared decisions and audit lines.
    pub fn from_config(config: &Config, fleet: &Fleet, replica: &str, audit: &AuditLog) -> Self {
        Self::reusing(config, fleet, replica, audit, None)
    }

    /// The rollouts of a reloaded `config`: a rollout of `previous` whose settings are
    /// unchanged and whose two pools the fleet took over goes on where it was (phase,
    /// decision, promotion step); any other starts afresh from the configured weights.
    pub fn reusing(
        config: &Config,
        fleet: &Fleet,
        replica: &str,
        audit: &AuditLog,
        previous: Option<&Rollouts>,
    ) -> Self {
        let replica: Arc<str> = Arc::from(replica);
        let find = |name: &str| fleet.pools().iter().find(|p| &*p.name == name).cloned();
        let mut rollouts = Self::default();
        for r in &config.rollouts {
            // Validation guarantees both pools exist.
            let (Some(stable), Some(canary)) = (find(&r.stable), find(&r.canary)) else {
                continue;
            };
            let old = previous
                .and_then(|p| p.of_canary(&r.canary))
                .filter(|old| old.config == *r);
            let kept = old.and_then(|old| {
                if Arc::ptr_eq(&old.stable, &stable) && Arc::ptr_eq(&old.canary, &canary) {
                    Some(old.clone())
                } else if old.stable.lineage == stable.lineage
                    && old.canary.lineage == canary.lineage
                {
                    // Its pools were rebuilt with other workers only: it carries on.
                    Some(Arc::new(old.rebound(stable.clone(), canary.clone())))
                } else {
                    None
                }
            });
            let rollout = kept.unwrap_or_else(|| {
                Arc::new(Rollout::new(
                    r.clone(),
                    stable,
                    canary,
                    replica.clone(),
                    audit.clone(),
                ))
            });
            rollouts.by_canary.insert(r.canary.clone(), rollout.clone());
            rollouts.list.push(rollout);
        }
        rollouts
    }

    /// Every rollout.
    pub fn all(&self) -> &[Arc<Rollout>] {
        &self.list
    }

    /// The rollout of `model`.
    pub fn of_model(&self, model: &str) -> Option<&Arc<Rollout>> {
        self.list.iter().find(|r| r.config.model == model)
    }

    /// The rollout whose canary is `pool`.
    pub fn of_canary(&self, pool: &str) -> Option<&Arc<Rollout>> {
        self.by_canary.get(pool)
    }

    /// Evaluate every rollout (the once-a-second tick: promotions need time to pass even
    /// when no request arrives).
    pub fn evaluate(&self, now: Instant) {
        for r in &self.list {
            r.evaluate(now);
        }
    }
}

/// A canary's rollout looks again after each of its canary pool's requests.
impl OutcomeWatch for Rollouts {
    fn counted(&self, pool: &Pool, now: Instant) {
        if let Some(rollout) = self.of_canary(&pool.name) {
            rollout.evaluate(now);
        }
    }
}

/// A window's rates as the admin port shows them.
pub fn rates_json(r: &Rates) -> Value {
    let trips: serde_json::Map<String, Value> = r
        .trips
        .iter()
        .map(|(reason, n)| {
            (
                (*reason).to_owned(),
                json!({"count": n, "rate": r.share(*n)}),
            )
        })
        .collect();
    json!({
        "requests": r.requests,
        "guard_trip_rate": r.share(r.trip_total()),
        "guard_trips": trips,
        "engine_error_rate": r.share(r.engine_errors),
        "engine_errors": r.engine_errors,
        "leak_suspicion_rate": r.share(r.leaks),
        "leak_suspicions": r.leaks,
        "ttft_samples": r.ttft_samples,
        "ttft_p99_seconds": r.ttft_p99.map(decide::seconds),
    })
}
