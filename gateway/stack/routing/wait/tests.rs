//! The pump's room arithmetic: per-worker charges and kept room.
use super::*;
use crate::fleet::TenantShares;

fn free(rooms: &[u64]) -> Vec<Room> {
    rooms.iter().map(|&free| Room { free, slot: 0 }).collect()
}

fn frees(rooms: &[Room]) -> Vec<u64> {
    rooms.iter().map(|r| r.free).collect()
}

#[test]
fn each_worker_charges_at_least_its_own_slot_share() {
    // A worker of large slots (a 400-token share) and one of small slots (50).
    let mut rooms = vec![
        Room {
            free: 400,
            slot: 400,
        },
        Room {
            free: 300,
            slot: 50,
        },
    ];
    let none = Reserve::default();
    // A short request: charged 400 on the first (the roomiest), 50 on the second.
    assert!(take(&mut rooms, &head("a", 10), &none));
    assert_eq!(frees(&rooms), [0, 300]);
    for _ in 0..6 {
        assert!(take(&mut rooms, &head("a", 10), &none));
    }
    assert_eq!(frees(&rooms), [0, 0], "six slots of 50 on the second");
    assert!(!take(&mut rooms, &head("a", 10), &none));
}

fn head(tenant: &str, cost: u64) -> Head {
    Head {
        tenant: Arc::from(tenant),
        cost,
        under_share: false,
    }
}

#[test]
fn a_head_takes_the_roomiest_worker_that_fits() {
    let mut rooms = free(&[300, 500, 100]);
    let none = Reserve::default();
    assert!(take(&mut rooms, &head("a", 200), &none));
    assert_eq!(frees(&rooms), [300, 300, 100]);
    assert!(!take(&mut rooms, &head("a", 301), &none));
    assert_eq!(
        frees(&rooms),
        [300, 300, 100],
        "a head that does not fit takes nothing"
    );
}

#[test]
fn a_tenants_kept_room_is_taken_only_by_that_tenant() {
    // Light held one request of 100 and gave it back: 100 is kept for it.
    let shares = Arc::new(TenantShares::default());
    drop(shares.hold(Arc::from("light"), 1, 100));
    let _flood = shares.hold(Arc::from("flood"), 1, 700);
    // The flood has more waiting: above its share, nothing kept for it.
    let _waiting = shares.waiting(Arc::from("flood"), 1, 700);
    let reserve = shares.reserve(1000, 0.5, 0.0);
    assert_eq!(reserve.kept_from("flood", false), 100);
    let mut rooms = free(&[150, 100]);
    assert!(take(&mut rooms, &head("flood", 50), &reserve));
    assert_eq!(frees(&rooms), [100, 100]);
    assert!(take(&mut rooms, &head("other", 100), &reserve));
    assert!(
        !take(&mut rooms, &head("other", 100), &reserve),
        "the last slot is kept for light"
    );
    assert_eq!(frees(&rooms), [100, 0]);
    assert!(take(&mut rooms, &head("light", 100), &reserve));
    assert_eq!(frees(&rooms), [0, 0]);
}
