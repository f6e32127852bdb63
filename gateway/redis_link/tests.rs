use super::*;
use redis::{ErrorKind, RedisError, ServerErrorKind};

fn server(kind: ServerErrorKind) -> RedisError {
    RedisError::from((ErrorKind::Server(kind), "reply"))
}

#[test]
fn moved_is_a_misconfiguration_only_where_kvgate_does_not_follow_it() {
    let moved = server(ServerErrorKind::Moved);
    assert_eq!(
        RedisProblem::of(&moved, Topology::Node),
        RedisProblem::Moved
    );
    assert_eq!(
        RedisProblem::of(&moved, Topology::Sentinel),
        RedisProblem::Moved
    );
    assert_eq!(
        RedisProblem::of(&moved, Topology::Cluster),
        RedisProblem::Unreachable
    );
    assert!(RedisProblem::Moved.is_misconfiguration());
    assert!(RedisProblem::Moved
        .fix()
        .contains("configure redis cluster mode"));
}

#[test]
fn readonly_is_a_failover_for_sentinel_and_cluster_and_a_replica_for_a_node() {
    let readonly = server(ServerErrorKind::ReadOnly);
    assert_eq!(
        RedisProblem::of(&readonly, Topology::Node),
        RedisProblem::ReadOnly
    );
    assert_eq!(
        RedisProblem::of(&readonly, Topology::Sentinel),
        RedisProblem::Unreachable
    );
    assert_eq!(
        RedisProblem::of(&readonly, Topology::Cluster),
        RedisProblem::Unreachable
    );
}

#[test]
fn wrongtype_crossslot_and_auth_are_misconfigurations_and_outages_are_not() {
    let wrongtype = redis::make_extension_error("WRONGTYPE".into(), Some("Operation".into()));
    for topology in [Topology::Node, Topology::Cluster, Topology::Sentinel] {
        assert_eq!(
            RedisProblem::of(&wrongtype, topology),
            RedisProblem::WrongType
        );
        assert_eq!(
            RedisProblem::of(&server(ServerErrorKind::CrossSlot), topology),
            RedisProblem::CrossSlot
        );
        assert_eq!(
            RedisProblem::of(&server(ServerErrorKind::NoPerm), topology),
            RedisProblem::Auth
        );
        let refused = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert_eq!(
            RedisProblem::of(&refused, topology),
            RedisProblem::Unreachable
        );
        assert_eq!(
            RedisProblem::of(&server(ServerErrorKind::ClusterDown), topology),
            RedisProblem::Unreachable
        );
    }
    assert!(!RedisProblem::Unreachable.is_misconfiguration());
    assert!(!RedisProblem::Other.is_misconfiguration());
}

#[test]
fn a_certificate_the_handshake_refused_is_tls_not_unreachable() {
    let untrusted = RedisError::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        rustls::Error::InvalidCertificate(rustls::CertificateError::UnknownIssuer),
    ));
    let no_client_cert = RedisError::from(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
    ));
    // The cluster client reports its first connections as text.
    let as_text = RedisError::from((
        ErrorKind::Io,
        "Failed to create initial connections",
        "invalid peer certificate: UnknownIssuer".to_owned(),
    ));
    for topology in [Topology::Node, Topology::Cluster, Topology::Sentinel] {
        for e in [&untrusted, &no_client_cert, &as_text] {
            assert_eq!(RedisProblem::of(e, topology), RedisProblem::Tls, "{e}");
        }
    }
    assert!(RedisProblem::Tls.is_misconfiguration());
    assert!(RedisProblem::Tls.fix().contains("redis_tls.ca_file"));
    let reset = RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionReset));
    assert_eq!(
        RedisProblem::of(&reset, Topology::Node),
        RedisProblem::Unreachable
    );
}
