//! Output held back for the leak scan: in block mode while the newest units continue
//! another tenant's text, in strict mode until enough later units were scanned (see
//! `guard/leak.rs` for what each guarantees).

use bytes::Bytes;
use std::collections::VecDeque;

use crate::stack::guard::leak::{HoldPolicy, LeakScan};

/// Output held back for the leak scan (block and strict modes): bytes and the scanned unit
/// count when they arrived.
#[derive(Debug, Default)]
pub(super) struct HoldBack {
    held: VecDeque<(Bytes, usize)>,
}

impl HoldBack {
    /// Queue `bytes` for the client and return what may go out now (in order): everything,
    /// unless `leak` — the scan, while the stream is not done — holds output.
    pub(super) fn release(&mut self, bytes: Bytes, leak: Option<&LeakScan>) -> Vec<Bytes> {
        let (policy, fed, in_run) = match leak {
            Some(l) => (l.hold_policy(), l.fed(), l.in_foreign_run()),
            None => (HoldPolicy::None, 0, false),
        };
        let hold_this = match policy {
            HoldPolicy::None => false,
            HoldPolicy::WhileForeignRun => in_run,
            HoldPolicy::Units(_) => true,
        };
        if !hold_this && self.held.is_empty() {
            return vec![bytes];
        }
        self.held.push_back((bytes, fed));
        if hold_this && policy == HoldPolicy::WhileForeignRun {
            return Vec::new();
        }
        let mut ready = Vec::new();
        while let Some((_, at)) = self.held.front() {
            if let HoldPolicy::Units(holdback) = policy {
                if fed.saturating_sub(*at) < holdback {
                    break;
                }
            }
            if let Some((b, _)) = self.held.pop_front() {
                ready.push(b);
            }
        }
        ready
    }

    /// Everything still held (the stream ended and passed).
    pub(super) fn release_all(&mut self) -> Vec<Bytes> {
        self.held.drain(..).map(|(b, _)| b).collect()
    }
}
