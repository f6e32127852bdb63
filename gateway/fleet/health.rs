//! A worker's health: what the active probes say and whether passive outlier detection has
//! ejected it.
//!
//! Two independent verdicts keep a worker from new requests:
//! - **down**: its health probe failed `unhealthy_threshold` times in a row. It comes back
//!   after `healthy_threshold` passed probes *and* a fresh capacity discovery (an engine
//!   restarted with a smaller KV pool must not be trusted with the old figure, I3).
//! - **ejected**: its requests failed `consecutive_failures` times in a row (connect
//!   failures, 5xx, timeouts, unreadable answers, guard trips), for a backoff that doubles
//!   with each ejection up to `max_ejection`. When the backoff ends the worker is on
//!   **trial** (half-open): it takes one request at a time; a success closes the ejection,
//!   a failure ejects it again for longer. Ejections of one pool's workers of one role never
//!   exceed `max_ejected_share` ([`EjectionGroup`]): a pool whose engines all fail is better
//!   served by its errors (which the guard keeps from ever being a 200) than by nothing.
//!
//! Which failures count alone: unreachable, timed out, unreadable answers, and guard trips
//! that show what the engine did. An error status (5xx), which a request's malformed
//! content can provoke in some engines (llama-cpp-python answers 500 to some requests
//! kvgate's parser passes), is blamed on the request's tenant
//! ([`WorkerHealth::failure_by`]): a run of failures made only of those ejects once at
//! least two tenants saw them, so one tenant cannot take a worker every tenant shares out
//! of rotation; one tenant's 5xx on a trial does not re-eject either.
//!
//! A probe that passes does not end an ejection: an engine that aborts every request can
//! still answer `/health`.
//!
//! The request path reads one atomic ([`WorkerHealth::serving`]) while nothing is wrong.

use std::sync::atomic::{AtomicU32, AtomicU8, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use crate::config::HealthConfig;

/// The health policy, from `[health]`; shared by every worker.
#[derive(Debug, Clone)]
pub struct HealthPolicy {
    pub interval: Duration,
    pub unhealthy_threshold: u32,
    pub healthy_threshold: u32,
    /// 0: passive ejection is off.
    pub consecutive_failures: u32,
    pub base_ejection: Duration,
    pub max_ejection: Duration,
    pub max_ejected_share: f64,
}

impl HealthPolicy {
    /// The policy of validated config.
    pub fn from_config(config: &HealthConfig) -> Self {
        Self {
            interval: config.interval,
            unhealthy_threshold: config.unhealthy_threshold,
            healthy_threshold: config.healthy_threshold,
            consecutive_failures: config.outlier.consecutive_failures,
            base_ejection: config.outlier.base_ejection,
            max_ejection: config.outlier.max_ejection,
            max_ejected_share: config.outlier.max_ejected_share,
        }
    }

    /// How long the `n`th ejection in a row lasts (1-based): doubling, capped.
    fn ejection(&self, n: u32) -> Duration {
        let factor = 1u32 << n.saturating_sub(1).min(20);
        self.base_ejection
            .saturating_mul(factor)
            .min(self.max_ejection)
    }
}

impl Default for HealthPolicy {
    fn default() -> Self {
        Self::from_config(&HealthConfig::default())
    }
}

/// The workers of one pool and role: how many may be ejected at once, and how many are.
#[derive(Debug)]
pub struct EjectionGroup {
    max: usize,
    ejected: AtomicUsize,
}

impl EjectionGroup {
    /// A group of `size` workers of which `share` (rounded down) may be ejected.
    pub fn new(size: usize, share: f64) -> Self {
        Self {
            max: (size as f64 * share).floor() as usize,
            ejected: AtomicUsize::new(0),
        }
    }

    /// Take one ejection slot, if the share allows.
    fn try_eject(&self) -> bool {
        self.ejected
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < self.max).then_some(n + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        let _ = self
            .ejected
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| n.checked_sub(1));
    }

    /// Workers ejected now (trials included).
    pub fn ejected(&self) -> usize {
        self.ejected.load(Ordering::Acquire)
    }
}

/// Whether a worker may take new requests, as far as its health goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Serving {
    Yes,
    /// Half-open after an ejection: one request at a time until one succeeds.
    Trial,
    Ejected {
        remaining: Duration,
        cause: &'static str,
    },
    Down {
        error: String,
    },
}

/// What a probe result changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ProbeVerdict {
    /// Nothing.
    Steady,
    /// The worker just went down.
    WentDown,
    /// Down, and passed enough probes: rediscover its capacity, then [`WorkerHealth::mark_up`].
    Recovering,
}

/// An ejection that just happened.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ejection {
    pub duration: Duration,
    /// The ejections in a row, this one included.
    pub count: u32,
    pub cause: &'static str,
    /// It followed a failed trial (half-open) rather than a run of failures.
    pub after_trial: bool,
}

const EJECTED: u8 = 1;
const DOWN: u8 = 2;

#[derive(Debug, Default, Clone)]
struct State {
    /// Set while ejected; once passed, the worker is on trial.
    ejected_until: Option<Instant>,
    cause: &'static str,
    /// Ejections in a row (forgotten after `max_ejection` without one).
    ejections: u32,
    last_closed: Option<Instant>,
    down: Option<String>,
    probes_passed: u32,
    probes_failed: u32,
    /// The last active probe's failure (kept after it passes again) and when.
    probe_error: Option<(String, Instant)>,
    /// When an active probe last passed.
    probe_ok_at: Option<Instant>,
    /// The current run of failures: whether any counts alone, and (up to two) tenants
    /// blamed for the others.
    run_counts_alone: bool,
    run_tenants: Vec<Arc<str>>,
}

impl State {
    fn end_run(&mut self) {
        self.run_counts_alone = false;
        self.run_tenants.clear();
    }

    /// Whether the run so far may eject: a failure in it counts alone, or two tenants saw
    /// failures.
    fn run_may_eject(&self) -> bool {
        self.run_counts_alone || self.run_tenants.len() >= 2
    }
}

/// One worker's health.
#[derive(Debug)]
pub struct WorkerHealth {
    policy: Arc<HealthPolicy>,
    group: Arc<EjectionGroup>,
    /// `EJECTED | DOWN`; 0 while nothing is wrong (the request path reads only this).
    flags: AtomicU8,
    /// Passive failures in a row.
    failures: AtomicU32,
    state: Mutex<State>,
}

/// What the admin port shows of a worker's health.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HealthSnapshot {
    /// `serving`, `trial`, `ejected` or `down`.
    pub state: &'static str,
    pub consecutive_failures: u32,
    pub ejections: u32,
    pub ejected_for: Option<Duration>,
    pub cause: Option<String>,
    /// The active probes (`consecutive_failures` above counts failed requests only).
    pub probe: ProbeSnapshot,
}

/// What the active health probes said of a worker lately.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProbeSnapshot {
    /// Probes failed in a row (0 once one passes).
    pub consecutive_failures: u32,
    /// Probes passed in a row.
    pub consecutive_passes: u32,
    /// The last failed probe's error and how long ago (kept after it passes again).
    pub last_error: Option<String>,
    pub last_failed_ago: Option<Duration>,
    /// How long ago a probe last passed (None: never, or probes are off).
    pub last_ok_ago: Option<Duration>,
}

impl WorkerHealth {
    /// Health under `policy`, ejections counted in `group`.
    pub fn new(policy: Arc<HealthPolicy>, group: Arc<EjectionGroup>) -> Self {
        Self {
            policy,
            group,
            flags: AtomicU8::new(0),
            failures: AtomicU32::new(0),
            state: Mutex::new(State::default()),
        }
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The active health check's interval (how old a load report may grow).
    pub fn interval(&self) -> Duration {
        self.policy.interval
    }

    /// Whether new requests may come (the request path: one atomic load when healthy).
    pub fn serving(&self) -> Serving {
        if self.flags.load(Ordering::Acquire) == 0 {
            return Serving::Yes;
        }
        self.serving_at(Instant::now())
    }

    /// [`Self::serving`] at `now`.
    pub fn serving_at(&self, now: Instant) -> Serving {
        let state = self.state();
        if let Some(error) = &state.down {
            return Serving::Down {
                error: error.clone(),
            };
        }
        match state.ejected_until {
            Some(until) if now < until => Serving::Ejected {
                remaining: until - now,
                cause: state.cause,
            },
            Some(_) => Serving::Trial,
            None => Serving::Yes,
        }
    }

    /// A request on this worker failed in a way no request content provokes (`cause`: a
    /// metric label): it counts alone. Returns the ejection when this failure ejected it.
    pub fn failure(&self, now: Instant, cause: &'static str) -> Option<Ejection> {
        self.failure_blamed(now, cause, None)
    }

    /// A request of `tenant` on this worker failed in a way its content may have provoked
    /// (an error status): it ejects only with another tenant's failures in
    /// the same run.
    pub fn failure_by(
        &self,
        now: Instant,
        cause: &'static str,
        tenant: &Arc<str>,
    ) -> Option<Ejection> {
        self.failure_blamed(now, cause, Some(tenant))
    }

    fn failure_blamed(
        &self,
        now: Instant,
        cause: &'static str,
        tenant: Option<&Arc<str>>,
    ) -> Option<Ejection> {
        if self.policy.consecutive_failures == 0 {
            return None;
        }
        let failures = self.failures.fetch_add(1, Ordering::AcqRel) + 1;
        let mut state = self.state();
        match tenant {
            None => state.run_counts_alone = true,
            Some(t) => {
                if state.run_tenants.len() < 2 && !state.run_tenants.contains(t) {
                    state.run_tenants.push(t.clone());
                }
            }
        }
        let after_trial = match state.ejected_until {
            // A request sent before the ejection: it is already out.
            Some(until) if now < until => return None,
            // One tenant's failure does not end a trial: the next request tries again.
            Some(_) if tenant.is_some() && !state.run_may_eject() => return None,
            // The trial failed: out again, for longer (its slot is still held).
            Some(_) => true,
            None if failures < self.policy.consecutive_failures => return None,
            None if !state.run_may_eject() => {
                tracing::debug!(
                    failures,
                    "failures in a row, all from one tenant's requests: not ejecting"
                );
                return None;
            }
            None => {
                if !self.group.try_eject() {
                    return None;
                }
                if state
                    .last_closed
                    .is_some_and(|c| now.duration_since(c) >= self.policy.max_ejection)
                {
                    state.ejections = 0;
                }
                false
            }
        };
        state.ejections += 1;
        let duration = self.policy.ejection(state.ejections);
        state.ejected_until = Some(now + duration);
        state.cause = cause;
        state.end_run();
        self.failures.store(0, Ordering::Release);
        self.flags.fetch_or(EJECTED, Ordering::AcqRel);
        Some(Ejection {
            duration,
            count: state.ejections,
            cause,
            after_trial,
        })
    }

    /// A request on this worker succeeded. Returns true when this closed an ejection
    /// (the request path: two atomic loads when healthy).
    pub fn success(&self) -> bool {
        if self.flags.load(Ordering::Acquire) & EJECTED == 0 {
            if self.failures.load(Ordering::Acquire) != 0 {
                let mut state = self.state();
                self.failures.store(0, Ordering::Release);
                state.end_run();
            }
            return false;
        }
        self.success_at(Instant::now())
    }

    /// [`Self::success`] at `now`.
    pub fn success_at(&self, now: Instant) -> bool {
        let mut state = self.state();
        if self.flags.load(Ordering::Acquire) & EJECTED == 0 {
            self.failures.store(0, Ordering::Release);
            state.end_run();
            return false;
        }
        match state.ejected_until {
            Some(until) if now >= until => {
                state.ejected_until = None;
                state.last_closed = Some(now);
                state.end_run();
                self.failures.store(0, Ordering::Release);
                self.flags.fetch_and(!EJECTED, Ordering::AcqRel);
                self.group.release();
                true
            }
            // Sent before the ejection; the trial decides.
            _ => false,
        }
    }

    /// An active probe's result (`Err`: why it failed).
    pub fn probe(&self, result: Result<(), String>) -> ProbeVerdict {
        self.probe_at(result, Instant::now())
    }

    /// [`Self::probe`] at `now`.
    pub fn probe_at(&self, result: Result<(), String>, now: Instant) -> ProbeVerdict {
        let mut state = self.state();
        match result {
            Ok(()) => {
                state.probe_ok_at = Some(now);
                state.probes_failed = 0;
                state.probes_passed = state.probes_passed.saturating_add(1);
                if state.down.is_some() && state.probes_passed >= self.policy.healthy_threshold {
                    return ProbeVerdict::Recovering;
                }
                ProbeVerdict::Steady
            }
            Err(error) => {
                state.probe_error = Some((error.clone(), now));
                state.probes_passed = 0;
                state.probes_failed = state.probes_failed.saturating_add(1);
                let failed = state.probes_failed;
                match &mut state.down {
                    Some(last) => {
                        *last = error;
                        ProbeVerdict::Steady
                    }
                    None if failed >= self.policy.unhealthy_threshold => {
                        state.down = Some(error);
                        self.flags.fetch_or(DOWN, Ordering::AcqRel);
                        ProbeVerdict::WentDown
                    }
                    None => ProbeVerdict::Steady,
                }
            }
        }
    }

    /// Back in service after recovering probes and a fresh capacity discovery. An
    /// ejection from while it was dying is not waited out: the worker goes on trial now
    /// (one request at a time until one succeeds).
    pub fn mark_up(&self) {
        self.mark_up_at(Instant::now());
    }

    /// [`Self::mark_up`] at `now`.
    pub fn mark_up_at(&self, now: Instant) {
        let mut state = self.state();
        state.down = None;
        if let Some(until) = &mut state.ejected_until {
            *until = (*until).min(now);
        }
        self.flags.fetch_and(!DOWN, Ordering::AcqRel);
    }

    /// How long until this worker may serve again, when it may not now (the 503's
    /// `Retry-After`): the rest of an ejection, or the probes a recovery needs.
    pub fn back_in(&self, now: Instant) -> Option<Duration> {
        match self.serving_at(now) {
            Serving::Yes | Serving::Trial => None,
            Serving::Ejected { remaining, .. } => Some(remaining),
            Serving::Down { .. } => Some(
                self.policy
                    .interval
                    .saturating_mul(self.policy.healthy_threshold),
            ),
        }
    }

    /// The state for the admin port.
    pub fn snapshot(&self, now: Instant) -> HealthSnapshot {
        let serving = self.serving_at(now);
        let state = self.state();
        let (name, ejected_for, cause) = match serving {
            Serving::Yes => ("serving", None, None),
            Serving::Trial => ("trial", None, Some(state.cause.to_owned())),
            Serving::Ejected { remaining, cause } => {
                ("ejected", Some(remaining), Some(cause.to_owned()))
            }
            Serving::Down { error } => ("down", None, Some(error)),
        };
        HealthSnapshot {
            state: name,
            consecutive_failures: self.failures.load(Ordering::Acquire),
            ejections: state.ejections,
            ejected_for,
            cause,
            probe: ProbeSnapshot {
                consecutive_failures: state.probes_failed,
                consecutive_passes: state.probes_passed,
                last_error: state.probe_error.as_ref().map(|(e, _)| e.clone()),
                last_failed_ago: state
                    .probe_error
                    .as_ref()
                    .map(|(_, at)| now.saturating_duration_since(*at)),
                last_ok_ago: state
                    .probe_ok_at
                    .map(|at| now.saturating_duration_since(at)),
            },
        }
    }
}

mod carry;

#[cfg(test)]
mod tests;
