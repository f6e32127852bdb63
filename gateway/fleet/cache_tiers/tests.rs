use super::*;
use serde_json::json;

fn policy(separates: bool, configured: Option<Vec<CacheTierConfig>>) -> CachePolicy {
    CachePolicy {
        separates_tenants: separates,
        allow_shared: false,
        configured,
        llama_cpp: false,
    }
}

fn tier(kind: TierKind, salted: Option<bool>) -> CacheTierConfig {
    CacheTierConfig { tier: kind, salted }
}

#[test]
fn sglang_server_args_name_the_tiers() {
    let r = parse_reported(&json!({
        "enable_hierarchical_cache": true,
        "hicache_storage_backend": "file",
        "enable_lmcache": false,
    }));
    assert!(r.known);
    let kinds: Vec<(TierKind, bool)> = r.tiers.iter().map(|t| (t.kind, t.salted)).collect();
    assert_eq!(
        kinds,
        [(TierKind::Host, true), (TierKind::Storage, false)],
        "host memory hangs off the salted tree; the storage backend keys by tokens"
    );
    assert_eq!(r.tiers[1].evidence, "hicache_storage_backend = \"file\"");
    let healthy = parse_reported(&json!({
        "enable_hierarchical_cache": false,
        "hicache_storage_backend": null,
    }));
    assert!(healthy.known && healthy.tiers.is_empty());
    let silent = parse_reported(&json!({"max_total_num_tokens": 5}));
    assert!(
        !silent.known,
        "an engine that says nothing is unknown, not tierless"
    );
    let llama = parse_reported(&json!({"cache_ram_mib": 8192}));
    assert_eq!(llama.tiers[0].kind, TierKind::PromptCacheRam);
    assert!(parse_reported(&json!({"cache_ram_mib": 0}))
        .tiers
        .is_empty());
}

#[test]
fn a_salted_multi_tenant_pool_refuses_an_unsalted_tier_unless_it_opts_out() {
    let storage = parse_reported(&json!({"hicache_storage_backend": "mooncake"}));
    let p = policy(true, None);
    let (tiers, warning) = p.tiers(Some(&storage));
    assert!(warning.is_none());
    let why = p.refusal(&tiers).expect("refused");
    assert!(why.contains("`storage`"), "{why}");
    assert!(
        why.contains("hicache_storage_backend = \"mooncake\""),
        "{why}"
    );
    assert!(why.contains("allow_shared_cache_tiers = true"), "{why}");
    let opted = CachePolicy {
        allow_shared: true,
        ..p.clone()
    };
    assert_eq!(opted.refusal(&tiers), None);
    assert_eq!(
        policy(false, None).refusal(&tiers),
        None,
        "one tenant, or no salt: nobody to keep apart"
    );
    let host = parse_reported(&json!({"enable_hierarchical_cache": true}));
    assert_eq!(
        p.refusal(&p.tiers(Some(&host)).0),
        None,
        "a salted tier is fine"
    );
}

#[test]
fn config_speaks_for_silent_engines_and_the_less_safe_side_wins() {
    // vLLM reports nothing: the config decides.
    let p = policy(true, Some(vec![tier(TierKind::Lmcache, None)]));
    let (tiers, _) = p.tiers(None);
    assert_eq!(tiers[0].source, TierSource::Configured);
    assert!(p.refusal(&tiers).is_some());
    // Config says the storage tier is salted, the engine says it is not: not salted, with a
    // warning; a tier the engine reports that config leaves out is there too.
    let p = policy(true, Some(vec![tier(TierKind::Storage, Some(true))]));
    let report = parse_reported(&json!({
        "enable_hierarchical_cache": true,
        "hicache_storage_backend": "file",
    }));
    let (tiers, warning) = p.tiers(Some(&report));
    let storage = tiers.iter().find(|t| t.kind == TierKind::Storage).unwrap();
    assert!(!storage.salted);
    assert!(warning.unwrap().contains("disagree"));
    // The engine reports none, config lists one: it counts.
    let (tiers, warning) = policy(true, Some(vec![tier(TierKind::Connector, None)]))
        .tiers(Some(&parse_reported(&json!({"enable_lmcache": false}))));
    assert_eq!(tiers.len(), 1);
    assert!(warning.is_some());
}

#[test]
fn llama_cpp_keeps_its_ram_cache_unless_told_otherwise() {
    let p = CachePolicy {
        llama_cpp: true,
        ..policy(true, None)
    };
    let (tiers, _) = p.tiers(None);
    assert_eq!(tiers[0].kind, TierKind::PromptCacheRam);
    assert_eq!(tiers[0].source, TierSource::EngineDefault);
    assert!(p.refusal(&tiers).unwrap().contains("--cache-ram 0"));
    let off = CachePolicy {
        configured: Some(Vec::new()),
        ..p
    };
    assert!(
        off.tiers(None).0.is_empty(),
        "cache_tiers = [] says it is off"
    );
}

#[test]
fn the_quick_question_agrees_with_the_tiers() {
    let reports = [
        None,
        Some(parse_reported(&json!({"enable_hierarchical_cache": true}))),
        Some(parse_reported(&json!({"hicache_storage_backend": "file"}))),
        Some(parse_reported(&json!({"version": "x"}))),
    ];
    let configs = [
        None,
        Some(Vec::new()),
        Some(vec![tier(TierKind::Host, None)]),
        Some(vec![tier(TierKind::Host, Some(false))]),
        Some(vec![tier(TierKind::Storage, Some(true))]),
    ];
    for llama_cpp in [false, true] {
        for r in &reports {
            for c in &configs {
                let p = CachePolicy {
                    llama_cpp,
                    ..policy(true, c.clone())
                };
                let slow = p.tiers(r.as_ref()).0.iter().any(|t| !t.salted);
                assert_eq!(p.any_shared(r.as_ref()), slow, "{r:?} {c:?} {llama_cpp}");
            }
        }
    }
}
