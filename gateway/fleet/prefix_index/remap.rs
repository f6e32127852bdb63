//! A pool rebuilt with other workers (a DNS change, a worker added to the file) keeps what
//! its prefix index knows of the workers it still has: their slots move, the entries of
//! the workers gone are purged.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use super::{PrefixIndex, EMPTY};
use crate::fleet::Outbox;

impl PrefixIndex {
    /// This index for a rebuilt pool whose empty index is `like`: `slots[old]` is the
    /// worker's slot in the rebuilt pool (None: it is gone, and its entries with it).
    /// None when `like` is shaped otherwise (its bounds changed): the rebuilt pool then
    /// starts empty.
    pub fn remapped(&self, slots: &[Option<usize>], like: &PrefixIndex) -> Option<PrefixIndex> {
        if self.shards.len() != like.shards.len()
            || self.per_shard != like.per_shard
            || self.max_age_ticks != like.max_age_ticks
        {
            return None;
        }
        let slot_of = |old: u16| -> u16 {
            slots
                .get(usize::from(old))
                .copied()
                .flatten()
                .and_then(|new| u16::try_from(new).ok())
                .filter(|&new| new != EMPTY)
                .unwrap_or(EMPTY)
        };
        let shards = self
            .shards
            .iter()
            .map(|shard| {
                let mut shard = shard.lock().unwrap_or_else(|p| p.into_inner()).clone();
                for node in &mut shard.nodes {
                    for holder in &mut node.holders {
                        if holder.slot != EMPTY {
                            holder.slot = slot_of(holder.slot);
                        }
                    }
                }
                Mutex::new(shard)
            })
            .collect();
        let seen = (0..like.seen.len())
            .map(|new| {
                let old = slots.iter().position(|s| *s == Some(new));
                let epoch = old
                    .and_then(|old| self.seen.get(old))
                    .map_or(0, |e| e.load(Ordering::Relaxed));
                AtomicU64::new(epoch)
            })
            .collect();
        Some(PrefixIndex {
            shards,
            per_shard: self.per_shard,
            max_age_ticks: self.max_age_ticks,
            // Holders' times are ticks since this instant.
            born: self.born,
            seen,
            counters: OnceLock::new(),
            outbox: Outbox::default(),
        })
    }
}
