//! A worker's cache tiers below the GPU prefix cache, and whether it may serve salted
//! tenants with them (issue 40, I5).
//!
//! The tenant's cache salt partitions the engine's GPU prefix cache; a tier below it whose
//! keys ignore the salt lets one tenant's request find another's prompt there (a hit its
//! time to first token shows, or, on llama.cpp, a restored conversation). So a worker of a
//! pool that keeps tenants apart ([`Config::separates_tenants`]) with such a tier is
//! refused like a worker of unknown capacity (I3): it serves nothing, and every view of it
//! (`GET /pools`, the status page, the start-up log, `kvgate check`) says which tier and
//! why — unless the pool sets `allow_shared_cache_tiers = true`.
//!
//! Where the tiers come from, in order:
//! - the engine's report: SGLang's `/get_server_info` carries every server argument
//!   (`enable_hierarchical_cache`, `hicache_storage_backend`, `enable_lmcache`; field names
//!   as in `python/sglang/srt/server_args.py`, `ServerArgs`, read at sgl-project/sglang
//!   469c63e5 — unverified against a running server, no GPU here);
//! - the pool's `cache_tiers`, for engines that report nothing (vLLM has no server-info
//!   route; llama.cpp's `/props` is read where it carries `cache_ram_mib`);
//! - else the engine's default: llama.cpp keeps a host-RAM prompt cache unless started with
//!   `--cache-ram 0` (`common/common.h`: `cache_ram_mib = 8192`, "0 - disable",
//!   ggml-org/llama.cpp); SGLang and vLLM keep none unless asked.
//!
//! When config and report disagree, each tier counts with the less safe of the two (a tier
//! either lists is there; salted only when both say so) and a warning says so.

use serde_json::Value;

use crate::config::{CacheTierConfig, ChatRules, Config, PoolConfig, TierKind};

/// Where a tier's entry came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TierSource {
    /// The engine's own report.
    Reported,
    /// The pool's `cache_tiers`.
    Configured,
    /// The engine's default, neither reported nor configured.
    EngineDefault,
}

impl TierSource {
    /// Its name in reports.
    pub fn as_str(self) -> &'static str {
        match self {
            TierSource::Reported => "reported",
            TierSource::Configured => "configured",
            TierSource::EngineDefault => "engine default",
        }
    }
}

/// One cache tier of a worker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Tier {
    pub kind: TierKind,
    /// Whether its keys include the request's cache salt.
    pub salted: bool,
    pub source: TierSource,
    /// What shows it: the report's field (`hicache_storage_backend = "file"`), or the config.
    pub evidence: String,
}

/// What an engine's report says of its tiers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ReportedTiers {
    /// Whether the report has the fields at all: an engine that says nothing is unknown,
    /// not tierless.
    pub known: bool,
    pub tiers: Vec<Tier>,
}

/// Read the tiers out of a server-info document (SGLang's server arguments are at its top
/// level), or a llama.cpp `/props` document that carries `cache_ram_mib`.
pub fn parse_reported(v: &Value) -> ReportedTiers {
    let reported = |kind: TierKind, salted: bool, evidence: String| Tier {
        kind,
        salted,
        source: TierSource::Reported,
        evidence,
    };
    let mut out = ReportedTiers::default();
    for key in [
        "enable_hierarchical_cache",
        "hicache_storage_backend",
        "enable_lmcache",
    ] {
        out.known |= v.get(key).is_some();
    }
    // SGLang HiCache: host memory (L2) hangs off the radix tree the salt partitions; its
    // storage backend (L3) keys pages by a hash of their token ids and model/rank only
    // (`HiCacheFile._get_suffixed_key`: key + `_{model}_{tp_rank}_{tp_size}`,
    // python/sglang/srt/mem_cache/hicache_storage.py at 001067ff), so salted tenants share it.
    if v.get("enable_hierarchical_cache").and_then(Value::as_bool) == Some(true) {
        out.tiers.push(reported(
            TierKind::Host,
            true,
            "enable_hierarchical_cache = true".into(),
        ));
    }
    if let Some(backend) = v
        .get("hicache_storage_backend")
        .and_then(Value::as_str)
        .filter(|b| !b.is_empty())
    {
        out.tiers.push(reported(
            TierKind::Storage,
            false,
            format!("hicache_storage_backend = \"{backend}\""),
        ));
    }
    if v.get("enable_lmcache").and_then(Value::as_bool) == Some(true) {
        out.tiers.push(reported(
            TierKind::Lmcache,
            false,
            "enable_lmcache = true".into(),
        ));
    }
    // llama.cpp: read only where the document says (unverified: no stored llama.cpp source
    // shows `/props` carrying it; a build that does is read, one that does not leaves the
    // config or the default in charge).
    let ram = v
        .get("cache_ram_mib")
        .or_else(|| v.get("params").and_then(|p| p.get("cache_ram_mib")))
        .and_then(Value::as_i64);
    if let Some(mib) = ram {
        out.known = true;
        if mib != 0 {
            out.tiers.push(reported(
                TierKind::PromptCacheRam,
                false,
                format!("cache_ram_mib = {mib}"),
            ));
        }
    }
    out
}

/// What a pool asks of its workers' tiers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CachePolicy {
    /// The pool salts and more than one tenant may use it.
    pub separates_tenants: bool,
    /// `allow_shared_cache_tiers`.
    pub allow_shared: bool,
    /// `cache_tiers`, when set.
    pub configured: Option<Vec<CacheTierConfig>>,
    /// Its engines are llama.cpp's server (`chat_rules = "llama_cpp"`).
    pub llama_cpp: bool,
}

impl CachePolicy {
    /// The policy of `pool` in `config`.
    pub fn of(config: &Config, pool: &PoolConfig) -> Self {
        Self {
            separates_tenants: config.separates_tenants(pool),
            allow_shared: pool.allow_shared_cache_tiers,
            configured: pool.cache_tiers.clone(),
            llama_cpp: pool.chat_rules() == ChatRules::LlamaCpp,
        }
    }

    /// The tiers of a worker whose engine reported `reported` (None: nothing read yet), and
    /// how config and report disagree, if they do.
    pub fn tiers(&self, reported: Option<&ReportedTiers>) -> (Vec<Tier>, Option<String>) {
        let configured: Option<Vec<Tier>> = self.configured.as_ref().map(|list| {
            list.iter()
                .map(|t| Tier {
                    kind: t.tier,
                    salted: t.is_salted(),
                    source: TierSource::Configured,
                    evidence: "the pool's cache_tiers".into(),
                })
                .collect()
        });
        match (reported.filter(|r| r.known), configured) {
            (Some(r), Some(c)) => merge(&r.tiers, &c),
            (Some(r), None) => (r.tiers.clone(), None),
            (None, Some(c)) => (c, None),
            (None, None) => (self.engine_default(), None),
        }
    }

    /// Whether any of the tiers [`CachePolicy::tiers`] would give ignores the salt: the
    /// refusal's question, answered without building them (the request path asks it of
    /// every worker it considers).
    pub fn any_shared(&self, reported: Option<&ReportedTiers>) -> bool {
        let configured = self
            .configured
            .as_ref()
            .map(|list| list.iter().any(|t| !t.is_salted()));
        match (reported.filter(|r| r.known), configured) {
            (Some(r), c) => r.tiers.iter().any(|t| !t.salted) || c.unwrap_or(false),
            (None, Some(c)) => c,
            (None, None) => self.llama_cpp,
        }
    }

    fn engine_default(&self) -> Vec<Tier> {
        if !self.llama_cpp {
            return Vec::new();
        }
        vec![Tier {
            kind: TierKind::PromptCacheRam,
            salted: false,
            source: TierSource::EngineDefault,
            evidence:
                "llama-server keeps a host-RAM prompt cache unless started with --cache-ram 0; \
                       if yours is, say so with cache_tiers = []"
                    .into(),
        }]
    }

    /// Why a worker with `tiers` may not serve this pool's tenants, or None.
    pub fn refusal(&self, tiers: &[Tier]) -> Option<String> {
        if !self.separates_tenants || self.allow_shared {
            return None;
        }
        let shared: Vec<String> = tiers
            .iter()
            .filter(|t| !t.salted)
            .map(|t| {
                format!(
                    "`{}` ({}: {})",
                    t.kind.as_str(),
                    t.source.as_str(),
                    t.evidence
                )
            })
            .collect();
        if shared.is_empty() {
            return None;
        }
        Some(format!(
            "shared cache tier {}: its keys ignore the tenant's cache salt, so salted tenants would share its pages; this worker serves none of them (I5). Turn the tier off, give each tenant its own pool (tenants = [\"...\"]), or set allow_shared_cache_tiers = true on the pool to accept the risk",
            shared.join(", ")
        ))
    }
}

/// Config and report together: every tier either lists, salted only when both say so.
fn merge(reported: &[Tier], configured: &[Tier]) -> (Vec<Tier>, Option<String>) {
    let mut tiers = reported.to_vec();
    let mut disagree = false;
    for c in configured {
        match tiers.iter_mut().find(|t| t.kind == c.kind) {
            Some(t) if t.salted != c.salted => {
                disagree = true;
                t.salted = false;
            }
            Some(_) => {}
            None => {
                disagree = true;
                tiers.push(c.clone());
            }
        }
    }
    disagree |= reported
        .iter()
        .any(|r| !configured.iter().any(|c| c.kind == r.kind));
    let names = |list: &[Tier]| {
        let names: Vec<String> = list
            .iter()
            .map(|t| {
                format!(
                    "{}{}",
                    t.kind.as_str(),
                    if t.salted { "" } else { " (unsalted)" }
                )
            })
            .collect();
        if names.is_empty() {
            "none".to_owned()
        } else {
            names.join(", ")
        }
    };
    let warning = disagree.then(|| {
        format!(
            "the pool's cache_tiers ({}) and the engine's report ({}) disagree; kvgate counts each tier with the less safe of the two",
            names(configured),
            names(reported)
        )
    });
    (tiers, warning)
}

#[cfg(test)]
mod tests;
