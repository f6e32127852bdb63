//! A pool's rules for remote images: whether they are fetched at all, from where, and how
//! much may be read for how long. Config is data: the fetcher applies it.

use std::net::IpAddr;
use std::time::Duration;

use crate::address::{classify, Forbidden};
use crate::cidr::IpCidr;

/// What a remote image fetch may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FetchPolicy {
    /// Remote URLs are fetched at all. Off by default: a gateway that fetches URLs its
    /// clients name is a request-forgery tool unless the operator means it to.
    pub allowed: bool,
    /// Networks an operator trusts although they are not public (an internal image store,
    /// e.g. `10.20.0.0/16`). Checked before the deny list, so it can open any range.
    pub allow_networks: Vec<IpCidr>,
    /// At most this many body bytes are read, whatever the caller asks for.
    pub max_bytes: usize,
    /// The whole fetch, every redirect and DNS lookup included, ends by then.
    pub timeout: Duration,
    /// At most this many redirects are followed.
    pub max_redirects: usize,
    /// `http://` URLs are fetched too (and `https://` may redirect to them). Off by default:
    /// plain HTTP lets anyone on the path swap the image.
    pub allow_http: bool,
}

impl Default for FetchPolicy {
    fn default() -> Self {
        Self {
            allowed: false,
            allow_networks: Vec::new(),
            // A JPEG's dimensions may come after EXIF, ICC and XMP segments of a few
            // hundred KiB; 2 MiB reaches them without letting one request pull an image.
            max_bytes: 2 << 20,
            timeout: Duration::from_secs(10),
            max_redirects: 3,
            allow_http: false,
        }
    }
}

impl FetchPolicy {
    /// A policy that fetches, with the default limits.
    pub fn allowing() -> Self {
        Self {
            allowed: true,
            ..Self::default()
        }
    }

    /// Whether an image may be fetched from `ip`: inside an allowed network, or public.
    pub fn check(&self, ip: IpAddr) -> Result<(), Forbidden> {
        if self.allow_networks.iter().any(|net| net.contains(ip)) {
            return Ok(());
        }
        match classify(ip) {
            Some(forbidden) => Err(forbidden),
            None => Ok(()),
        }
    }
}
