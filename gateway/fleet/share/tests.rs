//! Fair shares and the room kept for tenants below them.
use super::*;

fn name(s: &str) -> Arc<str> {
    Arc::from(s)
}

/// Pretend `tenant` has held `kv` on average for a while.
fn set_average(shares: &TenantShares, tenant: &str, kv: f64) {
    let mut tenants = shares.lock();
    let share = tenants.get_mut(tenant).expect("known tenant");
    share.average = kv;
    share.average_at = Instant::now();
    make_steady(share);
}

/// Pretend the tenant has been active for a while (its average means something).
fn make_steady(share: &mut Share) {
    share.since = Instant::now()
        .checked_sub(AVERAGE_OVER)
        .unwrap_or(share.since);
}

#[test]
fn fair_share_splits_the_pool_by_the_active_tenants_weights() {
    let shares = Arc::new(TenantShares::default());
    let _a = shares.hold(name("a"), 1, 600);
    let _b = shares.hold(name("b"), 2, 100);
    // 1200 tokens; a: 1/3 = 400, b: 2/3 = 800 (by their averages).
    set_average(&shares, "a", 600.0);
    set_average(&shares, "b", 799.0);
    assert!(!shares.under_share(&name("a"), 1, 1200, 0));
    assert!(shares.under_share(&name("b"), 2, 1200, 0));
    set_average(&shares, "b", 801.0);
    assert!(!shares.under_share(&name("b"), 2, 1200, 0));
    // A newcomer has no history: below.
    assert!(shares.under_share(&name("c"), 1, 1200, 0));
}

#[test]
fn a_burst_above_the_share_still_counts_as_below_while_the_average_is() {
    let shares = Arc::new(TenantShares::default());
    let _flood = shares.hold(name("flood"), 1, 900);
    let _burst: Vec<ShareHold> = (0..6).map(|_| shares.hold(name("light"), 1, 100)).collect();
    // Holding 600 of a fair 500 right now, but 300 on average.
    set_average(&shares, "light", 300.0);
    assert!(shares.under_share(&name("light"), 1, 1000, 0));
}

#[test]
fn a_light_tenant_keeps_its_recent_room_for_itself() {
    let shares = Arc::new(TenantShares::default());
    let _flood = shares.hold(name("flood"), 1, 5000);
    set_average(&shares, "flood", 5000.0);
    let mut light: Vec<ShareHold> = (0..3).map(|_| shares.hold(name("light"), 1, 100)).collect();
    set_average(&shares, "light", 300.0);
    // Capacity 10000, fair 5000 each; light holds its peak (300): one more request kept.
    assert_eq!(
        shares.reserve(10_000, 1.0, 0.0).kept_from("flood", false),
        100
    );
    // One answer ends: its room is kept too.
    light.pop();
    let reserve = shares.reserve(10_000, 1.0, 0.0);
    assert_eq!(reserve.kept_from("flood", false), 100);
    assert_eq!(reserve.slot, 100);
    // Its own kept room is not kept from it.
    assert_eq!(reserve.kept_from("light", false), 0);
    drop(light);
    // Its answers ended: the room it used is kept (its peak), not given to the flood.
    assert_eq!(
        shares.reserve(10_000, 1.0, 0.0).kept_from("flood", false),
        300
    );
    // Capped by the configured fraction, in whole slots: below one slot, nothing.
    assert_eq!(
        shares.reserve(10_000, 0.025, 0.0).kept_from("flood", false),
        200
    );
    assert_eq!(
        shares.reserve(10_000, 0.01, 0.0).kept_from("flood", false),
        100
    );
    assert_eq!(shares.reserve(10_000, 0.0099, 0.0).kept_from("x", false), 0);
    assert!(shares.reserve(10_000, 0.0, 0.0).is_empty());
}

#[test]
fn a_newcomer_keeps_room_for_its_next_request_from_its_first() {
    let shares = Arc::new(TenantShares::default());
    let _a = shares.hold(name("a"), 1, 500);
    let _b = shares.hold(name("b"), 1, 100);
    // b is below its share (500 of 1000) from its first request: one more kept.
    assert_eq!(shares.reserve(1000, 1.0, 0.0).kept_from("a", false), 100);
}

#[test]
fn a_contended_pool_keeps_spare_room_for_any_request_below_its_share() {
    let shares = Arc::new(TenantShares::default());
    let _flood = shares.hold(name("flood"), 1, 900);
    set_average(&shares, "flood", 900.0);
    let _queued: Vec<WaitingMark> = (0..2)
        .map(|_| shares.waiting(name("flood"), 1, 100))
        .collect();
    // Nobody is below its share: only the spare (10% of 1000 in whole requests of
    // 100, the flood's size) is kept, and only from requests at or above their share.
    let reserve = shares.reserve(1000, 0.25, 0.1);
    assert_eq!(reserve.kept_from("flood", false), 100);
    assert_eq!(reserve.kept_from("newcomer", true), 0);
    assert!(reserve.may_pass("newcomer", true));
    assert!(!reserve.may_pass("flood", false));
    // Less than one request: nothing spare; none asked: nothing.
    assert!(shares.reserve(1000, 0.25, 0.09).is_empty());
    assert!(shares.reserve(1000, 0.25, 0.0).is_empty());
    // Capped with the rest by fair_share_reserve.
    assert_eq!(
        shares.reserve(1000, 0.25, 0.5).kept_from("flood", false),
        200
    );
    // A pool nobody contends keeps no spare.
    let quiet = Arc::new(TenantShares::default());
    let _one = quiet.hold(name("one"), 1, 100);
    assert_eq!(quiet.reserve(1000, 0.25, 0.1).spare, 0);
}

#[test]
fn nothing_is_kept_past_a_tenants_fair_share() {
    let shares = Arc::new(TenantShares::default());
    let _a = shares.hold(name("a"), 1, 900);
    let _burst: Vec<ShareHold> = (0..5).map(|_| shares.hold(name("b"), 1, 100)).collect();
    // b holds 500, its fair share of 1000, though its average says below.
    set_average(&shares, "b", 100.0);
    assert!(shares.under_share(&name("b"), 1, 1000, 0));
    assert_eq!(shares.reserve(1000, 1.0, 0.0).kept_from("a", false), 0);
}

#[test]
fn a_tenant_arriving_with_a_burst_is_not_below_its_share() {
    let shares = Arc::new(TenantShares::default());
    let _a = shares.hold(name("a"), 1, 100);
    set_average(&shares, "a", 100.0);
    // b just arrived with 600 at once: its average is still near zero, but it holds more
    // than its fair 500, so it is neither below nor keeps room from a.
    let _burst: Vec<ShareHold> = (0..6).map(|_| shares.hold(name("b"), 1, 100)).collect();
    assert!(!shares.under_share(&name("b"), 1, 1000, 0));
    assert_eq!(shares.reserve(1000, 1.0, 0.0).kept_from("a", false), 0);
    // Once its average means something, the average decides.
    set_average(&shares, "b", 300.0);
    assert!(shares.under_share(&name("b"), 1, 1000, 0));
}

#[test]
fn tenants_at_their_share_keep_nothing() {
    let shares = Arc::new(TenantShares::default());
    let _a = shares.hold(name("a"), 1, 500);
    let _b = shares.hold(name("b"), 1, 500);
    set_average(&shares, "a", 500.0);
    set_average(&shares, "b", 500.0);
    assert!(shares.reserve(1000, 1.0, 0.0).is_empty());
}

#[test]
fn what_a_tenant_has_waiting_counts_against_its_share() {
    let shares = Arc::new(TenantShares::default());
    let _flood = shares.hold(name("flood"), 1, 900);
    set_average(&shares, "flood", 900.0);
    assert!(shares.under_share(&name("light"), 1, 1000, 0));
    let mark = shares.waiting(name("light"), 1, 100);
    // A second request while one waits queues behind it (no going ahead).
    assert!(!shares.under_share(&name("light"), 1, 1000, 0));
    // Two active tenants: light's fair share is 500; room is kept for its waiting one.
    assert_eq!(
        shares.reserve(1000, 1.0, 0.0).kept_from("flood", false),
        100
    );
    let marks: Vec<WaitingMark> = (0..5)
        .map(|_| shares.waiting(name("light"), 1, 100))
        .collect();
    // 600 waiting, 500 beyond its next request: at its share, nothing kept.
    assert!(shares.reserve(1000, 1.0, 0.0).is_empty());
    drop(marks);
    drop(mark);
    assert!(shares.under_share(&name("light"), 1, 1000, 0));
    assert_eq!(shares.len(), 2, "light stays known while recent");
}

#[test]
fn the_average_follows_the_held_kv_over_seconds() {
    let mut share = Share::new(1, Instant::now());
    share.kv = 1000;
    let later = share.average_at + AVERAGE_OVER;
    share.settle(later);
    // One time constant: 1 - 1/e of the way.
    assert!((share.average - 632.1).abs() < 1.0, "{}", share.average);
}

#[test]
fn each_tenants_keep_is_a_whole_slot_or_more() {
    let reserve = Reserve {
        keeps: vec![(name("light"), 456), (name("w2"), 461)],
        spare: 0,
        cap: 4096,
        slot: 461,
    };
    // Light's 456 is one slot of the largest request, not nothing.
    assert_eq!(reserve.kept_from("w2", false), 461);
    assert_eq!(reserve.kept_from("eq1", false), 922);
    let capped = Reserve {
        cap: 500,
        ..reserve
    };
    assert_eq!(capped.kept_from("eq1", false), 461);
}

#[test]
fn kept_room_counts_whole_slots_only() {
    assert!(keeps_fit(&[150, 50], 100, 100));
    assert!(!keeps_fit(&[150, 99], 200, 100));
    assert!(keeps_fit(&[200, 0], 200, 100));
    assert!(keeps_fit(&[0], 0, 100));
}
