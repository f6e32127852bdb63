//! Per-tenant limit decisions: the memory store's lock-free reserve at 1, 100 and 10,000
//! tenants against a `Mutex<HashMap>` running the same GCRA (the comparison pingora-limits
//! makes), the full `Limiter::admit` + permit drop, and one Redis round trip per reserve
//! (skipped with a note when `redis-server` is not installed).

#[path = "../tests/support_redis/mod.rs"]
mod support_redis;

use criterion::{criterion_group, criterion_main, BenchmarkId, Criterion};
use futures_util::FutureExt;
use std::collections::HashMap;
use std::hint::black_box;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use kvgate::stack::rate_limit::limiter::{
    Admission, LimitStore, Limiter, MemoryStore, RedisStore, TenantLimits,
};

const WINDOW_NS: u64 = 60_000_000_000;

/// Limits high enough that every decision is an admission (the hot path).
const LIMITS: TenantLimits = TenantLimits {
    requests_per_minute: Some(u32::MAX),
    tokens_per_minute: Some(1_000_000_000_000),
    max_concurrent: None,
};

/// The baseline: the same two-dimension GCRA behind one global lock.
struct MutexGcra {
    origin: Instant,
    tenants: Mutex<HashMap<String, (u64, u64)>>,
}

impl MutexGcra {
    fn reserve(&self, tenant: &str, tokens: u64) -> bool {
        let now = self.origin.elapsed().as_nanos() as u64;
        let req_cost = WINDOW_NS / u64::from(u32::MAX);
        let tok_cost = (u128::from(tokens) * u128::from(WINDOW_NS) / 1_000_000_000_000) as u64;
        let mut map = self.tenants.lock().expect("baseline lock");
        let state = match map.get_mut(tenant) {
            Some(s) => s,
            None => map.entry(tenant.to_owned()).or_insert((0, 0)),
        };
        let req = state.0.max(now) + req_cost;
        let tok = state.1.max(now) + tok_cost;
        if req - now > WINDOW_NS || tok - now > WINDOW_NS {
            return false;
        }
        *state = (req, tok);
        true
    }
}

fn names(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("tenant-{i}")).collect()
}

fn reserve_decision(c: &mut Criterion) {
    let mut group = c.benchmark_group("reserve");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    for tenants in [1usize, 100, 10_000] {
        let names = names(tenants);
        let store = MemoryStore::new();
        let baseline = MutexGcra {
            origin: Instant::now(),
            tenants: Mutex::new(HashMap::new()),
        };
        // Warm both maps so the measurement is the steady state, not first inserts.
        for n in &names {
            store.reserve_now(n, &LIMITS, 100);
            baseline.reserve(n, 100);
        }
        let mut i = 0;
        group.bench_function(BenchmarkId::new("memory_dashmap_cas", tenants), |b| {
            b.iter(|| {
                i = (i + 1) % tenants;
                black_box(store.reserve_now(&names[i], &LIMITS, 100))
            })
        });
        group.bench_function(BenchmarkId::new("baseline_mutex_hashmap", tenants), |b| {
            b.iter(|| {
                i = (i + 1) % tenants;
                black_box(baseline.reserve(&names[i], 100))
            })
        });
        let limiter = Limiter::new(MemoryStore::new());
        let with_slots = TenantLimits {
            max_concurrent: Some(u32::MAX),
            ..LIMITS
        };
        group.bench_function(BenchmarkId::new("limiter_admit_and_drop", tenants), |b| {
            b.iter(|| {
                i = (i + 1) % tenants;
                // Memory futures are ready on the first poll: no executor needed.
                let admission = limiter
                    .admit(names[i].as_str(), &with_slots, 100)
                    .now_or_never();
                black_box(matches!(admission, Some(Ok(Admission::Admitted(_)))))
            })
        });
    }
    group.finish();
}

fn redis_round_trip(c: &mut Criterion) {
    if !support_redis::RedisServer::available() {
        eprintln!("note: redis-server not installed; skipping the Redis round-trip bench");
        return;
    }
    let server = support_redis::RedisServer::start();
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        eprintln!("note: no Tokio runtime; skipping the Redis bench");
        return;
    };
    let store = match rt.block_on(RedisStore::connect(&server.url(), "bench")) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("note: cannot reach the bench redis ({e}); skipping");
            return;
        }
    };
    let mut group = c.benchmark_group("reserve");
    group
        .warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(3));
    group.bench_function("redis_unix_socket_evalsha", |b| {
        b.iter(|| black_box(rt.block_on(store.reserve("tenant-0", &LIMITS, 100))))
    });
    group.finish();
    drop(store);
    drop(server);
}

criterion_group!(benches, reserve_decision, redis_round_trip);
criterion_main!(benches);
