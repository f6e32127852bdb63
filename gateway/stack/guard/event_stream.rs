//! What the guards of the engines' own event protocols share (`/v1/responses` events and
//! Anthropic's messages events, `responses.rs` and `anthropic.rs`): the trip of a stream that
//! could not be read on, and the events held back while the leak scan is inside another
//! tenant's text.

use super::inspect::Trip;
use super::leak::{HoldPolicy, LeakScan};
use super::sse::StreamFailure;

/// The trip of a stream the re-framer could not read on.
pub(super) fn failure_trip(why: StreamFailure) -> Trip {
    match why {
        StreamFailure::Unreadable(_) => Trip::Unparsable {
            detail: "a stream event from the engine is too large",
        },
        StreamFailure::Broken(_) => Trip::Truncated {
            detail: "the engine's stream failed",
        },
    }
}

/// Events held back from the client while a blocking leak scan is inside a run of another
/// tenant's text; released with the first event after the run ends.
#[derive(Debug, Default)]
pub(super) struct HeldEvents(Vec<u8>);

impl HeldEvents {
    /// Pass `raw` on to `out` (after what was held), or hold it while `leak` is inside a
    /// foreign run.
    pub(super) fn emit(&mut self, leak: Option<&LeakScan>, out: &mut Vec<u8>, raw: &[u8]) {
        let holding =
            leak.is_some_and(|l| l.hold_policy() != HoldPolicy::None && l.in_foreign_run());
        self.0.extend_from_slice(raw);
        if !holding {
            out.append(&mut self.0);
        }
    }

    /// What is held, to `out` (the stream's final event has passed every check).
    pub(super) fn release(&mut self, out: &mut Vec<u8>) {
        out.append(&mut self.0);
    }

    /// Drop what is held (the stream ends in an error).
    pub(super) fn drop_all(&mut self) {
        self.0.clear();
    }
}
