//! Spreading a port's connections evenly over its data threads.
//!
//! Every data thread accepts on the same listening socket, and the kernel hands each new
//! connection to whichever thread's `accept` runs first. Under a burst (a load balancer or
//! a benchmark opening its pool) the thread that is already awake takes nearly all of them,
//! and since a connection stays on the thread that accepted it, one core then serves the
//! port while the others idle: measured on the 2-core harness, 18k instead of 25k req/s in
//! some runs, with ~0 context switches (one thread never ran out of work).
//!
//! So a thread that holds more open connections than the least loaded one steps back
//! briefly before accepting, leaving the connection to a less loaded thread. The step back
//! is bounded ([`MAX_DEFERRALS`] × [`DEFER_FOR`]): a thread that is stuck or busy never
//! keeps a connection waiting for long, the others take it after that.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long a more loaded thread waits for another to accept, per try.
pub const DEFER_FOR: Duration = Duration::from_millis(1);
/// Tries before it accepts anyway.
pub const MAX_DEFERRALS: u32 = 3;

/// Open connections per data thread of one port.
#[derive(Debug)]
pub struct AcceptBalance {
    open: Vec<AtomicUsize>,
}

impl AcceptBalance {
    /// The balance of `threads` threads, none with a connection yet.
    pub fn new(threads: usize) -> Arc<Self> {
        Arc::new(Self {
            open: (0..threads.max(1)).map(|_| AtomicUsize::new(0)).collect(),
        })
    }

    /// Thread `index`'s place in the balance.
    pub fn slot(self: &Arc<Self>, index: usize) -> BalanceSlot {
        BalanceSlot {
            balance: Arc::clone(self),
            index: index.min(self.open.len() - 1),
        }
    }
}

/// One thread's view: whether to step back, and its open connections.
#[derive(Debug, Clone)]
pub struct BalanceSlot {
    balance: Arc<AcceptBalance>,
    index: usize,
}

impl BalanceSlot {
    /// Whether this thread holds more connections than the least loaded one.
    pub fn should_defer(&self) -> bool {
        let open = &self.balance.open;
        let mine = open[self.index].load(Ordering::Relaxed);
        open.iter().any(|o| o.load(Ordering::Relaxed) < mine)
    }

    /// Count a connection this thread accepted, until the guard drops.
    pub fn opened(&self) -> OpenConnection {
        self.balance.open[self.index].fetch_add(1, Ordering::Relaxed);
        OpenConnection(self.clone())
    }
}

/// A connection counted in its thread's balance.
#[derive(Debug)]
pub struct OpenConnection(BalanceSlot);

impl Drop for OpenConnection {
    fn drop(&mut self) {
        self.0.balance.open[self.0.index].fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_more_loaded_threads_step_back() {
        let balance = AcceptBalance::new(3);
        let (a, b, c) = (balance.slot(0), balance.slot(1), balance.slot(2));
        assert!(!a.should_defer() && !b.should_defer());
        let first = a.opened();
        assert!(a.should_defer() && !b.should_defer() && !c.should_defer());
        let (_b1, _c1) = (b.opened(), c.opened());
        assert!(!a.should_defer(), "all level again");
        drop(first);
        assert!(b.should_defer() && c.should_defer() && !a.should_defer());
    }
}
