//! The live configuration: the current [`Generation`] (what one config builds and a reload
//! replaces whole). Requests take the generation that is current when they arrive and keep
//! it until they end (a stream included), so a reload never changes a request midway.
//!
//! The request path does not lock anything to follow reloads: each data thread's stack
//! compares one atomic generation number per request ([`super::live_stack`]) and is rebuilt
//! only when it moved.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use crate::generation::Generation;

/// The current generation.
#[derive(Debug)]
pub struct Live {
    current: RwLock<Arc<Generation>>,
    number: AtomicU64,
}

impl Live {
    /// Start with `first` (numbered 1).
    pub fn new(mut first: Generation) -> Self {
        first.number = 1;
        Self {
            current: RwLock::new(Arc::new(first)),
            number: AtomicU64::new(1),
        }
    }

    /// The current generation (admin port, background loops, a stack being rebuilt).
    pub fn current(&self) -> Arc<Generation> {
        self.current
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The current generation's number: one atomic load (the request path).
    pub fn number(&self) -> u64 {
        self.number.load(Ordering::Acquire)
    }

    /// Make `next` current; returns its number. Requests already running keep theirs.
    pub fn install(&self, mut next: Generation) -> u64 {
        let mut current = self.current.write().unwrap_or_else(|p| p.into_inner());
        let number = current.number + 1;
        next.number = number;
        *current = Arc::new(next);
        // After the swap: a thread that sees the new number finds the new generation.
        self.number.store(number, Ordering::Release);
        number
    }
}
