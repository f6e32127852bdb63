//! Leak scanning of an answer (I5): generated text is split into text units (no
//! tokenizer) and fed to the tenant's [`ResponseScanner`]; fragments of other tenants'
//! recent prompts are a suspected leak — reported (detect) or stopped (block).

use std::sync::Arc;

use super::inspect::Trip;
use crate::config::LeakMode;
use crate::stack::isolate::leak::units::TextUnits;
use crate::stack::isolate::leak::{LeakSuspicion, ResponseScanner};

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
    holdback: usize,
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
        // Block mode holds stream output back until enough later units have been scanned
        // that a foreign fragment ending in it would already have tripped; +1 for the word
        // still open at a chunk's end.
        let holdback = match mode {
            LeakMode::Block => scanner.tokens_to_decide() + 1,
            _ => 0,
        };
        Self {
            scanner,
            units: TextUnits::new(),
            buf: Vec::new(),
            mode,
            on_suspect,
            fed: 0,
            holdback,
        }
    }

    /// Generated units scanned so far.
    pub fn fed(&self) -> usize {
        self.fed
    }

    /// Units by which stream output is held back (0 unless blocking).
    pub fn holdback(&self) -> usize {
        self.holdback
    }

    /// Add generated text; `last` ends it (the open word counts).
    pub fn push(&mut self, text: &str, last: bool) -> Result<(), Trip> {
        self.buf.clear();
        self.units.push(text, &mut self.buf);
        if last {
            self.units.finish(&mut self.buf);
        }
        if self.buf.is_empty() {
            return Ok(());
        }
        self.fed += self.buf.len();
        let ids = std::mem::take(&mut self.buf);
        let found = self.scanner.feed(&ids, std::time::Instant::now());
        self.buf = ids;
        match found {
            Some(suspicion) => {
                (self.on_suspect)(suspicion);
                if self.mode == LeakMode::Block {
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
