//! One model's rollout: the canary's phase, the pool weights it implies, and every change
//! to them (automatic rollback, promotion steps, the admin's commands, another replica's
//! decision read from Redis).
//!
//! The phase is the one source of the two pools' weights: each change sets both, bumps the
//! epoch (how replicas order decisions) and writes one audit line.

use serde::{Deserialize, Serialize};
use serde_json::{json, Map, Value};
use std::sync::{Arc, Mutex};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::decide::{self, Breach};
use crate::audit::AuditLog;
use crate::config::RolloutConfig;
use crate::fleet::Pool;
use crate::metrics;

/// Where a rollout stands.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "phase", rename_all = "snake_case")]
pub enum Phase {
    /// The canary takes its share (configured weights, or a promotion step).
    Canary,
    /// The canary did worse than the stable pool (or an admin said so): weight 0.
    RolledBack {
        breach: Breach,
        /// `automatic` (this replica's traffic), `admin`, or `replica <id>` (read from Redis).
        origin: String,
    },
    /// The canary takes all traffic.
    Promoted,
}

/// A rollout's state as replicas share it (JSON in Redis).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Decision {
    /// Orders decisions: a replica applies a shared decision only when it is newer.
    pub epoch: u64,
    #[serde(flatten)]
    pub phase: Phase,
    /// The promotion step (index into `promotion.steps`), if one was taken.
    pub step: Option<usize>,
    /// Which replica decided.
    pub replica: String,
    /// When, in Unix milliseconds.
    pub at_ms: u64,
    /// The epoch of the decision that started the canary's current window (the last
    /// `clear`; 0: none since the start). A replica applying a decision whose
    /// `window_epoch` is newer than its own forgets its canary window too, exactly as the
    /// replica that took the decision did, even when it never saw that decision itself (a
    /// later one superseded it in Redis). Absent in decisions of older replicas: 0.
    #[serde(default)]
    pub window_epoch: u64,
}

#[derive(Debug)]
struct State {
    decision: Decision,
    /// When the current step (or the start) began: promotion waits a clean window.
    since: Instant,
    /// Not yet published to the other replicas.
    unpublished: bool,
}

/// One `[[rollouts]]` entry, live.
#[derive(Debug)]
pub struct Rollout {
    pub config: RolloutConfig,
    pub stable: Arc<Pool>,
    pub canary: Arc<Pool>,
    replica: Arc<str>,
    audit: AuditLog,
    state: Mutex<State>,
    /// Replaced by a reload: requests still in flight from before it must not move the
    /// weights of pools the new config shares.
    retired: std::sync::atomic::AtomicBool,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

impl Rollout {
    /// A rollout in its starting phase (configured weights).
    pub fn new(
        config: RolloutConfig,
        stable: Arc<Pool>,
        canary: Arc<Pool>,
        replica: Arc<str>,
        audit: AuditLog,
    ) -> Self {
        let decision = Decision {
            epoch: 0,
            phase: Phase::Canary,
            step: None,
            replica: replica.to_string(),
            at_ms: now_ms(),
            window_epoch: 0,
        };
        let rollout = Self {
            config,
            stable,
            canary,
            replica,
            audit,
            state: Mutex::new(State {
                decision,
                since: Instant::now(),
                unpublished: false,
            }),
            retired: std::sync::atomic::AtomicBool::new(false),
        };
        rollout.publish_gauges(&Phase::Canary);
        rollout
    }

    /// This rollout over `stable` and `canary`, pools rebuilt with other workers only (the
    /// same [lineage](Pool::lineage)): its phase, step and clock carry on (an autoscaled
    /// fleet does not restart a canary). Retire `self` once the copy is installed.
    pub fn rebound(&self, stable: Arc<Pool>, canary: Arc<Pool>) -> Self {
        let state = self.lock();
        Self {
            config: self.config.clone(),
            stable,
            canary,
            replica: self.replica.clone(),
            audit: self.audit.clone(),
            state: Mutex::new(State {
                decision: state.decision.clone(),
                since: state.since,
                unpublished: state.unpublished,
            }),
            retired: std::sync::atomic::AtomicBool::new(false),
        }
    }

    /// Whether this rollout carries `old` on: the same entry over the same pools, or over
    /// pools rebuilt with other workers only ([`Rollout::rebound`]).
    pub fn continues(&self, old: &Rollout) -> bool {
        self.config == old.config
            && self.stable.lineage == old.stable.lineage
            && self.canary.lineage == old.canary.lineage
    }

    /// A reload replaced this rollout: it decides nothing more.
    pub fn retire(&self) {
        self.retired
            .store(true, std::sync::atomic::Ordering::Release);
    }

    /// A new rollout over pools a reload kept: both start again from their configured
    /// weights (a rolled-back canary would otherwise stay at 0 and never be sampled).
    pub fn start_from_configured_weights(&self) {
        self.canary.set_weight(self.canary.configured_weight);
        self.stable.set_weight(self.stable.configured_weight);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The current decision.
    pub fn decision(&self) -> Decision {
        self.lock().decision.clone()
    }

    /// Look at both windows now: roll back on a breach, promote after a clean window.
    /// Called after every canary request and once a second.
    pub fn evaluate(&self, now: Instant) {
        if self.retired.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        // The rates are read under the state lock: a `clear` (ours or adopted) between
        // reading them and judging must not be judged on the window it just forgot.
        let mut state = self.lock();
        if state.decision.phase != Phase::Canary {
            return;
        }
        let canary = self.canary.signals.rates(now);
        let stable = self.stable.signals.rates(now);
        if let Some(breach) = decide::judge(&canary, &stable, &self.config) {
            self.change(
                &mut state,
                Phase::RolledBack {
                    breach,
                    origin: "automatic".into(),
                },
                None,
            );
            return;
        }
        let Some(promotion) = &self.config.promotion else {
            return;
        };
        let waited = now.saturating_duration_since(state.since) >= promotion.clean_window;
        if waited && decide::clean(&canary, &stable, &self.config) {
            let next = state
                .decision
                .step
                .map_or_else(|| self.first_step_above_configured(), |s| Some(s + 1));
            if let Some(step) = next.filter(|&s| s < promotion.steps.len()) {
                let phase = if promotion.steps[step] >= 100 {
                    Phase::Promoted
                } else {
                    Phase::Canary
                };
                self.change(&mut state, phase, Some(step));
            }
        }
    }

    /// The first promotion step above the configured canary share.
    fn first_step_above_configured(&self) -> Option<usize> {
        let steps = &self.config.promotion.as_ref()?.steps;
        let total = self.stable.configured_weight + self.canary.configured_weight;
        let share = (self.canary.configured_weight * 100)
            .checked_div(total)
            .unwrap_or(0);
        steps.iter().position(|&s| s > share)
    }

    /// Roll the canary back now (the admin API).
    pub fn roll_back(&self, reason: &str) {
        let now = Instant::now();
        let (canary, stable) = (
            self.canary.signals.rates(now),
            self.stable.signals.rates(now),
        );
        let mut state = self.lock();
        let breach = Breach {
            signal: format!("admin: {reason}"),
            canary: canary.share(canary.trip_total()),
            stable: stable.share(stable.trip_total()),
            canary_requests: canary.requests,
            stable_requests: stable.requests,
        };
        self.change(
            &mut state,
            Phase::RolledBack {
                breach,
                origin: "admin".into(),
            },
            None,
        );
    }

    /// Back to the configured weights with a fresh canary window (the canary was fixed).
    pub fn clear(&self) {
        let mut state = self.lock();
        let epoch = state.decision.epoch + 1;
        // `set` forgets the canary window for a newer `window_epoch`: the same step a
        // replica adopting this decision through Redis takes.
        self.set(&mut state, Phase::Canary, None, epoch, epoch, None);
    }

    /// One promotion step (to 100 % without configured steps).
    pub fn promote(&self) {
        let mut state = self.lock();
        let steps = self.config.promotion.as_ref().map(|p| p.steps.clone());
        let next = match (&steps, state.decision.step) {
            (Some(_), Some(s)) => Some(s + 1),
            (Some(_), None) => self.first_step_above_configured(),
            (None, _) => None,
        };
        match (steps, next) {
            (Some(steps), Some(step)) if step < steps.len() => {
                let phase = if steps[step] >= 100 {
                    Phase::Promoted
                } else {
                    Phase::Canary
                };
                self.change(&mut state, phase, Some(step));
            }
            _ => {
                let step = state.decision.step;
                self.change(&mut state, Phase::Promoted, step);
            }
        }
    }

    /// Apply another replica's decision if it is newer than ours.
    pub fn apply_shared(&self, shared: Decision) -> bool {
        self.apply(shared, false)
    }

    /// Our publish lost to `stored` (same epoch or newer): take it, unless it is ours.
    pub fn adopt(&self, stored: Decision) -> bool {
        self.apply(stored, true)
    }

    fn apply(&self, shared: Decision, ties_too: bool) -> bool {
        let mut state = self.lock();
        let newer = shared.epoch > state.decision.epoch
            || (ties_too && shared.epoch == state.decision.epoch && shared != state.decision);
        if !newer {
            return false;
        }
        let phase = match shared.phase.clone() {
            Phase::RolledBack { breach, origin } if shared.replica != *self.replica => {
                let origin = if origin == "admin" {
                    format!("admin via replica {}", shared.replica)
                } else {
                    format!("replica {}", shared.replica)
                };
                Phase::RolledBack { breach, origin }
            }
            other => other,
        };
        self.set(
            &mut state,
            phase,
            shared.step,
            shared.epoch,
            shared.window_epoch,
            Some(shared.replica),
        );
        true
    }

    /// The decision to publish, if this replica changed it since the last publish.
    pub fn unpublished(&self) -> Option<Decision> {
        let state = self.lock();
        state.unpublished.then(|| state.decision.clone())
    }

    /// `decision` reached Redis (or a newer one was found there).
    pub fn published(&self, epoch: u64) {
        let mut state = self.lock();
        if state.decision.epoch == epoch {
            state.unpublished = false;
        }
    }

    fn change(&self, state: &mut State, phase: Phase, step: Option<usize>) {
        let epoch = state.decision.epoch + 1;
        let window_epoch = state.decision.window_epoch;
        self.set(state, phase, step, epoch, window_epoch, None);
    }

    /// Make `phase` current; `by` is the replica that decided (None: this one). A
    /// `window_epoch` newer than the current one (a `clear`, here or on another replica)
    /// starts a fresh canary window: the receiving and the adopting replica alike.
    fn set(
        &self,
        state: &mut State,
        phase: Phase,
        step: Option<usize>,
        epoch: u64,
        window_epoch: u64,
        by: Option<String>,
    ) {
        // Every decision passes here: a rollout a reload replaced changes nothing more.
        if self.retired.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        let ours = by.is_none();
        if window_epoch > state.decision.window_epoch {
            self.canary.signals.reset();
        }
        let (canary_weight, stable_weight) = self.weights(&phase, step);
        self.canary.set_weight(canary_weight);
        self.stable.set_weight(stable_weight);
        state.decision = Decision {
            epoch,
            phase: phase.clone(),
            step,
            replica: by.unwrap_or_else(|| self.replica.to_string()),
            at_ms: now_ms(),
            window_epoch: window_epoch.max(state.decision.window_epoch),
        };
        state.since = Instant::now();
        state.unpublished = ours;
        self.publish_gauges(&phase);
        self.audit_change(&phase, step, epoch, canary_weight, stable_weight);
    }

    /// (canary, stable) weights of a phase.
    fn weights(&self, phase: &Phase, step: Option<usize>) -> (u32, u32) {
        let share = step.and_then(|s| self.config.promotion.as_ref()?.steps.get(s).copied());
        match (phase, share) {
            (Phase::RolledBack { .. }, _) => (0, self.stable.configured_weight.max(1)),
            (Phase::Promoted, _) => (100, 0),
            (Phase::Canary, Some(p)) => (p, 100 - p.min(100)),
            (Phase::Canary, None) => (self.canary.configured_weight, self.stable.configured_weight),
        }
    }

    fn publish_gauges(&self, phase: &Phase) {
        let value = match phase {
            Phase::Canary => 0.0,
            Phase::RolledBack { .. } => 1.0,
            Phase::Promoted => 2.0,
        };
        ::metrics::gauge!(metrics::ROLLOUT_PHASE, "model" => self.config.model.clone()).set(value);
    }

    fn audit_change(
        &self,
        phase: &Phase,
        step: Option<usize>,
        epoch: u64,
        canary: u32,
        stable: u32,
    ) {
        let mut fields = Map::new();
        fields.insert("model".into(), Value::from(self.config.model.clone()));
        fields.insert("canary_pool".into(), Value::from(&*self.canary.name));
        fields.insert("stable_pool".into(), Value::from(&*self.stable.name));
        fields.insert("canary_weight".into(), Value::from(canary));
        fields.insert("stable_weight".into(), Value::from(stable));
        fields.insert("epoch".into(), Value::from(epoch));
        let event = match phase {
            Phase::RolledBack { breach, origin } => {
                ::metrics::counter!(metrics::ROLLBACKS_TOTAL,
                    "model" => self.config.model.clone(),
                    "pool" => self.canary.name.to_string(),
                    "signal" => signal_label(&breach.signal),
                    "origin" => origin_label(origin))
                .increment(1);
                tracing::warn!(
                    model = %self.config.model, canary = %self.canary.name, signal = %breach.signal,
                    canary_rate = breach.canary, stable_rate = breach.stable, %origin,
                    "canary rolled back"
                );
                fields.insert("signal".into(), Value::from(breach.signal.clone()));
                fields.insert("canary_rate".into(), Value::from(breach.canary));
                fields.insert("stable_rate".into(), Value::from(breach.stable));
                fields.insert(
                    "canary_requests".into(),
                    Value::from(breach.canary_requests),
                );
                fields.insert(
                    "stable_requests".into(),
                    Value::from(breach.stable_requests),
                );
                fields.insert("origin".into(), Value::from(origin.clone()));
                "rollout_rolled_back"
            }
            Phase::Promoted => "rollout_promoted",
            Phase::Canary if step.is_some() => "rollout_step",
            Phase::Canary => "rollout_reset",
        };
        if let Some(s) = step {
            fields.insert("step".into(), Value::from(s));
        }
        self.audit.record(event, fields);
    }

    /// What the admin port shows.
    pub fn report(&self, now: Instant) -> Value {
        let decision = self.decision();
        let rates = |pool: &Pool| super::rates_json(&pool.signals.rates(now));
        json!({
            "model": self.config.model,
            "stable": {"pool": &*self.stable.name, "weight": self.stable.weight(), "rates": rates(&self.stable)},
            "canary": {"pool": &*self.canary.name, "weight": self.canary.weight(), "rates": rates(&self.canary)},
            "decision": decision,
            "window_seconds": self.config.window.as_secs_f64(),
            "min_requests": self.config.min_requests,
            "promotion_steps": self.config.promotion.as_ref().map(|p| p.steps.clone()),
        })
    }
}

/// `guard_trips/prompt_tokens_mismatch` stays; an admin's free text becomes `admin`.
fn signal_label(signal: &str) -> String {
    if signal.starts_with("admin") {
        "admin".into()
    } else {
        signal.to_owned()
    }
}

fn origin_label(origin: &str) -> &'static str {
    match origin {
        "automatic" => "automatic",
        "admin" => "admin",
        _ => "shared",
    }
}
