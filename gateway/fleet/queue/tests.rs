use super::*;
use futures_util::FutureExt;
use proptest::prelude::*;

const HOUR: Duration = Duration::from_secs(3600);

fn entry(tenant: &str, weight: u32, class: Priority, cost: u64) -> QueueEntry {
    QueueEntry {
        tenant: Arc::from(tenant),
        weight,
        class,
        cost,
        deadline: Instant::now() + HOUR,
        under_share: false,
    }
}

fn std_entry(tenant: &str, cost: u64) -> QueueEntry {
    entry(tenant, 1, Priority::Standard, cost)
}

/// Release the head alone: its tenant and cost (read from the snapshot's per-tenant depth).
fn release_next(q: &FairQueue) -> Option<(Arc<str>, u64)> {
    let before = q.snapshot().by_tenant;
    let mut cost = None;
    q.release(|c| cost.is_none() && cost.replace(c).is_none());
    let cost = cost?;
    let after = q.snapshot().by_tenant;
    let depth = |t: &Arc<str>| after.iter().find(|(a, _)| a == t).map_or(0, |(_, n)| *n);
    let (tenant, _) = before.into_iter().find(|(t, n)| depth(t) < *n)?;
    Some((tenant, cost))
}

/// A ticket's outcome if it has one now (needs a runtime for the deadline timer).
fn outcome(ticket: &mut Ticket) -> Option<Result<(), QueueRefusal>> {
    ticket.turn().now_or_never()
}

/// Release `budget` tokens' worth from backlogged tenants that join again whenever one of
/// theirs is released; the released cost per tenant.
fn backlogged_shares(
    q: &FairQueue,
    tenants: &[(&str, u32, Vec<u64>)],
    order: &[usize],
    budget: u64,
) -> Vec<u64> {
    let mut next = vec![0usize; tenants.len()];
    let mut tickets = Vec::new();
    let mut join = |t: usize, next: &mut Vec<usize>| {
        let (name, weight, costs) = &tenants[t];
        let cost = costs[next[t] % costs.len()];
        next[t] += 1;
        let ticket = q.join(entry(name, *weight, Priority::Standard, cost));
        tickets.push(ticket.expect("room in the queue"));
    };
    for &t in order {
        join(t, &mut next);
    }
    let mut served = vec![0u64; tenants.len()];
    while served.iter().sum::<u64>() < budget {
        let (tenant, cost) = release_next(q).expect("backlogged");
        let t = tenants
            .iter()
            .position(|(n, _, _)| **n == *tenant)
            .expect("known");
        served[t] += cost;
        join(t, &mut next);
    }
    served
}

fn jain(x: &[u64]) -> f64 {
    let sum: f64 = x.iter().map(|&v| v as f64).sum();
    let squares: f64 = x.iter().map(|&v| (v as f64).powi(2)).sum();
    sum * sum / (x.len() as f64 * squares)
}

#[tokio::test]
async fn equal_weights_alternate() {
    let q = FairQueue::new(64);
    let _tickets: Vec<_> = ["a", "a", "a", "a", "b", "b", "b", "b"]
        .iter()
        .map(|t| q.join(std_entry(t, 100)).unwrap())
        .collect();
    let order: Vec<String> = std::iter::from_fn(|| release_next(&q))
        .map(|(t, _)| t.to_string())
        .collect();
    assert_eq!(order, ["a", "b", "a", "b", "a", "b", "a", "b"]);
    assert!(q.is_empty());
}

#[tokio::test]
async fn weights_two_to_one_share_released_cost_two_to_one() {
    let q = FairQueue::new(64);
    let costs: Vec<u64> = (0..17).map(|i| 50 + (i * 37) % 200).collect();
    let tenants = [("heavy", 2, costs.clone()), ("light", 1, costs)];
    let served = backlogged_shares(&q, &tenants, &[0, 1, 0, 1, 1, 0], 300_000);
    let ratio = served[0] as f64 / served[1] as f64;
    assert!((1.8..=2.2).contains(&ratio), "{served:?}: {ratio}");
}

#[tokio::test]
async fn light_tenant_behind_a_long_backlog_is_served_first_or_second() {
    let q = FairQueue::new(256);
    let mut tickets: Vec<_> = (0..100)
        .map(|_| q.join(std_entry("noisy", 500)).unwrap())
        .collect();
    tickets.push(q.join(std_entry("light", 500)).unwrap());
    let first_two: Vec<_> = (0..2).filter_map(|_| release_next(&q)).collect();
    assert!(
        first_two.iter().any(|(t, _)| &**t == "light"),
        "{first_two:?}"
    );
    assert_eq!(q.len(), 99);
}

#[tokio::test]
async fn critical_before_standard_before_sheddable_always() {
    let q = FairQueue::new(64);
    // Cheap sheddable work from a fresh tenant still never overtakes a higher class.
    let of = |class| match class {
        Priority::Sheddable => ("batch", 1),
        Priority::Standard => ("busy", 10_000),
        Priority::Critical => ("vip", 10_000),
    };
    let _tickets: Vec<_> = (0..30usize)
        .map(|i| {
            let class = Priority::ALL[(i * 7) % 3];
            let (tenant, cost) = of(class);
            q.join(entry(tenant, 8, class, cost)).unwrap()
        })
        .collect();
    assert_eq!(q.snapshot().by_class.map(|(_, n)| n), [10, 10, 10]);
    let order: Vec<Priority> = std::iter::from_fn(|| release_next(&q))
        .filter_map(|(t, _)| Priority::ALL.into_iter().find(|&p| of(p).0 == &*t))
        .collect();
    assert_eq!(order.len(), 30);
    assert!(order.windows(2).all(|w| w[0] >= w[1]), "{order:?}");
}

#[tokio::test]
async fn a_full_queue_sheds_the_newest_lowest_and_refuses_when_nothing_is_lower() {
    let q = FairQueue::new(3);
    let mut s1 = q.join(entry("a", 1, Priority::Sheddable, 10)).unwrap();
    let mut s2 = q.join(entry("b", 1, Priority::Sheddable, 10)).unwrap();
    let mut x = q.join(std_entry("a", 10)).unwrap();
    // Nothing strictly lower than sheddable: refused at once.
    assert_eq!(
        q.join(entry("c", 1, Priority::Sheddable, 10)).err(),
        Some(QueueRefusal::Full)
    );
    let mut c1 = q.join(entry("c", 1, Priority::Critical, 10)).unwrap();
    assert_eq!(outcome(&mut s2), Some(Err(QueueRefusal::Shed)));
    assert_eq!(outcome(&mut s1), None);
    assert_eq!(q.len(), 3);
    let mut x2 = q.join(std_entry("c", 10)).unwrap();
    assert_eq!(outcome(&mut s1), Some(Err(QueueRefusal::Shed)));
    // Standard and critical only: a standard newcomer has nothing lower to shed.
    assert_eq!(q.join(std_entry("d", 10)).err(), Some(QueueRefusal::Full));
    assert_eq!(q.release(|_| true), 3);
    for t in [&mut c1, &mut x, &mut x2] {
        assert_eq!(outcome(t), Some(Ok(())));
    }
}

#[tokio::test(start_paused = true)]
async fn the_deadline_times_out_and_removes_the_entry() {
    let q = FairQueue::new(8);
    let mut late = q
        .join(QueueEntry {
            deadline: Instant::now() + Duration::from_secs(2),
            ..std_entry("a", 10)
        })
        .unwrap();
    let _other = q.join(std_entry("b", 20)).unwrap();
    let started = Instant::now();
    assert_eq!(late.turn().await, Err(QueueRefusal::TimedOut));
    assert_eq!(started.elapsed(), Duration::from_secs(2));
    assert_eq!(late.waited(), Duration::from_secs(2));
    assert_eq!(q.len(), 1);
    assert_eq!(
        release_next(&q).map(|(t, c)| (t.to_string(), c)),
        Some(("b".into(), 20))
    );
    // Asked again, the same answer.
    assert_eq!(late.turn().await, Err(QueueRefusal::TimedOut));
}

#[tokio::test(start_paused = true)]
async fn a_released_ticket_turns_ok_and_reports_its_wait() {
    let q = Arc::new(FairQueue::new(8));
    let mut ticket = q.join(std_entry("a", 10)).unwrap();
    let releaser = {
        let q = q.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(1500)).await;
            q.release(|_| true)
        })
    };
    assert_eq!(ticket.turn().await, Ok(()));
    assert_eq!(releaser.await.unwrap(), 1);
    assert_eq!(ticket.waited(), Duration::from_millis(1500));
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(
        ticket.waited(),
        Duration::from_millis(1500),
        "frozen once answered"
    );
}

#[tokio::test]
async fn dropping_a_ticket_removes_its_entry() {
    let q = FairQueue::new(8);
    let gone = q.join(std_entry("a", 10)).unwrap();
    let mut kept = q.join(std_entry("b", 20)).unwrap();
    drop(gone);
    assert_eq!(q.len(), 1);
    let mut seen = Vec::new();
    assert_eq!(
        q.release(|c| {
            seen.push(c);
            true
        }),
        1
    );
    assert_eq!(seen, [20], "no phantom head");
    assert_eq!(outcome(&mut kept), Some(Ok(())));
    assert!(q.snapshot().by_tenant.is_empty());
}

#[tokio::test]
async fn release_stops_at_a_head_that_does_not_fit() {
    let q = FairQueue::new(8);
    let mut big = q.join(std_entry("a", 100)).unwrap();
    let mut small = q.join(std_entry("a", 10)).unwrap();
    let mut asked = Vec::new();
    let admitted = q.release(|c| {
        asked.push(c);
        c <= 50
    });
    assert_eq!(
        (admitted, asked.as_slice()),
        (0, &[100][..]),
        "no overtaking"
    );
    assert_eq!((outcome(&mut big), outcome(&mut small)), (None, None));
    let mut budget = 110;
    let admitted = q.release(|c| {
        let fits = c <= budget;
        budget -= c.min(budget);
        fits
    });
    assert_eq!(admitted, 2);
    assert_eq!(outcome(&mut small), Some(Ok(())));
}

#[tokio::test(start_paused = true)]
async fn snapshot_and_retry_after_follow_the_drain_rate() {
    let q = FairQueue::new(64);
    assert_eq!(q.retry_after(), Duration::from_secs(5), "unknown rate");
    let _tickets: Vec<_> = (0..30)
        .map(|i| q.join(std_entry(["a", "b"][i % 2], 10)).unwrap())
        .collect();
    let _critical = q.join(entry("c", 1, Priority::Critical, 10)).unwrap();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let mut n = 0;
    assert_eq!(
        q.release(|_| {
            n += 1;
            n <= 11
        }),
        11
    );
    // 11 released over the queue's first 5 s: 2.2/s; 20 waiting: about 9 s.
    let snapshot = q.snapshot();
    assert_eq!(snapshot.len, 20);
    assert_eq!(snapshot.by_class.map(|(_, n)| n), [0, 20, 0]);
    let names: Vec<_> = snapshot
        .by_tenant
        .iter()
        .map(|(t, n)| (t.to_string(), *n))
        .collect();
    assert_eq!(names, [("a".to_owned(), 10), ("b".to_owned(), 10)]);
    assert_eq!(snapshot.oldest_wait, Duration::from_secs(5));
    assert!(
        (snapshot.drain_rate - 2.2).abs() < 1e-9,
        "{}",
        snapshot.drain_rate
    );
    let retry = q.retry_after().as_secs_f64();
    assert!((retry - 20.0 / 2.2).abs() < 1e-6, "{retry}");
    // Releases leave the window after 10 s.
    tokio::time::sleep(Duration::from_secs(11)).await;
    assert_eq!(q.snapshot().drain_rate, 0.0);
    assert_eq!(q.retry_after(), Duration::from_secs(5));
    assert_eq!(QueueRefusal::Full.retry_after(), Duration::from_secs(5));
    assert_eq!(QueueRefusal::Closed.retry_after(), Duration::from_secs(1));
}

#[tokio::test]
async fn closing_refuses_waiting_and_later_entries() {
    let q = FairQueue::new(8);
    let mut waiting = q.join(std_entry("a", 10)).unwrap();
    q.close();
    assert_eq!(outcome(&mut waiting), Some(Err(QueueRefusal::Closed)));
    assert_eq!(q.join(std_entry("a", 10)).err(), Some(QueueRefusal::Closed));
    let q = FairQueue::new(8);
    let mut orphan = q.join(std_entry("a", 10)).unwrap();
    drop(q);
    assert_eq!(outcome(&mut orphan), Some(Err(QueueRefusal::Closed)));
}

#[tokio::test]
async fn huge_costs_and_zero_weights_do_not_overflow() {
    let q = FairQueue::new(8);
    let _a: Vec<_> = (0..3)
        .map(|_| q.join(entry("a", 0, Priority::Standard, u64::MAX)).unwrap())
        .collect();
    let _b = q.join(entry("b", u32::MAX, Priority::Standard, 0)).unwrap();
    assert_eq!(q.release(|_| true), 4);
}

#[tokio::test]
async fn tenant_records_are_forgotten_when_a_class_empties() {
    let q = FairQueue::new(8);
    for i in 0..1000 {
        let _t = q.join(std_entry(&format!("t{i}"), 10)).unwrap();
        assert_eq!(q.release(|_| true), 1);
    }
    let state = lock(&q.state);
    assert!(state
        .lanes
        .iter()
        .all(|l| l.flows.is_empty() && l.queue.is_empty()));
    assert!(state.places.is_empty());
}

fn shares_case() -> impl Strategy<Value = (Vec<usize>, [Vec<u64>; 3])> {
    let costs = || prop::collection::vec(1u64..=2000, 1..12);
    (
        prop::collection::vec(0usize..3, 0..60),
        [costs(), costs(), costs()],
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Three equal-weight backlogged tenants: whatever their arrival interleaving and
    /// request sizes, the released tokens are shared fairly (Jain's index ≥ 0.95).
    #[test]
    fn equal_backlogged_tenants_share_fairly((mut order, costs) in shares_case()) {
        order.extend([2, 0, 1]);
        let q = FairQueue::new(256);
        let [a, b, c] = costs;
        let tenants = [("a", 1, a), ("b", 1, b), ("c", 1, c)];
        let served = backlogged_shares(&q, &tenants, &order, 200_000);
        prop_assert!(jain(&served) >= 0.95, "{:?}: {}", served, jain(&served));
    }
}

#[tokio::test]
async fn a_full_queue_sheds_from_the_tenant_with_the_most_queued_for_a_light_one() {
    let q = FairQueue::new(4);
    let mut flood: Vec<_> = (0..4)
        .map(|_| q.join(std_entry("flood", 100)).unwrap())
        .collect();
    // Full of one tenant's requests: another tenant's request takes the newest one's place.
    let _light = q
        .join(std_entry("light", 100))
        .expect("the light tenant gets in");
    let newest = flood.pop().expect("four");
    let mut newest = newest;
    assert_eq!(outcome(&mut newest), Some(Err(QueueRefusal::Shed)));
    assert_eq!(q.len(), 4);
    // The flood's own next request finds nothing it may shed: refused.
    assert_eq!(
        q.join(std_entry("flood", 100)).err(),
        Some(QueueRefusal::Full)
    );
    // Tenants with about as many queued do not shed each other.
    let q = FairQueue::new(2);
    let _a = q.join(std_entry("a", 100)).unwrap();
    let _b = q.join(std_entry("b", 100)).unwrap();
    assert_eq!(q.join(std_entry("c", 100)).err(), Some(QueueRefusal::Full));
}

#[tokio::test]
async fn a_sparse_tenant_goes_ahead_of_the_backlogged_tenants_heads() {
    let q = FairQueue::new(256);
    let mut tickets = Vec::new();
    for _ in 0..5 {
        for tenant in ["eq1", "eq2", "eq3"] {
            tickets.push(q.join(std_entry(tenant, 100)).unwrap());
        }
    }
    // Serve a few so the clock moves and every backlogged tenant has a head waiting.
    for _ in 0..3 {
        release_next(&q).expect("backlogged");
    }
    tickets.push(q.join(std_entry("light", 100)).unwrap());
    let (next, _) = release_next(&q).expect("one");
    assert_eq!(
        &*next, "light",
        "a sparse tenant is served at the next free room"
    );
    // Charged as usual: its second request waits its fair turn behind the heads.
    tickets.push(q.join(std_entry("light", 100)).unwrap());
    tickets.push(q.join(std_entry("light", 100)).unwrap());
    let next_three: Vec<_> = (0..3)
        .filter_map(|_| release_next(&q))
        .map(|(t, _)| t)
        .collect();
    assert!(
        next_three.iter().filter(|t| &***t == "light").count() <= 1,
        "{next_three:?}"
    );
}

#[test]
fn a_tenant_under_its_share_goes_ahead_and_its_head_says_so() {
    let q = FairQueue::new(8);
    let _a1 = q.join(std_entry("a", 10)).unwrap();
    let _a2 = q.join(std_entry("a", 10)).unwrap();
    // b has one queued already, so only its share makes it go ahead.
    let _b1 = q.join(std_entry("b", 10)).unwrap();
    let _b2 = q
        .join(QueueEntry {
            under_share: true,
            ..std_entry("b", 7)
        })
        .unwrap();
    let mut heads = Vec::new();
    q.release_with(|head| {
        heads.push(head.clone());
        true
    });
    // a1 and b1 are sparse; b2 (below its share) goes ahead of a2, the backlog's head.
    // Without its share it would finish at 10 + 7, after a2's 10.
    let costs: Vec<(u64, bool)> = heads.iter().map(|h| (h.cost, h.under_share)).collect();
    assert_eq!(costs, [(10, false), (10, false), (7, true), (10, false)]);
}

#[tokio::test(start_paused = true)]
async fn release_own_passes_a_head_that_does_not_fit_only_for_the_named_tenants() {
    let q = FairQueue::new(8);
    let mut big = q.join(std_entry("a", 100)).unwrap();
    let mut light = q.join(std_entry("light", 10)).unwrap();
    let mut other = q.join(std_entry("b", 10)).unwrap();
    // The head (100) does not fit 50: nothing is released in order.
    assert_eq!(q.release(|cost| cost <= 50), 0);
    // Light's own room lets it pass the head; b is not named.
    assert_eq!(
        q.release_own(|head| &*head.tenant == "light", |head| head.cost <= 50),
        1
    );
    assert_eq!(outcome(&mut light), Some(Ok(())));
    assert_eq!(outcome(&mut big), None);
    assert_eq!(outcome(&mut other), None);
    assert_eq!(q.len(), 2);
}

#[tokio::test(start_paused = true)]
async fn after_a_quiet_period_retry_after_follows_the_pace_since_the_queue_filled() {
    let q = FairQueue::new(64);
    // The queue sat empty for a minute (a quiet pool), then 26 requests arrive at once.
    tokio::time::sleep(Duration::from_secs(60)).await;
    let _tickets: Vec<_> = (0..26)
        .map(|_| q.join(std_entry("a", 10)).unwrap())
        .collect();
    // The pool frees a slot every 1.6 s.
    tokio::time::sleep(Duration::from_millis(1600)).await;
    let mut n = 0;
    assert_eq!(
        q.release(|_| {
            n += 1;
            n <= 1
        }),
        1
    );
    // 25 waiting at one release per 1.6 s: 40 s, not the 60 s (capped) that one release
    // averaged over the whole 10 s window would say.
    let retry = q.retry_after().as_secs_f64();
    assert!((retry - 40.0).abs() < 1e-6, "{retry}");
}
