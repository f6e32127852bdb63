use super::*;

use tokio::task::JoinHandle;

/// A scheduler over a pool of `capacity` tokens in pages of 4.
fn scheduler(capacity: usize, max_running: Option<usize>, wait: Duration) -> Arc<Scheduler> {
    let wake = Arc::new(Notify::new());
    let pool = KvPool::new(capacity, 4, Arc::clone(&wake));
    Scheduler::new(
        pool,
        wake,
        Arc::new(Notify::new()),
        Arc::new(SimStats::default()),
        max_running.and_then(NonZeroUsize::new),
        wait,
    )
}

fn demand(rid: &str, kv_tokens: usize) -> Demand<'_> {
    Demand {
        rid,
        kv_tokens,
        prompt_tokens: kv_tokens / 2,
    }
}

/// Yields until `done` holds: spawned waiters get to run, no clock is read.
async fn until(scheduler: &Scheduler, done: impl Fn(Load) -> bool) {
    for _ in 0..10_000 {
        if done(scheduler.load()) {
            return;
        }
        tokio::task::yield_now().await;
    }
    panic!("never reached: {:?}", scheduler.load());
}

/// Spawns a request that waits for admission and then holds its place until `release`.
fn spawn_waiter(
    scheduler: &Arc<Scheduler>,
    rid: &'static str,
    kv_tokens: usize,
    release: Arc<Notify>,
) -> JoinHandle<Result<(), PoolError>> {
    let scheduler = Arc::clone(scheduler);
    tokio::spawn(async move {
        let running = scheduler.admit(demand(rid, kv_tokens)).await?;
        release.notified().await;
        drop(running);
        Ok(())
    })
}

#[tokio::test]
async fn the_head_of_the_queue_blocks_smaller_requests_behind_it() {
    let scheduler = scheduler(16, None, Duration::from_secs(60));
    let held = scheduler.admit(demand("first", 8)).await.unwrap();
    let release = Arc::new(Notify::new());
    // 12 tokens do not fit beside the first request's 8; 4 would, but must not pass.
    let big = spawn_waiter(&scheduler, "big", 12, Arc::clone(&release));
    until(&scheduler, |l| l.waiting == 1).await;
    let small = spawn_waiter(&scheduler, "small", 4, Arc::clone(&release));
    until(&scheduler, |l| l.waiting == 2).await;
    for _ in 0..100 {
        tokio::task::yield_now().await;
    }
    let load = scheduler.load();
    assert_eq!((load.running, load.waiting), (1, 2), "small passed big");
    assert_eq!(load.waiting_prompt_tokens, 6 + 2);
    assert_eq!(scheduler.stats.admissions(), ["first"]);

    // The first request ends: big is admitted, and small (4 beside big's 12) right after.
    drop(held);
    until(&scheduler, |l| l.waiting == 0 && l.running == 2).await;
    assert_eq!(scheduler.stats.admissions(), ["first", "big", "small"]);
    release.notify_waiters();
    big.await.unwrap().unwrap();
    small.await.unwrap().unwrap();
    let stats = scheduler.stats.snapshot();
    assert_eq!((stats.scheduled, stats.admitted, stats.queued), (3, 3, 2));
    assert_eq!(stats.peak_waiting, 2);
    assert_eq!(stats.peak_kv_tokens, 16);
    assert_eq!(scheduler.load(), Load::default());
}

#[tokio::test]
async fn max_running_requests_bounds_the_batch_even_with_free_pages() {
    let scheduler = scheduler(64, Some(2), Duration::from_secs(60));
    let release = Arc::new(Notify::new());
    let waiters: Vec<_> = ["a", "b", "c", "d"]
        .into_iter()
        .map(|rid| spawn_waiter(&scheduler, rid, 4, Arc::clone(&release)))
        .collect();
    until(&scheduler, |l| l.running == 2 && l.waiting == 2).await;
    // Release one at a time: each end lets exactly one more in.
    release.notify_one();
    until(&scheduler, |l| l.running == 2 && l.waiting == 1).await;
    release.notify_one();
    until(&scheduler, |l| l.running == 2 && l.waiting == 0).await;
    release.notify_one();
    release.notify_one();
    for waiter in waiters {
        waiter.await.unwrap().unwrap();
    }
    assert_eq!(scheduler.stats.snapshot().peak_running, 2);
}

#[tokio::test(start_paused = true)]
async fn a_request_not_admitted_in_time_leaves_the_queue_with_exhausted() {
    let scheduler = scheduler(8, None, Duration::from_millis(50));
    let held = scheduler.admit(demand("held", 8)).await.unwrap();
    let err = scheduler.admit(demand("late", 4)).await.err().unwrap();
    assert!(matches!(err, PoolError::Exhausted { need: 4, .. }));
    assert_eq!(scheduler.load().waiting, 0);
    // The queue is not stuck behind the one that gave up.
    drop(held);
    let next = scheduler.admit(demand("next", 8)).await.unwrap();
    assert_eq!(next.content().len(), 0);
}

#[tokio::test]
async fn a_cancelled_waiter_leaves_the_queue_and_the_next_one_moves_up() {
    let scheduler = scheduler(8, None, Duration::from_secs(60));
    let held = scheduler.admit(demand("held", 8)).await.unwrap();
    let release = Arc::new(Notify::new());
    let gone = spawn_waiter(&scheduler, "gone", 8, Arc::clone(&release));
    until(&scheduler, |l| l.waiting == 1).await;
    let next = spawn_waiter(&scheduler, "next", 8, Arc::clone(&release));
    until(&scheduler, |l| l.waiting == 2).await;
    // The head's client goes away (hyper drops the handler's future).
    gone.abort();
    until(&scheduler, |l| l.waiting == 1).await;
    drop(held);
    until(&scheduler, |l| l.running == 1 && l.waiting == 0).await;
    assert_eq!(scheduler.stats.admissions(), ["held", "next"]);
    release.notify_waiters();
    next.await.unwrap().unwrap();
}

#[tokio::test]
async fn a_request_larger_than_the_pool_is_refused_at_once_and_capped_takes_what_is_free() {
    let scheduler = scheduler(16, None, Duration::from_secs(60));
    let err = scheduler.admit(demand("huge", 17)).await.err().unwrap();
    assert_eq!(
        err,
        PoolError::TooLarge {
            need: 17,
            capacity: 16
        }
    );
    assert_eq!(scheduler.stats.snapshot().scheduled, 0);
    let held = scheduler.admit(demand("held", 8)).await.unwrap();
    let capped = scheduler
        .admit_capped(demand("capped", 1000))
        .await
        .unwrap();
    assert_eq!(scheduler.pool().used_tokens(), 16);
    // Leaving the batch keeps the pages but frees the seat.
    let pages = capped.leave_batch();
    assert_eq!(scheduler.load().running, 1);
    assert_eq!(scheduler.pool().used_tokens(), 16);
    drop(pages);
    drop(held);
    assert_eq!(scheduler.load(), Load::default());
}
