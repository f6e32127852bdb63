//! The verdict on one probe's exchange: what a prompt below the limit must get (served,
//! counted exactly, no marker) and what one at or over it must get (a clear error).

use super::answer::Observed;
use super::report::Verdict;

/// What a probe must get.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) enum Expect {
    /// Served, correctly counted, no marker.
    Accept,
    /// A clear error.
    Refuse,
}

impl Expect {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            Expect::Accept => "accept",
            Expect::Refuse => "refuse",
        }
    }
}

pub(super) struct Exchange {
    pub(super) answer: Observed,
    pub(super) prefill: Option<Observed>,
}

/// The verdict on one exchange.
pub(super) fn judge(
    exchange: &Exchange,
    expect: Expect,
    tokens: u64,
    limit: u64,
) -> (Verdict, String) {
    let a = &exchange.answer;
    match expect {
        Expect::Accept => {
            if let Some(p) = &exchange.prefill {
                if !(200..300).contains(&p.status) || p.refusal.is_some() {
                    return (
                        Verdict::Fail,
                        format!(
                            "the prefill worker did not serve a prompt below the limit ({tokens} < {limit}): {}",
                            p.refusal.as_deref().unwrap_or("no answer")
                        ),
                    );
                }
            }
            if !a.success_like {
                return (
                    Verdict::Fail,
                    format!(
                        "a prompt below the limit ({tokens} < {limit}) was not served: {}",
                        a.refusal
                            .as_deref()
                            .or(a.guard_trip.as_deref())
                            .unwrap_or("no final finish reason")
                    ),
                );
            }
            if let Some(trip) = &a.guard_trip {
                return (
                    Verdict::Fail,
                    format!("served, but the answer is wrong: {trip}"),
                );
            }
            (
                Verdict::Pass,
                format!(
                    "served, prompt_tokens {}",
                    a.prompt_tokens
                        .map_or_else(|| "not reported".to_owned(), |n| n.to_string())
                ),
            )
        }
        Expect::Refuse => {
            if a.success_like {
                let cause = match a.prompt_tokens {
                    Some(n) if n != tokens => format!(
                        "; the engine reports prompt_tokens {n} for the {tokens} sent: it answered from a placeholder, not the prompt — the incident (an over-long prompt aborted inside the engine, then served from stale KV pages with a 200)"
                    ),
                    _ => String::new(),
                };
                return (
                    Verdict::Fail,
                    format!(
                        "an over-limit prompt ({tokens} ≥ limit {limit}) got a success (HTTP {}, finish_reason {}) instead of a clear error{cause}",
                        a.status,
                        a.finish_reason.as_deref().unwrap_or("none")
                    ),
                );
            }
            if a.status == 0 {
                return (
                    Verdict::Fail,
                    format!(
                        "an over-limit prompt got no answer at all, not a clear error: {}",
                        a.refusal.as_deref().unwrap_or("no answer")
                    ),
                );
            }
            (
                Verdict::Pass,
                format!("refused: {}", a.refusal.as_deref().unwrap_or("no success")),
            )
        }
    }
}
