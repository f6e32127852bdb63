//! Leak scanning of an answer (I5): generated text is turned back into token ids and fed
//! to the tenant's [`ResponseScanner`]; fragments of other tenants' recent prompts are a
//! suspected leak — reported (detect) or stopped (block).

use std::sync::Arc;

use super::inspect::Trip;
use crate::config::LeakMode;
use crate::stack::isolate::leak::{LeakSuspicion, ResponseScanner};
use kvgate_tokenize::ModelTokenizer;

/// Called once when a suspicion is first raised (audit line and metric).
pub type OnSuspect = Arc<dyn Fn(LeakSuspicion) + Send + Sync>;

/// The leak scan of one answer.
pub struct LeakScan {
    scanner: ResponseScanner,
    tokenizer: Arc<ModelTokenizer>,
    mode: LeakMode,
    pending: String,
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
    /// Scan with `scanner`, re-encoding with `tokenizer`.
    pub fn new(
        scanner: ResponseScanner,
        tokenizer: Arc<ModelTokenizer>,
        mode: LeakMode,
        on_suspect: OnSuspect,
    ) -> Self {
        // Block mode holds stream output back until enough later tokens have been scanned
        // that a foreign fragment ending in it would already have tripped; +1 for the piece
        // still buffered at a word boundary.
        let holdback = match mode {
            LeakMode::Block => scanner.tokens_to_decide() + 1,
            _ => 0,
        };
        Self {
            scanner,
            tokenizer,
            mode,
            pending: String::new(),
            on_suspect,
            fed: 0,
            holdback,
        }
    }

    /// Generated tokens scanned so far.
    pub fn fed(&self) -> usize {
        self.fed
    }

    /// Tokens by which stream output is held back (0 unless blocking).
    pub fn holdback(&self) -> usize {
        self.holdback
    }

    /// Add generated text; `last` flushes what is buffered. Text is re-encoded in pieces cut
    /// at whitespace, so pieces tokenize as they would inside the whole text.
    pub fn push(&mut self, text: &str, last: bool) -> Result<(), Trip> {
        self.pending.push_str(text);
        let cut = if last {
            self.pending.len()
        } else {
            match self.pending.rfind(char::is_whitespace) {
                Some(i) if i > 0 => i,
                _ => return Ok(()),
            }
        };
        let rest = self.pending.split_off(cut);
        let piece = std::mem::replace(&mut self.pending, rest);
        if piece.is_empty() {
            return Ok(());
        }
        let Ok(ids) = self.tokenizer.encode(&piece, false) else {
            return Ok(());
        };
        self.fed += ids.len();
        match self.scanner.feed(&ids, std::time::Instant::now()) {
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
