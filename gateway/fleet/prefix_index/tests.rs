use super::*;

fn worker(slot: usize) -> Candidate {
    Candidate { slot, epoch: 0 }
}

/// Distinct keys spread over every shard (as block keys, they look random).
fn keys(from: u64, n: u64) -> Vec<u64> {
    (from..from + n)
        .map(|i| crate::stack::routing::blocks::chain(&[i as u32], 1)[0])
        .collect()
}

#[test]
fn a_worker_matches_the_prefix_it_was_sent_and_others_nothing() {
    let index = PrefixIndex::new(3, 1000, Duration::from_secs(60));
    let now = Instant::now();
    let chain = keys(0, 10);
    index.insert(&chain, worker(1), now);
    let all = [worker(0), worker(1), worker(2)];
    assert_eq!(index.longest(&chain, &all, now), vec![0, 10, 0]);
    // A longer prompt with the same first 10 blocks, then its own.
    let mut longer = chain.clone();
    longer.extend(keys(100, 5));
    assert_eq!(index.longest(&longer, &all, now), vec![0, 10, 0]);
    // Diverging after 4 blocks.
    let mut other = chain[..4].to_vec();
    other.extend(keys(200, 6));
    assert_eq!(index.longest(&other, &all, now), vec![0, 4, 0]);
    index.insert(&other, worker(2), now);
    assert_eq!(index.longest(&other, &all, now), vec![0, 4, 10]);
    assert_eq!(index.longest(&chain, &all, now), vec![0, 10, 4]);
    assert_eq!(index.longest(&[], &all, now), vec![0, 0, 0]);
    assert_eq!(index.size().blocks, 16);
}

#[test]
fn the_bound_evicts_the_least_recently_sent_and_keeps_a_prefix() {
    let index = PrefixIndex::new(2, 8, Duration::from_secs(60));
    let now = Instant::now();
    let first = keys(0, 6);
    index.insert(&first, worker(0), now);
    let second = keys(50, 6);
    index.insert(&second, worker(1), now);
    assert_eq!(
        index.size(),
        IndexSize {
            blocks: 8,
            max_blocks: 8
        }
    );
    // The second prompt is whole; of the first, its leading blocks stayed (inserted last
    // block first, they were its most recent).
    assert_eq!(index.longest(&second, &[worker(1)], now), vec![6]);
    assert_eq!(index.longest(&first, &[worker(0)], now), vec![2]);
    // Sending the first again makes it the most recent: now the second loses blocks.
    index.insert(&first, worker(0), now);
    assert_eq!(index.longest(&first, &[worker(0)], now), vec![6]);
    assert_eq!(index.longest(&second, &[worker(1)], now), vec![2]);
    for round in 0..50 {
        index.insert(&keys(1000 + round * 7, 7), worker(round as usize % 2), now);
        assert!(index.size().blocks <= 8);
    }
}

#[test]
fn a_large_index_is_sharded_and_stays_within_its_bound() {
    let index = PrefixIndex::new(4, 2048, Duration::from_secs(60));
    let now = Instant::now();
    for round in 0..100u64 {
        index.insert(&keys(round * 64, 64), worker((round % 4) as usize), now);
    }
    let size = index.size();
    assert!(
        size.blocks <= size.max_blocks && size.max_blocks <= 2048,
        "{size:?}"
    );
    assert!(size.blocks > 1024, "{size:?}");
    let last = keys(99 * 64, 64);
    assert_eq!(index.longest(&last, &[worker(3)], now), vec![64]);
}

#[test]
fn holders_older_than_max_age_no_longer_count_and_are_evicted() {
    let index = PrefixIndex::new(2, 100, Duration::from_secs(10));
    let t0 = Instant::now();
    let chain = keys(0, 4);
    index.insert(&chain, worker(0), t0);
    let later = t0 + Duration::from_secs(9);
    assert_eq!(index.longest(&chain, &[worker(0)], later), vec![4]);
    let expired = t0 + Duration::from_secs(11);
    assert_eq!(index.longest(&chain, &[worker(0)], expired), vec![0]);
    // The next insert drops them.
    index.insert(&keys(10, 1), worker(1), expired);
    assert_eq!(index.size().blocks, 1);
}

#[test]
fn a_worker_that_left_service_matches_nothing_and_its_entries_go() {
    let index = PrefixIndex::new(2, 100, Duration::from_secs(60));
    let now = Instant::now();
    let chain = keys(0, 5);
    index.insert(&chain, worker(0), now);
    index.insert(&chain, worker(1), now);
    index.insert(&keys(20, 3), worker(0), now);
    assert_eq!(index.size().blocks, 8);
    // Worker 0 was drained (its epoch moved on): its old entries do not count …
    let moved = Candidate { slot: 0, epoch: 1 };
    assert_eq!(index.longest(&chain, &[moved, worker(1)], now), vec![0, 5]);
    // … and syncing purges them: keys only it held go, shared ones keep worker 1.
    index.sync(&[moved, worker(1)]);
    assert_eq!(index.size().blocks, 5);
    assert_eq!(
        index.longest(&chain, &[worker(0), worker(1)], now),
        vec![0, 5]
    );
    // Back in service, it is sent prompts anew.
    index.insert(&chain, moved, now);
    assert_eq!(index.longest(&chain, &[moved, worker(1)], now), vec![5, 5]);
}

#[test]
fn a_fifth_worker_replaces_the_one_sent_a_key_longest_ago() {
    let index = PrefixIndex::new(5, 100, Duration::from_secs(60));
    let t0 = Instant::now();
    let chain = keys(0, 2);
    for slot in 0..5 {
        index.insert(&chain, worker(slot), t0 + Duration::from_secs(slot as u64));
    }
    let all: Vec<Candidate> = (0..5).map(worker).collect();
    let now = t0 + Duration::from_secs(5);
    assert_eq!(index.longest(&chain, &all, now), vec![0, 2, 2, 2, 2]);
}

#[test]
fn a_rebuilt_pool_keeps_the_entries_of_the_workers_it_keeps_at_their_new_slots() {
    let index = PrefixIndex::new(3, 1000, Duration::from_secs(60));
    let now = Instant::now();
    let (a, b, c) = (keys(0, 6), keys(100, 6), keys(200, 6));
    index.insert(&a, worker(0), now);
    index.insert(&b, worker(1), now);
    index.insert(&c, worker(2), now);
    // Old worker 1 is gone; old 2 is the new 0, old 0 the new 1, and a new worker is 2.
    let like = PrefixIndex::new(3, 1000, Duration::from_secs(60));
    let rebuilt = index
        .remapped(&[Some(1), None, Some(0)], &like)
        .expect("same bounds");
    let all = [worker(0), worker(1), worker(2)];
    assert_eq!(rebuilt.longest(&c, &all, now), vec![6, 0, 0]);
    assert_eq!(rebuilt.longest(&a, &all, now), vec![0, 6, 0]);
    assert_eq!(
        rebuilt.longest(&b, &all, now),
        vec![0, 0, 0],
        "the gone worker's entries are purged, not given to the new one"
    );
    // Other bounds: nothing carried.
    let other = PrefixIndex::new(3, 10, Duration::from_secs(60));
    assert!(index
        .remapped(&[Some(0), Some(1), Some(2)], &other)
        .is_none());
}
