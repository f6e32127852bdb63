use serde_json::json;
use std::time::{Duration, Instant};

use super::window::TenantHour;
use super::*;

#[test]
fn usage_is_read_from_every_engine_shape() {
    let openai = json!({"prompt_tokens": 12, "completion_tokens": 5, "total_tokens": 17,
                        "prompt_tokens_details": {"cached_tokens": 8}});
    assert_eq!(
        TokenUsage::from_usage(&openai),
        Some(TokenUsage {
            prompt: 12,
            completion: 5,
            cached: 8
        })
    );
    let responses = json!({"input_tokens": 3, "output_tokens": 2,
                           "input_tokens_details": {"cached_tokens": 1}});
    assert_eq!(
        TokenUsage::from_usage(&responses),
        Some(TokenUsage {
            prompt: 3,
            completion: 2,
            cached: 1
        })
    );
    let meta = json!({"prompt_tokens": 7, "completion_tokens": 4, "cached_tokens": 6});
    assert_eq!(
        TokenUsage::from_meta(&meta),
        Some(TokenUsage {
            prompt: 7,
            completion: 4,
            cached: 6
        })
    );
    let batch = json!([{"text": "a", "meta_info": meta}, {"text": "b", "meta_info": meta}]);
    assert_eq!(
        TokenUsage::from_answer(&batch),
        Some(TokenUsage {
            prompt: 14,
            completion: 8,
            cached: 12
        })
    );
    assert_eq!(TokenUsage::from_usage(&json!({"total_tokens": 3})), None);
}

#[test]
fn outcomes_are_a_fixed_set() {
    assert_eq!(
        Outcome::of_error_code("upstream_timeout"),
        Outcome::EngineError
    );
    assert_eq!(
        Outcome::of_error_code("rate_limit_exceeded"),
        Outcome::Refused
    );
    assert_eq!(
        Outcome::of_error_code("internal_error"),
        Outcome::InternalError
    );
    assert_eq!(Outcome::of_error_code("anything new"), Outcome::Refused);
    assert_eq!(Outcome::of_stream_end("success"), Outcome::Ok);
    assert_eq!(Outcome::of_stream_end("guard_error"), Outcome::GuardTrip);
    assert_eq!(
        Outcome::of_stream_end("client_cancelled"),
        Outcome::ClientGone
    );
    let labels: Vec<_> = Outcome::ALL.iter().map(|o| o.label()).collect();
    assert_eq!(
        labels,
        [
            "ok",
            "refused",
            "engine_error",
            "guard_trip",
            "client_gone",
            "internal_error"
        ]
    );
}

#[test]
fn the_hour_forgets_what_is_older_than_an_hour() {
    let hour = TenantHour::new("t".into());
    let start = Instant::now();
    let used = Some(TokenUsage {
        prompt: 10,
        completion: 2,
        cached: 1,
    });
    hour.add_at(start, Outcome::Ok, used);
    hour.add_at(start, Outcome::Refused, None);
    let later = start + Duration::from_secs(30 * 60);
    hour.add_at(later, Outcome::Ok, used);
    let seen = hour.last_hour(later);
    assert_eq!(
        seen,
        HourCounts {
            requests: 3,
            errors: 1,
            prompt: 20,
            completion: 4,
            cached: 2
        }
    );
    let much_later = start + Duration::from_secs(75 * 60);
    assert_eq!(hour.last_hour(much_later).requests, 1);
    assert_eq!(
        hour.last_hour(start + Duration::from_secs(2 * 3600))
            .requests,
        0
    );
}

#[test]
fn a_ledger_times_its_tokens_and_settles_once() {
    let ledger = Ledger::new(std::sync::Arc::new(Book::default()));
    let first = Instant::now() + Duration::from_millis(100);
    ledger.token_times(first, first + Duration::from_millis(90));
    ledger.usage(TokenUsage {
        prompt: 4,
        completion: 10,
        cached: 0,
    });
    ledger.outcome(Outcome::Ok);
    let snap = ledger.snapshot();
    assert_eq!(snap.inter_token, Some(Duration::from_millis(10)));
    assert!(snap.ttft.is_some_and(|d| d >= Duration::from_millis(100)));
    let mut fields = Vec::new();
    snap.audit_fields(&mut fields);
    let names: Vec<_> = fields.iter().map(|(k, _)| *k).collect();
    // No tenant: an empty book names none.
    assert_eq!(
        names,
        [
            "prompt_tokens",
            "completion_tokens",
            "cached_tokens",
            "ttft_ms",
            "itl_ms"
        ]
    );
    ledger.settle();
    ledger.settle();
}
