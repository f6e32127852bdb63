//! The preflight report: per pool and worker (or prefill/decode pair), the capacity
//! findings and every probe with its verdict and evidence; printed for people, `--json`
//! for pipelines, and the exit code.

use serde::Serialize;
use std::fmt;

use super::answer::Observed;

/// One finding's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Verdict {
    Pass,
    /// Safe behind kvgate but worth fixing (the gateway refuses what the engine cannot do).
    Warn,
    Fail,
    /// Not run: the token budget was spent.
    Skipped,
}

impl Verdict {
    fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "PASS",
            Verdict::Warn => "WARN",
            Verdict::Fail => "FAIL",
            Verdict::Skipped => "SKIPPED",
        }
    }
}

/// What one probe sent, what it expected, and what came back.
#[derive(Debug, Clone, Serialize)]
pub struct ProbeResult {
    /// `boundary` or `isolation`.
    pub kind: &'static str,
    /// e.g. `limit + 1`, `tenant B short prompt`.
    pub name: String,
    /// The engine route.
    pub endpoint: &'static str,
    pub stream: bool,
    /// Prompt tokens sent.
    pub prompt_tokens: u64,
    /// `accept` (must be served correctly) or `refuse` (must get a clear error).
    pub expect: &'static str,
    pub verdict: Verdict,
    /// Why, in a sentence.
    pub detail: String,
    /// The decode (or unified) worker's answer; None when skipped.
    pub evidence: Option<Observed>,
    /// The prefill worker's answer, for a prefill/decode pair.
    pub prefill_evidence: Option<Observed>,
}

/// The capacity a worker reports against the model's window.
#[derive(Debug, Clone, Serialize)]
pub struct WorkerCapacity {
    pub role: &'static str,
    pub worker: String,
    pub version: Option<String>,
    pub context_length: Option<u64>,
    pub max_total_num_tokens: Option<u64>,
    pub max_req_input_len: Option<u64>,
    /// The prompt limit kvgate enforces for it (prompts must be below it).
    pub input_limit: Option<u64>,
    /// Discovery's failure, when `/get_server_info` could not be read.
    pub discovery_error: Option<String>,
    /// Why it may not serve (e.g. below `min_engine_version`).
    pub ineligible: Option<String>,
}

/// One finding about capacity.
#[derive(Debug, Clone, Serialize)]
pub struct Finding {
    pub verdict: Verdict,
    pub detail: String,
}

/// One worker, or one prefill/decode pair, of a pool.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    pub pool: String,
    pub model: String,
    /// `unified` or `disaggregated`.
    pub mode: &'static str,
    /// The worker, or `prefill → decode`.
    pub target: String,
    pub model_context_window: u64,
    /// The limit the probes are placed around.
    pub input_limit: Option<u64>,
    pub workers: Vec<WorkerCapacity>,
    pub capacity: Vec<Finding>,
    pub probes: Vec<ProbeResult>,
    /// Its workers that did not answer at all (`role host:port: why`): then nothing was
    /// probed, and each counts as one failure.
    pub unreachable: Vec<String>,
}

impl TargetReport {
    fn verdicts(&self) -> impl Iterator<Item = Verdict> + '_ {
        self.capacity
            .iter()
            .map(|f| f.verdict)
            .chain(self.probes.iter().map(|p| p.verdict))
            .chain(self.unreachable.iter().map(|_| Verdict::Fail))
    }
}

/// The whole run.
#[derive(Debug, Clone, Serialize)]
pub struct PreflightReport {
    /// PASS, FAIL, or SKIPPED (nothing failed, but the budget left probes unrun).
    pub result: Verdict,
    pub token_budget: u64,
    pub tokens_sent: u64,
    pub targets: Vec<TargetReport>,
}

impl PreflightReport {
    pub fn new(token_budget: u64, tokens_sent: u64, targets: Vec<TargetReport>) -> Self {
        let all = || targets.iter().flat_map(TargetReport::verdicts);
        let result = if targets.is_empty() || all().any(|v| v == Verdict::Fail) {
            Verdict::Fail
        } else if all().any(|v| v == Verdict::Skipped) {
            Verdict::Skipped
        } else {
            Verdict::Pass
        };
        Self {
            result,
            token_budget,
            tokens_sent,
            targets,
        }
    }

    /// 0 when every probe passed, 1 when any failed, 2 when some could not run.
    pub fn exit_code(&self) -> u8 {
        match self.result {
            Verdict::Pass | Verdict::Warn => 0,
            Verdict::Fail => 1,
            Verdict::Skipped => 2,
        }
    }

    fn count(&self, verdict: Verdict) -> usize {
        self.targets
            .iter()
            .flat_map(|t| &t.probes)
            .filter(|p| p.verdict == verdict)
            .count()
    }
}

fn evidence(f: &mut fmt::Formatter<'_>, label: &str, o: &Observed) -> fmt::Result {
    write!(f, "          {label}: status {}", o.status)?;
    if let Some(r) = &o.finish_reason {
        write!(f, ", finish_reason {r}")?;
    }
    if let Some(n) = o.prompt_tokens {
        write!(f, ", prompt_tokens reported {n}")?;
    }
    if let Some(r) = &o.refusal {
        write!(f, ", refusal: {r}")?;
    }
    writeln!(f)?;
    if !o.first_bytes.is_empty() {
        writeln!(
            f,
            "          first bytes: {}",
            o.first_bytes.replace('\n', "\\n")
        )?;
    }
    Ok(())
}

impl fmt::Display for PreflightReport {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for t in &self.targets {
            writeln!(
                f,
                "pool `{}` (model `{}`, {}): {}",
                t.pool, t.model, t.mode, t.target
            )?;
            for u in &t.unreachable {
                writeln!(f, "  {:<7} unreachable, not probed: {u}", "FAIL")?;
            }
            if !t.unreachable.is_empty() {
                continue;
            }
            for w in &t.workers {
                let n = |v: Option<u64>| v.map_or_else(|| "?".to_owned(), |v| v.to_string());
                writeln!(
                    f,
                    "    {:<7} {} version {}: context_length {}, max_total_num_tokens {}, max_req_input_len {}",
                    w.role,
                    w.worker,
                    w.version.as_deref().unwrap_or("unknown"),
                    n(w.context_length),
                    n(w.max_total_num_tokens),
                    n(w.max_req_input_len),
                )?;
            }
            for c in &t.capacity {
                writeln!(f, "  {:<7} capacity  {}", c.verdict.as_str(), c.detail)?;
            }
            for p in &t.probes {
                writeln!(
                    f,
                    "  {:<7} {:<9} {:<20} {:<6} {} ({} tokens): {}",
                    p.verdict.as_str(),
                    p.kind,
                    p.endpoint,
                    if p.stream { "stream" } else { "" },
                    p.name,
                    p.prompt_tokens,
                    p.detail
                )?;
                if p.verdict == Verdict::Fail {
                    if let Some(o) = &p.evidence {
                        evidence(f, "evidence", o)?;
                    }
                    if let Some(o) = &p.prefill_evidence {
                        evidence(f, "prefill", o)?;
                    }
                }
            }
        }
        writeln!(
            f,
            "{}: {} passed, {} failed, {} skipped, {} unreachable; {} of {} budget tokens sent",
            self.result.as_str(),
            self.count(Verdict::Pass),
            self.count(Verdict::Fail),
            self.count(Verdict::Skipped),
            self.targets
                .iter()
                .map(|t| t.unreachable.len())
                .sum::<usize>(),
            self.tokens_sent,
            self.token_budget
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn target(verdicts: &[Verdict]) -> TargetReport {
        TargetReport {
            pool: "p".into(),
            model: "m".into(),
            mode: "unified",
            target: "w".into(),
            model_context_window: 10,
            input_limit: Some(5),
            workers: Vec::new(),
            capacity: vec![Finding {
                verdict: Verdict::Warn,
                detail: "mismatch".into(),
            }],
            probes: verdicts
                .iter()
                .map(|&verdict| ProbeResult {
                    kind: "boundary",
                    name: "limit".into(),
                    endpoint: "/generate",
                    stream: false,
                    prompt_tokens: 5,
                    expect: "refuse",
                    verdict,
                    detail: String::new(),
                    evidence: None,
                    prefill_evidence: None,
                })
                .collect(),
            unreachable: Vec::new(),
        }
    }

    #[test]
    fn the_exit_code_follows_the_worst_verdict() {
        let pass = PreflightReport::new(100, 5, vec![target(&[Verdict::Pass])]);
        assert_eq!(
            (pass.result, pass.exit_code()),
            (Verdict::Pass, 0),
            "a warning alone passes"
        );
        let skipped =
            PreflightReport::new(100, 5, vec![target(&[Verdict::Pass, Verdict::Skipped])]);
        assert_eq!(skipped.exit_code(), 2);
        let failed = PreflightReport::new(
            100,
            5,
            vec![target(&[Verdict::Skipped]), target(&[Verdict::Fail])],
        );
        assert_eq!(failed.exit_code(), 1, "a failure outranks a skip");
        let nothing = PreflightReport::new(100, 0, Vec::new());
        assert_eq!(nothing.exit_code(), 1, "no worker probed proves nothing");
    }
}
