//! Tests of the leak detector: real Qwen3 token ids for the scenarios, injected time for
//! the window, random splits and a reference model for the scanner, a long run for the bound.

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::LazyLock;
use std::time::{Duration, Instant};

use proptest::prelude::*;

use super::*;
use kvgate_tokenize::ModelTokenizer;

static QWEN3: LazyLock<ModelTokenizer> = LazyLock::new(|| {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("config/tokenizers/qwen3");
    ModelTokenizer::from_dir(&dir).expect("tokenizer files ship with the repository")
});

fn ids(text: &str) -> Vec<u32> {
    QWEN3.encode(text, false).expect("encodes")
}

const SECRET: &str = "Patient Jane Roe, born 1984-03-07, was prescribed 40 mg of \
    fluoxetine after the consultation on Tuesday; her insurance number is NL-7781-2299.";
const PUBLIC_DOC: &str = "The Apache License, Version 2.0, grants every contributor's \
    patent license to make, have made, use, offer to sell, sell, import, and otherwise \
    transfer the Work, where such license applies only to those patent claims.";

fn store() -> FingerprintStore {
    FingerprintStore::new(LeakDetectorConfig::default())
}

fn scan(store: &FingerprintStore, tenant: &str, text: &str, now: Instant) -> Option<LeakSuspicion> {
    let mut scanner = store.scanner(tenant);
    scanner.feed(&ids(text), now);
    scanner.suspicion()
}

#[test]
fn another_tenants_secret_in_a_response_is_suspected() {
    let (store, t0) = (store(), Instant::now());
    store.record_prompt("a", &ids(&format!("Summarise this record: {SECRET}")), t0);
    store.record_prompt("b", &ids("Write a haiku about autumn."), t0);

    let response = format!("Here is a haiku. Also: {SECRET} Leaves fall softly.");
    let found = scan(&store, "b", &response, t0).expect("A's secret in B's response");
    assert_eq!(found.owner_tenants, 1);
    assert!(found.matched_ngrams >= 10, "{found:?}");
    // A tenant that never sent a prompt is protected too.
    assert!(scan(&store, "newcomer", &response, t0).is_some());
}

#[test]
fn a_tenants_own_prompt_echoed_back_is_not_a_leak() {
    let (store, t0) = (store(), Instant::now());
    store.record_prompt("a", &ids(&format!("Summarise this record: {SECRET}")), t0);
    let response = format!("You wrote: {SECRET} In short, a prescription.");
    assert_eq!(scan(&store, "a", &response, t0), None);
}

#[test]
fn text_two_tenants_sent_is_common_and_never_counts() {
    let (store, t0) = (store(), Instant::now());
    store.record_prompt(
        "a",
        &ids(&format!("Please explain this carefully: {PUBLIC_DOC}")),
        t0,
    );
    store.record_prompt("b", &ids(&format!("Translate to Dutch: {PUBLIC_DOC}")), t0);
    let echo = format!("The text says: {PUBLIC_DOC}");
    for tenant in ["a", "b", "c"] {
        assert_eq!(scan(&store, tenant, &echo, t0), None, "{tenant}");
    }
    // ...while what only A sent around it is still A's.
    let own = "Please explain this carefully: The Apache License, Version 2.0, grants";
    assert!(scan(&store, "c", own, t0).is_some());
}

#[test]
fn fewer_than_min_matches_is_no_suspicion() {
    let (store, t0) = (store(), Instant::now());
    let prompt: Vec<u32> = (100..140).collect();
    store.record_prompt("a", &prompt, t0);
    let mut scanner = store.scanner("b");
    // Exactly one foreign 8-gram, then unrelated ids.
    assert_eq!(scanner.feed(&prompt[..8], t0), None);
    assert_eq!(scanner.feed(&[1, 2, 3], t0), None);
    assert_eq!(scanner.suspicion(), None);
    // Repeating the same n-gram is still one distinct match.
    scanner.feed(&prompt[..8], t0);
    assert_eq!(scanner.suspicion(), None);
    // A second distinct one reaches min_matches = 2, and alarms once.
    let found = scanner.feed(&prompt[1..9], t0);
    assert_eq!(
        found,
        Some(LeakSuspicion {
            owner_tenants: 1,
            matched_ngrams: 2
        })
    );
    assert_eq!(scanner.feed(&prompt[2..10], t0), None);
    assert_eq!(scanner.suspicion().map(|s| s.matched_ngrams), Some(3));
}

#[test]
fn owners_are_counted_per_tenant() {
    let (store, t0) = (store(), Instant::now());
    let a: Vec<u32> = (100..120).collect();
    let b: Vec<u32> = (500..520).collect();
    store.record_prompt("a", &a, t0);
    store.record_prompt("b", &b, t0);
    let mut scanner = store.scanner("c");
    scanner.feed(&a, t0);
    scanner.feed(&b, t0);
    let found = scanner.suspicion().expect("both leak");
    assert_eq!(found.owner_tenants, 2);
    assert_eq!(found.matched_ngrams, 2 * (20 - 8 + 1));
}

#[test]
fn entries_older_than_the_window_never_match() {
    let (store, t0) = (store(), Instant::now());
    let window = store.config().window;
    let first: Vec<u32> = (100..130).collect();
    let later: Vec<u32> = (700..730).collect();
    store.record_prompt("a", &first, t0);
    // Same one-minute bucket, 30 s later: expiry is per entry, not per bucket.
    store.record_prompt("a", &later, t0 + Duration::from_secs(30));

    let found = |ids: &[u32], at: Instant| {
        let mut scanner = store.scanner("b");
        scanner.feed(ids, at);
        scanner.suspicion().is_some()
    };
    assert!(found(&first, t0 + window));
    assert!(!found(&first, t0 + window + Duration::from_millis(1)));
    assert!(found(&later, t0 + window + Duration::from_millis(1)));
    assert!(!found(&later, t0 + window + Duration::from_secs(31)));

    // Old buckets are dropped whole: by the shard a new prompt touches, or by `expire`.
    assert_eq!(store.len(), 2 * (30 - 8 + 1));
    store.expire(t0 + window + Duration::from_secs(31));
    assert_eq!(store.len(), 0);
    assert!(store.is_empty());
}

#[test]
fn a_prompt_sent_again_within_a_span_is_recorded_once_and_still_remembered() {
    let (store, t0) = (store(), Instant::now());
    let window = store.config().window;
    let span = window / 10;
    let prompt: Vec<u32> = (100..130).collect();
    let found = |at: Instant| {
        let mut scanner = store.scanner("b");
        scanner.feed(&prompt, at);
        scanner.suspicion().is_some()
    };
    store.record_prompt("a", &prompt, t0);
    // Sent again 30 s later: not recorded again, so it expires with the first send...
    store.record_prompt("a", &prompt, t0 + Duration::from_secs(30));
    assert!(found(t0 + window));
    assert!(!found(t0 + window + Duration::from_millis(1)));
    // ...which is never more than one span before its last send's window ends.
    assert!(Duration::from_secs(30) < span);
    // After a span it is recorded again, and lives a window from then.
    store.record_prompt("a", &prompt, t0 + span);
    assert!(found(t0 + span + window));
    // Another tenant sending it is recorded at once: the text becomes common.
    store.record_prompt("b", &prompt, t0 + span);
    let mut scanner = store.scanner("c");
    scanner.feed(&prompt, t0 + span);
    assert!(scanner.suspicion().is_none());
}

#[test]
fn a_text_prompt_sent_again_is_not_split_again() {
    let (store, t0) = (store(), Instant::now());
    let prompt: Vec<u32> = (100..130).collect();
    let splits = std::cell::Cell::new(0);
    let units = || {
        splits.set(splits.get() + 1);
        prompt.clone()
    };
    store.record_text_prompt("a", 42, t0, units);
    store.record_text_prompt("a", 42, t0 + Duration::from_secs(1), units);
    assert_eq!(splits.get(), 1);
    store.record_text_prompt("a", 43, t0, units);
    store.record_text_prompt("b", 42, t0, units);
    assert_eq!(splits.get(), 3, "another text, or another tenant, is split");
    let mut scanner = store.scanner("c");
    scanner.feed(&prompt, t0);
    assert!(
        scanner.suspicion().is_none(),
        "a and b both sent it: common"
    );
}

#[test]
fn common_text_becomes_owned_again_when_one_owner_ages_out() {
    let (store, t0) = (store(), Instant::now());
    let doc = ids(PUBLIC_DOC);
    store.record_prompt("a", &doc, t0);
    store.record_prompt("b", &doc, t0 + Duration::from_secs(300));
    let echo = |at: Instant| {
        let mut scanner = store.scanner("c");
        scanner.feed(&doc, at);
        scanner.suspicion()
    };
    assert_eq!(echo(t0 + Duration::from_secs(301)), None);
    // A's copy is older than the window: only B's recent prompt holds the text now.
    let found = echo(t0 + Duration::from_secs(601)).expect("B's text");
    assert_eq!(found.owner_tenants, 1);
}

#[test]
fn the_cap_evicts_the_oldest_first() {
    // 90 entries: one shard, buckets of 9.
    let store = FingerprintStore::new(LeakDetectorConfig {
        max_entries: 90,
        ..LeakDetectorConfig::default()
    });
    let t0 = Instant::now();
    let secret: Vec<u32> = (10_000..10_020).collect();
    store.record_prompt("a", &secret, t0);
    for i in 0..20u32 {
        let filler: Vec<u32> = (i * 100..i * 100 + 20).collect();
        store.record_prompt("c", &filler, t0 + Duration::from_millis(u64::from(i)));
        assert!(store.len() <= 90);
    }
    let seen = |ids: &[u32]| {
        let mut scanner = store.scanner("b");
        scanner.feed(ids, t0);
        scanner.suspicion().is_some()
    };
    assert!(!seen(&secret), "oldest prompt evicted");
    assert!(
        seen(&(1900..1920).collect::<Vec<_>>()),
        "newest prompt kept"
    );
}

#[test]
fn memory_stays_within_its_bound_over_a_long_run() {
    const MAX: usize = 50_000;
    let store = FingerprintStore::new(LeakDetectorConfig {
        max_entries: MAX,
        ..LeakDetectorConfig::default()
    });
    let t0 = Instant::now();
    let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let mut peak_bytes = 0;
    for i in 0..100_000u64 {
        let len = 8 + (next() % 56) as usize;
        let prompt: Vec<u32> = (0..len).map(|_| (next() % 151_000) as u32).collect();
        // 100 tenants, 100k prompts over ~17 minutes: time and size eviction both run.
        let tenant = format!("t{}", i % 100);
        store.record_prompt(&tenant, &prompt, t0 + Duration::from_millis(i * 10));
        if i % 1000 == 0 {
            assert!(store.len() <= MAX);
            peak_bytes = peak_bytes.max(store.memory_bytes());
        }
    }
    assert!(store.len() <= MAX);
    assert!(store.len() > MAX / 2, "the store is used: {}", store.len());
    // Tables grow by doubling, so each may be up to 2 × 8/7 of its entries; plus per-table
    // and per-bucket overhead (at most 2 × GENERATIONS + 2 buckets per shard) and names.
    let buckets = fingerprint::SHARDS * 22;
    let bound = MAX * ENTRY_BYTES * 16 / 7 + buckets * (64 + 16 + 8 * ENTRY_BYTES) + 64 * 1024;
    peak_bytes = peak_bytes.max(store.memory_bytes());
    assert!(peak_bytes <= bound, "{peak_bytes} > {bound}");
    assert!(store.memory_bytes() >= store.len() * ENTRY_BYTES);
}

#[test]
fn degenerate_configs_do_not_panic() {
    let t0 = Instant::now();
    for (ngram, max_entries, min_matches) in [(0, 10, 0), (1, 0, 1), (1, 1, 1), (64, 5, 3)] {
        let store = FingerprintStore::new(LeakDetectorConfig {
            ngram,
            window: Duration::ZERO,
            max_entries,
            min_matches,
        });
        store.record_prompt("a", &[1, 2, 3], t0);
        store.record_prompt("a", &[], t0);
        assert!(store.len() <= max_entries);
        let mut scanner = store.scanner("b");
        scanner.feed(&[1, 2, 3], t0);
        scanner.feed(&[], t0);
        let _ = scanner.suspicion();
    }
}

#[test]
fn the_sweep_rebuilds_the_filter_without_losing_a_live_prompt() {
    let (store, t0) = (store(), Instant::now());
    let window = store.config().window;
    let old: Vec<u32> = (100..130).collect();
    let live: Vec<u32> = (700..730).collect();
    store.record_prompt("a", &old, t0);
    let later = t0 + window / 2;
    store.record_prompt("a", &live, later);
    let found = |ids: &[u32], at: Instant| {
        let mut scanner = store.scanner("b");
        scanner.feed(ids, at);
        scanner.suspicion().is_some()
    };
    // The sweep drops the old bucket and rebuilds the filter from the live one.
    let sweep = t0 + window + Duration::from_secs(61);
    store.expire(sweep);
    assert!(
        found(&live, sweep),
        "a live prompt is still caught after the rebuild"
    );
    assert!(!found(&old, sweep));

    // Sweeps racing with recording and scanning on other threads never hide a prompt
    // recorded before the scan started.
    let recording = std::sync::atomic::AtomicUsize::new(2);
    std::thread::scope(|s| {
        s.spawn(|| {
            while recording.load(std::sync::atomic::Ordering::Relaxed) > 0 {
                store.expire(sweep);
            }
        });
        for tenant in ["c", "d"] {
            let (store, recording) = (&store, &recording);
            s.spawn(move || {
                for i in 0..3_000u32 {
                    let base = 10_000 + i * 100 + if tenant == "c" { 0 } else { 1 << 24 };
                    let secret: Vec<u32> = (0..24).map(|k| base + k).collect();
                    store.record_prompt(tenant, &secret, sweep);
                    let mut scanner = store.scanner("b");
                    scanner.feed(&secret[2..20], sweep);
                    assert!(
                        scanner.suspicion().is_some(),
                        "{tenant}'s secret {i} missed"
                    );
                }
                recording.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
            });
        }
    });
}

#[test]
fn store_and_scanner_cross_threads() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<FingerprintStore>();
    assert_send_sync::<ResponseScanner>();
    assert_send_sync::<crate::stack::isolate::CacheSalter>();
}

// === property tests ===

/// Three tenants' prompts over a small alphabet (so n-grams repeat and overlap), and a
/// response built from pieces of them and noise.
fn scenario() -> impl Strategy<Value = (Vec<Vec<u32>>, Vec<u32>, usize)> {
    let prompt = prop::collection::vec(0u32..6, 0..40);
    let prompts = prop::collection::vec(prompt, 3);
    let piece = prop_oneof![
        (0usize..3, 0usize..40, 1usize..20).prop_map(|(t, at, len)| (Some(t), at, len)),
        prop::collection::vec(0u32..6, 1..10).prop_map(|v| (None, v.len(), v.len())),
    ];
    (
        prompts,
        prop::collection::vec(piece, 0..8),
        0usize..4,
        1u32..4,
    )
        .prop_map(|(prompts, pieces, me, seed)| {
            let mut response = Vec::new();
            for (tenant, at, len) in pieces {
                match tenant {
                    Some(t) => {
                        let p = &prompts[t];
                        let at = at.min(p.len());
                        response.extend_from_slice(&p[at..(at + len).min(p.len())]);
                    }
                    None => response.extend((0..len as u32).map(|i| (i * seed + 1) % 6)),
                }
            }
            (prompts, response, me)
        })
}

fn config(ngram: usize) -> LeakDetectorConfig {
    LeakDetectorConfig {
        ngram,
        min_matches: 2,
        ..LeakDetectorConfig::default()
    }
}

fn filled(prompts: &[Vec<u32>], ngram: usize, t0: Instant) -> FingerprintStore {
    let store = FingerprintStore::new(config(ngram));
    for (t, prompt) in prompts.iter().enumerate() {
        store.record_prompt(&format!("t{t}"), prompt, t0);
    }
    store
}

/// The rules, stated directly: an n-gram is foreign if exactly one tenant's prompt holds it
/// and that tenant is not `me`.
fn reference(prompts: &[Vec<u32>], response: &[u32], me: usize, n: usize) -> (usize, usize) {
    let mut owners: HashMap<&[u32], HashSet<usize>> = HashMap::new();
    for (t, prompt) in prompts.iter().enumerate() {
        for w in prompt.windows(n) {
            owners.entry(w).or_default().insert(t);
        }
    }
    let mut matched = HashSet::new();
    let mut tenants = HashSet::new();
    for w in response.windows(n) {
        if let Some(set) = owners.get(w) {
            if set.len() == 1 && !set.contains(&me) {
                matched.insert(w);
                tenants.extend(set.iter().copied());
            }
        }
    }
    (matched.len(), tenants.len())
}

proptest! {
    #[test]
    fn any_split_finds_what_one_feed_finds(
        (prompts, response, me) in scenario(),
        ngram in 1usize..6,
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..12),
    ) {
        let t0 = Instant::now();
        let store = filled(&prompts, ngram, t0);
        let me = format!("t{me}");

        let mut whole = store.scanner(&me);
        let alarm = whole.feed(&response, t0);
        prop_assert_eq!(alarm, whole.suspicion());

        let mut pieces = store.scanner(&me);
        let mut cuts: Vec<usize> = cuts.iter().map(|c| c.index(response.len() + 1)).collect();
        cuts.sort_unstable();
        let mut alarms = Vec::new();
        let mut from = 0;
        for to in cuts.into_iter().chain([response.len()]) {
            alarms.extend(pieces.feed(&response[from..to], t0));
            from = to;
        }
        prop_assert_eq!(pieces.suspicion(), whole.suspicion());
        prop_assert_eq!(alarms.len(), usize::from(whole.suspicion().is_some()));

        let mut bytewise = store.scanner(&me);
        for id in &response {
            bytewise.feed(std::slice::from_ref(id), t0);
        }
        prop_assert_eq!(bytewise.suspicion(), whole.suspicion());
    }

    #[test]
    fn the_scanner_follows_the_rules(
        (prompts, response, me) in scenario(),
        ngram in 1usize..6,
    ) {
        let t0 = Instant::now();
        let store = filled(&prompts, ngram, t0);
        let mut scanner = store.scanner(&format!("t{me}"));
        scanner.feed(&response, t0);
        let (matched, owners) = reference(&prompts, &response, me, ngram);
        let expected = (matched >= 2).then_some(LeakSuspicion {
            owner_tenants: owners,
            matched_ngrams: matched,
        });
        prop_assert_eq!(scanner.suspicion(), expected);
    }
}
