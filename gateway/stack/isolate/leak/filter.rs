//! A lock-free "maybe stored" filter in front of the fingerprint shards.
//!
//! Nearly every n-gram of an answer was never recorded by anyone, yet each one used to take
//! a shard's read lock (one shared cache line bouncing between the worker threads) and look
//! into every live bucket. The filter answers "surely absent" for most of them with one
//! relaxed load, in the style of pingora's fixed-memory estimators: one bit per hash, set
//! when an n-gram is recorded, 16 bits per stored entry (≈ 6% of absent n-grams still go on
//! to the shards). It never answers "absent" for a stored entry, so the detector's guarantee
//! is the shards' own.
//!
//! Bits are never cleared in the filter scanners read. The periodic sweep rebuilds the other
//! copy from the live entries and then makes it the one read; recording sets bits in both
//! copies under the shard's write lock, after the rebuild cleared its copy or before the
//! rebuild reads that shard, so nothing recorded during a rebuild is missed. A scan that overlaps the start of
//! a rebuild (the epoch moved) does not trust the filter and asks the shards.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};

/// Filter bits per stored entry the store may hold.
const BITS_PER_ENTRY: usize = 16;

struct Bits {
    words: Box<[AtomicU64]>,
    mask: u64,
}

impl Bits {
    fn new(bits: usize) -> Self {
        let words = bits / 64;
        Self {
            words: (0..words).map(|_| AtomicU64::new(0)).collect(),
            mask: bits as u64 - 1,
        }
    }

    #[inline]
    fn locate(&self, hash: u64) -> (usize, u64) {
        // The low bits will do: n-gram hashes are fully mixed (`hash::fmix64`).
        let bit = hash & self.mask;
        ((bit / 64) as usize, 1 << (bit % 64))
    }

    #[inline]
    fn set(&self, hash: u64) {
        let (word, bit) = self.locate(hash);
        if self.words[word].load(Ordering::Relaxed) & bit == 0 {
            self.words[word].fetch_or(bit, Ordering::Release);
        }
    }

    #[inline]
    fn maybe(&self, hash: u64) -> bool {
        let (word, bit) = self.locate(hash);
        self.words[word].load(Ordering::Acquire) & bit != 0
    }

    fn clear(&self) {
        // Release: a scan that reads a cleared word also sees the epoch bump before it.
        for w in self.words.iter() {
            w.store(0, Ordering::Release);
        }
    }
}

/// Two bit copies, the one scanners read, and the rebuild epoch.
pub(crate) struct PresenceFilter {
    copies: [Bits; 2],
    active: AtomicUsize,
    /// Bumped before a rebuild clears the inactive copy and after it becomes active.
    epoch: AtomicU64,
}

/// The filter as one scan sees it (see [`PresenceFilter::view`]).
pub(crate) struct FilterView<'a> {
    filter: &'a PresenceFilter,
    bits: &'a Bits,
    epoch: u64,
}

impl PresenceFilter {
    /// A filter for a store of at most `max_entries` entries (at least 4 KiB of bits).
    pub(crate) fn new(max_entries: usize) -> Self {
        let bits = max_entries
            .saturating_mul(BITS_PER_ENTRY)
            .clamp(1 << 15, 1 << 31)
            .next_power_of_two();
        Self {
            copies: [Bits::new(bits), Bits::new(bits)],
            active: AtomicUsize::new(0),
            epoch: AtomicU64::new(0),
        }
    }

    /// Bytes the two copies take (fixed at creation).
    pub(crate) fn memory_bytes(&self) -> usize {
        2 * self.copies[0].words.len() * 8
    }

    /// Note a recorded hash: call under its shard's write lock (see the module docs).
    #[inline]
    pub(crate) fn set(&self, hash: u64) {
        self.copies[0].set(hash);
        self.copies[1].set(hash);
    }

    /// The copy to read for one batch of lookups.
    pub(crate) fn view(&self) -> FilterView<'_> {
        let epoch = self.epoch.load(Ordering::Acquire);
        let bits = &self.copies[self.active.load(Ordering::Acquire) & 1];
        FilterView {
            filter: self,
            bits,
            epoch,
        }
    }

    /// Rebuild: `live` calls its argument for every live stored hash. Runs off the request
    /// path (the periodic sweep); costs one pass over the entries.
    pub(crate) fn rebuild(&self, live: impl FnOnce(&mut dyn FnMut(u64))) {
        let next = (self.active.load(Ordering::Acquire) + 1) & 1;
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let bits = &self.copies[next];
        bits.clear();
        live(&mut |hash| bits.set(hash));
        self.active.store(next, Ordering::Release);
        self.epoch.fetch_add(1, Ordering::AcqRel);
    }
}

impl FilterView<'_> {
    /// Whether `hash` may be stored (false: surely not).
    #[inline]
    pub(crate) fn maybe(&self, hash: u64) -> bool {
        self.bits.maybe(hash)
    }

    /// Whether the "surely not" answers of this view hold: no rebuild started since it was
    /// taken. Check after the batch; if false, ask the shards for the skipped hashes.
    pub(crate) fn still_valid(&self) -> bool {
        self.filter.epoch.load(Ordering::Acquire) == self.epoch
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_set_hash_is_always_maybe_and_most_others_are_not() {
        let filter = PresenceFilter::new(10_000);
        let hashes: Vec<u64> = (0..10_000u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        for &h in &hashes {
            filter.set(h);
        }
        let view = filter.view();
        assert!(hashes.iter().all(|&h| view.maybe(h)));
        let absent = (0..10_000u64)
            .map(|i| (i + 1_000_000).wrapping_mul(0xff51_afd7_ed55_8ccd))
            .filter(|&h| view.maybe(h))
            .count();
        // 16 bits per entry: about 6% of absent hashes pass.
        assert!(absent < 1_500, "{absent} of 10000 absent hashes passed");
        assert!(view.still_valid());
    }

    #[test]
    fn a_rebuild_keeps_live_hashes_drops_dead_ones_and_invalidates_open_views() {
        let filter = PresenceFilter::new(1_000);
        filter.set(1);
        filter.set(2);
        let before = filter.view();
        filter.rebuild(|add| add(2));
        assert!(
            !before.still_valid(),
            "a view across a rebuild is not trusted"
        );
        let after = filter.view();
        assert!(after.maybe(2));
        assert!(!after.maybe(1));
        assert!(after.still_valid());
        // Recording during the next rebuild reaches the copy that becomes active.
        filter.rebuild(|add| {
            filter.set(3);
            add(2);
        });
        assert!(filter.view().maybe(3));
    }
}
