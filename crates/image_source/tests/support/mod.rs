//! Real image servers on loopback for the fetcher's tests: hand-written HTTP/1.1 so a test
//! controls every byte (a body that trickles, one far larger than anyone should read), and
//! counts what reached the wire. Each test binary uses a part of it.
#![allow(dead_code)]

use std::collections::VecDeque;
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use kvgate_image_source::{FetchPolicy, ImageFetcher, Resolve, Resolved};
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::TcpListener;
use tokio::sync::Notify;

/// The start of a PNG whose header says 640x480: what a header parser needs.
pub const PNG_HEADER: &[u8] =
    b"\x89PNG\r\n\x1a\n\0\0\0\rIHDR\0\0\x02\x80\0\0\x01\xe0\x08\x06\0\0\0";

/// What the server answers a request with.
#[derive(Debug, Clone)]
pub enum Reply {
    /// 200 with this content type: `prefix`, then zeros up to `total` bytes.
    Image {
        content_type: &'static str,
        prefix: Vec<u8>,
        total: usize,
    },
    /// A 302 to `location`.
    Redirect(String),
    /// This status, empty body.
    Status(u16),
    /// 200 `image/png` with a large declared length, then one byte per `every`, forever.
    Trickle { every: Duration },
}

impl Reply {
    pub fn png(total: usize) -> Self {
        Reply::Image {
            content_type: "image/png",
            prefix: PNG_HEADER.to_vec(),
            total,
        }
    }
}

/// What the server saw.
#[derive(Debug, Default)]
pub struct Stats {
    pub connections: AtomicUsize,
    /// Each request's head, in order.
    pub requests: Mutex<Vec<String>>,
    /// Body bytes written successfully.
    pub sent: AtomicUsize,
    /// A body write failed: the client closed the connection before the end.
    pub closed_early: AtomicBool,
    /// Signalled when a connection's handler ends.
    pub ended: Notify,
}

impl Stats {
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    pub fn requests(&self) -> Vec<String> {
        self.requests.lock().unwrap().clone()
    }
}

pub struct Server {
    pub addr: SocketAddr,
    pub stats: Arc<Stats>,
}

impl Server {
    /// A server on `ip`:0 answering every request with `route(path)`.
    pub async fn start_on(ip: &str, route: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Self {
        let listener = TcpListener::bind((ip, 0)).await.unwrap();
        let addr = listener.local_addr().unwrap();
        let stats = Arc::new(Stats::default());
        let route = Arc::new(route);
        let shared = stats.clone();
        tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    return;
                };
                shared.connections.fetch_add(1, Ordering::SeqCst);
                let (stats, route) = (shared.clone(), route.clone());
                tokio::spawn(async move {
                    let _ = handle(stream, &stats, &*route).await;
                    stats.ended.notify_one();
                });
            }
        });
        Self { addr, stats }
    }

    pub async fn start(route: impl Fn(&str) -> Reply + Send + Sync + 'static) -> Self {
        Self::start_on("127.0.0.1", route).await
    }

    pub fn url(&self, path: &str) -> String {
        format!("http://{}{path}", self.addr)
    }
}

/// Serve HTTP/1.1 requests on `stream` (plain, or TLS already accepted) until it closes.
pub async fn handle<S: AsyncRead + AsyncWrite + Unpin>(
    stream: S,
    stats: &Stats,
    route: &(dyn Fn(&str) -> Reply + Send + Sync),
) -> io::Result<()> {
    let mut stream = BufReader::new(stream);
    loop {
        let mut head = String::new();
        loop {
            let mut line = String::new();
            if stream.read_line(&mut line).await? == 0 {
                return Ok(());
            }
            head.push_str(&line);
            if line == "\r\n" {
                break;
            }
        }
        stats.requests.lock().unwrap().push(head.clone());
        let path = head.split(' ').nth(1).unwrap_or("/").to_string();
        let stream = stream.get_mut();
        match route(&path) {
            Reply::Image {
                content_type,
                prefix,
                total,
            } => {
                let head = format!("HTTP/1.1 200 OK\r\ncontent-type: {content_type}\r\ncontent-length: {total}\r\n\r\n");
                stream.write_all(head.as_bytes()).await?;
                write_body(stream, stats, &prefix, total).await?;
            }
            Reply::Redirect(location) => {
                let head = format!(
                    "HTTP/1.1 302 Found\r\nlocation: {location}\r\ncontent-length: 0\r\n\r\n"
                );
                stream.write_all(head.as_bytes()).await?;
            }
            Reply::Status(status) => {
                let head = format!("HTTP/1.1 {status} Nope\r\ncontent-type: text/plain\r\ncontent-length: 0\r\n\r\n");
                stream.write_all(head.as_bytes()).await?;
            }
            Reply::Trickle { every } => {
                let head =
                    "HTTP/1.1 200 OK\r\ncontent-type: image/png\r\ncontent-length: 1000000\r\n\r\n";
                stream.write_all(head.as_bytes()).await?;
                loop {
                    if stream.write_all(b"\0").await.is_err() {
                        stats.closed_early.store(true, Ordering::SeqCst);
                        return Ok(());
                    }
                    stats.sent.fetch_add(1, Ordering::SeqCst);
                    tokio::time::sleep(every).await;
                }
            }
        }
    }
}

async fn write_body<S: AsyncWrite + Unpin>(
    stream: &mut S,
    stats: &Stats,
    prefix: &[u8],
    total: usize,
) -> io::Result<()> {
    let chunk = vec![0u8; 64 << 10];
    let mut written = 0;
    let mut first = prefix.to_vec();
    first.truncate(total);
    for part in std::iter::once(&first[..]).chain(std::iter::repeat(&chunk[..])) {
        if written >= total {
            break;
        }
        let part = &part[..part.len().min(total - written)];
        if let Err(e) = stream.write_all(part).await {
            stats.closed_early.store(true, Ordering::SeqCst);
            return Err(e);
        }
        written += part.len();
        stats.sent.fetch_add(part.len(), Ordering::SeqCst);
    }
    Ok(())
}

/// A resolver that answers from a script, one answer per lookup (the last repeats), and
/// counts lookups: DNS that changes its mind.
#[derive(Debug, Default)]
pub struct ScriptedDns {
    answers: Mutex<VecDeque<io::Result<Vec<IpAddr>>>>,
    pub lookups: AtomicUsize,
}

impl ScriptedDns {
    pub fn new(answers: &[&[&str]]) -> Arc<Self> {
        let answers = answers
            .iter()
            .map(|a| Ok(a.iter().map(|ip| ip.parse().unwrap()).collect()))
            .collect();
        Arc::new(Self {
            answers: Mutex::new(answers),
            lookups: AtomicUsize::new(0),
        })
    }

    pub fn failing() -> Arc<Self> {
        Arc::new(Self {
            answers: Mutex::new(VecDeque::from([Err(io::Error::other("SERVFAIL"))])),
            lookups: AtomicUsize::new(0),
        })
    }

    pub fn lookups(&self) -> usize {
        self.lookups.load(Ordering::SeqCst)
    }
}

impl Resolve for ScriptedDns {
    fn resolve<'a>(&'a self, _host: &'a str, _port: u16) -> Resolved<'a> {
        self.lookups.fetch_add(1, Ordering::SeqCst);
        let mut answers = self.answers.lock().unwrap();
        let answer = if answers.len() > 1 {
            answers.pop_front().unwrap()
        } else {
            match answers.front().unwrap() {
                Ok(a) => Ok(a.clone()),
                Err(e) => Err(io::Error::other(e.to_string())),
            }
        };
        Box::pin(async move { answer })
    }
}

/// A policy that fetches plain http from 127.0.0.1 only (loopback is otherwise refused).
pub fn loopback_policy() -> FetchPolicy {
    FetchPolicy {
        allow_networks: vec!["127.0.0.1/32".parse().unwrap()],
        allow_http: true,
        ..FetchPolicy::allowing()
    }
}

/// A fetcher with no trusted CA (no test reaches a real TLS server) and the system resolver.
pub fn fetcher(policy: FetchPolicy) -> ImageFetcher {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let tls = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(rustls::RootCertStore::empty())
        .with_no_client_auth();
    ImageFetcher::with_tls_config(policy, Arc::new(tls))
}
