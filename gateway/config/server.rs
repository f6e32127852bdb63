//! `[server]`: the client-facing listeners, their deadlines and ceilings.

use serde::Deserialize;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use super::files::resolve;
use super::invalid::{deadline, Invalid};

/// The default of `server.tls_watch_interval`: how often certificate files are checked.
pub const CERT_WATCH_INTERVAL: Duration = Duration::from_secs(5);

/// `[server]`
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Data port (clients).
    pub listen: SocketAddr,
    /// Admin port: /health, /ready, /metrics, /reload. Keep it on a private interface.
    pub admin_listen: SocketAddr,
    /// Environment variable holding the admin token that `POST /reload` (and every other
    /// mutating admin route) requires as `Authorization: Bearer <token>`. Unset: mutating
    /// admin routes answer 403.
    pub admin_token_env: Option<String>,
    /// A file holding the admin token (e.g. a mounted secret), read at start; instead of
    /// `admin_token_env`.
    pub admin_token_file: Option<PathBuf>,
    /// Largest accepted request body, e.g. "64MiB".
    pub max_body_bytes: bytesize::ByteSize,
    /// How long in-flight requests and streams may run after SIGTERM/SIGINT.
    #[serde(with = "humantime_serde")]
    pub drain_timeout: Duration,
    /// How often the certificate files of `[server.tls]` and `[upstream.tls]` are checked
    /// for changes (a change is read at once; SIGHUP and `POST /reload` read them anyway).
    #[serde(with = "humantime_serde")]
    pub tls_watch_interval: Duration,
    /// Serve requests without an API key as the tenant `anonymous` (off by default).
    pub allow_anonymous: bool,
    /// TLS termination on the data port.
    pub tls: Option<TlsConfig>,
    /// Until a request's headers are complete; also how long an idle HTTP/1 keep-alive
    /// connection waits for its next request (hyper arms one timer for both). Then closed.
    #[serde(with = "humantime_serde")]
    pub header_read_timeout: Duration,
    /// Longest pause between two chunks of a request body (408).
    #[serde(with = "humantime_serde")]
    pub body_idle_timeout: Duration,
    /// Until a request body is complete (408).
    #[serde(with = "humantime_serde")]
    pub body_timeout: Duration,
    /// A write to the client that makes no progress this long (the client stopped reading)
    /// closes the connection, releasing the request's slots.
    #[serde(with = "humantime_serde")]
    pub send_timeout: Duration,
    /// HTTP/2 keep-alive ping interval; a client that does not answer within
    /// `http2_keep_alive_timeout` is disconnected.
    #[serde(with = "humantime_serde")]
    pub http2_keep_alive_interval: Duration,
    #[serde(with = "humantime_serde")]
    pub http2_keep_alive_timeout: Duration,
    /// Streams at once on one HTTP/2 connection.
    pub http2_max_concurrent_streams: u32,
    /// All request headers together (431 above it).
    pub max_header_bytes: bytesize::ByteSize,
    /// One header value (431 above it).
    pub max_header_value_bytes: bytesize::ByteSize,
    /// Client connections open at once; more wait in the kernel's accept queue.
    pub max_connections: usize,
    /// The kernel's accept queue of each listening port: connections beyond
    /// `max_connections` (and a burst faster than accepting) wait there; Linux caps it at
    /// `net.core.somaxconn`.
    pub listen_backlog: u32,
    /// Threads serving the data port, each with its own single-threaded runtime and engine
    /// connections, so a request never hops threads (`runtime::data_threads`). Default: one
    /// per CPU the process may use.
    pub data_threads: usize,
    /// Requests in flight at once across all tenants (503 + Retry-After above it).
    pub max_in_flight: usize,
    /// Memory budget for buffered request bodies and non-streamed engine answers together
    /// (503 + Retry-After when a request would exceed it).
    pub max_buffered_bytes: bytesize::ByteSize,
}

impl Default for ServerConfig {
    fn default() -> Self {
        Self {
            listen: SocketAddr::from(([0, 0, 0, 0], 8080)),
            admin_listen: SocketAddr::from(([127, 0, 0, 1], 9090)),
            admin_token_env: None,
            admin_token_file: None,
            max_body_bytes: bytesize::ByteSize::mib(64),
            drain_timeout: Duration::from_secs(30),
            tls_watch_interval: CERT_WATCH_INTERVAL,
            allow_anonymous: false,
            tls: None,
            header_read_timeout: Duration::from_secs(10),
            body_idle_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(60),
            send_timeout: Duration::from_secs(60),
            http2_keep_alive_interval: Duration::from_secs(20),
            http2_keep_alive_timeout: Duration::from_secs(20),
            http2_max_concurrent_streams: 128,
            max_header_bytes: bytesize::ByteSize::kib(64),
            max_header_value_bytes: bytesize::ByteSize::kib(16),
            max_connections: 4096,
            listen_backlog: 4096,
            data_threads: std::thread::available_parallelism().map_or(1, usize::from),
            max_in_flight: 1024,
            max_buffered_bytes: bytesize::ByteSize::gib(1),
        }
    }
}

/// `[server.tls]`: PEM certificate chain and private key.
#[derive(Debug, Clone, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TlsConfig {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl ServerConfig {
    /// The rules of `[server]`: zero would turn a guard off or refuse everything, and its
    /// files exist (resolved against `base`, the config file's folder).
    pub(super) fn check(&mut self, base: &Path) -> Result<(), Invalid> {
        if self.max_body_bytes.as_u64() == 0 {
            return Err(Invalid::new(
                "server.max_body_bytes",
                "must be positive, e.g. \"64MiB\"",
            ));
        }
        for (key, value) in [
            ("server.header_read_timeout", self.header_read_timeout),
            ("server.body_idle_timeout", self.body_idle_timeout),
            ("server.body_timeout", self.body_timeout),
            ("server.send_timeout", self.send_timeout),
            (
                "server.http2_keep_alive_interval",
                self.http2_keep_alive_interval,
            ),
            (
                "server.http2_keep_alive_timeout",
                self.http2_keep_alive_timeout,
            ),
        ] {
            deadline(key, value)?;
        }
        for (key, value) in [
            ("server.max_connections", self.max_connections),
            ("server.listen_backlog", self.listen_backlog as usize),
            ("server.data_threads", self.data_threads),
            ("server.max_in_flight", self.max_in_flight),
            (
                "server.http2_max_concurrent_streams",
                self.http2_max_concurrent_streams as usize,
            ),
        ] {
            if value == 0 {
                return Err(Invalid::new(key, "must be at least 1"));
            }
        }
        if self.max_header_bytes.as_u64() < 1024 {
            return Err(Invalid::new(
                "server.max_header_bytes",
                "must be at least \"1KiB\"",
            ));
        }
        if self.max_header_value_bytes.as_u64() == 0
            || self.max_header_value_bytes > self.max_header_bytes
        {
            return Err(Invalid::new(
                "server.max_header_value_bytes",
                "must be positive and at most server.max_header_bytes",
            ));
        }
        if self.admin_token_env.is_some() && self.admin_token_file.is_some() {
            return Err(Invalid::new(
                "server.admin_token_file",
                "set admin_token_env or admin_token_file, not both",
            ));
        }
        if let Some(f) = self.admin_token_file.as_mut() {
            resolve(base, f, "server.admin_token_file")?;
        }
        if let Some(tls) = self.tls.as_mut() {
            resolve(base, &mut tls.cert, "server.tls.cert")?;
            resolve(base, &mut tls.key, "server.tls.key")?;
        }
        if self.tls_watch_interval.is_zero() {
            return Err(Invalid::new(
                "server.tls_watch_interval",
                "must be above 0, e.g. \"5s\"",
            ));
        }
        Ok(())
    }
}
