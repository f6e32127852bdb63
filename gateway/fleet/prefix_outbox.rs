//! What a pool's prefix index has to tell the other replicas (`[prefix_routing]
//! share_with_replicas`, with `[limits]` in Redis): the block keys this replica sent to each
//! worker since the last round of `prefix_share`. The request path only appends to it (one
//! short lock, no Redis); the share loop takes it whole every round. Bounded: past
//! [`MOST_KEYS`] keys the oldest entries go (the others' indexes are approximate anyway, and
//! a replica that cannot reach Redis must not grow without end).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

/// Keys an outbox holds at most.
pub const MOST_KEYS: usize = 64 * 1024;

/// One pool's unsent inserts: (worker slot, the request's block keys).
#[derive(Debug, Default)]
pub struct Outbox {
    /// Set by the share loop while it runs for this pool: nothing is kept otherwise.
    open: AtomicBool,
    entries: Mutex<(VecDeque<Insert>, usize)>,
}

/// One insert: the worker's slot and the request's block keys.
type Insert = (usize, Arc<[u64]>);

impl Outbox {
    /// Keep inserts for the other replicas (or stop, dropping what is kept).
    pub fn open(&self, open: bool) {
        if !self.open.swap(open, Ordering::AcqRel) || open {
            return;
        }
        let mut entries = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        *entries = (VecDeque::new(), 0);
    }

    /// `keys` were sent to the worker in `slot` (a no-op unless open).
    pub fn push(&self, slot: usize, keys: &Arc<[u64]>) {
        if !self.open.load(Ordering::Acquire) || keys.len() > MOST_KEYS {
            return;
        }
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (entries, held) = &mut *guard;
        while *held + keys.len() > MOST_KEYS {
            let Some((_, dropped)) = entries.pop_front() else {
                break;
            };
            *held -= dropped.len();
        }
        *held += keys.len();
        entries.push_back((slot, keys.clone()));
    }

    /// `taken` could not be sent: keep it again, before what came since (within the bound:
    /// the oldest go first).
    pub fn put_back(&self, taken: Vec<Insert>) {
        if !self.open.load(Ordering::Acquire) {
            return;
        }
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (entries, held) = &mut *guard;
        for insert in taken.into_iter().rev() {
            if *held + insert.1.len() > MOST_KEYS {
                break;
            }
            *held += insert.1.len();
            entries.push_front(insert);
        }
    }

    /// Everything kept since the last call, oldest first.
    pub fn take(&self) -> Vec<Insert> {
        let mut guard = self.entries.lock().unwrap_or_else(|p| p.into_inner());
        let (entries, held) = &mut *guard;
        *held = 0;
        std::mem::take(entries).into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_it_keeps_nothing_open_it_keeps_the_newest_within_its_bound() {
        let outbox = Outbox::default();
        let keys: Arc<[u64]> = Arc::from(vec![1u64; 1000]);
        outbox.push(0, &keys);
        assert!(outbox.take().is_empty(), "closed");
        outbox.open(true);
        for slot in 0..100 {
            outbox.push(slot, &keys);
        }
        let kept = outbox.take();
        assert_eq!(kept.len(), MOST_KEYS / 1000);
        assert_eq!(kept.last().map(|(s, _)| *s), Some(99), "the newest stay");
        assert!(outbox.take().is_empty(), "taken whole");
        outbox.push(7, &keys);
        let taken = outbox.take();
        outbox.push(8, &keys);
        outbox.put_back(taken);
        let again: Vec<usize> = outbox.take().iter().map(|(s, _)| *s).collect();
        assert_eq!(again, [7, 8], "put back before what came since");
        outbox.push(7, &keys);
        outbox.open(false);
        assert!(outbox.take().is_empty(), "closing drops what was kept");
    }
}
