//! One hop on the wire: resolve once, check every address, connect to a checked one, and
//! send the request over that very connection.
//!
//! The address is pinned: the socket is opened to the `IpAddr` that passed the check, and
//! hyper gets that socket (no connector, no pool, no second lookup). A DNS answer that
//! changes between the check and the connection (rebinding) therefore changes nothing. The
//! name still goes out where it belongs: the `Host` header and TLS's SNI and certificate
//! check.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use bytes::Bytes;
use http::header::{ACCEPT, ACCEPT_ENCODING, HOST, USER_AGENT};
use http::{Request, Response};
use http_body_util::Empty;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::task::JoinHandle;
use tokio_rustls::TlsConnector;

use super::target::{Target, TargetHost};
use super::FetchError;
use crate::policy::FetchPolicy;
use crate::resolve::Resolve;

/// The connection task of a hop; aborted (closing the socket) when dropped, so a body the
/// caller stops reading does not keep downloading.
#[derive(Debug)]
pub(crate) struct Connection(JoinHandle<()>);

impl Drop for Connection {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The addresses a hop may connect to: the literal, or every address of the name, each
/// checked. One forbidden address refuses the host: a name that answers a public and a
/// private address is a rebinding attempt waiting for its turn.
pub(crate) async fn checked_addresses(
    target: &Target,
    policy: &FetchPolicy,
    resolver: &dyn Resolve,
) -> Result<Vec<IpAddr>, FetchError> {
    let addrs = match &target.host {
        TargetHost::Ip(ip) => vec![*ip],
        TargetHost::Name(name) => {
            resolver
                .resolve(name, target.port)
                .await
                .map_err(|e| FetchError::Dns {
                    host: name.clone(),
                    reason: e.to_string(),
                })?
        }
    };
    if addrs.is_empty() {
        return Err(FetchError::NoAddress {
            host: target.host_str().into(),
        });
    }
    for &addr in &addrs {
        policy.check(addr).map_err(|class| FetchError::Forbidden {
            host: target.host_str().into(),
            addr,
            class,
        })?;
    }
    Ok(addrs)
}

/// Connect to the first of `addrs` that answers and send the GET for `target`.
pub(crate) async fn send(
    target: &Target,
    addrs: &[IpAddr],
    tls: &Arc<rustls::ClientConfig>,
) -> Result<(Response<Incoming>, Connection), FetchError> {
    let host = target.host_str();
    let mut last = None;
    let mut stream = None;
    for &addr in addrs {
        match TcpStream::connect(SocketAddr::new(addr, target.port)).await {
            Ok(s) => {
                stream = Some(s);
                break;
            }
            Err(e) => last = Some(format!("{addr}: {e}")),
        }
    }
    let Some(stream) = stream else {
        return Err(FetchError::Connect {
            host: host.into(),
            reason: last.unwrap_or_else(|| "no address".into()),
        });
    };
    // Images are fetched one at a time and their bodies abandoned early: Nagle would only
    // delay the request line.
    let _ = stream.set_nodelay(true);
    if !target.https {
        return request(target, stream).await;
    }
    let name = match &target.host {
        TargetHost::Ip(ip) => ServerName::IpAddress((*ip).into()),
        TargetHost::Name(name) => {
            ServerName::try_from(name.clone()).map_err(|e| FetchError::Tls {
                host: host.into(),
                reason: e.to_string(),
            })?
        }
    };
    let stream = TlsConnector::from(tls.clone())
        .connect(name, stream)
        .await
        .map_err(|e| FetchError::Tls {
            host: host.into(),
            reason: e.to_string(),
        })?;
    request(target, stream).await
}

async fn request<T>(target: &Target, io: T) -> Result<(Response<Incoming>, Connection), FetchError>
where
    T: AsyncRead + AsyncWrite + Send + Unpin + 'static,
{
    let protocol = |e: hyper::Error| FetchError::Protocol {
        host: target.host_str().into(),
        reason: e.to_string(),
    };
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(io))
        .await
        .map_err(protocol)?;
    let connection = Connection(tokio::spawn(async move {
        if let Err(error) = conn.await {
            tracing::debug!(%error, "image connection ended");
        }
    }));
    let req = Request::get(target.path_and_query())
        .header(HOST, target.authority())
        .header(
            USER_AGENT,
            concat!("kvgate-image-fetch/", env!("CARGO_PKG_VERSION")),
        )
        .header(ACCEPT, "image/*")
        // The caller reads the image's own bytes: a compressed body would not be them.
        .header(ACCEPT_ENCODING, "identity")
        .body(Empty::<Bytes>::new())
        .map_err(|e| FetchError::InvalidUrl {
            reason: e.to_string(),
        })?;
    let response = sender.send_request(req).await.map_err(protocol)?;
    Ok((response, connection))
}
