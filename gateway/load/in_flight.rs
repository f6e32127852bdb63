//! A cap on requests in flight (the whole gateway, or one pool). A slot is taken without
//! waiting — over the cap is 503 at once, never a queue — and rides in the response body,
//! so a stream holds its slot until it ends or the client goes away.

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

/// A cap of `max` requests at once; cheap to clone.
#[derive(Debug, Clone)]
pub struct InFlightLimit {
    slots: Arc<Semaphore>,
    max: usize,
}

/// One request's slot; given back when dropped.
#[derive(Debug)]
pub struct InFlightSlot {
    _permit: OwnedSemaphorePermit,
}

impl InFlightLimit {
    /// At most `max` at once.
    pub fn new(max: usize) -> Self {
        let max = max.clamp(1, Semaphore::MAX_PERMITS);
        Self {
            slots: Arc::new(Semaphore::new(max)),
            max,
        }
    }

    /// A slot, or `None` when all are taken.
    pub fn try_acquire(&self) -> Option<InFlightSlot> {
        Arc::clone(&self.slots)
            .try_acquire_owned()
            .ok()
            .map(|p| InFlightSlot { _permit: p })
    }

    /// The cap.
    pub fn max(&self) -> usize {
        self.max
    }

    /// Requests holding a slot now.
    pub fn in_flight(&self) -> usize {
        self.max - self.slots.available_permits()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_are_refused_over_the_cap_and_returned_on_drop() {
        let limit = InFlightLimit::new(2);
        let a = limit.try_acquire().unwrap();
        let _b = limit.try_acquire().unwrap();
        assert!(limit.try_acquire().is_none());
        assert_eq!(limit.in_flight(), 2);
        drop(a);
        assert!(limit.try_acquire().is_some());
    }
}
