//! The DNS names that list a pool's workers (`discover = "dns"` / `"srv"`, issue 39): per
//! name, the last good answer and how its latest resolution went. Pure state: the runtime
//! resolves (`crate::dns`) and records here; the resolved config is built from what is here;
//! the admin port and the status page show it.
//!
//! The rules of an answer:
//! - a non-empty answer replaces the last one (a name is fresh again);
//! - a failure (NXDOMAIN, SERVFAIL, a timeout) or an empty answer keeps the last good
//!   answer and marks the name stale — DNS trouble never takes workers out of service;
//!   health checks and outlier ejection do that;
//! - a name that never answered with records lists no worker (its pool is not ready until
//!   it does), and is stale only once it failed after a good answer.
//!
//! One book lives as long as the process; every generation's fleet shares it.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Mutex;
use std::time::SystemTime;

use crate::config::Discover;
use crate::metrics;

/// One discovered name: which list of which pool it fills, and its URL as written.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct NameKey {
    pub pool: String,
    /// `workers`, `prefill` or `decode`.
    pub list: &'static str,
    /// The entry's URL as written (`http://engines.ns.svc:30000`).
    pub url: String,
    /// The host resolved (a metric label).
    pub name: String,
    pub kind: Discover,
}

/// One engine an answer lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Endpoint {
    pub addr: SocketAddr,
    /// Prefill: the KV bootstrap port the entry's `bootstrap_srv` gives this address.
    pub bootstrap_port: Option<u16>,
}

/// What is known of one name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NameState {
    /// The last good answer, sorted (an answer in another order is the same answer).
    pub endpoints: Vec<Endpoint>,
    /// When it last answered with records.
    pub last_ok: Option<SystemTime>,
    /// Why its latest resolution failed (None: it succeeded).
    pub last_error: Option<String>,
    /// The latest resolution failed and `endpoints` is an older answer.
    pub stale: bool,
    /// Failed resolutions since start.
    pub failures: u64,
}

/// Every discovered name of the running config.
#[derive(Debug, Default)]
pub struct NameBook {
    names: Mutex<BTreeMap<NameKey, NameState>>,
}

impl NameBook {
    /// Record one resolution of `key` (`Ok(empty)`: the name answered with no record).
    pub fn record(&self, key: &NameKey, answer: Result<Vec<Endpoint>, String>, now: SystemTime) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        let state = names.entry(key.clone()).or_default();
        let was_stale = state.stale;
        let error = match answer {
            Ok(mut endpoints) if !endpoints.is_empty() => {
                endpoints.sort();
                endpoints.dedup();
                if endpoints != state.endpoints {
                    tracing::info!(
                        pool = %key.pool, list = key.list, name = %key.name,
                        engines = ?endpoints.iter().map(|e| e.addr).collect::<Vec<_>>(),
                        "discovered name answered with a new set of engines"
                    );
                }
                state.endpoints = endpoints;
                state.last_ok = Some(now);
                state.last_error = None;
                state.stale = false;
                None
            }
            Ok(_) if state.endpoints.is_empty() => {
                // Never listed an engine: nothing to keep, and no older answer to be stale on.
                state.last_error = Some("the name has no records (yet)".to_owned());
                None
            }
            Ok(_) => Some("empty answer (no records) after a good one".to_owned()),
            Err(e) => Some(e),
        };
        if let Some(error) = error {
            state.failures += 1;
            state.stale = !state.endpoints.is_empty();
            ::metrics::counter!(metrics::DISCOVERY_DNS_FAILURES_TOTAL, &labels(key)).increment(1);
            if state.last_error.as_deref() != Some(&error) {
                tracing::warn!(
                    pool = %key.pool, list = key.list, name = %key.name, error = %error,
                    kept = state.endpoints.len(),
                    "discovered name did not resolve: the last answer is kept"
                );
            }
            state.last_error = Some(error);
        } else if was_stale {
            tracing::info!(pool = %key.pool, list = key.list, name = %key.name, "discovered name resolves again");
        }
        ::metrics::gauge!(metrics::DISCOVERY_DNS_STALE, &labels(key)).set(if state.stale {
            1.0
        } else {
            0.0
        });
    }

    /// The engines `key` lists now (its last good answer).
    pub fn endpoints(&self, key: &NameKey) -> Vec<Endpoint> {
        let names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        names
            .get(key)
            .map(|s| s.endpoints.clone())
            .unwrap_or_default()
    }

    /// Forget every name but `keep` (a reload removed them); their stale gauge goes to 0.
    pub fn retain(&self, keep: &[NameKey]) {
        let mut names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        names.retain(|key, _| {
            let kept = keep.contains(key);
            if !kept {
                ::metrics::gauge!(metrics::DISCOVERY_DNS_STALE, &labels(key)).set(0.0);
            }
            kept
        });
    }

    /// Every name of `pool` and its state.
    pub fn of_pool(&self, pool: &str) -> Vec<(NameKey, NameState)> {
        let names = self.names.lock().unwrap_or_else(|p| p.into_inner());
        names
            .iter()
            .filter(|(k, _)| k.pool == pool)
            .map(|(k, s)| (k.clone(), s.clone()))
            .collect()
    }
}

fn labels(key: &NameKey) -> [(&'static str, String); 2] {
    [("pool", key.pool.clone()), ("name", key.name.clone())]
}

#[cfg(test)]
mod tests;
