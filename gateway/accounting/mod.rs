//! Per-tenant accounting (issue 40): what each tenant used, by model and outcome, in the
//! metrics, the audit log and the status page.
//!
//! A request's [`Ledger`] is put in its extensions by `stack::rescue` (the outermost stage),
//! named for a tenant and model by `stack::tenant_rules` (both come from the config, never
//! from the client: a request that never gets that far is counted in
//! `kvgate_request_outcomes_total` only), given the engine's usage and the stream's token
//! timings by `stack::guard`, and settled once: by rescue for a whole answer, at the
//! stream's end for a stream. Settling adds to the tenant's counters (handles looked up
//! once per tenant × model when the config is loaded, [`Accounting::configure`]), to the
//! pool's latency histograms and to the tenant's last hour ([`TenantHour`], the status
//! page's table).
//!
//! Every tenant × model × outcome series exists at zero from start-up and from the reload
//! that adds a tenant or model, so alerts and dashboards never meet an absent series.

mod book;
mod ledger;
mod usage;
mod window;

#[cfg(test)]
mod tests;

pub use book::{Accounting, Book};
pub use ledger::{Ledger, LedgerSnapshot};
pub use usage::TokenUsage;
pub use window::{HourCounts, TenantHour, HOUR_MINUTES};

/// A tenant request's outcome, as its counters are labelled: a small fixed set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// Served: a whole answer, or a stream that reached its end.
    Ok,
    /// Refused by the gateway (limits, admission, queue, rules, overload).
    Refused,
    /// The engine failed: unreachable, timed out, an error status, a broken protocol.
    EngineError,
    /// The guard stopped the answer (I1) or found another tenant's data in it (I5).
    GuardTrip,
    /// The client left before its stream ended.
    ClientGone,
    /// A fault of the gateway itself.
    InternalError,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 6] = [
        Outcome::Ok,
        Outcome::Refused,
        Outcome::EngineError,
        Outcome::GuardTrip,
        Outcome::ClientGone,
        Outcome::InternalError,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Refused => "refused",
            Outcome::EngineError => "engine_error",
            Outcome::GuardTrip => "guard_trip",
            Outcome::ClientGone => "client_gone",
            Outcome::InternalError => "internal_error",
        }
    }

    /// The outcome of an error answer with `code` (`GatewayError::code`): `upstream_*`
    /// codes are the engine's failures, `internal_error` the gateway's, every other code a
    /// refusal.
    pub fn of_error_code(code: &str) -> Self {
        if code.starts_with("upstream_") {
            Outcome::EngineError
        } else if code == "internal_error" {
            Outcome::InternalError
        } else {
            Outcome::Refused
        }
    }

    /// The outcome of a stream's end as the guard names it (`success`, `guard_error`,
    /// `client_cancelled`).
    pub fn of_stream_end(outcome: &str) -> Self {
        match outcome {
            "success" => Outcome::Ok,
            "guard_error" => Outcome::GuardTrip,
            _ => Outcome::ClientGone,
        }
    }

    fn index(self) -> usize {
        self as usize
    }
}
