//! The cross-probe check: no probe's answer may hold another probe's prompt.
//!
//! Every probe prompt carries a nonce of its own (see `prompt`), and a correct engine
//! answers each prompt from its own KV. An answer that holds another probe's nonce, or text
//! of another probe's prompt judged by the leak detector's own n-gram test (each probe
//! recorded as if it were a tenant of its own, each answer scanned as its probe's tenant,
//! with `ngram` and `min_matches` from `[isolation]`), was served from another request's
//! pages — the incident's "v3 shape", which status, finish reason and `prompt_tokens` alone
//! cannot show. Text all probes share (the padding, the unit's words) is common to several
//! "tenants" and never counts, nor does an answer echoing its own prompt.

use std::time::{Duration, Instant};

use super::report::{ProbeResult, Verdict};
use crate::config::IsolationConfig;
use crate::stack::isolate::leak::units::units_of;
use crate::stack::isolate::leak::{FingerprintStore, LeakDetectorConfig};

/// What one probe sent: its label (see [`label`]), nonce and prompt text.
#[derive(Debug, Clone)]
pub(super) struct Sent {
    pub(super) label: String,
    pub(super) nonce: Option<String>,
    pub(super) text: String,
}

/// A probe's name in a finding: kind, route, name and whether it streamed (unique within
/// a target).
pub(super) fn label(r: &ProbeResult) -> String {
    format!(
        "{} {} {}{}",
        r.kind,
        r.endpoint,
        r.name,
        if r.stream { " (stream)" } else { "" }
    )
}

/// The n-gram test's settings: `[isolation]`'s, over a store sized to what is recorded and
/// remembering it for the whole run.
fn detector(isolation: &IsolationConfig, units: usize) -> LeakDetectorConfig {
    LeakDetectorConfig {
        ngram: isolation.ngram,
        min_matches: isolation.min_matches,
        window: Duration::from_secs(24 * 3600),
        // One entry per recorded unit at most; twice that keeps every shard below its cap.
        // Probe prompts repeat one unit, so their distinct n-grams are far fewer than their
        // units: the cap only bounds the filter's memory for huge windows.
        max_entries: units.saturating_mul(2).clamp(1 << 10, 1 << 22),
    }
}

/// Marks FAIL every answer in `results` that holds another probe's nonce or prompt text.
pub(super) fn check(results: &mut [ProbeResult], sent: &[Sent], isolation: &IsolationConfig) {
    if sent.len() < 2 {
        return;
    }
    let units: Vec<Vec<u32>> = sent.iter().map(|s| units_of(&s.text)).collect();
    let now = Instant::now();
    let store = FingerprintStore::new(detector(isolation, units.iter().map(Vec::len).sum()));
    for (s, u) in sent.iter().zip(&units) {
        store.record_prompt(&s.label, u, now);
    }
    for r in results.iter_mut() {
        let Some(answer) = r.evidence.as_ref().map(|o| o.text.clone()) else {
            continue;
        };
        if answer.is_empty() {
            continue;
        }
        let own = label(r);
        let own_units = sent
            .iter()
            .zip(&units)
            .find(|(s, _)| s.label == own)
            .map_or(&[][..], |(_, u)| &u[..]);
        let answer_units = units_of(&answer);
        let mut scanner = store.scanner(&own);
        scanner.feed(&answer_units, now);
        let suspected = scanner.suspicion().is_some();
        let mut found = Vec::new();
        for (s, u) in sent.iter().zip(&units) {
            if s.label == own || s.nonce.as_deref().is_some_and(|n| r.detail.contains(n)) {
                // Itself, or already named by the isolation probes' own check.
                continue;
            }
            if let Some(nonce) = s.nonce.as_deref().filter(|n| answer.contains(n)) {
                found.push(format!(
                    "answer of \"{own}\" holds text of probe \"{}\" (nonce {nonce})",
                    s.label
                ));
            } else if suspected
                && pairwise(
                    isolation,
                    (&own, own_units),
                    (&s.label, u),
                    &answer_units,
                    now,
                )
            {
                found.push(format!(
                    "answer of \"{own}\" holds text of probe \"{}\" (n-grams of its prompt)",
                    s.label
                ));
            }
        }
        if found.is_empty() && suspected {
            found.push(format!(
                "answer of \"{own}\" holds text of another probe's prompt (n-grams)"
            ));
        }
        if found.is_empty() {
            continue;
        }
        let finding = format!(
            "{}: the engine answered from another request's KV (stale pages or a shared cache)",
            found.join("; ")
        );
        r.detail = match r.verdict {
            Verdict::Fail => format!("{}; also: {finding}", r.detail),
            _ => finding,
        };
        r.verdict = Verdict::Fail;
    }
}

/// Whether `answer` holds text of `other`'s prompt that `own`'s does not: the n-gram test
/// with only the two recorded (label, units), so the finding can name `other`.
fn pairwise(
    isolation: &IsolationConfig,
    own: (&str, &[u32]),
    other: (&str, &[u32]),
    answer: &[u32],
    now: Instant,
) -> bool {
    let store = FingerprintStore::new(detector(isolation, own.1.len() + other.1.len()));
    store.record_prompt(own.0, own.1, now);
    store.record_prompt(other.0, other.1, now);
    let mut scanner = store.scanner(own.0);
    scanner.feed(answer, now);
    scanner.suspicion().is_some()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::commands::preflight::Observed;

    fn probe(name: &str, answer: &str) -> ProbeResult {
        let mut evidence = Observed::unanswered(String::new());
        evidence.status = 200;
        evidence.text = answer.to_owned();
        ProbeResult {
            kind: "boundary",
            name: name.into(),
            endpoint: "/generate",
            stream: false,
            prompt_tokens: 10,
            expect: "accept",
            verdict: Verdict::Pass,
            detail: "served".into(),
            evidence: Some(evidence),
            prefill_evidence: None,
        }
    }

    fn sent(name: &str, nonce: &str, text: &str) -> Sent {
        Sent {
            label: format!("boundary /generate {name}"),
            nonce: Some(nonce.into()),
            text: text.into(),
        }
    }

    const SHARED: &str = "Probe checks the engine's limits before it is sent to the engine.";

    #[test]
    fn an_answer_holding_another_probes_text_without_its_nonce_fails_naming_both() {
        let secret = "Alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima";
        let a_text = format!("{SHARED} kvgateaaaa {secret} {SHARED}");
        let b_text = format!("{SHARED} kvgatebbbb {SHARED}");
        let sent = vec![
            sent("a", "kvgateaaaa", &a_text),
            sent("b", "kvgatebbbb", &b_text),
        ];
        // B's answer holds a stretch of A's prompt, but not A's nonce.
        let mut results = vec![probe("a", SHARED), probe("b", secret)];
        check(&mut results, &sent, &IsolationConfig::default());
        assert_eq!(results[0].verdict, Verdict::Pass, "{}", results[0].detail);
        assert_eq!(results[1].verdict, Verdict::Fail);
        assert!(
            results[1].detail.contains(
                "answer of \"boundary /generate b\" holds text of probe \"boundary /generate a\" (n-grams of its prompt)"
            ),
            "{}",
            results[1].detail
        );
    }

    #[test]
    fn an_answer_holding_another_probes_nonce_fails_even_when_already_failed() {
        let sent = vec![
            sent(
                "a",
                "kvgate0123456789abcdef",
                "Probe kvgate0123456789abcdef checks.",
            ),
            sent(
                "b",
                "kvgatefedcba9876543210",
                "Probe kvgatefedcba9876543210 checks.",
            ),
        ];
        let mut results = vec![
            probe("a", "checks."),
            probe("b", "Probe kvgate0123456789abcdef"),
        ];
        results[1].verdict = Verdict::Fail;
        results[1].detail = "prompt_tokens 1, expected 10".into();
        check(&mut results, &sent, &IsolationConfig::default());
        assert_eq!(results[0].verdict, Verdict::Pass);
        assert_eq!(results[1].verdict, Verdict::Fail);
        assert!(
            results[1].detail.starts_with("prompt_tokens 1, expected 10; also: answer of \"boundary /generate b\" holds text of probe \"boundary /generate a\" (nonce kvgate0123456789abcdef)"),
            "{}",
            results[1].detail
        );
    }

    #[test]
    fn answers_echoing_their_own_prompts_pass() {
        let a_text =
            format!("{SHARED} Probe kvgate1111 one two three four five six seven eight nine ten");
        let b_text =
            format!("{SHARED} Probe kvgate2222 one two three four five six seven eight nine ten");
        let sent = vec![
            sent("a", "kvgate1111", &a_text),
            sent("b", "kvgate2222", &b_text),
        ];
        let mut results = vec![probe("a", &a_text), probe("b", &b_text[20..])];
        check(&mut results, &sent, &IsolationConfig::default());
        for r in &results {
            assert_eq!(r.verdict, Verdict::Pass, "{}", r.detail);
        }
    }
}
