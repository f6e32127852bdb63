//! Picking: a pool by weight, then a worker by the most KV room, least outstanding requests
//! when none has room for the request (or on ties).
//!
//! A worker's room ([`Worker::room`]) is its KV capacity × the overcommit minus the larger
//! of what kvgate holds there and what the engine last reported in use. Among eligible
//! workers with room for the request's cost (in tokens) the one with the most room *for
//! its size* wins — room ÷ capacity, so a pool of unequal workers is filled in proportion
//! and its idle workers tie (ties: least outstanding, then round-robin, as before). When
//! none has room, the least outstanding eligible worker is taken as before.
//!
//! With `[scheduling]` on, the routing stage claims only where the request fits
//! ([`claim_with_room`]) and otherwise waits in the pool's queue (`wait.rs`); the
//! least-outstanding fallback serves `enabled = false` and requests no worker could ever
//! hold.
//!
//! `take.rs` takes a pool's workers by these rules, role by role.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use crate::fleet::{allowed, KvCost, Pool, Worker, WorkerLoad};

/// Whether some eligible worker of `pool` could hold `cost` when empty: a request that no
/// worker could ever hold is not queued (it would only time out).
pub fn could_ever_fit(pool: &Pool, cost: KvCost, overcommit: f64) -> bool {
    pool.holding_workers().iter().any(|w| {
        w.is_eligible()
            && w.kv_tokens()
                .is_some_and(|c| allowed(c, overcommit) >= cost.total)
    })
}

/// The eligible worker with the most room for its size that fits `cost`, taken atomically;
/// a worker another request filled in the meantime is passed over for the next best.
pub(super) fn claim_fitting(
    workers: &[Arc<Worker>],
    cursor: &AtomicUsize,
    cost: u64,
    overcommit: f64,
) -> Option<WorkerLoad> {
    claim_first(workers, cursor, cost, overcommit, |worker| {
        // `most_room` falls back to the least outstanding worker when none fits.
        if !worker.fits(cost, overcommit) {
            return Taken::Stop;
        }
        worker
            .claim_within(cost, overcommit)
            .map_or(Taken::Next, Taken::Load)
    })
}

/// What one try at taking a worker came to.
enum Taken {
    Load(WorkerLoad),
    /// Taken meanwhile by another request: try the next best.
    Next,
    /// No worker will do.
    Stop,
}

/// The best worker by [`most_room`], taken with `take`; one that another request took in
/// the meantime is passed over for the next best.
fn claim_first(
    workers: &[Arc<Worker>],
    cursor: &AtomicUsize,
    cost: u64,
    overcommit: f64,
    take: impl Fn(&Arc<Worker>) -> Taken,
) -> Option<WorkerLoad> {
    let mut left: Vec<Arc<Worker>>;
    let mut candidates = workers;
    loop {
        let worker = most_room(candidates, cursor, cost, overcommit)?;
        match take(&worker) {
            Taken::Load(load) => return Some(load),
            Taken::Stop => return None,
            Taken::Next => {}
        }
        left = candidates
            .iter()
            .filter(|w| !Arc::ptr_eq(w, &worker))
            .cloned()
            .collect();
        candidates = &left;
    }
}

/// Least outstanding requests among eligible workers; ties go round-robin from `cursor`,
/// so an idle pool still spreads load instead of always hitting the first worker.
#[cfg(test)]
pub fn least_outstanding(workers: &[Arc<Worker>], cursor: &AtomicUsize) -> Option<Arc<Worker>> {
    best_for(workers, cursor, None)
}

/// The eligible worker with room for `cost` that has the most room for its size (room ÷
/// capacity; ties: least outstanding, then round-robin from `cursor`); when none has that
/// much room, the least outstanding one ([`least_outstanding`]).
pub fn most_room(
    workers: &[Arc<Worker>],
    cursor: &AtomicUsize,
    cost: u64,
    overcommit: f64,
) -> Option<Arc<Worker>> {
    best_for(workers, cursor, Some((cost, overcommit)))
}

/// One pass over `workers` from the cursor: the best by room (when `need` is given) and the
/// least outstanding.
fn best_for(
    workers: &[Arc<Worker>],
    cursor: &AtomicUsize,
    need: Option<(u64, f64)>,
) -> Option<Arc<Worker>> {
    let n = workers.len();
    if n == 0 {
        return None;
    }
    let start = cursor.fetch_add(1, Ordering::Relaxed) % n;
    let mut least: Option<(&Arc<Worker>, usize)> = None;
    let mut roomiest: Option<(&Arc<Worker>, (u64, u64), usize)> = None;
    for i in 0..n {
        let worker = &workers[(start + i) % n];
        if !worker.is_eligible() {
            continue;
        }
        let load = worker.outstanding();
        if least.is_none_or(|(_, b)| load < b) {
            least = Some((worker, load));
        }
        let Some((cost, overcommit)) = need else {
            continue;
        };
        let charge = worker.charge(cost, overcommit);
        let Some(room) = worker.room(overcommit).filter(|&r| r >= charge) else {
            continue;
        };
        // Room as a share of capacity (`room_of` only answers with a capacity).
        let share = (room, worker.kv_tokens().unwrap_or(0).max(1));
        let better = roomiest.is_none_or(|(_, s, l)| match more_room(share, s) {
            std::cmp::Ordering::Greater => true,
            std::cmp::Ordering::Equal => load < l,
            std::cmp::Ordering::Less => false,
        });
        if better {
            roomiest = Some((worker, share, load));
        }
    }
    roomiest
        .map(|(w, _, _)| w)
        .or(least.map(|(w, _)| w))
        .cloned()
}

/// Compares two rooms as shares of their workers' capacities, `(room, capacity)`, exactly
/// (cross-multiplied): idle workers of different sizes tie (and round-robin, as before),
/// and under load each is filled in proportion to its size.
fn more_room(a: (u64, u64), b: (u64, u64)) -> std::cmp::Ordering {
    (u128::from(a.0) * u128::from(b.1)).cmp(&(u128::from(b.0) * u128::from(a.1)))
}

/// [`most_room`], taking the worker for the request (holding `cost` of its KV): a worker
/// on trial that another request claimed in the meantime is passed over for the next best.
pub fn claim_best(
    workers: &[Arc<Worker>],
    cursor: &AtomicUsize,
    cost: u64,
    overcommit: f64,
) -> Option<WorkerLoad> {
    // Rarely taken meanwhile (a trial raced): then the others are tried.
    claim_first(workers, cursor, cost, overcommit, |worker| {
        worker.claim(cost).map_or(Taken::Next, Taken::Load)
    })
}

/// Deterministic weighted choice: over `total` consecutive calls each index `i` is chosen
/// `weights[i]` times (interleaved), so a 5% canary gets exactly 5% of requests.
pub fn weighted(weights: &[u32], counter: &AtomicU64) -> Option<usize> {
    let total: u64 = weights.iter().map(|&w| u64::from(w)).sum();
    if total == 0 {
        return None;
    }
    // Multiplying by a stride coprime with `total` permutes 0..total, so every cycle of
    // `total` tickets is exact while consecutive tickets land far apart (no bunching).
    let stride = [7919u64, 104_729, 1_299_709]
        .into_iter()
        .find(|p| total % p != 0)
        .unwrap_or(1);
    let ticket = counter.fetch_add(1, Ordering::Relaxed) % total;
    let mut point = (ticket * stride) % total;
    for (i, &w) in weights.iter().enumerate() {
        let w = u64::from(w);
        if point < w {
            return Some(i);
        }
        point -= w;
    }
    None
}

/// A tenant's order of preference over pools (weighted rendezvous hashing): pool `i`
/// scores `weights[i] / -ln(u)`, `u` a stable hash of (tenant, pool name) in (0, 1); the
/// highest score first, weight-0 pools left out.
///
/// Over many tenants pool `i` is first for `weights[i] / Σ weights` of them. The hash does
/// not depend on the weights, so while weights stand still a tenant always lands on the
/// same pool, on every replica; when a pool's weight rises, only tenants move *to* it, and
/// when it falls only tenants *on* it move away (a rollback sends the canary's tenants to
/// the stable pool, and no one else moves).
pub fn rendezvous(tenant: &str, names: &[&str], weights: &[u32]) -> Vec<usize> {
    let mut scored: Vec<(f64, usize)> = names
        .iter()
        .zip(weights)
        .enumerate()
        .filter(|(_, (_, &w))| w > 0)
        .map(|(i, (name, &w))| {
            let h = stable_hash(tenant, name);
            // 53 random bits, centred in their interval so u is never 0 or 1.
            let u = ((h >> 11) as f64 + 0.5) / (1u64 << 53) as f64;
            (f64::from(w) / -u.ln(), i)
        })
        .collect();
    scored.sort_by(|a, b| b.0.total_cmp(&a.0));
    scored.into_iter().map(|(_, i)| i).collect()
}

/// FNV-1a then a SplitMix64 finish: the same on every replica and every build (std's
/// hashers promise neither).
fn stable_hash(tenant: &str, pool: &str) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in tenant
        .as_bytes()
        .iter()
        .chain(&[0xff])
        .chain(pool.as_bytes())
    {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h ^= h >> 30;
    h = h.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    h ^= h >> 27;
    h = h.wrapping_mul(0x94d0_49bb_1331_11eb);
    h ^ (h >> 31)
}

#[cfg(test)]
mod tests {
    /// No overcommit (the default of `[scheduling] kv_overcommit`).
    const DEFAULT_KV_OVERCOMMIT: f64 = 1.0;
    use super::*;
    use crate::config::WorkerConfig;
    use crate::fleet::Role;

    fn workers(n: usize) -> Vec<Arc<Worker>> {
        (0..n)
            .map(|i| {
                let cfg = WorkerConfig {
                    url: format!("http://10.0.0.{i}:1").parse().unwrap(),
                    kv_tokens: Some(100),
                    max_running: None,
                    bootstrap_port: None,
                    bootstrap_host: None,
                    tls_server_name: None,
                    discover: None,
                    bootstrap_srv: None,
                };
                Arc::new(Worker::new(Arc::from("p"), Role::Unified, &cfg))
            })
            .collect()
    }

    #[test]
    fn ties_rotate_and_load_wins() {
        let ws = workers(3);
        let cursor = AtomicUsize::new(0);
        let picks: Vec<String> = (0..3)
            .map(|_| least_outstanding(&ws, &cursor).unwrap().authority.clone())
            .collect();
        assert_eq!(picks.len(), 3);
        assert_ne!(picks[0], picks[1]);
        assert_ne!(picks[1], picks[2]);
        let _busy0 = ws[0].start_request();
        let _busy1 = ws[1].start_request();
        for _ in 0..5 {
            assert_eq!(
                least_outstanding(&ws, &cursor).unwrap().authority,
                ws[2].authority
            );
        }
    }

    #[test]
    fn most_room_beats_least_outstanding_and_falls_back_when_full() {
        let ws = workers(3);
        let cursor = AtomicUsize::new(0);
        // Worker 0: one small request; worker 1: two tiny ones; worker 2: one huge one.
        let _a = ws[0].start_request_holding(10);
        let _b1 = ws[1].start_request_holding(1);
        let _b2 = ws[1].start_request_holding(1);
        let _c = ws[2].start_request_holding(95);
        assert_eq!(ws[0].room(1.0), Some(90));
        assert_eq!(ws[1].room(1.0), Some(98));
        assert_eq!(ws[2].room(1.0), Some(5));
        for _ in 0..4 {
            // Least outstanding would pick worker 0 or 2; the most room is worker 1.
            let w = most_room(&ws, &cursor, 20, DEFAULT_KV_OVERCOMMIT).unwrap();
            assert_eq!(w.authority, ws[1].authority);
        }
        // No worker has room for 99: the least outstanding rule as before (0 or 2).
        let w = most_room(&ws, &cursor, 99, DEFAULT_KV_OVERCOMMIT).unwrap();
        assert_ne!(w.authority, ws[1].authority);
        // Claiming holds the cost until the load drops.
        let load = claim_best(&ws, &cursor, 50, DEFAULT_KV_OVERCOMMIT).unwrap();
        assert_eq!(load.worker().authority, ws[1].authority);
        assert_eq!(ws[1].kv_in_flight(), 52);
        drop(load);
        assert_eq!(ws[1].kv_in_flight(), 2);
    }

    #[test]
    fn unequal_idle_workers_take_turns_and_fill_in_proportion() {
        let cfg = |i: u8, kv: u64| WorkerConfig {
            url: format!("http://10.0.1.{i}:1").parse().unwrap(),
            kv_tokens: Some(kv),
            max_running: None,
            bootstrap_port: None,
            bootstrap_host: None,
            tls_server_name: None,
            discover: None,
            bootstrap_srv: None,
        };
        let small = Arc::new(Worker::new(Arc::from("p"), Role::Unified, &cfg(1, 100)));
        let big = Arc::new(Worker::new(Arc::from("p"), Role::Unified, &cfg(2, 400)));
        let ws = vec![small.clone(), big.clone()];
        let cursor = AtomicUsize::new(0);
        let picks: Vec<String> = (0..4)
            .map(|_| most_room(&ws, &cursor, 10, 1.0).unwrap().authority.clone())
            .collect();
        assert_ne!(picks[0], picks[1], "idle: round-robin as before");
        assert_ne!(picks[1], picks[2]);
        // Half of the small one and a quarter of the big one used: the big one has more
        // room for its size.
        let _s = small.start_request_holding(50);
        let _b = big.start_request_holding(100);
        assert_eq!(
            most_room(&ws, &cursor, 10, 1.0).unwrap().authority,
            big.authority
        );
        // The small one has no room for 60: the big one even at more outstanding requests.
        let _b2 = big.start_request_holding(200);
        assert_eq!(big.room(1.0), Some(100));
        assert_eq!(
            most_room(&ws, &cursor, 60, 1.0).unwrap().authority,
            big.authority
        );
    }

    #[test]
    fn weights_are_honoured_exactly_over_a_cycle() {
        let counter = AtomicU64::new(0);
        let mut hits = [0u32; 2];
        for _ in 0..100 {
            hits[weighted(&[95, 5], &counter).unwrap()] += 1;
        }
        assert_eq!(hits, [95, 5]);
        assert_eq!(weighted(&[0, 0], &counter), None);
    }

    fn first_choices(weights: &[u32]) -> Vec<usize> {
        (0..2000)
            .map(|t| rendezvous(&format!("tenant-{t}"), &["stable", "canary"], weights)[0])
            .collect()
    }

    #[test]
    fn sticky_shares_follow_the_weights() {
        let canary = first_choices(&[95, 5]).iter().filter(|&&i| i == 1).count();
        // 5 % of 2000 = 100; the hash spreads tenants, it does not count them exactly.
        assert!(
            (60..=140).contains(&canary),
            "{canary} tenants on the canary"
        );
        assert!(rendezvous("t", &["a", "b"], &[0, 0]).is_empty());
        assert_eq!(rendezvous("t", &["a", "b"], &[0, 7]), vec![1]);
    }

    #[test]
    fn a_tenant_stays_while_weights_stand_and_moves_only_toward_a_growing_pool() {
        let at_5 = first_choices(&[95, 5]);
        assert_eq!(at_5, first_choices(&[95, 5]), "same weights, same pools");
        let at_25 = first_choices(&[75, 25]);
        for (before, after) in at_5.iter().zip(&at_25) {
            // Canary tenants stay on the canary as it grows; some stable ones join them.
            assert!(!(*before == 1 && *after == 0));
        }
        assert!(
            at_25.iter().filter(|&&i| i == 1).count() > at_5.iter().filter(|&&i| i == 1).count()
        );
        // Rolled back: everyone on the stable pool.
        assert!(first_choices(&[95, 0]).iter().all(|&i| i == 0));
    }
}
