//! The end of an event stream the guard rewrites in its own protocol (`/v1/responses`
//! events, Anthropic events an engine wrote): how it ended and when its tokens went out,
//! counted once when the stream's body goes (I6), as [`super::stream::GuardedStream`]
//! counts a chat stream's. Without it these streams were counted as successes when their
//! headers went out, with no token numbers in their audit line and no time to first token
//! (issue 40).

use std::time::Instant;

use super::report::TripReport;

/// How the stream ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Open,
    Completed,
    Tripped,
}

/// Carried by the stream's rewrite; dropped with the client's body.
#[derive(Debug)]
pub(super) struct StreamEnd {
    report: TripReport,
    phase: Phase,
    first_token: Option<Instant>,
    last_token: Option<Instant>,
}

impl StreamEnd {
    pub(super) fn new(report: TripReport) -> Self {
        Self {
            report,
            phase: Phase::Open,
            first_token: None,
            last_token: None,
        }
    }

    /// The report trips are recorded through.
    pub(super) fn report(&self) -> &TripReport {
        &self.report
    }

    /// An event carrying generated text goes to the client now (time to first token, the
    /// mean time between tokens: the protocol's own framing events, `response.created` or
    /// `message_start`, go out before the engine has generated anything and do not count).
    pub(super) fn token(&mut self) {
        let now = Instant::now();
        self.first_token.get_or_insert(now);
        self.last_token = Some(now);
    }

    /// The final success event went out.
    pub(super) fn completed(&mut self) {
        self.phase = Phase::Completed;
    }

    /// The stream ended with an error event of the guard's.
    pub(super) fn tripped(&mut self) {
        self.phase = Phase::Tripped;
    }
}

impl Drop for StreamEnd {
    fn drop(&mut self) {
        let outcome = match self.phase {
            Phase::Completed => "success",
            Phase::Tripped => "guard_error",
            Phase::Open => "client_cancelled",
        };
        if let (Some(first), Some(last)) = (self.first_token, self.last_token) {
            self.report.token_times(first, last);
        }
        self.report.outcome(outcome);
    }
}
