//! The error type's HTTP mapping and its cause chain.

use super::*;

#[test]
fn upstream_client_errors_keep_their_status_and_server_errors_become_502() {
    let e = |status| GatewayError::UpstreamStatus {
        pool: "p".into(),
        role: "decode",
        status,
        message: "m".into(),
    };
    assert_eq!(e(StatusCode::BAD_REQUEST).status(), StatusCode::BAD_REQUEST);
    assert_eq!(
        e(StatusCode::SERVICE_UNAVAILABLE).status(),
        StatusCode::SERVICE_UNAVAILABLE
    );
    assert_eq!(
        e(StatusCode::INTERNAL_SERVER_ERROR).status(),
        StatusCode::BAD_GATEWAY
    );
}

#[test]
fn error_body_has_the_openai_shape() {
    let v = GatewayError::ModelNotFound { model: "x".into() }.to_json(Some("id-1"));
    assert_eq!(v["error"]["request_id"], "id-1");
    assert_eq!(v["error"]["code"], "model_not_found");
    assert_eq!(v["error"]["param"], "model");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    assert!(v["error"]["message"].as_str().is_some());
}

#[test]
fn engine_side_errors_tell_clients_no_addresses_or_causes() {
    let unreachable = GatewayError::UpstreamUnavailable {
        pool: "p".into(),
        role: "decode",
        worker: "10.0.0.7:30000".into(),
        detail: "client error (Connect): tcp connect error: Connection refused".into(),
        connect: true,
    };
    assert!(
        unreachable.to_string().contains("10.0.0.7"),
        "the log keeps it"
    );
    let body = unreachable.to_json(None).to_string();
    assert!(
        !body.contains("10.0.0.7") && !body.contains("Connect"),
        "{body}"
    );
    let status = GatewayError::UpstreamStatus {
        pool: "p".into(),
        role: "prefill",
        status: StatusCode::BAD_REQUEST,
        message: "internal path /srv/model".into(),
    };
    assert!(!status.to_json(None).to_string().contains("/srv"));
    assert!(!GatewayError::Internal("secret".into())
        .to_json(None)
        .to_string()
        .contains("secret"));
}

#[test]
fn unknown_boxed_errors_are_internal() {
    let boxed: BoxError = "boom".into();
    assert!(matches!(
        GatewayError::from_boxed(boxed),
        GatewayError::Internal(_)
    ));
    let boxed: BoxError = Box::new(GatewayError::Unauthenticated);
    assert!(matches!(
        GatewayError::from_boxed(boxed),
        GatewayError::Unauthenticated
    ));
}

#[test]
fn a_gateway_error_wrapped_by_another_layer_is_found_in_the_cause_chain() {
    #[derive(Debug, thiserror::Error)]
    #[error("layer failed")]
    struct Wrapper(#[source] GatewayError);
    let boxed: BoxError = Box::new(Wrapper(GatewayError::BodyTooLarge { limit: 1 }));
    let found = GatewayError::from_boxed(boxed);
    assert_eq!(found.code(), "request_too_large");
    assert_eq!(found.status(), StatusCode::PAYLOAD_TOO_LARGE);
}
