//! Name resolution for the fetcher, behind a trait so tests can answer what they like (a
//! rebinding DNS server, say). The fetcher looks a host up once per hop and connects to an
//! address from that very answer: nothing downstream resolves the name again.

use std::future::Future;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;

/// A lookup's future: every address of the host, or why there is none.
pub type Resolved<'a> = Pin<Box<dyn Future<Output = io::Result<Vec<IpAddr>>> + Send + 'a>>;

/// Resolves a host name to its addresses.
pub trait Resolve: Send + Sync {
    /// Every address `host` resolves to (A and AAAA). `port` is passed for resolvers that
    /// want it (the system's `getaddrinfo` does); the addresses are what matters.
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolved<'a>;
}

/// The system's resolver (`getaddrinfo` through `tokio::net::lookup_host`): what the rest of
/// the host sees, `/etc/hosts` included.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemResolver;

impl Resolve for SystemResolver {
    fn resolve<'a>(&'a self, host: &'a str, port: u16) -> Resolved<'a> {
        Box::pin(async move {
            let addrs = tokio::net::lookup_host((host, port)).await?;
            let mut ips: Vec<IpAddr> = Vec::new();
            for addr in addrs {
                if !ips.contains(&addr.ip()) {
                    ips.push(addr.ip());
                }
            }
            Ok(ips)
        })
    }
}
