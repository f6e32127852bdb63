//! Tenant isolation (invariant I5): a tenant sees only its own data.
//!
//! Two independent building blocks, both pure library code with no I/O:
//!
//! - [`CacheSalter`] — the per-tenant prefix-cache salt. The gateway derives it from the
//!   tenant's name under its secret, strips every cache key a client sent, and injects the
//!   tenant's salt where the engine honours one (vLLM and SGLang `cache_salt`), so the
//!   engine never serves one tenant's cached prefix pages to another.
//! - [`FingerprintStore`] and [`ResponseScanner`] — the leak detector. It remembers the
//!   n-grams of each tenant's recent prompts (what the engine's KV pages hold), as text
//!   units ([`units`]: words and other characters, no tokenizer needed), and scans every
//!   response, streams piece by piece, for n-grams that only *another* tenant sent; it also
//!   says whether an answer's newest units are inside such a run
//!   ([`ResponseScanner::in_foreign_run`]), which is all a blocking stream waits for. That is the signature of the incident this gateway exists for: a 200 whose text
//!   came from other users' stale KV pages.
//!
//! # Using the detector on the request path
//!
//! Record the prompt *before* dispatch (so a tenant's own prompt is never foreign to
//! itself), then scan what comes back, with one scanner per response:
//!
//! ```
//! use std::time::Instant;
//! use kvgate::stack::isolate::leak::{FingerprintStore, LeakDetectorConfig};
//!
//! let store = FingerprintStore::new(LeakDetectorConfig::default());
//! let secret: Vec<u32> = (1000..1032).collect();
//! store.record_prompt("tenant-a", &secret, Instant::now());
//!
//! let mut scanner = store.scanner("tenant-b");
//! let found = scanner.feed(&secret[4..24], Instant::now());
//! assert_eq!(found.map(|s| s.owner_tenants), Some(1));
//! ```
//!
//! Costs: recording is one hash per prompt unit plus one table insert per n-gram under a
//! shard lock; scanning is one hash and one lock-free filter load per generated unit, and a
//! shard lookup (each shard's lock taken once per fed piece) only for the few the filter
//! passes (see `filter.rs` and `benches/fingerprint.rs`). Memory is bounded by `max_entries` (see [`ENTRY_BYTES`]).

mod filter;
mod fingerprint;
pub(crate) mod hash;
mod scan;
mod shard;
pub mod units;

#[cfg(test)]
mod tests;

pub use fingerprint::{FingerprintStore, LeakDetectorConfig, ENTRY_BYTES};
pub use scan::{LeakSuspicion, ResponseScanner};
