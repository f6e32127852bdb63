//! Scanning one response, incrementally, for n-grams that belong to another tenant.
//!
//! A response n-gram is *foreign* when exactly one tenant recorded it within the window and
//! that tenant is not the one being answered. Text two tenants share is common and never
//! counts, nor does the responding tenant's own prompt echoed back. `min_matches` distinct
//! foreign n-grams make a [`LeakSuspicion`].

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use super::fingerprint::{FingerprintStore, Inner, Owner};
use super::hash::{ngram_hashes, BuildPassThrough};

/// Distinct foreign n-grams remembered per response. Far above any sensible `min_matches`;
/// past it the count saturates instead of growing with a response that copies a whole
/// foreign prompt.
const MAX_TRACKED: usize = 65_536;

/// What a scanner found: a response holding fragments of other tenants' recent prompts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeakSuspicion {
    /// How many other tenants own the matched n-grams. Their names stay inside the
    /// detector, so the alarm itself cannot leak who else is on the gateway.
    pub owner_tenants: usize,
    /// Distinct foreign n-grams seen in the response so far.
    pub matched_ngrams: usize,
}

/// Scans one response to one tenant; feed it token ids as they are generated.
pub struct ResponseScanner {
    store: Arc<Inner>,
    /// The responding tenant's id, `None` if it never recorded a prompt.
    me: Option<u32>,
    /// The last `ngram - 1` ids of earlier feeds, then the current feed.
    pending: Vec<u32>,
    /// Scratch of one feed: its n-gram hashes and their owners.
    hashes: Vec<u64>,
    found: Vec<Owner>,
    matched: HashSet<u64, BuildPassThrough>,
    owners: Vec<u32>,
    alarmed: bool,
    /// Whether the newest n-gram fed is foreign: the answer's tail continues a run of
    /// another tenant's text (see [`ResponseScanner::in_foreign_run`]).
    in_run: bool,
    /// Scratch of [`ResponseScanner::would_continue_run`]: the n-gram it asks about.
    probe: Vec<u32>,
}

impl FingerprintStore {
    /// A scanner for one response to `tenant`.
    pub fn scanner(&self, tenant: &str) -> ResponseScanner {
        // A tenant that never recorded a prompt owns nothing; every owned n-gram is foreign.
        let me = self.inner().tenant_id(tenant, false);
        ResponseScanner::new(Arc::clone(self.inner()), me)
    }
}

impl ResponseScanner {
    pub(crate) fn new(store: Arc<Inner>, me: Option<u32>) -> Self {
        Self {
            store,
            me,
            pending: Vec::new(),
            hashes: Vec::new(),
            found: Vec::new(),
            matched: HashSet::default(),
            owners: Vec::new(),
            alarmed: false,
            in_run: false,
            probe: Vec::new(),
        }
    }

    /// Feeds generated token ids (any split: a stream's pieces, or the whole output).
    /// Keeps the last `ngram - 1` ids, so n-grams spanning pieces are seen exactly once.
    ///
    /// Returns the suspicion once, on the feed that first reaches `min_matches` distinct
    /// foreign n-grams; [`ResponseScanner::suspicion`] reports the running total after that.
    pub fn feed(&mut self, ids: &[u32], now: Instant) -> Option<LeakSuspicion> {
        let n = self.store.config.ngram;
        self.pending.extend_from_slice(ids);
        // `pending` starts with fewer than n ids from earlier feeds, so every window here
        // ends in this feed and none is checked twice.
        self.hashes.clear();
        ngram_hashes(&self.pending, n, &mut self.hashes);
        self.store.owners(&self.hashes, now, &mut self.found);
        for (&hash, &found) in self.hashes.iter().zip(&self.found) {
            let foreign = matches!(found, Owner::Only(owner) if Some(owner) != self.me);
            // The run state follows every n-gram, a repeated one too: it says whether the
            // answer's newest units still continue another tenant's text.
            self.in_run = foreign;
            if !foreign || self.matched.contains(&hash) {
                continue;
            }
            if let Owner::Only(owner) = found {
                if self.matched.len() < MAX_TRACKED {
                    self.matched.insert(hash);
                    if !self.owners.contains(&owner) {
                        self.owners.push(owner);
                    }
                }
            }
        }
        let keep_from = self.pending.len().saturating_sub(n - 1);
        self.pending.drain(..keep_from);

        if self.alarmed {
            return None;
        }
        let suspicion = self.suspicion()?;
        self.alarmed = true;
        Some(suspicion)
    }

    /// Generated units after which a foreign fragment ending at a given unit is sure to
    /// have raised the suspicion: `ngram + min_matches - 1`. A stream that must not let a
    /// single unit of a detected run out (strict mode) holds its output back by this many.
    pub fn tokens_to_decide(&self) -> usize {
        self.store.config.ngram + self.store.config.min_matches.saturating_sub(1)
    }

    /// Whether `unit`, fed next, would end a foreign n-gram: asked of the word still open at
    /// an event's end (its unit so far), so an event that completes the n-th unit of a
    /// foreign run is held although the word's end has not arrived yet. Changes nothing.
    pub fn would_continue_run(&mut self, unit: u32, now: Instant) -> bool {
        let n = self.store.config.ngram;
        if self.pending.len() + 1 < n {
            return false;
        }
        self.probe.clear();
        self.probe
            .extend_from_slice(&self.pending[self.pending.len() + 1 - n..]);
        self.probe.push(unit);
        self.hashes.clear();
        ngram_hashes(&self.probe, n, &mut self.hashes);
        self.store.owners(&self.hashes, now, &mut self.found);
        matches!(self.found.first(), Some(Owner::Only(owner)) if Some(*owner) != self.me)
    }

    /// Whether the newest n-gram fed is foreign (only another tenant's recent prompt holds
    /// it): the answer is inside a run of another tenant's text, which the next units either
    /// continue (towards `min_matches` and the suspicion) or break. Block mode holds stream
    /// output exactly while this is true; false before the first full n-gram.
    pub fn in_foreign_run(&self) -> bool {
        self.in_run
    }

    /// The suspicion so far: `Some` once `min_matches` distinct foreign n-grams were seen.
    pub fn suspicion(&self) -> Option<LeakSuspicion> {
        (self.matched.len() >= self.store.config.min_matches).then_some(LeakSuspicion {
            owner_tenants: self.owners.len(),
            matched_ngrams: self.matched.len(),
        })
    }
}

impl std::fmt::Debug for ResponseScanner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseScanner")
            .field("matched_ngrams", &self.matched.len())
            .field("owner_tenants", &self.owners.len())
            .field("alarmed", &self.alarmed)
            .finish_non_exhaustive()
    }
}
