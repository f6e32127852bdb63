use super::*;
use serde_json::json;

fn expect(counts: &[u64]) -> Expectation {
    Expectation {
        prompt_tokens: Some(counts.to_vec().into()),
        tolerance: 0,
    }
}

fn markers(literals: &[&str], patterns: &[&str]) -> Markers {
    Markers::from_config(&GuardConfig {
        markers: literals.iter().map(|s| s.to_string()).collect(),
        marker_patterns: patterns.iter().map(|s| s.to_string()).collect(),
        ..GuardConfig::default()
    })
}

fn native(finish: Value, prompt: u64, text: &str) -> Vec<u8> {
    json!({"text": text, "meta_info": {"finish_reason": finish, "prompt_tokens": prompt}})
        .to_string()
        .into_bytes()
}

#[test]
fn native_abort_keeps_its_status_or_has_none() {
    let m = Markers::default();
    let with = native(
        json!({"type": "abort", "message": "too long", "status_code": 400}),
        5,
        "",
    );
    assert_eq!(
        check_answer(Shape::Native, &with, &m, &expect(&[5])),
        Err(Trip::Aborted {
            status: Some(400),
            message: "too long".into()
        })
    );
    let without = native(
        json!({"type": "abort", "message": "gone", "status_code": null}),
        5,
        "x",
    );
    assert!(matches!(
        check_answer(Shape::Native, &without, &m, &expect(&[5])),
        Err(Trip::Aborted { status: None, .. })
    ));
    let ok = native(json!({"type": "length", "length": 4}), 5, "fine");
    assert_eq!(check_answer(Shape::Native, &ok, &m, &expect(&[5])), Ok(()));
}

#[test]
fn batches_errors_and_empty_results_trip() {
    let m = Markers::default();
    let batch = json!([
        {"text": "a", "meta_info": {"finish_reason": {"type": "stop"}, "prompt_tokens": 3}},
        {"text": "b", "meta_info": {"finish_reason": {"type": "abort", "message": "x"}, "prompt_tokens": 4}}
    ]);
    assert!(matches!(
        check_answer(
            Shape::Native,
            batch.to_string().as_bytes(),
            &m,
            &expect(&[3, 4])
        ),
        Err(Trip::Aborted { .. })
    ));
    for body in [
        r#"{"error":{"message":"boom","code":503}}"#,
        r#"{"object":"error","message":"bad","code":400}"#,
    ] {
        assert!(matches!(
            check_answer(Shape::OpenAi, body.as_bytes(), &m, &expect(&[1])),
            Err(Trip::ErrorIn2xx { .. })
        ));
    }
    for (shape, body) in [
        (Shape::Native, "[]"),
        (Shape::Native, "{}"),
        (Shape::Native, "not json"),
        (Shape::OpenAi, r#"{"choices": []}"#),
        (Shape::OpenAi, r#"{"id": "x"}"#),
    ] {
        assert!(
            matches!(
                check_answer(shape, body.as_bytes(), &m, &expect(&[1])),
                Err(Trip::EmptyResult { .. })
            ),
            "{body}"
        );
    }
}

#[test]
fn openai_abort_and_error_finish_reasons_trip() {
    let m = Markers::default();
    for reason in ["abort", "error"] {
        let body = json!({"choices": [{"message": {"content": "x"}, "finish_reason": reason}], "usage": {"prompt_tokens": 2}});
        assert!(matches!(
            check_answer(
                Shape::OpenAi,
                body.to_string().as_bytes(),
                &m,
                &expect(&[2])
            ),
            Err(Trip::Aborted { .. })
        ));
    }
    let ok = json!({"choices": [{"message": {"content": "x"}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 2}});
    assert_eq!(
        check_answer(Shape::OpenAi, ok.to_string().as_bytes(), &m, &expect(&[2])),
        Ok(())
    );
}

#[test]
fn a_swapped_in_placeholder_shows_in_the_prompt_count() {
    let m = Markers::default();
    let body = native(
        json!({"type": "length", "length": 8}),
        1,
        "someone else's text",
    );
    assert_eq!(
        check_answer(Shape::Native, &body, &m, &expect(&[5000])),
        Err(Trip::PromptTokens {
            sample: 0,
            expected: 5000,
            reported: 1
        })
    );
    let tolerant = Expectation {
        prompt_tokens: Some(vec![5000].into()),
        tolerance: 2,
    };
    let near = native(json!({"type": "length", "length": 8}), 4998, "ok");
    assert_eq!(check_answer(Shape::Native, &near, &m, &tolerant), Ok(()));
}

#[test]
fn markers_match_literals_and_patterns() {
    let m = markers(&["[[PLACEHOLDER]]"], &["(?i)request was aborted"]);
    let lit = native(json!({"type": "stop"}), 3, "... [[PLACEHOLDER]] ...");
    assert_eq!(
        check_answer(Shape::Native, &lit, &m, &expect(&[3])),
        Err(Trip::PlaceholderMarker)
    );
    let pat = json!({"choices": [{"message": {"content": "The Request Was Aborted."}, "finish_reason": "stop"}]});
    assert_eq!(
        check_answer(Shape::OpenAi, pat.to_string().as_bytes(), &m, &expect(&[3])),
        Err(Trip::PlaceholderMarker)
    );
    assert!(m.overlap() >= "[[PLACEHOLDER]]".len());
}

#[test]
fn the_prefill_leg_is_checked_in_json_and_sse_form() {
    let e = expect(&[10]);
    let json_abort = native(
        json!({"type": "abort", "message": "no", "status_code": 400}),
        10,
        "",
    );
    assert!(matches!(
        check_prefill(Shape::Native, &json_abort, &e),
        Err(Trip::Aborted {
            status: Some(400),
            ..
        })
    ));
    let placeholder = native(json!({"type": "length", "length": 0}), 1, "");
    assert!(matches!(
        check_prefill(Shape::Native, &placeholder, &e),
        Err(Trip::PromptTokens { .. })
    ));
    let sse = "data: {\"text\":\"\",\"meta_info\":{\"finish_reason\":{\"type\":\"abort\",\"message\":\"x\"},\"prompt_tokens\":10}}\n\ndata: [DONE]\n\n";
    assert!(matches!(
        check_prefill(Shape::Native, sse.as_bytes(), &e),
        Err(Trip::Aborted { .. })
    ));
    let fine = native(json!({"type": "length", "length": 0}), 10, "");
    assert_eq!(check_prefill(Shape::Native, &fine, &e), Ok(()));
}
