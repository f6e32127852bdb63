//! Which addresses a remote image may come from: public unicast only. Everything else
//! (loopback, private, link-local and the cloud metadata address, CGNAT, unique-local,
//! multicast, broadcast, documentation and reserved ranges) is [`Forbidden`], and so are the
//! IPv6 forms that carry such an IPv4 address (mapped, compatible, NAT64, 6to4), because the
//! network delivers them to that IPv4 address.
//!
//! The operator's allow-list is applied by the caller (`FetchPolicy::check`), before this.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

#[cfg(test)]
mod tests;

/// Why an address is no place to fetch an image from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Forbidden {
    /// `0.0.0.0/8`, `::`: "this host", which reaches the local machine.
    Unspecified,
    /// `127.0.0.0/8`, `::1`.
    Loopback,
    /// RFC 1918: `10/8`, `172.16/12`, `192.168/16`.
    Private,
    /// RFC 6598 shared address space (carrier-grade NAT), `100.64/10`.
    SharedNat,
    /// `169.254/16`, `fe80::/10`.
    LinkLocal,
    /// `169.254.169.254` (and `fd00:ec2::254`): the cloud instance metadata service, which
    /// hands out credentials.
    Metadata,
    /// `fc00::/7`, `fec0::/10` (deprecated site-local), `64:ff9b:1::/48` (local NAT64).
    UniqueLocal,
    /// `224/4`, `ff00::/8`.
    Multicast,
    /// `255.255.255.255`.
    Broadcast,
    /// `192.0.2/24`, `198.51.100/24`, `203.0.113/24`, `2001:db8::/32`, `3fff::/20`.
    Documentation,
    /// Benchmarking, protocol assignments, `240/4`, discard-only, tunnel and other special
    /// ranges that host no images.
    Reserved,
}

// === impl Forbidden ===

impl Forbidden {
    /// A stable, low-cardinality label for metrics and logs.
    pub fn label(self) -> &'static str {
        match self {
            Self::Unspecified => "unspecified",
            Self::Loopback => "loopback",
            Self::Private => "private",
            Self::SharedNat => "shared_nat",
            Self::LinkLocal => "link_local",
            Self::Metadata => "metadata",
            Self::UniqueLocal => "unique_local",
            Self::Multicast => "multicast",
            Self::Broadcast => "broadcast",
            Self::Documentation => "documentation",
            Self::Reserved => "reserved",
        }
    }
}

impl fmt::Display for Forbidden {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::Unspecified => "an unspecified address",
            Self::Loopback => "a loopback address",
            Self::Private => "a private address",
            Self::SharedNat => "a carrier-grade NAT address",
            Self::LinkLocal => "a link-local address",
            Self::Metadata => "the cloud metadata address",
            Self::UniqueLocal => "a unique-local (private) address",
            Self::Multicast => "a multicast address",
            Self::Broadcast => "the broadcast address",
            Self::Documentation => "a documentation address",
            Self::Reserved => "a reserved address",
        })
    }
}

/// The address the network delivers to: an IPv4-mapped (`::ffff:a.b.c.d`) IPv6 address is
/// its IPv4 address. (NAT64 and 6to4 forms stay IPv6: they are routed, and checked by what
/// they embed in [`classify`].)
pub(crate) fn canonical(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => ip,
        },
        v4 => v4,
    }
}

/// Why `ip` is forbidden, or `None` for a public unicast address.
pub(crate) fn classify(ip: IpAddr) -> Option<Forbidden> {
    match canonical(ip) {
        IpAddr::V4(v4) => classify_v4(v4),
        IpAddr::V6(v6) => classify_v6(v6),
    }
}

fn classify_v4(ip: Ipv4Addr) -> Option<Forbidden> {
    let [a, b, c, d] = ip.octets();
    let forbidden = match (a, b, c) {
        (0, _, _) => Forbidden::Unspecified,
        (10, _, _) => Forbidden::Private,
        (100, 64..=127, _) => Forbidden::SharedNat,
        (127, _, _) => Forbidden::Loopback,
        (169, 254, 169) if d == 254 => Forbidden::Metadata,
        (169, 254, _) => Forbidden::LinkLocal,
        (172, 16..=31, _) => Forbidden::Private,
        // IETF protocol assignments (DS-Lite, NAT64 discovery, ...), and the deprecated 6to4
        // relay anycast.
        (192, 0, 0) | (192, 88, 99) => Forbidden::Reserved,
        (192, 0, 2) | (198, 51, 100) | (203, 0, 113) => Forbidden::Documentation,
        (192, 168, _) => Forbidden::Private,
        (198, 18..=19, _) => Forbidden::Reserved,
        (224..=239, _, _) => Forbidden::Multicast,
        (255, 255, 255) if d == 255 => Forbidden::Broadcast,
        (240..=255, _, _) => Forbidden::Reserved,
        _ => return None,
    };
    Some(forbidden)
}

fn classify_v6(ip: Ipv6Addr) -> Option<Forbidden> {
    let s = ip.segments();
    let bits = u128::from(ip);
    if ip.is_unspecified() {
        return Some(Forbidden::Unspecified);
    }
    if ip.is_loopback() {
        return Some(Forbidden::Loopback);
    }
    // IPv4-compatible `::a.b.c.d` (deprecated, still routed by some stacks as IPv4).
    if bits >> 32 == 0 {
        return Some(classify_v4(low_v4(bits)).unwrap_or(Forbidden::Reserved));
    }
    let forbidden = match s[0] {
        // NAT64 well-known prefix: a gateway turns it into the IPv4 address it embeds.
        0x0064 if s[1] == 0xff9b && s[2..6] == [0; 4] => return classify_v4(low_v4(bits)),
        // Local-use NAT64 (RFC 8215) translates into the operator's own network.
        0x0064 if s[1] == 0xff9b && s[2] == 0x0001 => Forbidden::UniqueLocal,
        // Discard-only.
        0x0100 if s[1..4] == [0; 3] => Forbidden::Reserved,
        // IETF protocol assignments, Teredo (2001::/32) included: a tunnel to an IPv4
        // address this check cannot see.
        0x2001 if s[1] < 0x0200 => Forbidden::Reserved,
        0x2001 if s[1] == 0x0db8 => Forbidden::Documentation,
        // 6to4 (deprecated, RFC 7526): the site's IPv4 address sits in bits 16..48. Named by
        // what it embeds when that is telling, refused either way.
        0x2002 => {
            let v4 = Ipv4Addr::new((s[1] >> 8) as u8, s[1] as u8, (s[2] >> 8) as u8, s[2] as u8);
            return Some(classify_v4(v4).unwrap_or(Forbidden::Reserved));
        }
        0x3fff if s[1] < 0x1000 => Forbidden::Documentation,
        0xfd00 if ip == Ipv6Addr::new(0xfd00, 0xec2, 0, 0, 0, 0, 0, 0x254) => Forbidden::Metadata,
        0xfc00..=0xfdff => Forbidden::UniqueLocal,
        0xfe80..=0xfebf => Forbidden::LinkLocal,
        0xfec0..=0xfeff => Forbidden::UniqueLocal,
        0xff00..=0xffff => Forbidden::Multicast,
        _ => return None,
    };
    Some(forbidden)
}

fn low_v4(bits: u128) -> Ipv4Addr {
    Ipv4Addr::from((bits & 0xffff_ffff) as u32)
}
