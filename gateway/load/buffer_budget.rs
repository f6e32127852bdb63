//! The memory budget for buffered request bodies and non-streamed engine answers.
//!
//! Every byte the gateway holds whole — a request body before it is parsed and forwarded,
//! an engine's non-streamed answer before the guard checked it — is reserved here first,
//! chunk by chunk as it arrives. The reservation lives as long as the bytes do (it rides in
//! request and response extensions and bodies), so the sum over all requests never exceeds
//! `server.max_buffered_bytes`. Counted in KiB (a semaphore counts in `u32`).

use std::sync::Arc;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

const UNIT: u64 = 1024;

/// The shared budget; cheap to clone.
#[derive(Debug, Clone)]
pub struct BufferBudget {
    units: Arc<Semaphore>,
    total_units: u32,
}

/// Bytes reserved from a [`BufferBudget`]; given back when dropped.
#[derive(Debug, Default)]
pub struct BufferPermit {
    held: Option<OwnedSemaphorePermit>,
    bytes: u64,
}

impl BufferBudget {
    /// A budget of `bytes` (at least one unit).
    pub fn new(bytes: u64) -> Self {
        let total_units = u32::try_from(bytes.div_ceil(UNIT).max(1)).unwrap_or(u32::MAX);
        Self {
            units: Arc::new(Semaphore::new(total_units as usize)),
            total_units,
        }
    }

    /// Grow `permit` so it covers `bytes` in all; false (nothing taken) when the budget
    /// cannot hold them now.
    pub fn reserve(&self, permit: &mut BufferPermit, bytes: u64) -> bool {
        let have = permit.bytes.div_ceil(UNIT);
        let need = bytes.div_ceil(UNIT);
        if need <= have {
            permit.bytes = permit.bytes.max(bytes);
            return true;
        }
        let Ok(more) = u32::try_from(need - have) else {
            return false;
        };
        if more > self.total_units {
            return false;
        }
        match Arc::clone(&self.units).try_acquire_many_owned(more) {
            Ok(p) => {
                match permit.held.as_mut() {
                    Some(held) => held.merge(p),
                    None => permit.held = Some(p),
                }
                permit.bytes = bytes;
                true
            }
            Err(_) => false,
        }
    }

    /// Bytes reserved right now, over all requests (`kvgate_buffered_bytes`).
    pub fn in_use(&self) -> u64 {
        u64::from(self.total_units).saturating_sub(self.units.available_permits() as u64) * UNIT
    }
}

impl BufferPermit {
    /// Bytes this permit covers.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reservations_grow_and_are_given_back() {
        let budget = BufferBudget::new(10 * 1024);
        let mut a = BufferPermit::default();
        assert!(budget.reserve(&mut a, 3000));
        assert!(budget.reserve(&mut a, 6000));
        assert_eq!(budget.in_use(), 6 * 1024);
        let mut b = BufferPermit::default();
        assert!(!budget.reserve(&mut b, 5 * 1024), "over the budget");
        assert_eq!(budget.in_use(), 6 * 1024, "a refusal takes nothing");
        assert!(budget.reserve(&mut b, 4 * 1024));
        drop(a);
        assert_eq!(budget.in_use(), 4 * 1024);
        let mut huge = BufferPermit::default();
        assert!(!budget.reserve(&mut huge, u64::MAX));
    }
}
