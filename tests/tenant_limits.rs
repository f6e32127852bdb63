//! Per-tenant limits against both backends: the memory store on paused Tokio time (exact,
//! no wall clock), the Redis store against a real `redis-server` on a unix socket.

mod support_redis;

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use kvgate::stack::rate_limit::limiter::{
    Admission, Decision, Denied, FailurePolicy, GuardedStore, LimitStore, Limiter, MemoryStore,
    RedisOptions, RedisStore, TenantLimits, TenantPermit,
};
use support_redis::RedisServer;
use tokio::time::advance;

fn rpm(n: u32) -> TenantLimits {
    TenantLimits {
        requests_per_minute: Some(n),
        ..TenantLimits::UNLIMITED
    }
}

fn tpm(n: u64) -> TenantLimits {
    TenantLimits {
        tokens_per_minute: Some(n),
        ..TenantLimits::UNLIMITED
    }
}

fn conc(n: u32) -> TenantLimits {
    TenantLimits {
        max_concurrent: Some(n),
        ..TenantLimits::UNLIMITED
    }
}

async fn admit(limiter: &Limiter, tenant: &str, limits: &TenantLimits, tokens: u64) -> Admission {
    limiter
        .admit(tenant, limits, tokens)
        .await
        .expect("a guarded or memory store does not fail")
}

fn admitted(a: Admission) -> TenantPermit {
    match a {
        Admission::Admitted(p) => p,
        Admission::Denied(d) => panic!("expected admission, got {d:?}"),
    }
}

fn denied(a: Admission) -> Decision {
    match a {
        Admission::Denied(d) => d,
        Admission::Admitted(p) => panic!("expected denial, got {:?}", p.decision()),
    }
}

/// Budget that can refill while a real-time test runs (`limit` per minute over `elapsed`):
/// zero below 600 ms at 100/min, so the hammer tests demand the exact limit.
fn refill(limit: u64, elapsed: Duration) -> u64 {
    (elapsed.as_secs_f64() * limit as f64 / 60.0).floor() as u64
}

// === memory store, paused time ===

#[tokio::test(start_paused = true)]
async fn memory_rpm_exact_then_refills() {
    let limiter = Limiter::new(MemoryStore::new());
    let limits = rpm(60);
    for i in 0..60 {
        let permit = admitted(admit(&limiter, "a", &limits, 0).await);
        assert_eq!(permit.decision().remaining_requests, Some(59 - i));
    }
    let d = denied(admit(&limiter, "a", &limits, 0).await);
    assert_eq!(d.denied_by, Some(Denied::Requests));
    assert_eq!(d.retry_after, Duration::from_secs(1));
    assert_eq!(d.remaining_requests, Some(0));
    assert_eq!(d.reset_requests, Duration::from_secs(60));
    assert_eq!(d.limit_requests, Some(60));

    advance(Duration::from_millis(999)).await;
    denied(admit(&limiter, "a", &limits, 0).await);
    advance(Duration::from_millis(1)).await;
    admitted(admit(&limiter, "a", &limits, 0).await);
    denied(admit(&limiter, "a", &limits, 0).await);

    advance(Duration::from_secs(60)).await;
    let p = admitted(admit(&limiter, "a", &limits, 0).await);
    assert_eq!(p.decision().remaining_requests, Some(59));
}

#[tokio::test(start_paused = true)]
async fn memory_tpm_reserve_then_settle_refunds_and_charges() {
    let limiter = Limiter::new(MemoryStore::new());
    let limits = tpm(1000);
    let mut first = admitted(admit(&limiter, "a", &limits, 600).await);
    assert_eq!(first.decision().remaining_tokens, Some(400));

    // 500 do not fit; 100 are missing at 1000/min: 6 s.
    let d = denied(admit(&limiter, "a", &limits, 500).await);
    assert_eq!(d.denied_by, Some(Denied::Tokens));
    assert_eq!(d.retry_after, Duration::from_secs(6));
    assert_eq!(d.remaining_tokens, Some(400));

    // The engine used 100 of 600: 500 come back.
    first.settle_with(100);
    drop(first);
    let p = admitted(admit(&limiter, "a", &limits, 500).await);
    assert_eq!(p.decision().remaining_tokens, Some(400));
    drop(p); // no usage reported: the reservation stands

    // Used more than reserved: the extra is charged.
    let mut over = admitted(admit(&limiter, "a", &limits, 100).await);
    assert_eq!(over.decision().remaining_tokens, Some(300));
    over.settle_with(400);
    drop(over);
    let zero = admitted(admit(&limiter, "a", &limits, 0).await);
    assert_eq!(zero.decision().remaining_tokens, Some(0));
    let d = denied(admit(&limiter, "a", &limits, 1).await);
    assert_eq!(d.retry_after, Duration::from_millis(60));

    let d = denied(admit(&limiter, "b", &limits, 1001).await);
    assert_eq!(d.denied_by, Some(Denied::TokensOverBudget));
}

#[tokio::test(start_paused = true)]
async fn memory_denied_tokens_take_no_request() {
    let limiter = Limiter::new(MemoryStore::new());
    let limits = TenantLimits {
        requests_per_minute: Some(2),
        tokens_per_minute: Some(100),
        max_concurrent: Some(1),
    };
    let p = admitted(admit(&limiter, "a", &limits, 100).await);
    assert_eq!(p.decision().remaining_requests, Some(1));
    drop(p);
    // Tokens refuse: neither the request nor the slot stays taken.
    let d = denied(admit(&limiter, "a", &limits, 1).await);
    assert_eq!(d.denied_by, Some(Denied::Tokens));
    assert_eq!(d.remaining_requests, Some(1));
    advance(Duration::from_secs(60)).await;
    let p = admitted(admit(&limiter, "a", &limits, 100).await);
    assert_eq!(p.decision().remaining_requests, Some(1));
}

#[tokio::test(start_paused = true)]
async fn memory_concurrency_slots_release_on_permit_drop() {
    let store = Arc::new(MemoryStore::new());
    let limiter = Limiter::from_arc(store.clone());
    let limits = conc(2);
    let a = admitted(admit(&limiter, "t", &limits, 0).await);
    let b = admitted(admit(&limiter, "t", &limits, 0).await);
    let d = denied(admit(&limiter, "t", &limits, 0).await);
    assert_eq!(d.denied_by, Some(Denied::Concurrency));
    assert_eq!(store.slots_in_use("t"), 2);
    drop(a);
    assert_eq!(store.slots_in_use("t"), 1);
    let c = admitted(admit(&limiter, "t", &limits, 0).await);
    drop((b, c));
    assert_eq!(store.slots_in_use("t"), 0);

    // A rate denial gives the slot back at once.
    let both = TenantLimits {
        requests_per_minute: Some(1),
        ..conc(1)
    };
    let held = admitted(admit(&limiter, "u", &both, 0).await);
    drop(held);
    denied(admit(&limiter, "u", &both, 0).await);
    assert_eq!(store.slots_in_use("u"), 0);
}

#[tokio::test(start_paused = true)]
async fn memory_tenants_are_isolated() {
    let limiter = Limiter::new(MemoryStore::new());
    let limits = TenantLimits {
        requests_per_minute: Some(3),
        tokens_per_minute: Some(300),
        max_concurrent: Some(3),
    };
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(admitted(admit(&limiter, "a", &limits, 100).await));
    }
    denied(admit(&limiter, "a", &limits, 0).await);
    let b = admitted(admit(&limiter, "b", &limits, 300).await);
    assert_eq!(b.decision().remaining_requests, Some(2));
    assert_eq!(b.decision().remaining_tokens, Some(0));
}

#[tokio::test(start_paused = true)]
async fn memory_ten_thousand_tenants() {
    let store = Arc::new(MemoryStore::new());
    let limits = rpm(2);
    for round in 0..3 {
        for t in 0..10_000 {
            let d = store.reserve_now(&format!("tenant-{t}"), &limits, 0);
            assert_eq!(d.allowed, round < 2, "tenant {t} round {round}");
        }
    }
    assert_eq!(store.tenant_count(), 10_000);
    advance(Duration::from_secs(60)).await;
    store.evict_idle();
    assert_eq!(store.tenant_count(), 0);
}

/// One instance under 400 concurrent tasks on a multi-threaded runtime admits the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn memory_exact_under_concurrent_load() {
    let limiter = Limiter::new(MemoryStore::new());
    let (count, elapsed) = hammer(vec![limiter], 400, rpm(100)).await;
    assert!(
        (100..=100 + refill(100, elapsed)).contains(&count),
        "{count}"
    );
}

/// `tasks` tasks per limiter race for one tenant's budget; returns how many got in.
async fn hammer(limiters: Vec<Limiter>, tasks: usize, limits: TenantLimits) -> (u64, Duration) {
    let start = Instant::now();
    let gate = Arc::new(tokio::sync::Barrier::new(limiters.len() * tasks));
    let mut joins = Vec::new();
    for limiter in limiters {
        for _ in 0..tasks {
            let (limiter, gate) = (limiter.clone(), gate.clone());
            joins.push(tokio::spawn(async move {
                gate.wait().await;
                matches!(
                    admit(&limiter, "shared", &limits, 0).await,
                    Admission::Admitted(_)
                )
            }));
        }
    }
    let mut count = 0;
    for j in joins {
        count += u64::from(j.await.expect("task"));
    }
    (count, start.elapsed())
}

// === redis store, real server ===

fn opts() -> RedisOptions {
    RedisOptions {
        op_timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    }
}

async fn redis_limiter(server: &RedisServer, prefix: &str) -> Limiter {
    let store = RedisStore::connect_with(&server.url(), prefix, opts())
        .await
        .expect("connect to the test redis");
    Limiter::new(store)
}

#[tokio::test]
async fn redis_rpm_exact_then_refills() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server, "kv").await;
    let limits = rpm(5);
    let start = Instant::now();
    for i in 0..5 {
        let p = admitted(admit(&limiter, "a", &limits, 0).await);
        assert_eq!(p.decision().remaining_requests, Some(4 - i));
    }
    let d = denied(admit(&limiter, "a", &limits, 0).await);
    assert_eq!(d.denied_by, Some(Denied::Requests));
    // 12 s per request at 5/min, minus what refilled since the first take.
    assert!(d.retry_after <= Duration::from_secs(12), "{d:?}");
    assert!(
        d.retry_after >= Duration::from_secs(12) - start.elapsed(),
        "{d:?}"
    );
    assert!(d.reset_requests <= Duration::from_secs(60));

    // Keys carry a TTL so idle tenants vanish.
    let ttl = server.command(&["PTTL", "kv:{a}:req"]);
    let ttl: i64 = ttl.trim_start_matches(':').parse().expect("PTTL integer");
    assert!((59_000..=61_000).contains(&ttl), "{ttl}");

    // At 6000/min one request refills every 10 ms: wait what the store says, then pass.
    let fast = rpm(6000);
    let d = loop {
        if let Admission::Denied(d) = admit(&limiter, "b", &fast, 0).await {
            break d;
        }
    };
    assert!(d.retry_after <= Duration::from_millis(10), "{d:?}");
    tokio::time::sleep(d.retry_after).await;
    admitted(admit(&limiter, "b", &fast, 0).await);
}

#[tokio::test]
async fn redis_tpm_reserve_then_settle_refunds_and_charges() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server, "kv").await;
    // 600/min refills 10 tokens a second: a remaining count may be one higher than exact.
    let limits = tpm(600);
    let near = |got: Option<u64>, want: u64| {
        let got = got.expect("limited");
        assert!((want..=want + 1).contains(&got), "{got} vs {want}");
    };
    let mut first = admitted(admit(&limiter, "a", &limits, 400).await);
    near(first.decision().remaining_tokens, 200);
    let d = denied(admit(&limiter, "a", &limits, 300).await);
    assert_eq!(d.denied_by, Some(Denied::Tokens));
    assert!(d.retry_after <= Duration::from_secs(10), "{d:?}");
    first.settle_with(100);
    drop(first);
    // The refund runs on a spawned task: wait for it (bounded).
    let p = eventually(|| admit(&limiter, "a", &limits, 300)).await;
    near(p.decision().remaining_tokens, 200);
    drop(p);

    let mut over = admitted(admit(&limiter, "a", &limits, 100).await);
    over.settle_with(400);
    drop(over);
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let d = denied(admit(&limiter, "a", &limits, 200).await);
        if d.remaining_tokens.is_some_and(|r| r < 50) {
            assert_eq!(d.denied_by, Some(Denied::Tokens));
            break;
        }
        assert!(Instant::now() < deadline, "charge never landed: {d:?}");
        tokio::task::yield_now().await;
    }
    let d = denied(admit(&limiter, "b", &limits, 601).await);
    assert_eq!(d.denied_by, Some(Denied::TokensOverBudget));
}

/// Retry an admission until it passes (effects of a dropped permit land asynchronously).
async fn eventually<F, Fut>(mut f: F) -> TenantPermit
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Admission>,
{
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match f().await {
            Admission::Admitted(p) => return p,
            Admission::Denied(d) if Instant::now() > deadline => panic!("still denied: {d:?}"),
            Admission::Denied(_) => tokio::time::sleep(Duration::from_millis(5)).await,
        }
    }
}

#[tokio::test]
async fn redis_concurrency_slots_release_and_crashed_leases_expire() {
    let server = RedisServer::start();
    let short = RedisOptions {
        lease_ttl: Duration::from_millis(600),
        ..opts()
    };
    // Replica A takes its slot without a permit, so "crashing" it below leaves the lease.
    let a = RedisStore::connect_with(&server.url(), "kv", short)
        .await
        .expect("connect a");
    let b = RedisStore::connect_with(&server.url(), "kv", short)
        .await
        .expect("connect b");
    let b = Limiter::new(b);
    let limits = conc(2);
    assert!(a.acquire_slot("t", &limits).await.expect("acquire"));
    assert_eq!(a.local_leases("t"), 1);
    let two = admitted(admit(&b, "t", &limits, 0).await);
    let d = denied(admit(&b, "t", &limits, 0).await);
    assert_eq!(d.denied_by, Some(Denied::Concurrency));
    drop(two);
    let two = eventually(|| admit(&b, "t", &limits, 0)).await;

    // Renewal keeps a held slot past its TTL.
    for _ in 0..4 {
        a.renew_now().await.expect("renew");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    denied(admit(&b, "t", &limits, 0).await);

    // Replica A crashes: nothing releases or renews its lease, which then expires.
    drop(a);
    let three = eventually(|| admit(&b, "t", &limits, 0)).await;
    drop((two, three));
}

/// Two replicas, 200 tasks each, one tenant at 100/min: the limit holds exactly.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redis_two_replicas_admit_exactly_the_limit() {
    let server = RedisServer::start();
    let one = redis_limiter(&server, "kv").await;
    let two = redis_limiter(&server, "kv").await;
    let (count, elapsed) = hammer(vec![one, two], 200, rpm(100)).await;
    assert!(
        (100..=100 + refill(100, elapsed)).contains(&count),
        "{count} in {elapsed:?}"
    );
}

/// A buffer that collects log lines, to count transitions.
#[derive(Clone, Default)]
struct Logs(Arc<Mutex<Vec<u8>>>);

impl Write for Logs {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("log buffer").extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Logs {
    fn count(&self, needle: &str) -> usize {
        let text = String::from_utf8_lossy(&self.0.lock().expect("log buffer")).into_owned();
        text.lines().filter(|l| l.contains(needle)).count()
    }
}

#[tokio::test]
async fn redis_fail_open_logs_once_and_recovers() {
    let logs = Logs::default();
    let writer = logs.clone();
    let subscriber = tracing_subscriber::fmt()
        .with_writer(move || writer.clone())
        .with_ansi(false)
        .with_max_level(tracing::Level::INFO)
        .finish();
    let _guard = tracing::subscriber::set_default(subscriber);

    let mut server = RedisServer::start();
    let store = RedisStore::connect_with(&server.url(), "kv", opts())
        .await
        .expect("connect");
    let guarded = Arc::new(GuardedStore::new(store, FailurePolicy::FailOpen));
    let limiter = Limiter::from_arc(guarded.clone());
    let limits = TenantLimits {
        requests_per_minute: Some(1),
        tokens_per_minute: Some(100),
        max_concurrent: Some(1),
    };
    drop(admitted(admit(&limiter, "a", &limits, 10).await));
    denied(admit(&limiter, "a", &limits, 10).await);

    server.kill();
    for _ in 0..10 {
        let p = admitted(admit(&limiter, "a", &limits, 10).await);
        assert_eq!(p.decision().remaining_requests, None);
    }
    assert!(!guarded.is_healthy());
    assert!(guarded.error_count() >= 10);
    assert_eq!(guarded.transitions(), 1);
    assert_eq!(logs.count("limit store failing"), 1);

    server.restart();
    let deadline = Instant::now() + Duration::from_secs(10);
    while !guarded.is_healthy() {
        assert!(Instant::now() < deadline, "never recovered");
        let _ = guarded.reserve("probe", &limits, 0).await;
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(guarded.transitions(), 2);
    assert_eq!(logs.count("limit store recovered"), 1);
    // Redis lost its data in the crash: a fresh budget, enforced again.
    drop(admitted(admit(&limiter, "a", &limits, 10).await));
    denied(admit(&limiter, "a", &limits, 10).await);
}

#[tokio::test]
async fn redis_fail_closed_denies_while_down() {
    let mut server = RedisServer::start();
    let store = RedisStore::connect_with(&server.url(), "kv", opts())
        .await
        .expect("connect");
    let limiter = Limiter::new(GuardedStore::new(store, FailurePolicy::FailClosed));
    let limits = rpm(100);
    admitted(admit(&limiter, "a", &limits, 0).await);
    server.kill();
    let d = denied(admit(&limiter, "a", &limits, 0).await);
    assert_eq!(d.denied_by, Some(Denied::StoreUnavailable));
    assert!(d.retry_after > Duration::ZERO);
}

#[tokio::test]
async fn redis_tenants_are_isolated() {
    let server = RedisServer::start();
    let limiter = redis_limiter(&server, "kv").await;
    let limits = TenantLimits {
        requests_per_minute: Some(3),
        tokens_per_minute: Some(300),
        max_concurrent: Some(3),
    };
    let mut held = Vec::new();
    for _ in 0..3 {
        held.push(admitted(admit(&limiter, "a", &limits, 100).await));
    }
    denied(admit(&limiter, "a", &limits, 0).await);
    let b = admitted(admit(&limiter, "b", &limits, 300).await);
    assert_eq!(b.decision().remaining_requests, Some(2));
    assert_eq!(b.decision().remaining_tokens, Some(0));
}
