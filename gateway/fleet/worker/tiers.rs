//! A worker's cache tiers and whether they let it serve its pool's tenants
//! (`fleet/cache_tiers.rs` has the rules; issue 40).

use std::sync::Arc;

use serde_json::{json, Value};

use super::{Discovery, Worker};
use crate::fleet::cache_tiers::{CachePolicy, Tier};

impl Worker {
    /// What its pool asks of its cache tiers.
    pub fn with_cache_policy(mut self, policy: Arc<CachePolicy>) -> Self {
        self.cache_policy = policy;
        self
    }

    /// Its cache tiers (reported, configured or the engine's default), and how its pool's
    /// `cache_tiers` and its engine's report disagree, if they do.
    pub fn cache_tiers(&self) -> (Vec<Tier>, Option<String>) {
        let guard = self.discovery.read().unwrap_or_else(|p| p.into_inner());
        let reported = match &*guard {
            Discovery::Found(info) => Some(&info.cache_tiers),
            _ => None,
        };
        self.cache_policy.tiers(reported)
    }

    /// Why its tiers keep it from serving its pool's salted tenants, or None.
    pub fn cache_tier_refusal(&self) -> Option<String> {
        let policy = &self.cache_policy;
        if !policy.separates_tenants || policy.allow_shared {
            // Nothing to refuse: skip reading the discovery lock on the request path.
            return None;
        }
        let shared = {
            let guard = self.discovery.read().unwrap_or_else(|p| p.into_inner());
            match &*guard {
                Discovery::Found(info) => policy.any_shared(Some(&info.cache_tiers)),
                _ => policy.any_shared(None),
            }
        };
        // Built only for a worker refused: the message names every shared tier.
        shared
            .then(|| policy.refusal(&self.cache_tiers().0))
            .flatten()
    }

    /// Its tiers as the admin port shows them (`GET /pools`, the status page).
    pub fn cache_tiers_json(&self) -> Value {
        let (tiers, disagreement) = self.cache_tiers();
        json!({
            "tiers": tiers.iter().map(|t| json!({
                "tier": t.kind.as_str(),
                "salted": t.salted,
                "source": t.source.as_str(),
                "evidence": t.evidence,
            })).collect::<Vec<_>>(),
            "disagreement": disagreement,
        })
    }
}
