//! The `x-kvgate-priority` header end to end: a tenant may lower its class or raise it up to
//! its `max_priority` (the request is served as before), asking above is 403
//! `priority_not_allowed`, a value that names no class is 400, and no engine sees either.

mod support;

use serde_json::json;
use support::*;

use kvgate_sim::{SimFault, SimRole};

const WINDOW: u64 = 32768;

#[tokio::test]
async fn the_priority_header_is_checked_against_the_tenants_maximum() {
    let sim = engine(SimRole::Unified, SimFault::None, 40960, WINDOW as usize).await;
    let mut text = config_with_pools(WINDOW, &unified_pool("p", &[worker(&sim, Some(40960))]));
    // t1 (KEY) keeps the defaults: standard, at most standard. "vip" may ask for critical.
    text.push_str(&format!(
        "\n{}priority = \"sheddable\"\nmax_priority = \"critical\"\nweight = 2\n",
        tenant_table("vip", "vip-key")
    ));
    let gw = gateway(&text).await;
    let url = format!("http://{}/generate", gw.data_addr());
    let body = json!({"model": "qwen3", "text": "hello", "sampling_params": {"max_new_tokens": 2}});

    for (key, class) in [
        (KEY, None),
        (KEY, Some("sheddable")),
        (KEY, Some("standard")),
        ("vip-key", None),
        ("vip-key", Some("critical")),
    ] {
        let headers: Vec<(&str, &str)> = class
            .map(|c| ("x-kvgate-priority", c))
            .into_iter()
            .collect();
        let reply = post_with(&url, Some(key), &headers, &body).await;
        assert_eq!(reply.status, 200, "{key} {class:?}: {}", reply.text());
    }
    let served = generations(&sim).len();

    let reply = post_with(&url, Some(KEY), &[("x-kvgate-priority", "critical")], &body).await;
    assert_eq!(reply.status, 403, "{}", reply.text());
    assert_eq!(error_code(&reply), "priority_not_allowed");
    let message = error_message(&reply);
    assert!(
        message.contains("`t1`") && message.contains("maximum is `standard`"),
        "{message}"
    );

    for garbage in ["urgent", "Critical", ""] {
        let reply = post_with(&url, Some(KEY), &[("x-kvgate-priority", garbage)], &body).await;
        assert_eq!(reply.status, 400, "{garbage:?}: {}", reply.text());
        assert_eq!(error_code(&reply), "invalid_request");
        assert!(error_message(&reply).contains("sheddable, standard, critical"));
    }
    assert_eq!(generations(&sim).len(), served, "refusals reach no engine");
}
