//! Worker: capacity, eligibility and load counting.

use super::*;

fn worker(kv: Option<u64>, role: Role) -> Worker {
    let config = WorkerConfig {
        url: "http://10.0.0.1:30000".parse().unwrap(),
        kv_tokens: kv,
        max_running: None,
        bootstrap_port: None,
        bootstrap_host: None,
        tls_server_name: None,
        discover: None,
        bootstrap_srv: None,
    };
    Worker::new(Arc::from("p"), role, &config)
}

#[test]
fn smaller_of_configured_and_discovered_capacity_wins() {
    let w = worker(Some(1000), Role::Unified);
    assert_eq!(w.kv_tokens(), Some(1000));
    w.set_discovery(Discovery::Found(ServerInfo {
        max_total_num_tokens: Some(800),
        ..Default::default()
    }));
    assert_eq!(w.kv_tokens(), Some(800));
    assert_eq!(w.capacity_mismatch(), Some((1000, 800)));
}

#[test]
fn unknown_capacity_is_ineligible() {
    let w = worker(None, Role::Decode);
    assert!(!w.is_eligible());
    w.set_discovery(Discovery::Failed("connection refused".into()));
    assert!(w.ineligibility().unwrap().contains("connection refused"));
    w.set_discovery(Discovery::Found(ServerInfo {
        max_total_num_tokens: Some(10),
        ..Default::default()
    }));
    assert!(w.is_eligible());
}

#[test]
fn prefill_needs_a_bootstrap_port() {
    let w = worker(Some(10), Role::Prefill);
    assert!(!w.is_eligible());
    w.set_discovery(Discovery::Found(ServerInfo {
        bootstrap_port: Some(8998),
        ..Default::default()
    }));
    assert!(w.is_eligible());
    assert_eq!(w.base_url, "http://10.0.0.1:30000");
    assert_eq!(w.bootstrap_host, "10.0.0.1");
}

#[test]
fn load_guard_counts_outstanding_requests() {
    let w = Arc::new(worker(Some(10), Role::Unified));
    let a = w.start_request();
    let b = w.start_request();
    assert_eq!(w.outstanding(), 2);
    drop(a);
    assert_eq!(w.outstanding(), 1);
    drop(b);
    assert_eq!(w.outstanding(), 0);
}

#[test]
fn a_worker_on_trial_is_claimed_by_one_request_at_a_time() {
    let policy = Arc::new(HealthPolicy {
        consecutive_failures: 1,
        base_ejection: std::time::Duration::from_secs(10),
        ..HealthPolicy::default()
    });
    let w = Arc::new(worker(Some(1000), Role::Unified).with_health(
        policy,
        Arc::new(EjectionGroup::new(2, 1.0)),
        "/health",
    ));
    // Ejected 20 s ago for 10 s: on trial now.
    let then = std::time::Instant::now() - std::time::Duration::from_secs(20);
    assert!(w.health().failure(then, "status_5xx").is_some());
    assert_eq!(w.health().serving(), Serving::Trial);
    let first = w.claim(0).expect("the trial request");
    assert!(w.claim(0).is_none(), "a second request waits for the trial");
    drop(first);
    assert!(w.claim(0).is_some());
    // Back in service: any number at once.
    assert!(w.health().success());
    let (a, b) = (w.claim(0), w.claim(0));
    assert!(a.is_some() && b.is_some());
}

#[test]
fn leaving_service_moves_the_cache_epoch_on() {
    let policy = Arc::new(HealthPolicy {
        consecutive_failures: 1,
        ..HealthPolicy::default()
    });
    let w = worker(Some(1000), Role::Unified).with_slot(3).with_health(
        policy,
        Arc::new(EjectionGroup::new(2, 1.0)),
        "/health",
    );
    assert_eq!(
        w.prefix_candidate(),
        crate::fleet::Candidate { slot: 3, epoch: 0 }
    );
    w.set_draining(true);
    assert_eq!(w.cache_epoch(), 1, "drained");
    w.set_draining(true);
    w.set_draining(false);
    assert_eq!(w.cache_epoch(), 1, "only the drain itself counts");
    w.request_failed("status_5xx");
    assert_eq!(w.cache_epoch(), 2, "ejected");
}

#[test]
fn a_request_holds_at_least_a_running_slots_share_where_slots_are_known() {
    let config = |max_running| WorkerConfig {
        url: "http://10.0.0.1:30000".parse().unwrap(),
        kv_tokens: Some(1000),
        max_running,
        bootstrap_port: None,
        bootstrap_host: None,
        tls_server_name: None,
        discover: None,
        bootstrap_srv: None,
    };
    let unknown = Worker::new(Arc::from("p"), Role::Unified, &config(None));
    assert_eq!(unknown.max_running(), None);
    assert_eq!(unknown.slot_tokens(1.0), None, "only KV bounds it");
    let slotted = Worker::new(Arc::from("p"), Role::Unified, &config(Some(4)));
    assert_eq!(slotted.slot_tokens(1.0), Some(250));
    assert_eq!(
        slotted.slot_tokens(1.5),
        Some(375),
        "slots are not overcommitted"
    );
    // The engine reports fewer slots than configured: the smaller is enforced.
    slotted.set_reported_max_running(Some(3));
    assert_eq!(slotted.max_running(), Some(3));
    assert_eq!(slotted.slot_tokens(1.0), Some(333));
    slotted.set_reported_max_running(None);
    assert_eq!(slotted.max_running(), Some(4));
}

#[test]
fn requests_only_the_engine_sees_take_their_slots_from_the_room() {
    let config = WorkerConfig {
        url: "http://10.0.0.1:30000".parse().unwrap(),
        kv_tokens: Some(1000),
        max_running: Some(4),
        bootstrap_port: None,
        bootstrap_host: None,
        tls_server_name: None,
        discover: None,
        bootstrap_srv: None,
    };
    let worker = Worker::new(Arc::from("p"), Role::Unified, &config);
    assert_eq!(worker.room(1.0), Some(1000));
    // Two short requests of another front door run there, one more waits: three slots,
    // though they hold hardly any KV.
    worker.set_engine_load(
        Some(crate::fleet::EngineLoad {
            running: 2,
            waiting: 1,
            used_kv_tokens: Some(40),
            foreign_kv_tokens: None,
            foreign_requests: 0,
            at: std::time::Instant::now(),
        }),
        0,
    );
    assert_eq!(worker.foreign_load(1.0), Some(750));
    assert_eq!(worker.room(1.0), Some(250));
}

#[test]
fn a_shared_cache_tier_makes_a_worker_of_a_salted_pool_ineligible() {
    let policy = Arc::new(crate::fleet::CachePolicy {
        separates_tenants: true,
        ..Default::default()
    });
    let w = worker(Some(1000), Role::Unified).with_cache_policy(policy);
    assert!(
        w.is_eligible(),
        "nothing known of its tiers: none, SGLang's default"
    );
    w.set_discovery(Discovery::Found(ServerInfo {
        cache_tiers: crate::fleet::parse_reported(&serde_json::json!({
            "enable_hierarchical_cache": true,
            "hicache_storage_backend": "file",
        })),
        ..Default::default()
    }));
    let why = w.ineligibility().expect("refused");
    assert!(
        why.starts_with("shared cache tier `storage` (reported"),
        "{why}"
    );
    // A worker of a pool that does not keep tenants apart serves either way.
    let open = worker(Some(1000), Role::Unified);
    open.set_discovery(w.discovery());
    assert!(open.is_eligible());
}
