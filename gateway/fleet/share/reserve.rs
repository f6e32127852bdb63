//! The room kept for tenants below their share (see the parent module), as a pump or a
//! claim checks it: per tenant, in whole slots, and spare room for any of them.

use std::sync::Arc;

/// Room kept for tenants below their share, each tenant's apart: a tenant may use only
/// its own kept room and the spare, never another's (newcomers arriving together do not
/// eat a steady tenant's room).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reserve {
    /// Per tenant: the KV tokens kept for it.
    pub(super) keeps: Vec<(Arc<str>, u64)>,
    /// Kept for any request below its tenant's share (`newcomer_reserve`, while the pool
    /// is contended): a newcomer has no room of its own yet.
    pub(super) spare: u64,
    /// The most kept in all (`fair_share_reserve` × the pool).
    pub(super) cap: u64,
    /// The largest request of the tenants it is kept for: kept room is only useful in
    /// pieces this big (one worker's room must hold a request).
    pub slot: u64,
}

impl Reserve {
    /// The room to keep from a request of `tenant`: every other tenant's, and the spare
    /// unless the request is below its tenant's share (`under_share`), in whole slots
    /// (each tenant's keep rounded up: a request needs a whole slot), capped (in whole
    /// slots: a cap below one slot keeps nothing).
    pub fn kept_from(&self, tenant: &str, under_share: bool) -> u64 {
        let slot = self.slot.max(1);
        let spare = if under_share { 0 } else { self.spare };
        let slots = self
            .keeps
            .iter()
            .filter(|(t, _)| &**t != tenant)
            .map(|(_, k)| k.div_ceil(slot))
            .fold(spare / slot, u64::saturating_add);
        slots.min(self.cap / slot).saturating_mul(slot)
    }

    /// Whether nothing is kept.
    pub fn is_empty(&self) -> bool {
        self.keeps.is_empty() && self.spare == 0
    }

    /// Whether a request of `tenant` (below its share: `under_share`) has room kept that
    /// it may take past a queue head that does not fit: its tenant's own, or the spare.
    pub fn may_pass(&self, tenant: &str, under_share: bool) -> bool {
        (under_share && self.spare > 0) || self.keeps.iter().any(|(t, _)| &**t == tenant)
    }
}

/// Whether `keep` tokens still fit in `rooms` (each worker's free KV) in whole `slot`s.
pub fn keeps_fit<'a>(rooms: impl IntoIterator<Item = &'a u64>, keep: u64, slot: u64) -> bool {
    if keep == 0 {
        return true;
    }
    let slot = slot.max(1);
    let kept: u64 = rooms.into_iter().map(|r| r / slot * slot).sum();
    kept >= keep
}
