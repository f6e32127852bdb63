//! Leak scanning of an answer (I5): generated text is split into text units (no
//! tokenizer) and fed to the tenant's [`ResponseScanner`]; fragments of other tenants'
//! recent prompts are a suspected leak — reported (detect) or stopped (block, strict).
//!
//! # What a stream's client can see ([`HoldPolicy`])
//!
//! With `n = ngram`, `m = min_matches` and `K = n + m - 1` (the detector trips on a run of
//! K consecutive units only another tenant's recent prompt holds):
//!
//! - **block** (the default) holds output only while the answer's newest units end a
//!   foreign n-gram, i.e. while they continue a run of another tenant's text; the run
//!   either trips (the stream ends with an error event, the held output never leaves) or
//!   breaks (everything held leaves at once). A foreign run is first visible at its n-th
//!   unit, so of a run that trips at most its first `n - 1` units reach the client (7 by
//!   default: at most 16 bytes each, whitespace aside, plus the first bytes of a word still
//!   open at an event's end). A healthy stream — no n-gram of it is only another tenant's —
//!   is never held: each event leaves as soon as it is checked. A healthy stream that
//!   happens to hold up to `m - 1` foreign n-grams (text one other tenant sent lately) is
//!   held until the unit that breaks the run: at most `m - 1` units plus the breaking one.
//! - **strict** holds every stream back by `K + 1` units (the +1: a word still open at an
//!   event's end), so not one unit of a run that trips reaches the client; every stream's
//!   first content waits for those units.
//!
//! Non-streamed answers are checked whole before the 200 in every mode.

use std::sync::Arc;

use super::inspect::Trip;
use crate::config::LeakMode;
use crate::stack::isolate::leak::units::TextUnits;
use crate::stack::isolate::leak::{LeakSuspicion, ResponseScanner};

/// How stream output waits for the leak scan.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HoldPolicy {
    /// Nothing is held (off, detect).
    None,
    /// Held while the newest units continue a foreign run (block).
    WhileForeignRun,
    /// Held until this many later units were scanned (strict).
    Units(usize),
}

/// Called once when a suspicion is first raised (audit line and metric).
pub type OnSuspect = Arc<dyn Fn(LeakSuspicion) + Send + Sync>;

/// The leak scan of one answer.
pub struct LeakScan {
    scanner: ResponseScanner,
    units: TextUnits,
    buf: Vec<u32>,
    mode: LeakMode,
    on_suspect: OnSuspect,
    fed: usize,
    hold: HoldPolicy,
    /// Block mode: the word still open at the end of the last text would, as it stands,
    /// end a foreign n-gram.
    open_word_in_run: bool,
}

impl std::fmt::Debug for LeakScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeakScan")
            .field("mode", &self.mode)
            .field("fed", &self.fed)
            .finish()
    }
}

impl LeakScan {
    /// Scan with `scanner`.
    pub fn new(scanner: ResponseScanner, mode: LeakMode, on_suspect: OnSuspect) -> Self {
        let hold = match mode {
            LeakMode::Off | LeakMode::Detect => HoldPolicy::None,
            LeakMode::Block => HoldPolicy::WhileForeignRun,
            // Until enough later units were scanned that a foreign fragment ending in the
            // output would already have tripped; +1 for the word still open at an event's end.
            LeakMode::Strict => HoldPolicy::Units(scanner.tokens_to_decide() + 1),
        };
        Self {
            scanner,
            units: TextUnits::new(),
            buf: Vec::new(),
            mode,
            on_suspect,
            fed: 0,
            hold,
            open_word_in_run: false,
        }
    }

    /// Generated units scanned so far.
    pub fn fed(&self) -> usize {
        self.fed
    }

    /// How stream output waits for this scan.
    pub fn hold_policy(&self) -> HoldPolicy {
        self.hold
    }

    /// Whether the newest units scanned — the word still open included, as it stands —
    /// continue a run of another tenant's text.
    pub fn in_foreign_run(&self) -> bool {
        self.scanner.in_foreign_run() || self.open_word_in_run
    }

    /// Add generated text; `last` ends it (the open word counts).
    pub fn push(&mut self, text: &str, last: bool) -> Result<(), Trip> {
        self.buf.clear();
        self.units.push(text, &mut self.buf);
        if last {
            self.units.finish(&mut self.buf);
        }
        let now = std::time::Instant::now();
        let found = if self.buf.is_empty() {
            None
        } else {
            self.fed += self.buf.len();
            let ids = std::mem::take(&mut self.buf);
            let found = self.scanner.feed(&ids, now);
            self.buf = ids;
            found
        };
        if self.hold == HoldPolicy::WhileForeignRun {
            // An event that ends inside a word leaves before the word is a unit: look at the
            // word as it stands, so the n-th unit of a foreign run never leaves whole.
            self.open_word_in_run = match self.units.open_unit() {
                Some(unit) => self.scanner.would_continue_run(unit, now),
                None => false,
            };
        }
        match found {
            Some(suspicion) => {
                (self.on_suspect)(suspicion);
                if self.mode.blocks() {
                    return Err(Trip::LeakSuspected {
                        owners: suspicion.owner_tenants,
                    });
                }
                Ok(())
            }
            None => Ok(()),
        }
    }
}
