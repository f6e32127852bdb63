//! Picking: a pool by weight, then a worker by least outstanding requests.

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;

use super::Worker;

/// Least outstanding requests among eligible workers; ties go round-robin from `cursor`,
/// so an idle pool still spreads load instead of always hitting the first worker.
pub fn least_outstanding(workers: &[Arc<Worker>], cursor: &AtomicUsize) -> Option<Arc<Worker>> {
    let n = workers.len();
    if n == 0 {
        return None;
    }
    let start = cursor.fetch_add(1, Ordering::Relaxed) % n;
    let mut best: Option<(&Arc<Worker>, usize)> = None;
    for i in 0..n {
        let worker = &workers[(start + i) % n];
        if !worker.is_eligible() {
            continue;
        }
        let load = worker.outstanding();
        if best.is_none_or(|(_, b)| load < b) {
            best = Some((worker, load));
        }
    }
    best.map(|(w, _)| w.clone())
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::WorkerConfig;
    use crate::stack::routing::Role;

    fn workers(n: usize) -> Vec<Arc<Worker>> {
        (0..n)
            .map(|i| {
                let cfg = WorkerConfig {
                    url: format!("http://10.0.0.{i}:1").parse().unwrap(),
                    kv_tokens: Some(100),
                    bootstrap_port: None,
                    bootstrap_host: None,
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
    fn weights_are_honoured_exactly_over_a_cycle() {
        let counter = AtomicU64::new(0);
        let mut hits = [0u32; 2];
        for _ in 0..100 {
            hits[weighted(&[95, 5], &counter).unwrap()] += 1;
        }
        assert_eq!(hits, [95, 5]);
        assert_eq!(weighted(&[0, 0], &counter), None);
    }
}
