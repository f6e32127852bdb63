//! Counters and the received-request log, for assertions in tests.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

/// One request as the engine received it, recorded before anything else happens.
#[derive(Clone, Debug)]
pub struct ReceivedRequest {
    /// Request path, e.g. `/generate`.
    pub path: String,
    /// The request headers (tests check what the gateway forwards, e.g. `traceparent`).
    pub headers: http::HeaderMap,
    /// The body parsed as JSON, or `null` when empty or malformed.
    pub body: serde_json::Value,
    /// Body length in bytes.
    pub bytes: usize,
}

/// A point-in-time copy of the engine's counters.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SimStatsSnapshot {
    /// Requests received on the HTTP listener (every path).
    pub requests: u64,
    /// Sum of request body sizes.
    pub body_bytes: u64,
    /// Streaming responses started.
    pub streams_started: u64,
    /// Streaming responses whose body was read to its end.
    pub streams_completed: u64,
    /// Streaming responses dropped before their end: the client went away.
    pub streams_cancelled: u64,
    /// Generated-token events handed to the client's connection so far (all streams),
    /// counted as each leaves the body: tests order what a client saw against it.
    pub token_events_sent: u64,
    /// Rooms published as ready on the bootstrap listener (prefill).
    pub rooms_published: u64,
    /// Rooms published as aborted (prefill).
    pub rooms_aborted: u64,
    /// KV transfers served: ready rooms handed to a decode (prefill).
    pub kv_transfers: u64,
    /// KV transfers received from a prefill (decode).
    pub kv_received: u64,
    /// Samples that ended with an abort finish reason or error.
    pub aborted: u64,
    /// Requests that entered the scheduler's waiting queue (admitted at once or later).
    pub scheduled: u64,
    /// Requests admitted into the running batch.
    pub admitted: u64,
    /// Requests that could not be admitted at once and had to wait in the queue.
    pub queued: u64,
    /// Requests in the running batch now.
    pub running_reqs: u64,
    /// Requests in the waiting queue now.
    pub waiting_reqs: u64,
    /// The most requests the running batch ever held at once.
    pub peak_running: u64,
    /// The longest the waiting queue ever was.
    pub peak_waiting: u64,
    /// The most KV tokens (allocated pages times page size) ever held, read at each admission.
    pub peak_kv_tokens: u64,
    /// Prompt tokens of the prefills this engine ran (unified and prefill roles; a decode
    /// runs none): `sglang:prompt_tokens_total`.
    pub prompt_tokens: u64,
    /// Of those, tokens found in the prefix cache: `sglang:cached_tokens_total`.
    pub cached_tokens: u64,
    /// Prompt tokens charged `prefill_token_latency` each: the uncached ones.
    pub prefill_tokens_charged: u64,
    /// Blocks (full KV pages of prompts) in the prefix cache now.
    pub prefix_cache_blocks: u64,
}

/// Live counters behind [`SimStatsSnapshot`].
#[derive(Debug, Default)]
pub(crate) struct SimStats {
    pub(crate) requests: AtomicU64,
    pub(crate) body_bytes: AtomicU64,
    pub(crate) streams_started: AtomicU64,
    pub(crate) streams_completed: AtomicU64,
    pub(crate) streams_cancelled: AtomicU64,
    pub(crate) token_events_sent: AtomicU64,
    pub(crate) rooms_published: AtomicU64,
    pub(crate) rooms_aborted: AtomicU64,
    pub(crate) kv_transfers: AtomicU64,
    pub(crate) kv_received: AtomicU64,
    pub(crate) aborted: AtomicU64,
    pub(crate) scheduled: AtomicU64,
    pub(crate) admitted: AtomicU64,
    pub(crate) queued: AtomicU64,
    pub(crate) prompt_tokens: AtomicU64,
    pub(crate) cached_tokens: AtomicU64,
    pub(crate) prefill_tokens_charged: AtomicU64,
    peak_running: AtomicU64,
    peak_waiting: AtomicU64,
    peak_kv_tokens: AtomicU64,
    received: Mutex<ReceivedLog>,
    /// Request ids in the order the scheduler admitted them.
    admissions: Mutex<Vec<String>>,
}

/// Adds one to a counter.
pub(crate) fn bump(counter: &AtomicU64) {
    add(counter, 1);
}

/// Adds `n` to a counter.
pub(crate) fn add(counter: &AtomicU64, n: usize) {
    counter.fetch_add(n as u64, Ordering::Relaxed);
}

/// Most requests, and most body bytes, the log keeps (tests read far fewer; the counters
/// count them all).
const RECEIVED_LOG_MAX: usize = 65_536;
const RECEIVED_LOG_MAX_BYTES: usize = 256 << 20;

/// The requests received, newest last, and their body bytes.
#[derive(Debug, Default)]
struct ReceivedLog {
    entries: Vec<ReceivedRequest>,
    bytes: usize,
}

impl SimStats {
    /// Records a request in the log and counters.
    pub(crate) fn record(&self, request: ReceivedRequest) {
        bump(&self.requests);
        self.body_bytes
            .fetch_add(request.bytes as u64, Ordering::Relaxed);
        // A poisoned log only means another request panicked mid-push; keep recording.
        let mut log = self.received.lock().unwrap_or_else(|p| p.into_inner());
        log.bytes += request.bytes;
        log.entries.push(request);
        if log.entries.len() > RECEIVED_LOG_MAX || log.bytes > RECEIVED_LOG_MAX_BYTES {
            // A long demo or a load run must not hold every body it ever got (bodies with
            // images are hundreds of KB): the oldest half goes.
            let half = log.entries.len() / 2;
            let dropped: usize = log.entries.drain(..half).map(|r| r.bytes).sum();
            log.bytes -= dropped;
        }
    }

    /// Records one admission into the running batch: its id, the batch size and the KV
    /// tokens in use right after it.
    pub(crate) fn record_admission(&self, rid: &str, running: usize, used_tokens: usize) {
        bump(&self.admitted);
        self.peak_running
            .fetch_max(running as u64, Ordering::Relaxed);
        self.peak_kv_tokens
            .fetch_max(used_tokens as u64, Ordering::Relaxed);
        let mut log = self.admissions.lock().unwrap_or_else(|p| p.into_inner());
        log.push(rid.to_string());
    }

    /// Records the waiting queue's length after a request joined it.
    pub(crate) fn raise_peak_waiting(&self, waiting: usize) {
        self.peak_waiting
            .fetch_max(waiting as u64, Ordering::Relaxed);
    }

    pub(crate) fn admissions(&self) -> Vec<String> {
        self.admissions
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub(crate) fn received(&self) -> Vec<ReceivedRequest> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entries
            .clone()
    }

    pub(crate) fn snapshot(&self) -> SimStatsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::Relaxed);
        SimStatsSnapshot {
            requests: get(&self.requests),
            body_bytes: get(&self.body_bytes),
            streams_started: get(&self.streams_started),
            streams_completed: get(&self.streams_completed),
            streams_cancelled: get(&self.streams_cancelled),
            token_events_sent: get(&self.token_events_sent),
            rooms_published: get(&self.rooms_published),
            rooms_aborted: get(&self.rooms_aborted),
            kv_transfers: get(&self.kv_transfers),
            kv_received: get(&self.kv_received),
            aborted: get(&self.aborted),
            scheduled: get(&self.scheduled),
            admitted: get(&self.admitted),
            queued: get(&self.queued),
            // Live gauges belong to the scheduler; the engine fills them in.
            running_reqs: 0,
            waiting_reqs: 0,
            peak_running: get(&self.peak_running),
            peak_waiting: get(&self.peak_waiting),
            peak_kv_tokens: get(&self.peak_kv_tokens),
            prompt_tokens: get(&self.prompt_tokens),
            cached_tokens: get(&self.cached_tokens),
            prefill_tokens_charged: get(&self.prefill_tokens_charged),
            // The cache belongs to the engine; it fills this in.
            prefix_cache_blocks: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(bytes: usize) -> ReceivedRequest {
        ReceivedRequest {
            path: "/generate".into(),
            headers: http::HeaderMap::new(),
            body: serde_json::Value::Null,
            bytes,
        }
    }

    #[test]
    fn the_log_forgets_its_oldest_half_past_its_byte_or_count_bound() {
        let stats = SimStats::default();
        for _ in 0..3 {
            stats.record(request(100 << 20));
        }
        // 300 MiB of bodies is over 256: the oldest one went.
        assert_eq!(stats.received().len(), 2);
        assert_eq!(stats.snapshot().requests, 3, "the counters count them all");
        let stats = SimStats::default();
        for _ in 0..=RECEIVED_LOG_MAX {
            stats.record(request(10));
        }
        assert_eq!(stats.received().len(), RECEIVED_LOG_MAX / 2 + 1);
    }
}
