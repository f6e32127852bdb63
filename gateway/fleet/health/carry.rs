//! A worker that survives a rebuild of its pool (a DNS change, a reload) keeps its health:
//! an ejected engine is not let back in, nor a down one counted up, by an autoscale event.

use std::sync::atomic::Ordering;

use super::{WorkerHealth, EJECTED};

impl WorkerHealth {
    /// Take over `previous`'s verdicts (the same engine in the pool before its rebuild):
    /// its ejection and its end, a down verdict, failures in a row, probe results. An
    /// ejection counts in this worker's group (the rebuilt pool's), whose share it may
    /// then fill: the engine is out either way.
    pub fn carry_from(&self, previous: &WorkerHealth) {
        let state = previous.state().clone();
        let flags = previous.flags.load(Ordering::Acquire);
        *self.state() = state;
        self.failures
            .store(previous.failures.load(Ordering::Acquire), Ordering::Release);
        if flags & EJECTED != 0 {
            self.group.ejected.fetch_add(1, Ordering::AcqRel);
        }
        self.flags.store(flags, Ordering::Release);
    }
}
