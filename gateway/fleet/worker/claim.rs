//! A worker's live load: taking it for one request (the outstanding count and the KV the
//! request holds, both given back by the [`WorkerLoad`] guard), the engine's own report,
//! and the room the two leave (see [`crate::fleet::load`] for which number wins).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use super::Worker;
use crate::fleet::load::{allowed, room_of, EngineLoad, STALE_AFTER_INTERVALS};
use crate::fleet::Serving;

impl Worker {
    /// KV tokens in flight here on kvgate's own account (prompt + allowed new tokens of
    /// every request claimed here, until its body ends).
    pub fn kv_in_flight(&self) -> u64 {
        self.kv.in_flight()
    }

    /// The engine's last load report, unless it is older than
    /// [`STALE_AFTER_INTERVALS`] health intervals (None: no report, or a stale one).
    pub fn engine_load(&self) -> Option<EngineLoad> {
        let max_age = self.health.interval().saturating_mul(STALE_AFTER_INTERVALS);
        self.kv.engine_load(max_age)
    }

    /// Record the engine's load report (None: it gave none this round), asked for while
    /// kvgate had `before` requests here: the larger of that and the count now is kvgate's
    /// share of the engine's requests (requests that ended meanwhile are not another front
    /// door's).
    pub fn set_engine_load(&self, report: Option<EngineLoad>, before: usize) {
        let outstanding = self.outstanding().max(before) as u64;
        self.kv.set_engine_load(report, outstanding, &self.labels());
    }

    /// The KV tokens still free here: the enforced capacity ([`Worker::kv_tokens`]) ×
    /// `overcommit`, minus the larger of kvgate's account and the engine's used tokens,
    /// never below 0. None when the capacity is unknown (such a worker never serves).
    pub fn room(&self, overcommit: f64) -> Option<u64> {
        let foreign = self.foreign_load(overcommit);
        room_of(self.kv_tokens(), overcommit, self.kv_in_flight(), foreign)
    }

    /// Wake whoever waits for room in this worker's pool (and, after a reload that rebuilt
    /// it, the pool it succeeds): a load guard dropped.
    pub fn notify_room_freed(&self) {
        self.kv.notify_room_freed();
    }

    /// Take this worker for one request holding `kv` tokens of its KV, if it is still free
    /// to take: a worker on trial after an ejection takes one request at a time across
    /// every data thread (the load is claimed with a compare-and-swap from 0), any other
    /// always.
    pub fn claim(self: &Arc<Self>, kv: u64) -> Option<WorkerLoad> {
        if self.health.serving() == Serving::Trial {
            self.outstanding
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .ok()?;
            self.outstanding_gauge().set(1.0);
            return Some(WorkerLoad::holding(self, kv));
        }
        Some(self.start_request_holding(kv))
    }

    /// [`Worker::claim`], only if `kv` tokens fit in this worker's room now (capacity ×
    /// `overcommit` against kvgate's account plus what only the engine sees), taken
    /// atomically: the gateway queue's claims never promise an engine more KV than it holds.
    pub fn claim_within(self: &Arc<Self>, kv: u64, overcommit: f64) -> Option<WorkerLoad> {
        // Where slots bind, at least one slot's share (`worker/slots.rs`).
        let kv = self.charge(kv, overcommit);
        let allowed = allowed(self.kv_tokens()?, overcommit);
        let foreign = self.foreign_load(overcommit);
        if !self
            .kv
            .try_add_within(kv, allowed, foreign, || self.labels())
        {
            return None;
        }
        let outstanding = if self.health.serving() == Serving::Trial {
            // On trial: one request at a time (see `claim`); give the KV back if taken.
            if self
                .outstanding
                .compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed)
                .is_err()
            {
                self.kv.release(kv, || self.labels());
                return None;
            }
            1
        } else {
            self.outstanding.fetch_add(1, Ordering::Relaxed) + 1
        };
        self.outstanding_gauge().set(outstanding as f64);
        Some(WorkerLoad::held(self, kv))
    }

    /// Count one request (holding no KV) against this worker until the guard drops.
    pub fn start_request(self: &Arc<Self>) -> WorkerLoad {
        self.start_request_holding(0)
    }

    /// Count one request holding `kv` tokens against this worker until the guard drops.
    pub fn start_request_holding(self: &Arc<Self>, kv: u64) -> WorkerLoad {
        let n = self.outstanding.fetch_add(1, Ordering::Relaxed) + 1;
        self.outstanding_gauge().set(n as f64);
        WorkerLoad::holding(self, kv)
    }
}

/// Holds one outstanding request, and the KV tokens it costs, against a worker; both are
/// given back when it drops (the KV earlier with [`WorkerLoad::release_kv`]).
#[derive(Debug)]
pub struct WorkerLoad {
    worker: Arc<Worker>,
    kv: AtomicU64,
}

impl WorkerLoad {
    fn holding(worker: &Arc<Worker>, kv: u64) -> Self {
        worker.kv.add(kv, || worker.labels());
        Self::held(worker, kv)
    }

    /// A guard for `kv` tokens already added to the worker's account.
    fn held(worker: &Arc<Worker>, kv: u64) -> Self {
        Self {
            worker: worker.clone(),
            kv: AtomicU64::new(kv),
        }
    }

    /// The worker this load is on.
    pub fn worker(&self) -> &Arc<Worker> {
        &self.worker
    }

    /// The KV tokens this load still holds.
    pub fn kv(&self) -> u64 {
        self.kv.load(Ordering::Relaxed)
    }

    /// Give the KV back now while the request stays outstanding (a PD prefill worker whose
    /// leg ended: the decode worker holds the prompt's KV from then on).
    pub fn release_kv(&self) {
        let kv = self.kv.swap(0, Ordering::Relaxed);
        self.worker.kv.release(kv, || self.worker.labels());
    }
}

impl Drop for WorkerLoad {
    fn drop(&mut self) {
        let n = self
            .worker
            .outstanding
            .fetch_sub(1, Ordering::Relaxed)
            .saturating_sub(1);
        self.worker.outstanding_gauge().set(n as f64);
        self.release_kv();
        // Another request may fit now even when this one held no KV (an outstanding slot).
        self.worker.notify_room_freed();
    }
}
