//! Property tests of the guard's stream check over the re-framer: whatever the chunk
//! boundaries, a valid stream passes byte for byte, and arbitrary bytes never panic and get
//! the same verdict however they are cut.

use bytes::Bytes;
use proptest::prelude::*;
use std::sync::Arc;

use super::{StreamCheck, UsageRewrite};
use crate::stack::guard::inspect::{Expectation, Markers, Shape, Trip};
use crate::stack::guard::sse::tests::cut;
use crate::stack::guard::sse::SseReframer;

/// Feed `chunks` through a re-framer and a fresh check: what would reach the client, and the
/// trip that ended the stream, if any.
fn run(chunks: &[&[u8]], prompt_tokens: u64) -> (Vec<u8>, Option<Trip>) {
    let expect = Expectation {
        prompt_tokens: Some(Arc::from(vec![prompt_tokens])),
        tolerance: 0,
    };
    let mut check = StreamCheck::new(
        Shape::Native,
        Markers::default(),
        expect,
        1,
        UsageRewrite::default(),
    );
    let mut reframer = SseReframer::new();
    let mut out = Vec::new();
    let mut events = Vec::new();
    let emit = |check: &mut StreamCheck, bytes: Bytes, out: &mut Vec<u8>| {
        for b in check.release(bytes) {
            out.extend_from_slice(&b);
        }
    };
    for chunk in chunks {
        if reframer.push(chunk, &mut events).is_err() {
            return (out, Some(Trip::Truncated { detail: "limit" }));
        }
        for event in events.drain(..) {
            match check.event(&event) {
                Ok(Some(bytes)) => emit(&mut check, bytes, &mut out),
                Ok(None) => {}
                Err(trip) => return (out, Some(trip)),
            }
        }
    }
    if let Some(tail) = reframer.finish() {
        match check.event(&tail) {
            Ok(Some(bytes)) => emit(&mut check, bytes, &mut out),
            Ok(None) => {}
            Err(trip) => return (out, Some(trip)),
        }
    }
    match check.end() {
        Ok(()) => {
            for b in check.release_all() {
                out.extend_from_slice(&b);
            }
            (out, None)
        }
        Err(trip) => (out, Some(trip)),
    }
}

/// A valid SGLang native stream of `pieces` (cumulative text), ending with a length finish.
fn native_stream(pieces: &[String], prompt_tokens: u64) -> Vec<u8> {
    let mut text = String::new();
    let mut out = String::new();
    for (i, piece) in pieces.iter().enumerate() {
        text.push_str(piece);
        let last = i + 1 == pieces.len();
        let finish = if last {
            serde_json::json!({"type": "length", "length": pieces.len()})
        } else {
            serde_json::Value::Null
        };
        let event = serde_json::json!({
            "text": text,
            "meta_info": {"id": "r", "finish_reason": finish,
                          "prompt_tokens": prompt_tokens, "completion_tokens": i + 1},
        });
        out.push_str(&format!("data: {event}\n\n"));
    }
    out.push_str("data: [DONE]\n\n");
    out.into_bytes()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    #[test]
    fn a_valid_stream_passes_unchanged_however_it_is_cut(
        pieces in prop::collection::vec("[a-z \\n]{0,12}", 1..12),
        prompt in 1u64..100_000,
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let input = native_stream(&pieces, prompt);
        let (out, trip) = run(&cut(&input, &cuts), prompt);
        prop_assert_eq!(trip, None);
        prop_assert_eq!(out, input.clone());
        // Byte by byte, too.
        let bytes: Vec<&[u8]> = input.chunks(1).collect();
        prop_assert_eq!(run(&bytes, prompt).1, None);
        // The wrong prompt count always trips, wherever the cuts are.
        let (_, trip) = run(&cut(&input, &cuts), prompt + 1);
        prop_assert!(matches!(trip, Some(Trip::PromptTokens { .. })), "{:?}", trip);
    }

    #[test]
    fn arbitrary_bytes_never_panic_and_the_verdict_ignores_chunking(
        input in prop::collection::vec(
            prop_oneof![
                4 => prop::sample::select(&b"data: \n\r{}[]\":,DONE"[..]),
                2 => prop::sample::select(&b"textmeta_infofinish_reasonnulllength"[..]),
                1 => any::<u8>(),
            ],
            0..300,
        ),
        cuts in prop::collection::vec(any::<prop::sample::Index>(), 0..30),
    ) {
        let whole = run(&[&input], 3);
        let chunked = run(&cut(&input, &cuts), 3);
        prop_assert_eq!(&whole, &chunked);
        // Nothing reaches the client past a trip's point, and no stream of junk passes.
        prop_assert!(whole.0.len() <= input.len());
        if whole.1.is_none() {
            prop_assert!(input.windows(6).any(|w| w == b"[DONE]"), "passed without [DONE]");
        }
    }
}

/// One event of a generated OpenAI stream: any field of any type engines (or broken
/// engines) send, usage sometimes, errors sometimes.
fn openai_event() -> impl Strategy<Value = String> {
    let value = |values: &'static [&'static str]| {
        prop::option::weighted(0.75, prop::sample::select(values).prop_map(str::to_owned))
    };
    let choice = (
        value(&["0", "1", "\"1\"", "null"]),
        value(&[
            "null",
            "\"stop\"",
            "\"length\"",
            "\"abort\"",
            "\"error\"",
            "7",
        ]),
        value(&[
            "{\"content\":\"a word\"}",
            "{\"content\":\"PLACEHOLDER\"}",
            "{\"content\":\"PLACE\"}",
            "{\"content\":\"HOLDER \\u0041\"}",
            "{\"content\":null}",
            "{\"role\":\"assistant\"}",
            "null",
            "\"x\"",
        ]),
        value(&["\"text piece\"", "\"PLACEHOLDER\"", "null", "3"]),
    )
        .prop_map(|(index, finish, delta, text)| {
            let fields: Vec<String> = [
                ("index", index),
                ("finish_reason", finish),
                ("delta", delta),
                ("text", text),
            ]
            .into_iter()
            .filter_map(|(k, v)| v.map(|v| format!("\"{k}\":{v}")))
            .collect();
            format!("{{{}}}", fields.join(","))
        });
    let choices = prop_oneof![
        6 => prop::collection::vec(choice, 0..3).prop_map(|c| format!("[{}]", c.join(","))),
        1 => prop::sample::select(&["null", "\"x\"", "{}"][..]).prop_map(str::to_owned),
    ];
    (
        prop::option::weighted(0.9, choices),
        prop::option::weighted(
            0.4,
            prop::sample::select(
                &[
                    "{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}",
                    "{\"prompt_tokens\":8,\"total_tokens\":9}",
                    "{\"prompt_tokens\":7,\"total_tokens\":\"9\"}",
                    "{\"prompt_tokens\":7,\"prompt_tokens\":8}",
                    "{}",
                    "[7]",
                    "7",
                    "null",
                ][..],
            )
            .prop_map(str::to_owned),
        ),
        prop::option::weighted(0.05, Just("{\"message\":\"boom\"}".to_string())),
    )
        .prop_map(|(choices, usage, error)| {
            let fields: Vec<String> = [("choices", choices), ("usage", usage), ("error", error)]
                .into_iter()
                .filter_map(|(k, v)| v.map(|v| format!("\"{k}\":{v}")))
                .collect();
            format!("data: {{{}}}\n\n", fields.join(","))
        })
}

/// Every event's outcome, then the end's, the usage and what reached the client.
fn run_openai(
    events: &[String],
    batch: usize,
    rewrite: UsageRewrite,
    typed_view: bool,
) -> Vec<String> {
    let markers = Markers::from_config(&crate::config::GuardConfig {
        markers: vec!["PLACEHOLDER".into()],
        ..crate::config::GuardConfig::default()
    });
    let expect = Expectation {
        prompt_tokens: Some(Arc::from(vec![7, 7])),
        tolerance: 0,
    };
    let mut check = StreamCheck::new(Shape::OpenAi, markers, expect, batch, rewrite);
    check.typed_view = typed_view;
    let mut reframer = SseReframer::new();
    let mut parsed = Vec::new();
    let mut seen = Vec::new();
    for event in events {
        reframer.push(event.as_bytes(), &mut parsed).unwrap();
        for e in parsed.drain(..) {
            let outcome = check.event(&e);
            seen.push(format!("{outcome:?}"));
            if outcome.is_err() {
                return seen;
            }
        }
    }
    seen.push(format!("{:?}", check.end()));
    seen.push(format!("{:?}", check.usage_total()));
    seen
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(1024))]

    #[test]
    fn typed_chunks_are_checked_as_the_tree_checks_them(
        mut events in prop::collection::vec(openai_event(), 1..6),
        done in any::<bool>(),
        batch in 1usize..3,
        strip_final_usage in any::<bool>(),
        strip_chunk_usage in any::<bool>(),
    ) {
        if done {
            events.push("data: [DONE]\n\n".into());
        }
        let rewrite = UsageRewrite { strip_final_usage, strip_chunk_usage };
        let typed = run_openai(&events, batch, rewrite, true);
        let tree = run_openai(&events, batch, rewrite, false);
        prop_assert_eq!(typed, tree, "{:?}", events);
    }
}

#[test]
fn the_chunk_equivalence_test_exercises_the_typed_view() {
    use crate::stack::guard::inspect::typed::OpenAiChunk;
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut typed, total) = (0, 512);
    for _ in 0..total {
        let event = openai_event().new_tree(&mut runner).unwrap().current();
        let data = event.trim_start_matches("data: ").trim_end();
        typed += usize::from(OpenAiChunk::parse(data).is_some());
    }
    assert!(
        typed * 2 > total,
        "only {typed} of {total} chunks took the typed view"
    );
}

#[test]
fn usage_only_on_the_finishing_chunk_is_the_final_usage() {
    // llama.cpp's /v1/completions stream: no continuous usage, the final usage on the chunk
    // with the finish_reason, no usage chunk of its own.
    let events: Vec<String> = [
        r#"{"choices":[{"index":0,"text":"a","finish_reason":null}]}"#,
        r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}"#,
        "[DONE]",
    ]
    .iter()
    .map(|d| format!("data: {d}\n\n"))
    .collect();
    for typed_view in [true, false] {
        let asked = UsageRewrite {
            strip_final_usage: false,
            strip_chunk_usage: true,
        };
        let out = run_openai(&events, 1, asked, typed_view);
        assert!(out[1].contains("usage"), "kept when asked: {out:?}");
        let not_asked = UsageRewrite {
            strip_final_usage: true,
            strip_chunk_usage: true,
        };
        let out = run_openai(&events, 1, not_asked, typed_view);
        assert!(
            !out[1].contains("usage"),
            "stripped when not asked: {out:?}"
        );
    }
    // An engine that honours continuous usage: stripped from every chunk with choices, the
    // finishing one included; its own final usage chunk is what the client gets.
    let continuous: Vec<String> = [
        r#"{"choices":[{"index":0,"text":"a","finish_reason":null}],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}"#,
        r#"{"choices":[{"index":0,"text":"","finish_reason":"length"}],"usage":{"prompt_tokens":7,"completion_tokens":2,"total_tokens":9}}"#,
        // (run_openai expects prompts of 7 tokens for two samples: 14 in all)
        r#"{"choices":[],"usage":{"prompt_tokens":14,"completion_tokens":2,"total_tokens":16}}"#,
        "[DONE]",
    ]
    .iter()
    .map(|d| format!("data: {d}\n\n"))
    .collect();
    let asked = UsageRewrite {
        strip_final_usage: false,
        strip_chunk_usage: true,
    };
    let out = run_openai(&continuous, 1, asked, true);
    assert!(
        !out[0].contains("usage") && !out[1].contains("usage"),
        "{out:?}"
    );
    assert!(out[2].contains("usage"), "{out:?}");
}
