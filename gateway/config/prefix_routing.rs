//! `[prefix_routing]`: inside a pool, send a request to the worker that recently got the
//! longest prefix of its prompt (its KV pages are likely still in that engine's prefix
//! cache), unless that worker is busier than the least loaded one by `balance_margin`
//! (issue 31).
//!
//! Read per generation: `enabled`, `block_size`, `balance_margin` and `share_with_replicas`
//! apply after a reload; `max_blocks` and `max_age` to a pool's index when it is built.

use serde::Deserialize;
use std::time::Duration;

use super::invalid::{self, Invalid};

/// The largest `block_size`: engines page their KV in far smaller blocks.
const LARGEST_BLOCK: usize = 4096;
/// The largest `max_blocks` per pool (about 5 GiB of index at its bound).
const MOST_BLOCKS: usize = 100_000_000;

/// `[prefix_routing]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct PrefixRoutingConfig {
    /// Prefer the worker holding a request's prompt prefix (off: by load only, as before).
    pub enabled: bool,
    /// Tokens per KV block: set it to the engines' page size (SGLang `--page-size`, vLLM
    /// `--block-size`). Only full blocks of a prompt are matched.
    pub block_size: usize,
    /// How much busier, as a share of KV capacity in use, the worker holding the prefix may
    /// be than the least loaded eligible worker and still get the request (0.0 to 1.0).
    pub balance_margin: f64,
    /// Blocks a pool's index remembers; the least recently sent go first.
    pub max_blocks: usize,
    /// How long a block sent to a worker is taken to stay in its cache.
    #[serde(with = "humantime_serde")]
    pub max_age: Duration,
    /// With `[limits]` in Redis: share the indexes with the other replicas through it
    /// (approximately, about every 250 ms, never on the request path).
    pub share_with_replicas: bool,
}

impl Default for PrefixRoutingConfig {
    fn default() -> Self {
        Self {
            enabled: true,
            block_size: 16,
            balance_margin: 0.25,
            max_blocks: 262_144,
            max_age: Duration::from_secs(600),
            share_with_replicas: true,
        }
    }
}

impl PrefixRoutingConfig {
    /// The rules of `[prefix_routing]`.
    pub(super) fn check(&self) -> Result<(), Invalid> {
        if !(1..=LARGEST_BLOCK).contains(&self.block_size) {
            return Err(Invalid::new(
                "prefix_routing.block_size",
                format!(
                    "must be between 1 and {LARGEST_BLOCK}: set it to the engines' KV page size (SGLang --page-size, vLLM --block-size; 16 is usual)"
                ),
            ));
        }
        if !(self.balance_margin.is_finite() && (0.0..=1.0).contains(&self.balance_margin)) {
            return Err(Invalid::new(
                "prefix_routing.balance_margin",
                "must be between 0.0 (any difference in load balances) and 1.0 (the prefix always wins), e.g. 0.25",
            ));
        }
        if !(1..=MOST_BLOCKS).contains(&self.max_blocks) {
            return Err(Invalid::new(
                "prefix_routing.max_blocks",
                format!(
                    "must be between 1 and {MOST_BLOCKS}; to keep no index, set `enabled = false`"
                ),
            ));
        }
        invalid::deadline("prefix_routing.max_age", self.max_age)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_pass_and_each_bound_names_its_key() {
        assert_eq!(PrefixRoutingConfig::default().check(), Ok(()));
        let key = |c: PrefixRoutingConfig| c.check().err().map(|e| e.key);
        let base = PrefixRoutingConfig::default;
        for bad in [0, 4097] {
            let c = PrefixRoutingConfig {
                block_size: bad,
                ..base()
            };
            assert_eq!(key(c).as_deref(), Some("prefix_routing.block_size"));
        }
        for bad in [-0.1, 1.5, f64::NAN, f64::INFINITY] {
            let c = PrefixRoutingConfig {
                balance_margin: bad,
                ..base()
            };
            assert_eq!(key(c).as_deref(), Some("prefix_routing.balance_margin"));
        }
        let c = PrefixRoutingConfig {
            max_blocks: 0,
            ..base()
        };
        assert_eq!(key(c).as_deref(), Some("prefix_routing.max_blocks"));
        let c = PrefixRoutingConfig {
            max_age: Duration::ZERO,
            ..base()
        };
        assert_eq!(key(c).as_deref(), Some("prefix_routing.max_age"));
        for fine in [0.0, 1.0] {
            let c = PrefixRoutingConfig {
                balance_margin: fine,
                block_size: 1,
                ..base()
            };
            assert_eq!(key(c), None);
        }
    }
}
