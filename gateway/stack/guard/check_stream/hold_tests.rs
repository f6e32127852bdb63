//! What a stream's client sees while the leak scan runs: block mode lets a healthy stream's
//! events out as they are checked and holds only inside a run of another tenant's text;
//! strict mode holds every stream back. The guarantees in `guard/leak.rs`, checked here
//! event by event (one generated word per event, as an engine streams).

use bytes::Bytes;
use proptest::prelude::*;
use std::sync::Arc;
use std::time::Instant;

use super::{StreamCheck, UsageRewrite};
use crate::config::LeakMode;
use crate::stack::guard::inspect::{Expectation, Markers, Shape, Trip};
use crate::stack::guard::leak::LeakScan;
use crate::stack::guard::sse::{SseEvent, SseReframer};
use crate::stack::isolate::leak::units::{longest_shared_run, units_of};
use crate::stack::isolate::leak::{FingerprintStore, LeakDetectorConfig};

const NGRAM: usize = 8;
const MIN_MATCHES: usize = 2;

/// Alice's secret-bearing prompt: distinct words, so every 8-gram of it is hers alone.
fn alice_prompt() -> String {
    (0..120)
        .map(|i| format!("alicew{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn store_with_alice() -> FingerprintStore {
    let store = FingerprintStore::new(LeakDetectorConfig {
        ngram: NGRAM,
        min_matches: MIN_MATCHES,
        ..Default::default()
    });
    store.record_prompt("alice", &units_of(&alice_prompt()), Instant::now());
    // Bob's own prompt is on record too, as the isolation stage does before dispatch.
    store.record_prompt("bob", &units_of(&healthy_words(0, 60)), Instant::now());
    store
}

fn healthy_words(from: usize, to: usize) -> String {
    (from..to)
        .map(|i| format!("bobw{i}"))
        .collect::<Vec<_>>()
        .join(" ")
}

fn check_for_bob(store: &FingerprintStore, mode: LeakMode) -> StreamCheck {
    let scan = LeakScan::new(store.scanner("bob"), mode, Arc::new(|_| {}));
    StreamCheck::new(
        Shape::OpenAi,
        Markers::default(),
        Expectation {
            prompt_tokens: None,
            tolerance: 0,
        },
        1,
        UsageRewrite::default(),
    )
    .with_leak_scan(Some(scan))
}

fn chunk_event(piece: &str) -> SseEvent {
    let data = serde_json::json!({"choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": null}]});
    let mut events = Vec::new();
    let mut reframer = SseReframer::new();
    reframer
        .push(
            SseEvent::data_event(&data.to_string()).as_ref(),
            &mut events,
        )
        .unwrap();
    events.pop().unwrap()
}

/// The words of `text` as stream pieces (" word" each, as detokenizers emit them).
fn pieces(text: &str) -> Vec<String> {
    text.split_whitespace().map(|w| format!(" {w}")).collect()
}

/// Feeds `pieces` one event each: per event, how many events left at once; the text that
/// reached the client; the trip, if one ended the stream.
fn stream(check: &mut StreamCheck, pieces: &[String]) -> (Vec<usize>, String, Option<Trip>) {
    let mut released = Vec::new();
    let mut client = String::new();
    for piece in pieces {
        let bytes = match check.event(&chunk_event(piece)) {
            Ok(Some(bytes)) => bytes,
            Ok(None) => continue,
            Err(trip) => return (released, client, Some(trip)),
        };
        let out = check.release(bytes);
        released.push(out.len());
        client.extend(out.iter().map(text_of));
    }
    (released, client, None)
}

/// The generated text inside released event bytes.
fn text_of(bytes: &Bytes) -> String {
    let mut events = Vec::new();
    SseReframer::new().push(bytes, &mut events).unwrap();
    events
        .iter()
        .filter_map(|e| e.json())
        .filter_map(|v| {
            v["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_owned)
        })
        .collect()
}

#[test]
fn block_mode_lets_every_event_of_a_healthy_stream_out_as_it_is_checked() {
    let store = store_with_alice();
    let mut check = check_for_bob(&store, LeakMode::Block);
    // Bob's answer quotes his own prompt and new words: nothing of it is only Alice's.
    let text = format!("{} {}", healthy_words(0, 40), healthy_words(500, 540));
    let (released, _, trip) = stream(&mut check, &pieces(&text));
    assert!(trip.is_none());
    assert!(
        released.iter().all(|&n| n == 1),
        "every event leaves with its own check: {released:?}"
    );
}

#[test]
fn strict_mode_holds_every_stream_back_by_k_plus_one_units() {
    let store = store_with_alice();
    let mut check = check_for_bob(&store, LeakMode::Strict);
    let (released, _, trip) = stream(&mut check, &pieces(&healthy_words(500, 540)));
    assert!(trip.is_none());
    let k = NGRAM + MIN_MATCHES - 1;
    assert!(released[..k + 1].iter().all(|&n| n == 0), "{released:?}");
    assert_eq!(released[k + 1], 1, "{released:?}");
}

#[test]
fn block_mode_holds_one_foreign_ngram_and_releases_it_when_the_run_breaks() {
    let store = store_with_alice();
    let mut check = check_for_bob(&store, LeakMode::Block);
    // Exactly one 8-gram of Alice's (below min_matches), then Bob's words again.
    let alice: Vec<String> = pieces(&alice_prompt())[10..10 + NGRAM].to_vec();
    let mut all = pieces(&healthy_words(500, 505));
    all.extend(alice);
    all.extend(pieces(&healthy_words(505, 510)));
    let (released, client, trip) = stream(&mut check, &all);
    assert!(trip.is_none(), "one foreign n-gram is not a suspicion");
    // Out as they come until the event whose word (still open) would complete the n-gram;
    // held until the unit after the run is complete (the second event after it: each
    // word ends only when the next event's space arrives), which releases all three.
    let hold_at = 5 + NGRAM - 1;
    assert!(released[..hold_at].iter().all(|&n| n == 1), "{released:?}");
    assert_eq!(
        released[hold_at], 0,
        "held: its open word ends a foreign n-gram"
    );
    assert_eq!(
        released[hold_at + 1],
        0,
        "held until the next unit is complete"
    );
    assert_eq!(released[hold_at + 2], 3, "the break releases what was held");
    assert!(released[hold_at + 3..].iter().all(|&n| n == 1));
    assert_eq!(units_of(&client).len(), all.len(), "nothing lost");
}

#[test]
fn block_mode_stops_a_leak_with_at_most_ngram_minus_one_foreign_units_out() {
    let store = store_with_alice();
    for mode in [LeakMode::Block, LeakMode::Strict] {
        let mut check = check_for_bob(&store, mode);
        let mut all = pieces(&healthy_words(500, 520));
        all.extend(pieces(&alice_prompt()));
        let (_, client, trip) = stream(&mut check, &all);
        assert!(
            matches!(trip, Some(Trip::LeakSuspected { owners: 1 })),
            "{mode:?}: {trip:?}"
        );
        let out = longest_shared_run(&client, &alice_prompt());
        let most = if mode == LeakMode::Strict {
            0
        } else {
            NGRAM - 1
        };
        assert!(out <= most, "{mode:?}: {out} foreign units reached bob");
        if mode == LeakMode::Block {
            assert_eq!(
                out,
                NGRAM - 1,
                "the bound is tight: the run is seen at its n-th unit"
            );
        }
    }
}

#[test]
fn text_two_tenants_sent_is_common_and_never_held() {
    let store = store_with_alice();
    // Bob sends Alice's document too: its n-grams are common from then on.
    store.record_prompt("bob", &units_of(&alice_prompt()), Instant::now());
    let mut check = check_for_bob(&store, LeakMode::Block);
    let (released, _, trip) = stream(&mut check, &pieces(&alice_prompt()));
    assert!(trip.is_none());
    assert!(released.iter().all(|&n| n == 1), "{released:?}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Whatever healthy text precedes it, however many words each event carries and
    /// wherever in Alice's prompt the leaked run starts: the stream trips, and at most
    /// `ngram - 1` units of her text reach Bob (none in strict mode).
    #[test]
    fn a_leaked_run_is_stopped_within_the_bound(
        healthy in 0usize..30,
        start in 0usize..60,
        len in (NGRAM + MIN_MATCHES - 1)..60,
        words_per_event in 1usize..4,
        strict in any::<bool>(),
    ) {
        let store = store_with_alice();
        let mode = if strict { LeakMode::Strict } else { LeakMode::Block };
        let mut check = check_for_bob(&store, mode);
        let alice = pieces(&alice_prompt());
        let mut words = pieces(&healthy_words(500, 500 + healthy));
        words.extend(alice[start..start + len].iter().cloned());
        words.extend(pieces(&healthy_words(600, 610)));
        let events: Vec<String> = words.chunks(words_per_event).map(|c| c.concat()).collect();
        let (_, client, trip) = stream(&mut check, &events);
        let tripped = matches!(trip, Some(Trip::LeakSuspected { .. }));
        prop_assert!(tripped, "{trip:?}");
        let out = longest_shared_run(&client, &alice_prompt());
        prop_assert!(out <= if strict { 0 } else { NGRAM - 1 }, "{} units out", out);
    }

    /// A healthy stream (no n-gram only another tenant sent) is never held in block mode,
    /// however its events are cut.
    #[test]
    fn a_healthy_stream_is_never_held(
        from in 0usize..1000,
        len in 1usize..80,
        words_per_event in 1usize..4,
    ) {
        let store = store_with_alice();
        let mut check = check_for_bob(&store, LeakMode::Block);
        let words = pieces(&healthy_words(from, from + len));
        let events: Vec<String> = words.chunks(words_per_event).map(|c| c.concat()).collect();
        let (released, _, trip) = stream(&mut check, &events);
        prop_assert!(trip.is_none());
        prop_assert!(released.iter().all(|&n| n == 1), "{:?}", released);
    }
}
