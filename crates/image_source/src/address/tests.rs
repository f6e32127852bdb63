use super::*;

fn class(s: &str) -> Option<Forbidden> {
    classify(s.parse().unwrap())
}

#[test]
fn public_addresses_pass() {
    for ip in [
        "8.8.8.8",
        "1.1.1.1",
        "93.184.215.14",
        "100.63.255.255",
        "100.128.0.1",
        "172.15.255.255",
        "172.32.0.1",
        "192.169.0.1",
        "2606:4700::1111",
        "2a00:1450:4001::1",
        "::ffff:8.8.8.8",
        "64:ff9b::808:808",
    ] {
        assert_eq!(class(ip), None, "{ip}");
    }
}

#[test]
fn ipv4_special_ranges_are_forbidden() {
    for (ip, want) in [
        ("0.0.0.0", Forbidden::Unspecified),
        ("0.1.2.3", Forbidden::Unspecified),
        ("10.0.0.5", Forbidden::Private),
        ("172.16.0.1", Forbidden::Private),
        ("172.31.255.255", Forbidden::Private),
        ("192.168.1.1", Forbidden::Private),
        ("100.64.0.1", Forbidden::SharedNat),
        ("100.127.255.255", Forbidden::SharedNat),
        ("127.0.0.1", Forbidden::Loopback),
        ("127.255.255.254", Forbidden::Loopback),
        ("169.254.0.1", Forbidden::LinkLocal),
        ("169.254.169.254", Forbidden::Metadata),
        ("192.0.0.170", Forbidden::Reserved),
        ("192.0.2.1", Forbidden::Documentation),
        ("198.51.100.7", Forbidden::Documentation),
        ("203.0.113.9", Forbidden::Documentation),
        ("198.18.0.1", Forbidden::Reserved),
        ("224.0.0.1", Forbidden::Multicast),
        ("239.255.255.250", Forbidden::Multicast),
        ("240.0.0.1", Forbidden::Reserved),
        ("255.255.255.255", Forbidden::Broadcast),
    ] {
        assert_eq!(class(ip), Some(want), "{ip}");
    }
}

#[test]
fn ipv6_special_ranges_are_forbidden() {
    for (ip, want) in [
        ("::", Forbidden::Unspecified),
        ("::1", Forbidden::Loopback),
        ("fe80::1", Forbidden::LinkLocal),
        ("febf::1", Forbidden::LinkLocal),
        ("fc00::1", Forbidden::UniqueLocal),
        ("fd12:3456::1", Forbidden::UniqueLocal),
        ("fec0::1", Forbidden::UniqueLocal),
        ("fd00:ec2::254", Forbidden::Metadata),
        ("ff02::1", Forbidden::Multicast),
        ("2001:db8::1", Forbidden::Documentation),
        ("3fff::1", Forbidden::Documentation),
        ("2001::1", Forbidden::Reserved),
        ("100::1", Forbidden::Reserved),
        ("64:ff9b:1::a00:5", Forbidden::UniqueLocal),
    ] {
        assert_eq!(class(ip), Some(want), "{ip}");
    }
}

#[test]
fn ipv6_forms_of_forbidden_ipv4_are_forbidden() {
    for (ip, want) in [
        ("::ffff:127.0.0.1", Forbidden::Loopback),
        ("::ffff:7f00:1", Forbidden::Loopback),
        ("::ffff:10.0.0.5", Forbidden::Private),
        ("::ffff:169.254.169.254", Forbidden::Metadata),
        ("::127.0.0.1", Forbidden::Loopback),
        ("::8.8.8.8", Forbidden::Reserved),
        ("64:ff9b::7f00:1", Forbidden::Loopback),
        ("64:ff9b::a9fe:a9fe", Forbidden::Metadata),
        ("64:ff9b::c0a8:101", Forbidden::Private),
        ("2002:7f00:1::", Forbidden::Loopback),
        ("2002:a00:5::1", Forbidden::Private),
        ("2002:808:808::1", Forbidden::Reserved),
    ] {
        assert_eq!(class(ip), Some(want), "{ip}");
    }
}

#[test]
fn mapped_addresses_are_their_ipv4() {
    let ip: IpAddr = "::ffff:10.1.2.3".parse().unwrap();
    assert_eq!(canonical(ip), "10.1.2.3".parse::<IpAddr>().unwrap());
    let ip: IpAddr = "2001:4860::1".parse().unwrap();
    assert_eq!(canonical(ip), ip);
}

#[test]
fn labels_and_messages_are_distinct() {
    let all = [
        Forbidden::Unspecified,
        Forbidden::Loopback,
        Forbidden::Private,
        Forbidden::SharedNat,
        Forbidden::LinkLocal,
        Forbidden::Metadata,
        Forbidden::UniqueLocal,
        Forbidden::Multicast,
        Forbidden::Broadcast,
        Forbidden::Documentation,
        Forbidden::Reserved,
    ];
    let labels: std::collections::HashSet<_> = all.iter().map(|f| f.label()).collect();
    let texts: std::collections::HashSet<_> = all.iter().map(|f| f.to_string()).collect();
    assert_eq!(labels.len(), all.len());
    assert_eq!(texts.len(), all.len());
}
