//! The typed view against the tree path, on generated answers.

use super::super::answer::Parsed;
use super::super::{check_openai, Answer, Expectation, Markers, Shape};
use crate::config::GuardConfig;
use proptest::prelude::*;
use serde_json::Value;

/// What the tree path reads from `body`: check outcome, usage, texts.
fn tree(
    body: &[u8],
    markers: &Markers,
    expect: &Expectation,
) -> (String, Option<u64>, Vec<String>) {
    let answer = Answer(Parsed::Tree(serde_json::from_slice::<Value>(body).ok()));
    read(&answer, markers, expect)
}

fn read(
    answer: &Answer<'_>,
    markers: &Markers,
    expect: &Expectation,
) -> (String, Option<u64>, Vec<String>) {
    (
        format!("{:?}", answer.check(Shape::OpenAi, markers, expect)),
        answer.usage(Shape::OpenAi),
        answer
            .texts(Shape::OpenAi)
            .into_iter()
            .map(str::to_owned)
            .collect(),
    )
}

fn markers() -> Markers {
    Markers::from_config(&GuardConfig {
        markers: vec!["PLACEHOLDER".into()],
        ..GuardConfig::default()
    })
}

fn expect() -> Expectation {
    Expectation {
        prompt_tokens: Some(vec![7].into()),
        tolerance: 0,
    }
}

fn one_of(values: &'static [&'static str]) -> impl Strategy<Value = Option<String>> {
    prop::option::weighted(0.8, prop::sample::select(values).prop_map(str::to_owned))
}

/// Fields in a shuffled order, each maybe absent, sometimes one twice.
fn object(fields: Vec<(&'static str, Option<String>)>, dup: bool, order: usize) -> String {
    let mut present: Vec<String> = fields
        .into_iter()
        .filter_map(|(k, v)| v.map(|v| format!("\"{k}\":{v}")))
        .collect();
    if !present.is_empty() {
        let n = present.len();
        present.rotate_left(order % n);
        if dup {
            present.push(present[0].clone());
        }
    }
    format!("{{{}}}", present.join(","))
}

const FINISH: &[&str] = &[
    "\"stop\"",
    "\"length\"",
    "\"abort\"",
    "\"error\"",
    "null",
    "7",
    "{}",
];
const TEXT: &[&str] = &[
    "\"t\"",
    "\"a PLACEHOLDER here\"",
    "\"esc\\u0061ped \\\"PLACEHOLDER\\\"\"",
    "null",
    "5",
    "[\"PLACEHOLDER\"]",
];
const MESSAGE: &[&str] = &[
    "{\"role\":\"assistant\",\"content\":\"hi\"}",
    "{\"content\":\"PLACEHOLDER\"}",
    "{\"content\":null}",
    "{\"content\":7}",
    "{}",
    "null",
    "\"x\"",
    "[\"PLACEHOLDER\"]",
    "{\"content\":\"PLACEHOLDER\",\"content\":\"ok\"}",
];
const USAGE: &[&str] = &[
    "{\"prompt_tokens\":7,\"completion_tokens\":2,\"total_tokens\":9}",
    "{\"prompt_tokens\":8,\"total_tokens\":9}",
    "{\"prompt_tokens\":-7,\"total_tokens\":9.0}",
    "{\"prompt_tokens\":\"7\"}",
    "{\"prompt_tokens\":7,\"prompt_tokens\":8}",
    "[7,9]",
    "null",
    "7",
];
const OTHER: &[&str] = &[
    "null",
    "\"chat.completion\"",
    "\"error\"",
    "{\"message\":\"boom\",\"code\":500}",
    "7",
];

fn choice() -> impl Strategy<Value = String> {
    let object = (
        one_of(FINISH),
        one_of(MESSAGE),
        one_of(TEXT),
        one_of(&["0"]),
        any::<bool>(),
        0..4usize,
    )
        .prop_map(|(f, m, t, i, dup, order)| {
            object(
                vec![
                    ("finish_reason", f),
                    ("message", m),
                    ("text", t),
                    ("index", i),
                ],
                dup && order == 0,
                order,
            )
        });
    prop_oneof![8 => object, 1 => prop::sample::select(&["null", "\"x\"", "7", "[]"][..]).prop_map(str::to_owned)]
}

fn answer() -> impl Strategy<Value = String> {
    let choices = prop_oneof![
        8 => prop::collection::vec(choice(), 0..3).prop_map(|c| format!("[{}]", c.join(","))),
        1 => prop::sample::select(&["null", "{}", "\"x\""][..]).prop_map(str::to_owned),
    ];
    let error = prop::option::weighted(0.15, prop::sample::select(OTHER).prop_map(str::to_owned));
    let object_field =
        prop::option::weighted(0.5, prop::sample::select(OTHER).prop_map(str::to_owned));
    (
        choices,
        one_of(USAGE),
        object_field,
        error,
        one_of(&["\"x\""]),
        any::<bool>(),
        0..4usize,
    )
        .prop_map(|(c, u, object_field, error, id, dup, order)| {
            object(
                vec![
                    ("choices", Some(c)),
                    ("usage", u),
                    ("object", object_field),
                    ("error", error),
                    ("id", id),
                ],
                dup && order == 1,
                order,
            )
        })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2048))]

    #[test]
    fn the_typed_view_reads_every_answer_as_the_tree_does(body in answer()) {
        let (markers, expect) = (markers(), expect());
        let want = tree(body.as_bytes(), &markers, &expect);
        let answer = Answer::parse(body.as_bytes(), Shape::OpenAi);
        prop_assert_eq!(read(&answer, &markers, &expect), want, "{}", body);
    }
}

#[test]
fn the_equivalence_test_exercises_the_typed_view() {
    // The property above only means something if many generated answers take the
    // typed path rather than falling back to the tree.
    use proptest::strategy::ValueTree;
    let mut runner = proptest::test_runner::TestRunner::deterministic();
    let (mut typed, total) = (0, 512);
    for _ in 0..total {
        let body = answer().new_tree(&mut runner).unwrap().current();
        typed += usize::from(matches!(
            Answer::parse(body.as_bytes(), Shape::OpenAi).0,
            Parsed::OpenAi(_)
        ));
    }
    assert!(
        typed * 4 > total,
        "only {typed} of {total} answers took the typed view"
    );
}

#[test]
fn the_typed_view_takes_the_usual_answer_and_leaves_the_rest_to_the_tree() {
    let usual = br#"{"id":"x","object":"chat.completion","choices":[{"index":0,"message":{"role":"assistant","content":"hi"},"finish_reason":"stop"}],"usage":{"prompt_tokens":7,"completion_tokens":1,"total_tokens":8}}"#;
    assert!(matches!(
        Answer::parse(usual, Shape::OpenAi).0,
        Parsed::OpenAi(_)
    ));
    for other in [
        &br#"[{"choices":[]}]"#[..],
        br#"{"error":{"message":"x"},"choices":[]}"#,
        br#"{"object":"error","message":"x"}"#,
        br#"{"choices":[],"choices":[{"finish_reason":"stop"}]}"#,
        br#"{"choices":["x"]}"#,
        br#"{"choices":[{"message":"x"}]}"#,
        br#"not json"#,
    ] {
        assert!(
            matches!(Answer::parse(other, Shape::OpenAi).0, Parsed::Tree(_)),
            "{}",
            String::from_utf8_lossy(other)
        );
    }
    // A native answer is never read as an OpenAI one.
    assert!(matches!(
        Answer::parse(usual, Shape::Native).0,
        Parsed::Tree(_)
    ));
    // The tree path, for reference, on the usual answer.
    let v: Value = serde_json::from_slice(usual).unwrap();
    assert!(check_openai(&v, &markers(), &expect()).is_ok());
}
