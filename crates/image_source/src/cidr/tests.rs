use super::*;

fn cidr(s: &str) -> IpCidr {
    s.parse().unwrap()
}

fn ip(s: &str) -> IpAddr {
    s.parse().unwrap()
}

#[test]
fn parses_networks_and_bare_addresses() {
    assert_eq!(cidr("10.20.0.0/16").to_string(), "10.20.0.0/16");
    assert_eq!(cidr("127.0.0.1").to_string(), "127.0.0.1/32");
    assert_eq!(cidr("fd00::/8").to_string(), "fd00::/8");
    assert_eq!(cidr("::1").to_string(), "::1/128");
    assert_eq!(cidr("0.0.0.0/0").to_string(), "0.0.0.0/0");
}

#[test]
fn refuses_bad_networks() {
    assert!(matches!(
        "10.20.0.0/33".parse::<IpCidr>(),
        Err(CidrError::Prefix(_))
    ));
    assert!(matches!(
        "10.20.0.0/x".parse::<IpCidr>(),
        Err(CidrError::Prefix(_))
    ));
    assert!(matches!(
        "example.com/8".parse::<IpCidr>(),
        Err(CidrError::Address(_))
    ));
    let err = "10.20.1.0/16".parse::<IpCidr>().unwrap_err();
    assert!(err.to_string().contains("10.20.0.0/16"), "{err}");
    assert_eq!(IpCidr::new(ip("10.0.0.1"), 8), None);
    assert_eq!(IpCidr::new(ip("10.0.0.0"), 8), Some(cidr("10.0.0.0/8")));
}

#[test]
fn contains_by_prefix() {
    let net = cidr("10.20.0.0/16");
    assert!(net.contains(ip("10.20.0.1")));
    assert!(net.contains(ip("10.20.255.255")));
    assert!(!net.contains(ip("10.21.0.1")));
    assert!(!net.contains(ip("fd00::1")));
    assert!(
        net.contains(ip("::ffff:10.20.3.4")),
        "a mapped address is its IPv4"
    );
    assert!(cidr("0.0.0.0/0").contains(ip("8.8.8.8")));
    assert!(cidr("127.0.0.1/32").contains(ip("127.0.0.1")));
    assert!(!cidr("127.0.0.1/32").contains(ip("127.0.0.2")));
    assert!(cidr("fd00::/8").contains(ip("fd12::1")));
    assert!(!cidr("fd00::/8").contains(ip("fe80::1")));
    assert!(cidr("::/0").contains(ip("2001:db8::1")));
}
