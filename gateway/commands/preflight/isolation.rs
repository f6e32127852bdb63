//! The isolation probes of a target, on its first route, before the boundaries.
//!
//! Probe tenant A plants its nonce in a long prompt. Probe tenant B then sends an over-limit
//! prompt, a short one, one just below the limit and a long one (the longest that leaves
//! room for [`ISOLATION_NEW_TOKENS`] new tokens below the limit); A's nonce
//! in any of B's answers is a FAIL. Each of these prompts carries its own nonce too, and the
//! cross-probe check (`cross`) holds every answer against every other probe's prompt, so an
//! answer read from any other probe's pages is caught, whichever tenant sent it.
//!
//! Why these four for B: the over-limit prompt is where the incident's engine answered from
//! a placeholder's stale pages; the short prompt fits any pool, so its pages surely hold its
//! nonce; the prompts just below the limit and the long one are where an engine that
//! overstates its KV pool (and admits by its context length) gets stale pages for a prompt
//! it cannot hold. The one just below the limit has room for only a few new tokens beside
//! it (as the boundary probe there); the long one asks for enough that an answer read from
//! stale pages shows a whole nonce.

use super::capacity::TokenBudget;
use super::probes::{failed_to_build, Prober};
use super::report::{ProbeResult, Verdict};
use super::verdict::Expect;
use crate::stack::api::Endpoint;

/// Tokens of tenant A's planted prompt at most: long enough to fill many KV pages.
const PLANT_TOKENS: u64 = 8192;
/// Tokens of tenant B's short prompt.
const SHORT_TOKENS: u64 = 64;
/// New tokens of the isolation probes that have room for them: enough that an answer read
/// from another prompt's pages shows a whole nonce.
const ISOLATION_NEW_TOKENS: u64 = 48;

const PLANT: &str = "tenant A plants a nonce";
const OVER: &str = "tenant B over-limit prompt";
const SHORT: &str = "tenant B short prompt";
const BELOW: &str = "tenant B prompt at limit - 1";
const LONG: &str = "tenant B long prompt";

impl Prober<'_> {
    pub(super) async fn isolation(
        &self,
        endpoint: Endpoint,
        limit: u64,
        budget: &mut TokenBudget,
    ) -> Vec<ProbeResult> {
        let (salt_a, salt_b) = match &self.salts {
            Some((a, b)) => (Some(a.clone()), Some(b.clone())),
            None => (None, None),
        };
        // The longest prompt that leaves room for the new tokens below the limit.
        let long_tokens = limit.saturating_sub(1 + ISOLATION_NEW_TOKENS);
        let plant_tokens = PLANT_TOKENS.min(long_tokens);
        let mut results = Vec::new();
        let plant = match self.prompt(endpoint, plant_tokens) {
            Ok(p) => p,
            Err(e) => {
                results.push(failed_to_build(
                    "isolation",
                    endpoint,
                    false,
                    PLANT,
                    plant_tokens,
                    &e,
                ));
                return results;
            }
        };
        let Some(nonce) = plant.nonce.clone() else {
            let e = "the nonce does not survive tokenizing and decoding";
            results.push(failed_to_build(
                "isolation",
                endpoint,
                false,
                PLANT,
                plant_tokens,
                e,
            ));
            return results;
        };
        let mut planted = self
            .probe(
                "isolation",
                PLANT.into(),
                endpoint,
                false,
                plant,
                Expect::Accept,
                limit,
                salt_a,
                ISOLATION_NEW_TOKENS,
                budget,
            )
            .await;
        if planted.verdict == Verdict::Pass {
            planted.detail = format!("served; its prompt holds nonce {nonce}");
        }
        let planted_ok = planted.verdict == Verdict::Pass;
        results.push(planted);
        if !planted_ok {
            // Without A's prompt in the engine there is nothing for B to find.
            for name in [OVER, SHORT, BELOW, LONG] {
                results.push(ProbeResult {
                    kind: "isolation",
                    name: name.into(),
                    endpoint: endpoint.path(),
                    stream: false,
                    prompt_tokens: 0,
                    expect: "no foreign text",
                    verdict: Verdict::Skipped,
                    detail: "tenant A's prompt was not served, so there is nothing to look for"
                        .into(),
                    evidence: None,
                    prefill_evidence: None,
                });
            }
            return results;
        }
        // The over-limit prompt asks for as many new tokens as fit the window beside it, so
        // the engine's input-limit path answers it, not its context-length check.
        let over_new = self
            .window
            .saturating_sub(limit + 2)
            .min(ISOLATION_NEW_TOKENS)
            .max(self.settings.max_new_tokens);
        let probes = [
            (OVER, limit + 1, Expect::Refuse, over_new),
            (SHORT, SHORT_TOKENS, Expect::Accept, ISOLATION_NEW_TOKENS),
            (
                BELOW,
                limit.saturating_sub(1),
                Expect::Accept,
                self.settings.max_new_tokens,
            ),
            (LONG, long_tokens, Expect::Accept, ISOLATION_NEW_TOKENS),
        ];
        for (name, tokens, expect, max_new) in probes {
            let prompt = match self.prompt(endpoint, tokens) {
                Ok(p) => p,
                Err(e) => {
                    results.push(failed_to_build(
                        "isolation",
                        endpoint,
                        false,
                        name,
                        tokens,
                        &e,
                    ));
                    continue;
                }
            };
            let mut r = self
                .probe(
                    "isolation",
                    name.into(),
                    endpoint,
                    false,
                    prompt,
                    expect,
                    limit,
                    salt_b.clone(),
                    max_new,
                    budget,
                )
                .await;
            let leaked = r.evidence.as_ref().is_some_and(|o| o.text.contains(&nonce));
            if leaked {
                r.verdict = Verdict::Fail;
                r.detail = format!(
                    "tenant B's answer holds tenant A's nonce {nonce}: the engine served another tenant's KV (stale pages or a shared prefix cache){}",
                    if r.detail.is_empty() { String::new() } else { format!("; also: {}", r.detail) }
                );
            } else if r.verdict == Verdict::Pass {
                r.detail = format!("{}; no trace of tenant A's nonce", r.detail);
            }
            r.expect = if expect == Expect::Accept {
                "accept, no foreign text"
            } else {
                "refuse, no foreign text"
            };
            results.push(r);
        }
        results
    }
}
