//! Engines discovered by DNS (issue 39): a worker entry with `discover = "dns"` stands for
//! every A/AAAA address of its URL's host, one with `discover = "srv"` for every target of
//! its SRV name (a Kubernetes headless Service per role). The names are resolved at start,
//! on every reload and on `[discovery] interval`; the resolved config (each such entry
//! replaced by plain entries, one per engine) is what a generation is built from.
//!
//! - `resolver`: the lookups (hickory, on tokio).
//! - `expand`: which names a config has, and the resolved config from their answers.
//!
//! The answers and how each name fares live in the fleet's [`crate::fleet::NameBook`]; the
//! runtime applies a changed answer as a reload does (`runtime::process::reload`).

mod expand;
mod resolver;

pub use expand::{queries, resolved, Query};
pub use resolver::{DnsResolver, LookupError};

use std::sync::Mutex;
use std::time::SystemTime;

use crate::config::{Config, DiscoveryConfig};
use crate::fleet::NameBook;

/// Resolves the names of a config: one resolver per `[discovery]` section, made on first
/// use (a config without `discover` entries never reads /etc/resolv.conf).
#[derive(Debug, Default)]
pub struct Discoverer {
    resolver: Mutex<Option<(DiscoveryConfig, DnsResolver)>>,
}

impl Discoverer {
    /// Resolve every `discover` name of `written` once, concurrently, into `book` (a name
    /// that fails keeps its last answer), forget the names `written` no longer has, and
    /// return the resolved config. Without `discover` entries: `written` as it is.
    pub async fn resolve(&self, written: &Config, book: &NameBook) -> Config {
        let queries = queries(written);
        book.retain(&queries.iter().map(|q| q.key.clone()).collect::<Vec<_>>());
        if queries.is_empty() {
            return written.clone();
        }
        match self.resolver(&written.discovery) {
            Ok(resolver) => {
                resolver.clear_cache();
                let lookups = queries.iter().map(|q| {
                    resolver.endpoints(q.key.kind, &q.key.name, q.port, q.bootstrap_srv.as_deref())
                });
                let answers = futures_util::future::join_all(lookups).await;
                let now = SystemTime::now();
                for (query, answer) in queries.iter().zip(answers) {
                    book.record(&query.key, answer.map_err(|e| e.to_string()), now);
                }
            }
            Err(e) => {
                let now = SystemTime::now();
                for query in &queries {
                    book.record(&query.key, Err(e.to_string()), now);
                }
            }
        }
        resolved(written, book)
    }

    /// The resolver of `config`: the one made before if `[discovery]` is the same.
    fn resolver(&self, config: &DiscoveryConfig) -> Result<DnsResolver, LookupError> {
        let mut slot = self.resolver.lock().unwrap_or_else(|p| p.into_inner());
        if let Some((made_for, resolver)) = slot.as_ref() {
            if made_for == config {
                return Ok(resolver.clone());
            }
        }
        let resolver = DnsResolver::new(config)?;
        *slot = Some((config.clone(), resolver.clone()));
        Ok(resolver)
    }
}

#[cfg(test)]
mod tests;
