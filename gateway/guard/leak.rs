//! Leak scanning of an answer (I5): generated text is turned back into token ids and fed
//! to the tenant's [`ResponseScanner`]; fragments of other tenants' recent prompts are a
//! suspected leak — reported (detect) or stopped (block).

use std::sync::Arc;

use super::inspect::Trip;
use crate::config::LeakMode;
use crate::isolation::{LeakSuspicion, ResponseScanner};
use crate::tokenize::ModelTokenizer;

/// Text is re-encoded in pieces of at least this many bytes, cut at whitespace, so pieces
/// tokenize as they would inside the whole text.
const PIECE_BYTES: usize = 256;

/// Called once when a suspicion is first raised (audit line and metric).
pub type OnSuspect = Arc<dyn Fn(LeakSuspicion) + Send + Sync>;

/// The leak scan of one answer.
pub struct LeakScan {
    scanner: ResponseScanner,
    tokenizer: Arc<ModelTokenizer>,
    mode: LeakMode,
    pending: String,
    on_suspect: OnSuspect,
}

impl std::fmt::Debug for LeakScan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeakScan")
            .field("mode", &self.mode)
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
        Self {
            scanner,
            tokenizer,
            mode,
            pending: String::new(),
            on_suspect,
        }
    }

    /// Add generated text; `last` flushes what is buffered.
    pub fn push(&mut self, text: &str, last: bool) -> Result<(), Trip> {
        self.pending.push_str(text);
        if !last && self.pending.len() < PIECE_BYTES {
            return Ok(());
        }
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
        let Ok(ids) = self.tokenizer.encode(&piece, false) else {
            return Ok(());
        };
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
