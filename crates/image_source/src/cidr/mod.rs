//! An IP network in CIDR notation (`10.20.0.0/16`, `fd00::/8`): the operator's allow-list
//! of internal image stores. Small enough to carry here rather than take a crate for it.

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use crate::address::canonical;

#[cfg(test)]
mod tests;

/// A network: an address and a prefix length. A bare address is a /32 (or /128).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IpCidr {
    network: IpAddr,
    prefix: u8,
}

/// Why a CIDR string was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CidrError {
    /// The part before `/` is not an IP address.
    #[error("`{0}` is not an IP network (expected e.g. 10.20.0.0/16 or fd00::/8)")]
    Address(String),
    /// The prefix length is not a number within the address's bits.
    #[error("`{0}` has a bad prefix length (0-32 for IPv4, 0-128 for IPv6)")]
    Prefix(String),
    /// Bits are set below the prefix: most likely a typo, so refused rather than masked.
    #[error("`{0}` has host bits set below its prefix length (did you mean {1}?)")]
    HostBits(String, String),
}

// === impl IpCidr ===

impl IpCidr {
    /// The network `network/prefix`; `None` when the prefix is longer than the address or
    /// bits are set below it.
    pub fn new(network: IpAddr, prefix: u8) -> Option<Self> {
        let cidr = Self { network, prefix };
        (prefix <= bits(network) && cidr.masked() == network).then_some(cidr)
    }

    /// Whether `ip` is inside. An IPv4-mapped IPv6 address (`::ffff:10.20.0.1`) is its IPv4
    /// address here, as it is to the operating system that connects to it.
    pub fn contains(&self, ip: IpAddr) -> bool {
        match (self.network, canonical(ip)) {
            (IpAddr::V4(net), IpAddr::V4(ip)) => prefix_eq(
                u128::from(u32::from(net)),
                u128::from(u32::from(ip)),
                32,
                self.prefix,
            ),
            (IpAddr::V6(net), IpAddr::V6(ip)) => {
                prefix_eq(u128::from(net), u128::from(ip), 128, self.prefix)
            }
            _ => false,
        }
    }

    fn masked(&self) -> IpAddr {
        match self.network {
            IpAddr::V4(a) => {
                let mask = u32::MAX
                    .checked_shl(32 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX
                    .checked_shl(128 - u32::from(self.prefix))
                    .unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        }
    }
}

fn bits(ip: IpAddr) -> u8 {
    if ip.is_ipv4() {
        32
    } else {
        128
    }
}

/// Whether the top `prefix` of `width` bits of `a` and `b` agree.
fn prefix_eq(a: u128, b: u128, width: u32, prefix: u8) -> bool {
    let shift = width - u32::from(prefix);
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

impl FromStr for IpCidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let s = s.trim();
        let (addr, prefix) = match s.split_once('/') {
            Some((addr, prefix)) => (addr, Some(prefix)),
            None => (s, None),
        };
        let network: IpAddr = addr.parse().map_err(|_| CidrError::Address(s.into()))?;
        let prefix = match prefix {
            None => bits(network),
            Some(p) => match p.parse::<u8>() {
                Ok(p) if p <= bits(network) => p,
                _ => return Err(CidrError::Prefix(s.into())),
            },
        };
        let cidr = Self { network, prefix };
        let masked = cidr.masked();
        if masked != network {
            return Err(CidrError::HostBits(s.into(), format!("{masked}/{prefix}")));
        }
        Ok(cidr)
    }
}

impl fmt::Display for IpCidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}
