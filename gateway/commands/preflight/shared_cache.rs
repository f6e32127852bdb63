//! The shared-cache check of a target (issue 40): two probe tenants with different cache
//! salts must not share any level of the engine's cache.
//!
//! The salt keeps tenants apart in the engine's GPU prefix cache, but a tier below it may
//! key pages by their tokens alone (SGLang's HiCache storage, LMCache) or take no salt at
//! all (llama.cpp's host-RAM prompt cache). So, [`ROUNDS`] times: probe tenant A sends a
//! fresh long prompt P; probe tenant B (another salt) sends the same P; then B sends a
//! fresh prompt Q of the same length, a cold prefill. Each asks for one new token, so the
//! time to its answer is its time to first token.
//!
//! The rule, stated in the report:
//! - by count, where the engine reports cached tokens: B found more of P cached than of its
//!   own fresh Q (anything its own earlier prompts share, like a chat template's start,
//!   counts in both) in any round → FAIL;
//! - by time: B's median time to first token on P below [`HIT_RATIO`] of the median on Q,
//!   and at least [`MIN_GAP`] below it → FAIL (an engine whose cold prefill is faster than
//!   that cannot show a hit in its timing; the count decides alone then, and when the
//!   engine reports no count either the check is a WARN: nothing was proven).
//!
//! It runs only where the pool keeps tenants apart (`Pool::separates_tenants`: salts, and
//! more than one tenant may use it); its prompts are not part of the cross-probe check, as
//! B's answer to A's prompt rightly echoes A's prompt.

use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use super::capacity::TokenBudget;
use super::probes::Prober;
use super::report::{ProbeResult, Verdict};
use crate::stack::api::Endpoint;
use crate::stack::guard::inspect::Expectation;

/// Rounds of (A's prompt, B's same prompt, B's fresh prompt).
pub(super) const ROUNDS: usize = 5;
/// Tokens of each prompt at most: long enough that its prefill takes measurable time.
const PROMPT_TOKENS: u64 = 2048;
/// B's median below this share of the cold median is a hit.
const HIT_RATIO: f64 = 0.5;
/// ... and below it by at least this much.
const MIN_GAP: Duration = Duration::from_millis(10);

const NAME: &str = "tenant B resends tenant A's prompt";

/// One request's outcome: served, its cached tokens and its time.
struct Timed {
    served: bool,
    cached: Option<u64>,
    elapsed: Duration,
    why: Option<String>,
}

impl Prober<'_> {
    /// The check, or None where the pool does not keep tenants apart.
    pub(super) async fn shared_cache(
        &self,
        endpoint: Endpoint,
        limit: u64,
        budget: &mut TokenBudget,
    ) -> Option<ProbeResult> {
        let (salt_a, salt_b) = self.salts.clone()?;
        if !self.pool.separates_tenants {
            return None;
        }
        let tokens = PROMPT_TOKENS.min(limit / 2).max(1);
        let mut result = ProbeResult {
            kind: "shared-cache",
            name: NAME.into(),
            endpoint: endpoint.path(),
            stream: false,
            prompt_tokens: tokens,
            expect: "no cache hit across salts",
            verdict: Verdict::Skipped,
            detail: String::new(),
            evidence: None,
            prefill_evidence: None,
        };
        let (mut same, mut cold) = (Vec::new(), Vec::new());
        for round in 1..=ROUNDS {
            if !budget.take(3 * tokens) {
                result.detail = format!(
                    "over the token budget after {} of {ROUNDS} rounds ({} of {} spent)",
                    round - 1,
                    budget.spent,
                    budget.limit
                );
                return Some(result);
            }
            let built = self
                .prompt(endpoint, tokens)
                .and_then(|p| Ok((p, self.prompt(endpoint, tokens)?)));
            let (shared, fresh) = match built {
                Ok(pair) => pair,
                Err(e) => {
                    result.verdict = Verdict::Fail;
                    result.detail = format!("the probe prompt could not be built: {e}");
                    return Some(result);
                }
            };
            let a = self.timed(endpoint, &shared.fields, &salt_a, tokens).await;
            let b = self.timed(endpoint, &shared.fields, &salt_b, tokens).await;
            let q = self.timed(endpoint, &fresh.fields, &salt_b, tokens).await;
            for (who, t) in [("A", &a), ("B", &b), ("B's fresh prompt", &q)] {
                if !t.served {
                    result.verdict = Verdict::Fail;
                    result.detail = format!(
                        "round {round}: tenant {who} was not served a prompt below the limit ({tokens} < {limit}): {}",
                        t.why.as_deref().unwrap_or("no answer")
                    );
                    return Some(result);
                }
            }
            same.push(b);
            cold.push(q);
        }
        let (verdict, detail) = judge(&same, &cold, tokens);
        result.verdict = verdict;
        result.detail = detail;
        Some(result)
    }

    /// Send `fields` under `salt` for one new token, timed from send to the whole answer.
    async fn timed(
        &self,
        endpoint: Endpoint,
        fields: &serde_json::Map<String, serde_json::Value>,
        salt: &str,
        tokens: u64,
    ) -> Timed {
        let tolerance = if endpoint == Endpoint::Generate {
            0
        } else {
            self.chat_tolerance
        };
        let expectation = Expectation {
            prompt_tokens: Some(Arc::from(vec![tokens])),
            tolerance,
        };
        let started = Instant::now();
        let exchange = self
            .exchange(
                endpoint,
                false,
                fields.clone(),
                Some(salt.to_owned()),
                1,
                &expectation,
            )
            .await;
        let elapsed = started.elapsed();
        let a = exchange.answer;
        Timed {
            served: a.success_like,
            cached: a.cached_tokens,
            elapsed,
            why: a.refusal.or(a.guard_trip),
        }
    }
}

fn median(mut times: Vec<Duration>) -> Duration {
    times.sort();
    times.get(times.len() / 2).copied().unwrap_or_default()
}

fn ms(d: Duration) -> String {
    format!("{:.1} ms", d.as_secs_f64() * 1e3)
}

/// The verdict over the rounds: B's answers to A's prompts (`same`) against B's fresh
/// prompts (`cold`).
fn judge(same: &[Timed], cold: &[Timed], tokens: u64) -> (Verdict, String) {
    let rounds = same.len();
    // By count: more of A's prompt cached than of a fresh prompt of B's own.
    let counted = same.iter().zip(cold).enumerate().find_map(|(i, (b, q))| {
        let (Some(b), Some(q)) = (b.cached, q.cached) else {
            return None;
        };
        (b > q).then_some((i + 1, b, q))
    });
    let reported = same.iter().chain(cold).all(|t| t.cached.is_some());
    let med_same = median(same.iter().map(|t| t.elapsed).collect());
    let med_cold = median(cold.iter().map(|t| t.elapsed).collect());
    let timing = format!(
        "median time to first token {} for tenant B on tenant A's prompt against {} for a cold prefill of a fresh prompt of the same length ({rounds} rounds of {tokens} tokens; a hit is below {:.0}% of the cold median and at least {} below it)",
        ms(med_same),
        ms(med_cold),
        HIT_RATIO * 100.0,
        ms(MIN_GAP)
    );
    if let Some((round, b, q)) = counted {
        return (
            Verdict::Fail,
            format!(
                "round {round}: tenant B (another cache salt) got cached_tokens {b} for tenant A's prompt, against {q} for a fresh prompt of its own: a cache level shared across salts served another tenant's prompt; {timing}"
            ),
        );
    }
    let timing_hit = med_same.as_secs_f64() < HIT_RATIO * med_cold.as_secs_f64()
        && med_cold.saturating_sub(med_same) >= MIN_GAP;
    if timing_hit {
        return (
            Verdict::Fail,
            format!(
                "tenant B's time to first token shows a cache hit on tenant A's prompt{}: a cache level shared across salts served another tenant's prompt, silently; {timing}",
                if reported {
                    " although the engine reports no cached tokens for it"
                } else {
                    ""
                }
            ),
        );
    }
    let timing_can_tell = med_cold >= MIN_GAP.saturating_mul(2);
    match (reported, timing_can_tell) {
        (false, false) => (
            Verdict::Warn,
            format!(
                "unproven: the engine reports no cached tokens and prefills too fast here for its timing to show a hit; {timing}"
            ),
        ),
        (true, false) => (
            Verdict::Pass,
            format!(
                "no cached tokens across salts in {rounds} rounds (the engine prefills too fast here for its timing to tell); {timing}"
            ),
        ),
        (reported, true) => (
            Verdict::Pass,
            format!(
                "no hit across salts{}; {timing}",
                if reported {
                    ", by cached_tokens and by timing"
                } else {
                    " by timing (the engine reports no cached tokens)"
                }
            ),
        ),
    }
}

#[cfg(test)]
mod tests;
