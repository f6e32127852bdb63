//! Live load per worker: the KV kvgate itself has in flight on each worker, the engine's
//! own report of its load, and the room the two leave.
//!
//! - **kvgate's account.** Every claim of a worker for a request carries the request's KV
//!   cost ([`KvCost`]: admission's prompt tokens plus the new tokens it allowed, clipped to
//!   the context window); the worker's load guard (`WorkerLoad`) gives it back when the
//!   response body ends (a PD prefill worker's share, the prompt, when its leg ends).
//! - **The engine's report** ([`EngineLoad`]), polled on the health interval: SGLang's
//!   `GET /v1/loads`, or vLLM's Prometheus `GET /metrics`. An engine that offers neither has
//!   none, and only kvgate's account counts. A report older than
//!   [`STALE_AFTER_INTERVALS`] health intervals is ignored.
//! - **Room** ([`room_of`]): the enforced capacity × overcommit minus kvgate's own account
//!   minus what *only the engine* sees: at each report, the engine's used tokens beyond
//!   what kvgate had in flight then ([`EngineLoad::foreign_kv_tokens`]: another front door
//!   — a second gateway, a client going straight to the engine — sharing the engine).
//!   kvgate's own account is fresh between polls and the report is up to an interval old:
//!   when kvgate's requests end, their room is free at once instead of waiting for the next
//!   poll (a queue would otherwise drain only at the poll rate), while other front doors'
//!   load still counts until the engine reports it gone.
//!
//! A pool's workers share one [`tokio::sync::Notify`]: it is notified whenever a load guard
//! gives KV back or a new engine report shows more room than the last one.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, RwLock};
use std::time::{Duration, Instant};

use tokio::sync::Notify;

use crate::metrics;

/// The KV a running request may hold beyond its tokens: the last page's rest, at the
/// usual page size (vLLM's default block size, SGLang's common page size).
const PAGE_ROUNDING_TOKENS: u64 = 16;

/// A worker's gauge labels (pool, role, worker), built only when a gauge is first needed.
pub type Labels = [(&'static str, String); 3];

/// A report older than this many health intervals no longer counts.
pub const STALE_AFTER_INTERVALS: u32 = 3;

/// What one request costs in a worker's KV pool, in tokens.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvCost {
    /// The prompt tokens: what a PD prefill worker holds until its leg ends.
    pub prompt: u64,
    /// The prompt plus the new tokens the answer may still generate: what a unified or
    /// decode worker holds until the response body ends.
    pub total: u64,
}

impl KvCost {
    /// No cost known (a request path without admission's count).
    pub const ZERO: KvCost = KvCost {
        prompt: 0,
        total: 0,
    };
}

/// An engine's own report of its load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineLoad {
    /// Requests running (in the batch).
    pub running: u64,
    /// Requests waiting in the engine's queue.
    pub waiting: u64,
    /// KV tokens in use, when the engine says (SGLang: `num_used_tokens`; vLLM: its
    /// usage fraction × the worker's capacity).
    pub used_kv_tokens: Option<u64>,
    /// Of those, the tokens beyond kvgate's own account when the report was read: load
    /// that only the engine sees (set when the report is recorded).
    pub foreign_kv_tokens: Option<u64>,
    /// The requests running or waiting there beyond kvgate's own outstanding ones when the
    /// report was read: requests only the engine sees, each taking a running slot (set
    /// when the report is recorded).
    pub foreign_requests: u64,
    /// When the report was read.
    pub at: Instant,
}

/// The room of a worker of `capacity` KV tokens (None: unknown), over-committed by
/// `overcommit`, with `in_flight` tokens on kvgate's account and `foreign` tokens that only
/// the engine sees: capacity × overcommit − both, never below 0.
pub fn room_of(
    capacity: Option<u64>,
    overcommit: f64,
    in_flight: u64,
    foreign: Option<u64>,
) -> Option<u64> {
    Some(
        allowed(capacity?, overcommit)
            .saturating_sub(in_flight.saturating_add(foreign.unwrap_or(0))),
    )
}

/// `capacity` × `overcommit`, in tokens.
pub fn allowed(capacity: u64, overcommit: f64) -> u64 {
    // `as` saturates: a huge or NaN product cannot wrap.
    (capacity as f64 * overcommit.max(0.0)) as u64
}

/// One worker's live load: kvgate's account and the engine's last report.
#[derive(Debug)]
pub struct KvAccount {
    in_flight: AtomicU64,
    engine: RwLock<Option<EngineLoad>>,
    /// The pool's notifier, and after a reload that rebuilt the pool (which hands the
    /// account to the new pool's worker, [`KvAccount::also_notify`]) the new pool's too:
    /// requests may wait in either generation's queue until the old one is gone. Weak: a
    /// pool that is gone is no longer notified.
    room_freed: RwLock<Vec<std::sync::Weak<Notify>>>,
    /// The in-flight gauge, looked up once (after the recorder is installed).
    gauge: OnceLock<::metrics::Gauge>,
}

impl KvAccount {
    /// An empty account that notifies `room_freed` when KV is given back.
    pub fn new(room_freed: Arc<Notify>) -> Self {
        Self {
            in_flight: AtomicU64::new(0),
            engine: RwLock::new(None),
            room_freed: RwLock::new(vec![Arc::downgrade(&room_freed)]),
            gauge: OnceLock::new(),
        }
    }

    /// The KV tokens in flight on kvgate's account.
    pub fn in_flight(&self) -> u64 {
        self.in_flight.load(Ordering::Relaxed)
    }

    /// Wake whoever waits for room in the pools this account belongs to.
    pub fn notify_room_freed(&self) {
        for notify in self
            .room_freed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
            .filter_map(std::sync::Weak::upgrade)
        {
            notify.notify_waiters();
        }
    }

    /// Also notify the pools `other` notifies (a rebuilt pool's, taking this account over);
    /// pools that are gone are forgotten.
    pub fn also_notify(&self, other: &KvAccount) {
        let added: Vec<_> = other
            .room_freed
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        let mut mine = self.room_freed.write().unwrap_or_else(|p| p.into_inner());
        mine.extend(added);
        mine.retain(|w| w.strong_count() > 0);
    }

    /// Hold `tokens` more; `labels` name the worker's gauge (asked once).
    pub fn add(&self, tokens: u64, labels: impl FnOnce() -> Labels) {
        if tokens == 0 {
            return;
        }
        let n = self.in_flight.fetch_add(tokens, Ordering::Relaxed) + tokens;
        self.gauge(labels).set(n as f64);
    }

    /// Hold `tokens` more only if the account, plus the `foreign` load only the engine
    /// sees, then stays within `allowed` (the capacity × overcommit): a compare-and-swap,
    /// so two requests racing for the last room cannot both get it.
    pub fn try_add_within(
        &self,
        tokens: u64,
        allowed: u64,
        foreign: Option<u64>,
        labels: impl FnOnce() -> Labels,
    ) -> bool {
        let taken = self
            .in_flight
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                let used = n.saturating_add(foreign.unwrap_or(0));
                (used.saturating_add(tokens) <= allowed).then_some(n.saturating_add(tokens))
            });
        match taken {
            Ok(before) => {
                if tokens > 0 {
                    self.gauge(labels).set(before.saturating_add(tokens) as f64);
                }
                true
            }
            Err(_) => false,
        }
    }

    /// Give `tokens` back; wakes whoever waits for room.
    pub fn release(&self, tokens: u64, labels: impl FnOnce() -> Labels) {
        if tokens == 0 {
            return;
        }
        let before = self
            .in_flight
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| {
                Some(n.saturating_sub(tokens))
            })
            .unwrap_or(0);
        self.gauge(labels).set(before.saturating_sub(tokens) as f64);
        self.notify_room_freed();
    }

    fn gauge(&self, labels: impl FnOnce() -> Labels) -> &::metrics::Gauge {
        self.gauge
            .get_or_init(|| ::metrics::gauge!(metrics::WORKER_KV_IN_FLIGHT, &labels()))
    }

    /// The engine's last report, if it is younger than `max_age`.
    pub fn engine_load(&self, max_age: Duration) -> Option<EngineLoad> {
        let report = *self.engine.read().unwrap_or_else(|p| p.into_inner());
        report.filter(|r| r.at.elapsed() <= max_age)
    }

    /// Record the engine's report (None: it gave none this time), read while kvgate had
    /// `outstanding` requests there; wakes whoever waits for room when the engine now
    /// holds less of others' load than it last said.
    pub fn set_engine_load(&self, report: Option<EngineLoad>, outstanding: u64, labels: &Labels) {
        // What the engine uses beyond kvgate's own account now is someone else's load —
        // less the pages' rounding: an engine allocates whole pages, so each running
        // request may use up to a page more than its tokens, and that is not another
        // front door's load (counted as such, it took a request's room from every worker
        // of a full pool).
        let report = report.map(|mut r| {
            let rounding = r.running.saturating_mul(PAGE_ROUNDING_TOKENS);
            r.foreign_kv_tokens = r
                .used_kv_tokens
                .map(|used| used.saturating_sub(self.in_flight().saturating_add(rounding)));
            r.foreign_requests = r
                .running
                .saturating_add(r.waiting)
                .saturating_sub(outstanding);
            r
        });
        let previous = {
            let mut slot = self.engine.write().unwrap_or_else(|p| p.into_inner());
            std::mem::replace(&mut *slot, report)
        };
        if let Some(r) = &report {
            ::metrics::gauge!(metrics::WORKER_ENGINE_WAITING, labels).set(r.waiting as f64);
        }
        let used = |r: Option<EngineLoad>| r.and_then(|r| r.foreign_kv_tokens).unwrap_or(0);
        let requests = |r: Option<EngineLoad>| r.map_or(0, |r| r.foreign_requests);
        if used(report) < used(previous) || requests(report) < requests(previous) {
            self.notify_room_freed();
        }
    }
}

/// What an engine's load endpoint said, before it becomes an [`EngineLoad`].
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Reported {
    pub running: u64,
    pub waiting: u64,
    /// KV tokens in use (SGLang).
    pub used_tokens: Option<u64>,
    /// KV in use as a fraction of the pool (vLLM).
    pub usage: Option<f64>,
    /// The most requests it runs at once (SGLang's `max_running_requests`, summed over
    /// its data-parallel ranks).
    pub max_running: Option<u64>,
}

/// SGLang's `GET /v1/loads`: the sum over its ranks (`loads`), else the top-level fields.
/// None when the answer has none of them.
pub fn parse_sglang_loads(body: &[u8]) -> Option<Reported> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let ranks: Vec<&serde_json::Value> = match value.get("loads").and_then(|l| l.as_array()) {
        Some(list) if !list.is_empty() => list.iter().collect(),
        _ => vec![&value],
    };
    let field = |r: &serde_json::Value, name: &str| r.get(name).and_then(|v| v.as_u64());
    let mut out = Reported::default();
    let mut any = false;
    for rank in ranks {
        let running = field(rank, "num_running_reqs");
        let waiting = field(rank, "num_waiting_reqs");
        let used = field(rank, "num_used_tokens");
        if let Some(n) = field(rank, "max_running_requests") {
            out.max_running = Some(out.max_running.unwrap_or(0) + n);
        }
        any |= running.is_some() || waiting.is_some() || used.is_some();
        out.running += running.unwrap_or(0);
        out.waiting += waiting.unwrap_or(0);
        if let Some(u) = used {
            out.used_tokens = Some(out.used_tokens.unwrap_or(0) + u);
        }
    }
    any.then_some(out)
}

/// vLLM's Prometheus `GET /metrics`: `vllm:num_requests_running` and
/// `vllm:num_requests_waiting` summed over their label sets, and `vllm:kv_cache_usage_perc`
/// (older: `vllm:gpu_cache_usage_perc`; a fraction, 0 to 1) averaged over them (each label
/// set is one engine's share of the pool). None when none of them is there.
pub fn parse_vllm_metrics(text: &str) -> Option<Reported> {
    let mut running = None::<f64>;
    let mut waiting = None::<f64>;
    let (mut usage, mut usage_old) = ((0.0, 0u32), (0.0, 0u32));
    for (name, value) in prometheus_samples(text) {
        match name {
            "vllm:num_requests_running" => *running.get_or_insert(0.0) += value,
            "vllm:num_requests_waiting" => *waiting.get_or_insert(0.0) += value,
            "vllm:kv_cache_usage_perc" => usage = (usage.0 + value, usage.1 + 1),
            "vllm:gpu_cache_usage_perc" => usage_old = (usage_old.0 + value, usage_old.1 + 1),
            _ => {}
        }
    }
    let (sum, n) = if usage.1 > 0 { usage } else { usage_old };
    let usage = (n > 0).then(|| (sum / f64::from(n)).clamp(0.0, 1.0));
    if running.is_none() && waiting.is_none() && usage.is_none() {
        return None;
    }
    let count = |v: Option<f64>| v.map_or(0, |v| v.max(0.0) as u64);
    Some(Reported {
        running: count(running),
        waiting: count(waiting),
        used_tokens: None,
        usage,
        max_running: None,
    })
}

/// The samples of a Prometheus text exposition: `(metric name, value)` per line, comments,
/// blank and unreadable lines skipped. Labels (quoted values may hold spaces, `}` and
/// escaped quotes) and a trailing timestamp are read past.
pub fn prometheus_samples(text: &str) -> impl Iterator<Item = (&str, f64)> {
    text.lines().filter_map(|line| {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            return None;
        }
        let name_end = line
            .find(|c: char| c == '{' || c.is_whitespace())
            .unwrap_or(line.len());
        let name = &line[..name_end];
        let mut rest = &line[name_end..];
        if rest.starts_with('{') {
            rest = &rest[labels_end(rest)?..];
        }
        let value = rest.split_whitespace().next()?.parse::<f64>().ok()?;
        (!name.is_empty() && value.is_finite()).then_some((name, value))
    })
}

/// The byte after the `}` closing the label block `s` opens, quotes respected.
fn labels_end(s: &str) -> Option<usize> {
    let mut quoted = false;
    let mut escaped = false;
    for (i, c) in s.char_indices() {
        match c {
            _ if escaped => escaped = false,
            '\\' if quoted => escaped = true,
            '"' => quoted = !quoted,
            '}' if !quoted => return Some(i + 1),
            _ => {}
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::future::Future;

    #[test]
    fn room_counts_our_account_and_what_only_the_engine_sees() {
        assert_eq!(room_of(None, 1.0, 0, None), None, "unknown capacity");
        assert_eq!(room_of(Some(1000), 1.0, 0, None), Some(1000));
        assert_eq!(room_of(Some(1000), 1.0, 300, None), Some(700));
        // Another front door holds 300 that only the engine sees.
        assert_eq!(room_of(Some(1000), 1.0, 300, Some(300)), Some(400));
        assert_eq!(room_of(Some(1000), 1.0, 500, Some(300)), Some(200));
        // Never below zero.
        assert_eq!(room_of(Some(1000), 1.0, 1500, Some(10)), Some(0));
        // Overcommit scales the capacity.
        assert_eq!(room_of(Some(1000), 1.5, 1000, None), Some(500));
        assert_eq!(room_of(Some(1000), 0.5, 0, None), Some(500));
        assert_eq!(room_of(Some(1000), f64::NAN, 0, None), Some(0));
    }

    #[test]
    fn account_adds_releases_and_notifies() {
        let notify = Arc::new(Notify::new());
        let account = KvAccount::new(notify.clone());
        let labels = [
            ("pool", "p".to_owned()),
            ("role", "unified".to_owned()),
            ("worker", "w".to_owned()),
        ];
        account.add(100, || labels.clone());
        account.add(50, || labels.clone());
        assert_eq!(account.in_flight(), 150);
        let waiter = notify.notified();
        let mut waiter = std::pin::pin!(waiter);
        waiter.as_mut().enable();
        account.release(100, || labels.clone());
        assert_eq!(account.in_flight(), 50);
        let waker = futures_util::task::noop_waker();
        let mut cx = std::task::Context::from_waker(&waker);
        assert!(waiter.as_mut().poll(&mut cx).is_ready());
        account.release(500, || labels.clone());
        assert_eq!(account.in_flight(), 0, "saturates");
    }

    #[test]
    fn stale_reports_are_ignored() {
        let account = KvAccount::new(Arc::new(Notify::new()));
        let labels = [
            ("pool", "p".to_owned()),
            ("role", "unified".to_owned()),
            ("worker", "w".to_owned()),
        ];
        let old = Instant::now()
            .checked_sub(Duration::from_secs(10))
            .unwrap_or_else(Instant::now);
        let report = EngineLoad {
            running: 1,
            waiting: 2,
            used_kv_tokens: Some(30),
            foreign_kv_tokens: None,
            foreign_requests: 0,
            at: old,
        };
        account.set_engine_load(Some(report), 1, &labels);
        // 30 used, none on kvgate's account, a page's rounding for its one running request;
        // of its three requests (one running, two waiting) kvgate sent one.
        let recorded = EngineLoad {
            foreign_kv_tokens: Some(14),
            foreign_requests: 2,
            ..report
        };
        assert_eq!(account.engine_load(Duration::from_secs(60)), Some(recorded));
        assert_eq!(account.engine_load(Duration::from_secs(1)), None);
    }

    #[test]
    fn sglang_loads_top_level_and_ranks() {
        let top = br#"{"num_running_reqs":2,"num_waiting_reqs":1,"num_used_tokens":640,
            "max_total_num_tokens":4096,"token_usage":0.156,"max_running_requests":16}"#;
        let r = parse_sglang_loads(top).unwrap();
        assert_eq!((r.running, r.waiting, r.used_tokens), (2, 1, Some(640)));
        assert_eq!(r.max_running, Some(16));
        let ranks = br#"{"num_running_reqs":9,"loads":[
            {"num_running_reqs":1,"num_waiting_reqs":0,"num_used_tokens":100},
            {"num_running_reqs":2,"num_waiting_reqs":3,"num_used_tokens":200}]}"#;
        let r = parse_sglang_loads(ranks).unwrap();
        assert_eq!((r.running, r.waiting, r.used_tokens), (3, 3, Some(300)));
        assert_eq!(r.max_running, None, "not reported");
        assert_eq!(parse_sglang_loads(b"{}"), None);
        assert_eq!(parse_sglang_loads(b"not json"), None);
    }

    #[test]
    fn prometheus_lines_are_read_past_labels_and_timestamps() {
        let text = "# HELP vllm:num_requests_running Running.\n\
            # TYPE vllm:num_requests_running gauge\n\
            vllm:num_requests_running{engine=\"0\",model_name=\"m\"} 3.0\n\
            vllm:num_requests_running{engine=\"1\",model_name=\"a }b \\\"c\"} 2 1712345678000\n\
            vllm:num_requests_waiting 4\n\
            vllm:kv_cache_usage_perc{engine=\"0\"} 0.5\n\
            vllm:kv_cache_usage_perc{engine=\"1\"} 0.25\n\
            vllm:gpu_cache_usage_perc 0.9\n\
            garbage line without value\n\
            broken{unclosed=\"x 1\n\
            \n";
        let samples: Vec<(&str, f64)> = prometheus_samples(text).collect();
        assert_eq!(samples[0], ("vllm:num_requests_running", 3.0));
        assert_eq!(samples[1], ("vllm:num_requests_running", 2.0));
        assert_eq!(samples.len(), 6);
        let r = parse_vllm_metrics(text).unwrap();
        assert_eq!((r.running, r.waiting), (5, 4));
        assert_eq!(r.usage, Some(0.375), "the newer name wins, averaged");
        let old = parse_vllm_metrics("vllm:gpu_cache_usage_perc{a=\"b\"} 0.9\n").unwrap();
        assert_eq!(old.usage, Some(0.9));
        assert_eq!(old.running, 0);
        assert_eq!(parse_vllm_metrics("sglang:num_running_reqs 1\n"), None);
        assert_eq!(parse_vllm_metrics("<html>404</html>"), None);
    }
}
