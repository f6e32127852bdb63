//! The rollback rule: does the canary do worse than the stable pool, by more than the
//! margin, on enough requests to say so?

use serde::{Deserialize, Serialize};
use std::time::Duration;

use crate::config::RolloutConfig;
use crate::fleet::Rates;

/// A signal the canary breached, with the two rates compared.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Breach {
    /// `guard_trips`, `guard_trips/<reason>`, `engine_errors`, `leak_suspicions` or
    /// `ttft_p99` (also the metric label).
    pub signal: String,
    /// The canary's rate (share of requests; seconds for `ttft_p99`).
    pub canary: f64,
    /// The stable pool's rate, same unit.
    pub stable: f64,
    /// Requests in each pool's window.
    pub canary_requests: u64,
    pub stable_requests: u64,
}

/// The first breached signal, if any. The stable pool with no traffic counts as a
/// perfect baseline (rate 0): a canary alone must stay within the margin by itself.
pub fn judge(canary: &Rates, stable: &Rates, config: &RolloutConfig) -> Option<Breach> {
    if canary.requests < config.min_requests {
        return None;
    }
    let m = &config.margins;
    let breach = |signal: String, c: f64, s: f64| Breach {
        signal,
        canary: c,
        stable: s,
        canary_requests: canary.requests,
        stable_requests: stable.requests,
    };
    let compare = |signal: String, c: u64, s: u64, margin: f64| {
        let (c, s) = (canary.share(c), stable.share(s));
        (c > s + margin).then(|| breach(signal, c, s))
    };
    // A reason of its own first: it says what broke (a new abort, a count mismatch).
    for &(reason, n) in &canary.trips {
        let found = compare(
            format!("guard_trips/{reason}"),
            n,
            stable.trips_of(reason),
            m.guard_trips,
        );
        if found.is_some() {
            return found;
        }
    }
    compare(
        "guard_trips".into(),
        canary.trip_total(),
        stable.trip_total(),
        m.guard_trips,
    )
    .or_else(|| {
        compare(
            "engine_errors".into(),
            canary.engine_errors,
            stable.engine_errors,
            m.engine_errors,
        )
    })
    .or_else(|| {
        compare(
            "leak_suspicions".into(),
            canary.leaks,
            stable.leaks,
            m.leak_suspicions,
        )
    })
    .or_else(|| {
        // Latency needs enough samples on both sides: an idle stable pool says nothing.
        let enough = canary.ttft_samples >= config.min_requests
            && stable.ttft_samples >= config.min_requests;
        let (c, s) = (canary.ttft_p99?, stable.ttft_p99?);
        let slower = c.as_secs_f64() > s.as_secs_f64() * m.ttft_p99_ratio
            && c.saturating_sub(s) > m.ttft_p99_slack;
        (enough && slower).then(|| breach("ttft_p99".into(), c.as_secs_f64(), s.as_secs_f64()))
    })
}

/// Whether the canary had a clean window: enough requests, no breach.
pub fn clean(canary: &Rates, stable: &Rates, config: &RolloutConfig) -> bool {
    canary.requests >= config.min_requests && judge(canary, stable, config).is_none()
}

/// Seconds as a short human string for audit lines and reports.
pub fn seconds(d: Duration) -> f64 {
    (d.as_secs_f64() * 1000.0).round() / 1000.0
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::RollbackMargins;

    fn config(min: u64) -> RolloutConfig {
        RolloutConfig {
            model: "m".into(),
            stable: "s".into(),
            canary: "c".into(),
            window: Duration::from_secs(60),
            min_requests: min,
            margins: RollbackMargins::default(),
            promotion: None,
        }
    }

    fn rates(requests: u64, trips: u64, errors: u64) -> Rates {
        Rates {
            requests,
            engine_errors: errors,
            trips: if trips > 0 {
                vec![("aborted", trips)]
            } else {
                vec![]
            },
            ..Rates::default()
        }
    }

    #[test]
    fn a_small_sample_never_decides() {
        // Every canary request tripped, but only three of them.
        assert_eq!(
            judge(&rates(3, 3, 0), &rates(1000, 0, 0), &config(50)),
            None
        );
        assert!(judge(&rates(50, 3, 0), &rates(1000, 0, 0), &config(50)).is_some());
    }

    #[test]
    fn the_margin_is_over_the_stable_rate() {
        let cfg = config(100);
        // 2 % vs 1.5 %: within the one-point margin.
        assert_eq!(judge(&rates(1000, 20, 0), &rates(1000, 15, 0), &cfg), None);
        // 3 % vs 1.5 %.
        let b = judge(&rates(1000, 30, 0), &rates(1000, 15, 0), &cfg).unwrap();
        assert_eq!(b.signal, "guard_trips/aborted");
        assert!((b.canary - 0.03).abs() < 1e-9 && (b.stable - 0.015).abs() < 1e-9);
        let b = judge(&rates(1000, 0, 50), &rates(0, 0, 0), &cfg).unwrap();
        assert_eq!(b.signal, "engine_errors");
        assert_eq!(b.stable_requests, 0);
    }

    #[test]
    fn latency_needs_both_samples_and_both_margins() {
        let cfg = config(10);
        let with_p99 = |n: u64, ms: u64| Rates {
            requests: n,
            ttft_samples: n,
            ttft_p99: Some(Duration::from_millis(ms)),
            ..Rates::default()
        };
        assert_eq!(judge(&with_p99(100, 900), &with_p99(5, 100), &cfg), None);
        assert_eq!(judge(&with_p99(100, 150), &with_p99(100, 60), &cfg), None);
        let b = judge(&with_p99(100, 900), &with_p99(100, 100), &cfg).unwrap();
        assert_eq!(b.signal, "ttft_p99");
        assert!(clean(&with_p99(100, 150), &with_p99(100, 100), &cfg));
        assert!(!clean(&with_p99(5, 150), &with_p99(100, 100), &cfg));
    }
}
