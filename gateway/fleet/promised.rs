//! Room the gateway queue has handed out but not yet seen taken: a request the queue
//! released claims its workers a moment later (when its task runs), and until then a
//! second pump must not hand the same room to another request (which would then fail its
//! claim and lose its place). A promise is settled by the claim, or expires: a released
//! request whose client went away in that moment never claims.
//!
//! The order makes the count safe: a pump reads the promises *before* the workers' room,
//! and a claim takes its room *before* it settles its promise, so a claim racing a pump is
//! at worst counted twice (the pump releases less; the settle wakes the pumps again),
//! never missed.

use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// How long a promise holds room for a released request that has not claimed it.
const PROMISE_TTL: Duration = Duration::from_secs(1);

/// The pool's outstanding promises: (when, KV tokens).
#[derive(Debug, Default)]
pub struct Promised {
    promises: Mutex<Vec<(Instant, u64)>>,
    /// Held by one pump at a time: a pump reads the promises, then the workers' room, then
    /// adds its own promises, and no other pump may promise in between.
    pumping: Mutex<()>,
}

impl Promised {
    /// Serialize pumps (see the field).
    pub fn pumping(&self) -> MutexGuard<'_, ()> {
        self.pumping.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Promise `cost` tokens to a released request.
    pub fn add(&self, cost: u64) {
        let mut promises = self.promises.lock().unwrap_or_else(|p| p.into_inner());
        promises.push((Instant::now(), cost));
    }

    /// The released request of `cost` claimed (or gave up): its promise ends.
    pub fn settle(&self, cost: u64) {
        let mut promises = self.promises.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(i) = promises.iter().position(|&(_, c)| c == cost) {
            promises.swap_remove(i);
        }
    }

    /// The tokens promised and not yet taken (expired promises are dropped).
    pub fn total(&self) -> u64 {
        let mut promises = self.promises.lock().unwrap_or_else(|p| p.into_inner());
        let now = Instant::now();
        promises.retain(|&(at, _)| now.duration_since(at) < PROMISE_TTL);
        promises
            .iter()
            .map(|&(_, c)| c)
            .fold(0, u64::saturating_add)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn promises_add_up_settle_one_at_a_time_and_expire() {
        let p = Promised::default();
        p.add(100);
        p.add(100);
        p.add(30);
        assert_eq!(p.total(), 230);
        p.settle(100);
        assert_eq!(p.total(), 130);
        p.settle(7); // nothing of that cost: no change
        assert_eq!(p.total(), 130);
        {
            let mut promises = p.promises.lock().unwrap();
            for (at, _) in promises.iter_mut() {
                *at -= PROMISE_TTL;
            }
        }
        assert_eq!(p.total(), 0, "expired promises hold nothing");
    }
}
