//! The prefill leg of a PD request: its worker's whole answer (a response extension from
//! dispatch) is checked before the decode answer is looked at, and a trip there blames the
//! prefill worker in its pool's window.

use http::Response;

use super::extensions::PrefillAnswer;
use super::inspect::{self, Expectation};
use super::plan::GuardPlan;
use super::report::TripReport;
use crate::body::BoxBody;
use crate::error::GatewayError;

/// Check the prefill answer `response` carries, if any (and take it off the response: its
/// buffer reservation is released once it has been checked).
pub(super) fn check_prefill_answer(
    response: &mut Response<BoxBody>,
    plan: &GuardPlan<'_>,
    expect: &Expectation,
    report: &TripReport,
) -> Result<(), GatewayError> {
    let Some(PrefillAnswer(prefill, _held)) = response.extensions_mut().remove::<PrefillAnswer>()
    else {
        return Ok(());
    };
    if !plan.checks {
        return Ok(());
    }
    if let Err(trip) = inspect::check_prefill(plan.shape, &prefill, expect) {
        report.blame_prefill();
        return Err(report.record(&trip));
    }
    Ok(())
}
