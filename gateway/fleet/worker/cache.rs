//! What a worker's engine may still hold in its prefix cache, as far as routing is
//! concerned: its cache epoch. A worker that leaves service — drained through the admin
//! API, ejected for failing requests, down for failing its health checks — moves to a new
//! epoch, so the pool's prefix index stops sending conversations back to it for what it
//! held before: an ejected or restarted engine may have lost its cache, and a drained one
//! is on its way out. Once back, it is matched on what it is sent from then on.

use std::sync::atomic::Ordering;

use super::Worker;
use crate::fleet::Candidate;

impl Worker {
    /// Its cache epoch now (see the module docs).
    pub fn cache_epoch(&self) -> u64 {
        self.cache_epoch.load(Ordering::Acquire)
    }

    /// It left service: what the prefix index remembers of it no longer counts.
    pub fn left_service(&self) {
        self.cache_epoch.fetch_add(1, Ordering::AcqRel);
    }

    /// As the pool's prefix index names it: its slot and cache epoch now.
    pub fn prefix_candidate(&self) -> Candidate {
        Candidate {
            slot: self.slot,
            epoch: self.cache_epoch(),
        }
    }
}
