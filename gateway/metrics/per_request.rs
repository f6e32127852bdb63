//! The metric handles every request touches, looked up once per label set and kept.
//!
//! `counter!(name, labels)` builds a key (a label vector, often an owned string), hashes it
//! and searches the recorder's registry on every call: about a microsecond for the four
//! series each request updates, several percent of a request's CPU on the hot path. The
//! label sets here are few and bounded (endpoints, status codes, outcomes, pools from the
//! config), so each one is looked up once and its handle reused.
//!
//! Handles are only cached after [`super::handle`] has installed the recorder: a handle taken
//! before would be a no-op forever.

use metrics::{Counter, Histogram};
use std::collections::HashMap;
use std::hash::Hash;
use std::sync::{Arc, OnceLock, PoisonError, RwLock};

use super::{
    REQUESTS_TOTAL, REQUEST_DURATION_SECONDS, REQUEST_OUTCOMES_TOTAL, UPSTREAM_REQUESTS_TOTAL,
};

/// Handles by label set, created on first use.
struct HandleCache<K, H> {
    map: RwLock<HashMap<K, H>>,
}

impl<K: Eq + Hash, H: Clone> HandleCache<K, H> {
    fn new() -> Self {
        Self {
            map: RwLock::new(HashMap::new()),
        }
    }

    fn get(&self, key: K, create: impl FnOnce(&K) -> H) -> H {
        if let Some(h) = self
            .map
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .get(&key)
        {
            return h.clone();
        }
        let mut map = self.map.write().unwrap_or_else(PoisonError::into_inner);
        map.entry(key).or_insert_with_key(|k| create(k)).clone()
    }
}

struct Caches {
    requests: HandleCache<(&'static str, u16), Counter>,
    durations: HandleCache<&'static str, Histogram>,
    outcomes: HandleCache<&'static str, Counter>,
    upstream: HandleCache<(Arc<str>, &'static str, &'static str), Counter>,
}

fn caches() -> &'static Caches {
    static CACHES: OnceLock<Caches> = OnceLock::new();
    CACHES.get_or_init(|| {
        super::handle();
        Caches {
            requests: HandleCache::new(),
            durations: HandleCache::new(),
            outcomes: HandleCache::new(),
            upstream: HandleCache::new(),
        }
    })
}

/// `kvgate_requests_total{endpoint, status}`.
pub fn requests(endpoint: &'static str, status: u16) -> Counter {
    caches().requests.get((endpoint, status), |&(endpoint, status)| {
        ::metrics::counter!(REQUESTS_TOTAL, "endpoint" => endpoint, "status" => status.to_string())
    })
}

/// `kvgate_request_duration_seconds{endpoint}`.
pub fn duration(endpoint: &'static str) -> Histogram {
    caches().durations.get(
        endpoint,
        |&endpoint| ::metrics::histogram!(REQUEST_DURATION_SECONDS, "endpoint" => endpoint),
    )
}

/// `kvgate_request_outcomes_total{outcome}`.
pub fn outcome(outcome: &'static str) -> Counter {
    caches().outcomes.get(
        outcome,
        |&outcome| ::metrics::counter!(REQUEST_OUTCOMES_TOTAL, "outcome" => outcome),
    )
}

/// `kvgate_upstream_requests_total{pool, role, outcome}`.
pub fn upstream(pool: &Arc<str>, role: &'static str, outcome: &'static str) -> Counter {
    caches()
        .upstream
        .get((pool.clone(), role, outcome), |(pool, role, outcome)| {
            ::metrics::counter!(
                UPSTREAM_REQUESTS_TOTAL,
                "pool" => ::metrics::SharedString::from(pool.clone()),
                "role" => *role,
                "outcome" => *outcome
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cached_handle_counts_in_the_rendered_metrics() {
        let pool: Arc<str> = Arc::from("per-request-test-pool");
        upstream(&pool, "unified", "ok").increment(2);
        upstream(&pool, "unified", "ok").increment(1);
        requests("per_request_test", 418).increment(1);
        let text = super::super::handle().render();
        assert!(
            text.contains(r#"kvgate_upstream_requests_total{pool="per-request-test-pool",role="unified",outcome="ok"} 3"#),
            "{text}"
        );
        assert!(
            text.contains(r#"kvgate_requests_total{endpoint="per_request_test",status="418"} 1"#),
            "{text}"
        );
    }
}
