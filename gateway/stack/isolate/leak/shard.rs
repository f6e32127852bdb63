//! One shard of the fingerprint store: a ring of time-bucketed generations, oldest first
//! (see `fingerprint.rs` for the layout and the ownership rules).

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use super::hash::BuildPassThrough;

/// Owner value of an n-gram that two or more tenants recorded.
pub(crate) const COMMON: u32 = u32::MAX;

/// Who owns an n-gram among the live entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Owner {
    /// Not looked up yet (only inside `fingerprint::Inner::owners`).
    Unknown,
    Nobody,
    Only(u32),
    Common,
}

impl Owner {
    pub(super) fn with(self, owner: u32) -> Self {
        match self {
            _ if owner == COMMON => Owner::Common,
            Owner::Nobody | Owner::Unknown => Owner::Only(owner),
            Owner::Only(t) if t == owner => self,
            _ => Owner::Common,
        }
    }
}

#[derive(Clone, Copy)]
pub(super) struct Limits {
    pub(super) window: Duration,
    /// Longest time one bucket stays open.
    pub(super) span: Duration,
    /// Most entries one shard holds (its share of `max_entries`).
    pub(super) shard_cap: usize,
    /// Most entries one bucket holds, so the oldest fraction can always be dropped.
    pub(super) bucket_cap: usize,
}

/// One stored n-gram: who recorded it, and when last (ms after its bucket's start).
#[derive(Clone, Copy)]
pub struct Slot {
    owner: u32,
    seen_ms: u32,
}

pub(super) struct Bucket {
    pub(super) start: Instant,
    pub(super) newest: Instant,
    pub(super) map: HashMap<u64, Slot, BuildPassThrough>,
}

#[derive(Default)]
pub(super) struct Shard {
    pub(super) buckets: VecDeque<Bucket>,
    pub(super) entries: usize,
}

// === impl Shard ===

impl Shard {
    /// Drops the buckets whose newest entry is older than the window.
    pub(super) fn expire(&mut self, now: Instant, window: Duration) {
        while let Some(front) = self.buckets.front() {
            if now.saturating_duration_since(front.newest) <= window {
                break;
            }
            self.entries -= front.map.len();
            self.buckets.pop_front();
        }
    }

    pub(super) fn insert(&mut self, hash: u64, owner: u32, now: Instant, limits: &Limits) {
        let current_is_open = self
            .buckets
            .back()
            .is_some_and(|b| now.saturating_duration_since(b.start) < limits.span);
        if current_is_open {
            if let Some(bucket) = self.buckets.back_mut() {
                let seen_ms = bucket.offset_ms(now);
                if let Some(slot) = bucket.map.get_mut(&hash) {
                    // Already here: refresh; a second tenant makes it common for good.
                    if slot.owner != owner {
                        slot.owner = COMMON;
                    }
                    slot.seen_ms = slot.seen_ms.max(seen_ms);
                    bucket.newest = bucket.newest.max(now);
                    return;
                }
            }
        }
        let full = self
            .buckets
            .back()
            .is_none_or(|b| b.map.len() >= limits.bucket_cap);
        if !current_is_open || full {
            self.buckets.push_back(Bucket {
                start: now,
                newest: now,
                map: HashMap::default(),
            });
        }
        // Evict oldest first. The current bucket is never dropped: it holds at most
        // `bucket_cap <= shard_cap` entries and has room, so the loop ends below the cap.
        while self.entries >= limits.shard_cap && self.buckets.len() > 1 {
            if let Some(oldest) = self.buckets.pop_front() {
                self.entries -= oldest.map.len();
            }
        }
        if let Some(bucket) = self.buckets.back_mut() {
            let seen_ms = bucket.offset_ms(now);
            bucket.map.insert(hash, Slot { owner, seen_ms });
            bucket.newest = bucket.newest.max(now);
            self.entries += 1;
        }
    }

    pub(super) fn owner(&self, hash: u64, now: Instant, window: Duration) -> Owner {
        let mut owner = Owner::Nobody;
        for bucket in self.buckets.iter().rev() {
            if now.saturating_duration_since(bucket.newest) > window {
                continue;
            }
            let Some(slot) = bucket.map.get(&hash) else {
                continue;
            };
            let seen = bucket.start + Duration::from_millis(u64::from(slot.seen_ms));
            if now.saturating_duration_since(seen) > window {
                continue;
            }
            owner = owner.with(slot.owner);
            if owner == Owner::Common {
                break;
            }
        }
        owner
    }
}

impl Bucket {
    fn offset_ms(&self, now: Instant) -> u32 {
        // Rounded down, so a stored time is never later than the real one and an entry
        // expires no later than `window` after it was recorded.
        let ms = now.saturating_duration_since(self.start).as_millis();
        u32::try_from(ms).unwrap_or(u32::MAX)
    }
}
