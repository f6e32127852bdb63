//! The resolved config: the config as written, each `discover` entry replaced by one plain
//! worker entry per engine its name lists now (its last good answer). The running
//! generation is built from it, so a pool whose engines did not change compares equal and
//! is kept whole by `Fleet::reusing`, and one whose engines changed is rebuilt.

use std::collections::HashSet;

use crate::config::{Config, Discover, PoolConfig, WorkerConfig};
use crate::fleet::{Endpoint, NameBook, NameKey};

/// One `discover` entry to resolve.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Query {
    pub key: NameKey,
    /// The port of a `Dns` entry's workers (the URL's, else the scheme's).
    pub port: u16,
    pub bootstrap_srv: Option<String>,
}

/// The pool lists a `discover` entry may be in, by name.
fn lists(pool: &PoolConfig) -> [(&'static str, &Vec<WorkerConfig>); 3] {
    [
        ("workers", &pool.workers),
        ("prefill", &pool.prefill),
        ("decode", &pool.decode),
    ]
}

fn key_of(pool: &PoolConfig, list: &'static str, entry: &WorkerConfig, kind: Discover) -> NameKey {
    NameKey {
        pool: pool.name.clone(),
        list,
        url: entry.url.to_string(),
        name: entry.url.host().unwrap_or_default().to_owned(),
        kind,
    }
}

/// Every `discover` entry of `config`.
pub fn queries(config: &Config) -> Vec<Query> {
    let mut out = Vec::new();
    for pool in &config.pools {
        for (list, entries) in lists(pool) {
            for entry in entries {
                let Some(kind) = entry.discover else { continue };
                let https = entry.url.scheme_str() == Some("https");
                out.push(Query {
                    key: key_of(pool, list, entry, kind),
                    port: entry.url.port_u16().unwrap_or(if https { 443 } else { 80 }),
                    bootstrap_srv: entry.bootstrap_srv.clone(),
                });
            }
        }
    }
    out
}

/// `written` with every `discover` entry replaced by the engines `book` lists for it; an
/// address listed twice in one pool list (two names, or a name and a plain entry) is one
/// worker, the first entry's.
pub fn resolved(written: &Config, book: &NameBook) -> Config {
    let mut config = written.clone();
    for (pool, original) in config.pools.iter_mut().zip(&written.pools) {
        let [workers, prefill, decode] = lists(original).map(|(list, entries)| {
            let mut seen = HashSet::new();
            let mut out = Vec::new();
            for entry in entries {
                let expanded = match entry.discover {
                    None => vec![entry.clone()],
                    Some(kind) => book
                        .endpoints(&key_of(original, list, entry, kind))
                        .into_iter()
                        .filter_map(|e| worker_at(entry, e))
                        .collect(),
                };
                out.extend(
                    expanded
                        .into_iter()
                        .filter(|w| seen.insert(w.url.authority().map(|a| a.to_string()))),
                );
            }
            out
        });
        pool.workers = workers;
        pool.prefill = prefill;
        pool.decode = decode;
    }
    config
}

/// The plain entry of one engine a `discover` entry's name lists: its URL at the engine's
/// address, every other setting the entry's; an https engine is still checked against the
/// name (its certificate names the Service, not the pod's address).
fn worker_at(entry: &WorkerConfig, endpoint: Endpoint) -> Option<WorkerConfig> {
    let scheme = entry.url.scheme_str().unwrap_or("http");
    let url = format!("{scheme}://{}", endpoint.addr).parse().ok()?;
    let tls_server_name = match (&entry.tls_server_name, scheme) {
        (Some(name), _) => Some(name.clone()),
        // An SRV name's service and protocol labels (`_https._tcp.`) are no host's name.
        (None, "https") => entry.url.host().map(|host| {
            let mut labels = host.split('.').skip_while(|l| l.starts_with('_'));
            let first = labels.next().unwrap_or_default();
            labels.fold(first.to_owned(), |name, l| name + "." + l)
        }),
        (None, _) => None,
    };
    Some(WorkerConfig {
        url,
        tls_server_name,
        bootstrap_port: entry.bootstrap_port.or(endpoint.bootstrap_port),
        discover: None,
        bootstrap_srv: None,
        ..entry.clone()
    })
}
