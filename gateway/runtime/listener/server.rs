//! The accept loop: plain TCP or rustls, HTTP/1.1 and HTTP/2 (h2c or ALPN h2) on one port,
//! with graceful shutdown.
//!
//! On shutdown the listener stops accepting, open connections are told to finish (HTTP/1
//! closes after the current response, HTTP/2 sends GOAWAY) and in-flight requests and
//! streams get up to the drain timeout before the remaining connections are dropped.

use http::{Request, Response};
use http_body::Body;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use hyper_util::service::TowerToHyperService;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tower::Service;

use crate::body::BoxError;
use crate::metrics;
use crate::runtime::listener::accept_balance::{BalanceSlot, DEFER_FOR, MAX_DEFERRALS};
use crate::runtime::listener::conn_deadlines::{until_first_request, MarkStarted, SendTimeoutIo};
use std::sync::atomic::AtomicBool;

/// How long a TLS handshake may take before the connection is dropped.
const TLS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// A shutdown signal shared by servers and background tasks.
#[derive(Clone, Debug)]
pub struct Shutdown {
    rx: watch::Receiver<bool>,
}

/// The sending half of [`Shutdown`].
#[derive(Debug)]
pub struct ShutdownTrigger {
    tx: watch::Sender<bool>,
}

impl Shutdown {
    /// A new signal and its trigger.
    pub fn new() -> (ShutdownTrigger, Shutdown) {
        let (tx, rx) = watch::channel(false);
        (ShutdownTrigger { tx }, Shutdown { rx })
    }

    /// Resolves once shutdown was triggered (or the trigger was dropped).
    pub async fn wait(&mut self) {
        let _ = self.rx.wait_for(|stop| *stop).await;
    }

    /// Whether shutdown was triggered.
    pub fn is_triggered(&self) -> bool {
        *self.rx.borrow()
    }
}

impl ShutdownTrigger {
    /// Start shutting down.
    pub fn trigger(&self) {
        let _ = self.tx.send(true);
    }
}

pub use crate::tls::TlsError;

/// The connection-level deadlines and ceilings of one listener (from `[server]`).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Until a request's headers are complete, and the idle time of an HTTP/1 keep-alive
    /// connection before its next request (hyper arms one timer for both).
    pub header_read_timeout: Duration,
    /// All request headers together: HTTP/1 stops reading (431) and HTTP/2 refuses the
    /// header list past it.
    pub max_header_bytes: usize,
    pub http2_keep_alive_interval: Duration,
    pub http2_keep_alive_timeout: Duration,
    pub http2_max_concurrent_streams: u32,
    /// Connections open at once; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// A write to the client stalled this long (it stopped reading): connection closed.
    pub send_timeout: Duration,
}

impl ConnectionLimits {
    /// The limits `[server]` configures.
    pub fn from_config(server: &crate::config::ServerConfig) -> Self {
        Self {
            header_read_timeout: server.header_read_timeout,
            max_header_bytes: usize::try_from(server.max_header_bytes.as_u64())
                .unwrap_or(usize::MAX),
            http2_keep_alive_interval: server.http2_keep_alive_interval,
            http2_keep_alive_timeout: server.http2_keep_alive_timeout,
            http2_max_concurrent_streams: server.http2_max_concurrent_streams,
            max_connections: server.max_connections,
            send_timeout: server.send_timeout,
        }
    }

    fn builder(&self) -> auto::Builder<TokioExecutor> {
        let mut builder = auto::Builder::new(TokioExecutor::new());
        builder
            .http1()
            .timer(TokioTimer::new())
            .header_read_timeout(self.header_read_timeout)
            // hyper answers 431 once an unfinished head fills its read buffer, so the buffer
            // cap is the header-block limit: a giant header costs at most this much.
            .max_buf_size(self.max_header_bytes.max(8192));
        builder
            .http2()
            .timer(TokioTimer::new())
            .keep_alive_interval(self.http2_keep_alive_interval)
            .keep_alive_timeout(self.http2_keep_alive_timeout)
            .max_concurrent_streams(self.http2_max_concurrent_streams)
            .max_header_list_size(u32::try_from(self.max_header_bytes).unwrap_or(u32::MAX));
        builder
    }
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self::from_config(&crate::config::ServerConfig::default())
    }
}

/// What a listener serves: a cloneable HTTP service whose futures may move between tasks
/// (one list of bounds for [`serve`], [`serve_within`] and `data_threads`).
pub trait ConnectionService<B: ResponseBody>:
    Service<Request<Incoming>, Response = Response<B>, Error = Infallible, Future: Send + 'static>
    + Clone
    + Send
    + 'static
{
}

impl<S, B> ConnectionService<B> for S
where
    B: ResponseBody,
    S: Service<Request<Incoming>, Response = Response<B>, Error = Infallible>
        + Clone
        + Send
        + 'static,
    S::Future: Send + 'static,
{
}

/// A response body a connection can write from any task.
pub trait ResponseBody: Body<Data: Send, Error: Into<BoxError>> + Send + 'static {}

impl<B> ResponseBody for B
where
    B: Body + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
}

/// Serve `service` on `listener` until `shutdown`, then drain for up to `drain_timeout`.
pub async fn serve<S, B>(
    listener: TcpListener,
    tls: Option<TlsAcceptor>,
    service: S,
    shutdown: Shutdown,
    drain_timeout: Duration,
    limits: ConnectionLimits,
) where
    S: ConnectionService<B>,
    B: ResponseBody,
{
    let connections = Arc::new(tokio::sync::Semaphore::new(limits.max_connections.max(1)));
    let listening = Listening {
        tls,
        shutdown,
        drain_timeout,
        limits,
        connections,
        balance: None,
    };
    serve_within(listener, service, listening).await
}

/// How one accept loop serves: everything of [`serve`] but the listener and the service.
#[derive(Clone)]
pub(crate) struct Listening {
    pub tls: Option<TlsAcceptor>,
    pub shutdown: Shutdown,
    pub drain_timeout: Duration,
    pub limits: ConnectionLimits,
    /// The connection cap's permits, shared by every accept loop on the port.
    pub connections: Arc<tokio::sync::Semaphore>,
    /// This loop's place among the port's data threads (`None`: the only loop).
    pub balance: Option<BalanceSlot>,
}

/// As [`serve`], with the connection cap's permits possibly shared with other accept loops
/// on the same port (`runtime::data_threads`).
pub(crate) async fn serve_within<S, B>(listener: TcpListener, service: S, listening: Listening)
where
    S: ConnectionService<B>,
    B: ResponseBody,
{
    let Listening {
        tls,
        mut shutdown,
        drain_timeout,
        limits,
        connections,
        balance,
    } = listening;
    let graceful = GracefulShutdown::new();
    let builder = limits.builder();
    loop {
        // At the connection cap, stop accepting until one closes: new connections wait in
        // the kernel's (bounded) accept queue instead of costing memory here.
        let slot = tokio::select! {
            slot = Arc::clone(&connections).acquire_owned() => slot,
            _ = shutdown.wait() => break,
        };
        let Ok(slot) = slot else { break };
        // Leave the next connection to a less loaded data thread, for a moment.
        if let Some(balance) = &balance {
            let mut tries = 0;
            while tries < MAX_DEFERRALS && balance.should_defer() {
                tries += 1;
                tokio::select! {
                    _ = tokio::time::sleep(DEFER_FOR) => {}
                    _ = shutdown.wait() => break,
                }
            }
            if shutdown.is_triggered() {
                break;
            }
        }
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = shutdown.wait() => break,
        };
        let (stream, peer) = match accepted {
            Ok(pair) => pair,
            Err(e) => {
                // Out of file descriptors and the like: back off instead of spinning.
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let _ = stream.set_nodelay(true);
        let started = Arc::new(AtomicBool::new(false));
        let service = TowerToHyperService::new(MarkStarted::new(service.clone(), started.clone()));
        let builder = builder.clone();
        let tls = tls.clone();
        let watcher = graceful.watcher();
        let (first_request, send_timeout) = (limits.header_read_timeout, limits.send_timeout);
        let counted = balance.as_ref().map(BalanceSlot::opened);
        tokio::spawn(async move {
            let _slot = slot;
            let _counted = counted;
            let open = ::metrics::gauge!(metrics::CONNECTIONS_OPEN);
            open.increment(1.0);
            let closed_idle = || {
                tracing::debug!(%peer, "no request within header_read_timeout; closed");
                Ok(())
            };
            let result = match tls {
                None => {
                    let io = TokioIo::new(SendTimeoutIo::new(stream, send_timeout));
                    let conn = builder.serve_connection_with_upgrades(io, service);
                    let serving = watcher.watch(conn.into_owned());
                    until_first_request(serving, first_request, &started, closed_idle).await
                }
                Some(acceptor) => {
                    match tokio::time::timeout(TLS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await
                    {
                        Ok(Ok(tls_stream)) => {
                            // ALPN already chose the protocol: no version sniffing.
                            let h2 = tls_stream.get_ref().1.alpn_protocol() == Some(b"h2");
                            let builder = if h2 {
                                builder.http2_only()
                            } else {
                                builder.http1_only()
                            };
                            let io = TokioIo::new(SendTimeoutIo::new(tls_stream, send_timeout));
                            let conn = builder.serve_connection_with_upgrades(io, service);
                            let serving = watcher.watch(conn.into_owned());
                            until_first_request(serving, first_request, &started, closed_idle).await
                        }
                        Ok(Err(e)) => {
                            tracing::debug!(%peer, error = %e, "TLS handshake failed");
                            Ok(())
                        }
                        Err(_) => {
                            tracing::debug!(%peer, "TLS handshake timed out");
                            Ok(())
                        }
                    }
                }
            };
            if let Err(e) = result {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
            open.decrement(1.0);
        });
    }
    drop(listener);
    if tokio::time::timeout(drain_timeout, graceful.shutdown())
        .await
        .is_err()
    {
        tracing::warn!(
            ?drain_timeout,
            "drain timeout passed; dropping remaining connections"
        );
    }
}
