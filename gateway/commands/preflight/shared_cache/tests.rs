use super::*;

fn timed(ms: u64, cached: Option<u64>) -> Timed {
    Timed {
        served: true,
        cached,
        elapsed: Duration::from_millis(ms),
        why: None,
    }
}

#[test]
fn a_count_above_a_fresh_prompts_own_is_a_hit() {
    let same: Vec<Timed> = (0..5).map(|_| timed(1, Some(16))).collect();
    let cold: Vec<Timed> = (0..5).map(|_| timed(1, Some(16))).collect();
    let (v, d) = judge(&same, &cold, 2048);
    assert_eq!(v, Verdict::Pass, "{d}");
    let mut same = same;
    same[2] = timed(1, Some(2032));
    let (v, d) = judge(&same, &cold, 2048);
    assert_eq!(v, Verdict::Fail);
    assert!(d.starts_with("round 3: tenant B"), "{d}");
}

#[test]
fn the_median_time_shows_a_silent_hit() {
    // Reported 0 cached, but B's answers come at once where a cold prefill takes 200 ms.
    let same: Vec<Timed> = [2, 3, 250, 2, 2]
        .iter()
        .map(|&m| timed(m, Some(0)))
        .collect();
    let cold: Vec<Timed> = [200, 210, 190, 205, 2]
        .iter()
        .map(|&m| timed(m, Some(0)))
        .collect();
    let (v, d) = judge(&same, &cold, 2048);
    assert_eq!(v, Verdict::Fail, "{d}");
    assert!(d.contains("reports no cached tokens"), "{d}");
    // Comparable times pass; one slow outlier does not move a median.
    let same: Vec<Timed> = [190, 205, 900, 200, 195]
        .iter()
        .map(|&m| timed(m, None))
        .collect();
    let (v, d) = judge(&same, &cold, 2048);
    assert_eq!(v, Verdict::Pass, "{d}");
}

#[test]
fn an_engine_too_fast_to_time_and_silent_proves_nothing() {
    let same: Vec<Timed> = (0..5).map(|_| timed(1, None)).collect();
    let cold: Vec<Timed> = (0..5).map(|_| timed(2, None)).collect();
    assert_eq!(judge(&same, &cold, 64).0, Verdict::Warn);
}
