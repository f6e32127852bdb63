//! A worker's running slots: how many requests its engine runs at once (SGLang's
//! `--max-running-requests`, vLLM's `--max-num-seqs`, llama.cpp's `--parallel`). An engine
//! with fewer slots than requests sent queues the rest in its own FIFO, where kvgate's fair
//! queue can no longer order them; so where slots bind, kvgate sends at most that many.
//!
//! Slots are scheduled as KV: a request is charged at least one slot's share of the
//! worker's KV it lands on ([`Worker::charge`]; [`Worker::slot_tokens`]: capacity ×
//! overcommit ÷ slots), so the KV account, the gateway queue and the fair shares
//! (`fleet::share`) bound whichever resource binds first, with the same guarantees
//! (dominant-resource accounting). A request longer than a slot's share is charged its
//! KV, as before. Each worker charges its own share: in a pool of unequal workers, each
//! holds as many requests as its own slots and KV allow. The engine's report of requests
//! kvgate did not send (`foreign_requests`: another front door) takes their slots' share
//! from the room.
//!
//! The limit is the smallest of the configured `max_running` (the worker's, else its
//! pool's), what `/get_server_info` reported (`internal_states[*]`'s
//! `effective_max_running_requests_per_dp`, `fleet/discovery.rs`), and what the load report
//! (`/v1/loads`' `max_running_requests`) last said.

use std::sync::atomic::Ordering;

use super::Worker;
use crate::fleet::load::allowed;

impl Worker {
    /// The most requests this worker's engine runs at once, when known.
    pub fn max_running(&self) -> Option<u64> {
        let discovered = self.discovered_number(|i| i.max_running_requests);
        let reported = Some(self.reported_max_running.load(Ordering::Relaxed)).filter(|&n| n > 0);
        [self.configured_max_running, discovered, reported]
            .into_iter()
            .flatten()
            .filter(|&n| n > 0)
            .min()
    }

    /// The pool's `max_running`, for a worker whose entry does not say its own.
    pub fn with_pool_max_running(mut self, slots: Option<u32>) -> Self {
        if self.configured_max_running.is_none() {
            self.configured_max_running = slots.map(u64::from);
        }
        self
    }

    /// Record what the engine's load report said of its slots (None: it did not say).
    pub fn set_reported_max_running(&self, slots: Option<u64>) {
        self.reported_max_running
            .store(slots.unwrap_or(0), Ordering::Relaxed);
    }

    /// One running slot's share of this worker's KV (capacity × `overcommit` ÷ slots,
    /// rounded down, so that all the slots fit and one more does not): the least a request
    /// is charged here. None where slots are unknown or the capacity is.
    pub fn slot_tokens(&self, overcommit: f64) -> Option<u64> {
        let slots = self.max_running()?;
        Some((allowed(self.kv_tokens()?, overcommit) / slots).max(1))
    }

    /// What a request of `kv` tokens is charged here: at least one slot's share.
    pub fn charge(&self, kv: u64, overcommit: f64) -> u64 {
        self.slot_tokens(overcommit).map_or(kv, |slot| kv.max(slot))
    }

    /// Whether a request of `kv` tokens fits in this worker's room now, as charged here.
    pub fn fits(&self, kv: u64, overcommit: f64) -> bool {
        let charge = self.charge(kv, overcommit);
        self.room(overcommit).is_some_and(|r| r >= charge)
    }

    /// The load only the engine sees, in KV tokens: the larger of its KV beyond kvgate's
    /// account and its requests beyond kvgate's, each at a slot's share.
    pub fn foreign_load(&self, overcommit: f64) -> Option<u64> {
        let report = self.engine_load()?;
        // Most reports name no foreign request: the slot share is not looked up then.
        let by_slots = (report.foreign_requests > 0)
            .then(|| self.slot_tokens(overcommit))
            .flatten()
            .map(|slot| slot.saturating_mul(report.foreign_requests));
        match (report.foreign_kv_tokens, by_slots) {
            (Some(a), Some(b)) => Some(a.max(b)),
            (a, b) => a.or(b),
        }
    }
}
