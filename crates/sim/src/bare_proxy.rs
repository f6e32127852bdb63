//! `kvgate bare-proxy`: the load harness's floor — hyper and tokio forwarding requests with
//! none of kvgate's stages.
//!
//! It does what kvgate's own I/O does for a non-streamed answer and nothing else: the same
//! server (hyper-util's auto builder, HTTP/1.1 and h2c), the same pooled client (hyper-util's
//! legacy client, TCP_NODELAY), the request body and the answer buffered whole, as the
//! guard needs them, and the same thread per core (`--threads`, one per CPU: each thread
//! its own single-threaded runtime, accept loop and client). Measured beside nginx in one run, it shows how much of the gap between
//! kvgate and nginx is the HTTP stack itself, and so how far kvgate's checks could go.

use std::convert::Infallible;
use std::net::SocketAddr;

use bytes::Bytes;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Request, Response, StatusCode};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

use super::cli::{io, wait_for_signal, SimError};

/// Largest body either way (as kvgate's default).
const MAX_BODY_BYTES: usize = 64 << 20;

/// Command-line arguments of the bare proxy.
#[derive(clap::Args, Clone, Debug)]
pub struct BareProxyArgs {
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1:8090")]
    pub listen: SocketAddr,
    /// Where every request goes, e.g. http://127.0.0.1:30001.
    #[arg(long)]
    pub upstream: http::Uri,
    /// Serving threads (default: one per CPU).
    #[arg(long)]
    pub threads: Option<usize>,
}

type UpstreamClient = Client<HttpConnector, Full<Bytes>>;

/// Runs the proxy until Ctrl-C or SIGTERM.
pub async fn run_bare_proxy_cli(args: BareProxyArgs) -> Result<(), SimError> {
    let listener =
        std::net::TcpListener::bind(args.listen).map_err(io(format!("binding {}", args.listen)))?;
    listener
        .set_nonblocking(true)
        .map_err(io("setting the listener non-blocking"))?;
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, usize::from));
    for index in 0..threads.max(1) {
        let listener = listener.try_clone().map_err(io("sharing the listener"))?;
        let upstream = args.upstream.clone();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(io("starting a runtime"))?;
        std::thread::Builder::new()
            .name(format!("bare-proxy-{index}"))
            .spawn(move || {
                runtime.block_on(async move {
                    let Ok(listener) = TcpListener::from_std(listener) else {
                        return;
                    };
                    if let Ok((_, task)) = spawn_bare_proxy(listener, upstream) {
                        let _ = task.await;
                    }
                })
            })
            .map_err(io("starting a thread"))?;
    }
    println!("bare-proxy http=http://{} threads={threads}", args.listen);
    wait_for_signal().await?;
    Ok(())
}

/// Serves on `listener`, forwarding to `upstream`.
pub fn spawn_bare_proxy(
    listener: TcpListener,
    upstream: http::Uri,
) -> std::io::Result<(SocketAddr, JoinHandle<()>)> {
    let addr = listener.local_addr()?;
    let mut connector = HttpConnector::new();
    connector.set_nodelay(true);
    let client: UpstreamClient = Client::builder(TokioExecutor::new()).build(connector);
    let task = tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            let _ = stream.set_nodelay(true);
            let (client, upstream) = (client.clone(), upstream.clone());
            tokio::spawn(async move {
                let service = hyper::service::service_fn(move |req| {
                    forward(client.clone(), upstream.clone(), req)
                });
                let _ = auto::Builder::new(TokioExecutor::new())
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    Ok((addr, task))
}

async fn forward(
    client: UpstreamClient,
    upstream: http::Uri,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Infallible> {
    Ok(exchange(client, upstream, req).await.unwrap_or_else(|e| {
        let mut response = Response::new(Full::new(Bytes::from(e)));
        *response.status_mut() = StatusCode::BAD_GATEWAY;
        response
    }))
}

async fn exchange(
    client: UpstreamClient,
    upstream: http::Uri,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, String> {
    let (mut parts, body) = req.into_parts();
    let body = Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading the request: {e}"))?
        .to_bytes();
    let mut target = upstream.into_parts();
    target.path_and_query = parts.uri.path_and_query().cloned();
    parts.uri = http::Uri::from_parts(target).map_err(|e| e.to_string())?;
    parts.headers.remove(http::header::HOST);
    let answer = client
        .request(Request::from_parts(parts, Full::new(body)))
        .await
        .map_err(|e| format!("upstream: {e}"))?;
    let (parts, body) = answer.into_parts();
    let body = Limited::new(body, MAX_BODY_BYTES)
        .collect()
        .await
        .map_err(|e| format!("reading the answer: {e}"))?
        .to_bytes();
    Ok(Response::from_parts(parts, Full::new(body)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn forwards_the_body_and_answers_502_without_an_upstream() {
        // An upstream that echoes the body.
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let echo_addr = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((stream, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let service = hyper::service::service_fn(|req: Request<Incoming>| async move {
                        let body = req.into_body().collect().await.unwrap().to_bytes();
                        Ok::<_, Infallible>(Response::new(Full::new(body)))
                    });
                    let _ = auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream: http::Uri = format!("http://{echo_addr}").parse().unwrap();
        let (addr, _task) = spawn_bare_proxy(listener, upstream).unwrap();
        let client: UpstreamClient =
            Client::builder(TokioExecutor::new()).build(HttpConnector::new());
        let answer = client
            .request(
                Request::post(format!("http://{addr}/v1/chat/completions"))
                    .body(Full::new(Bytes::from_static(b"{\"hello\":1}")))
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::OK);
        let body = answer.into_body().collect().await.unwrap().to_bytes();
        assert_eq!(&body[..], b"{\"hello\":1}");

        // Nothing listens there: 502 with the reason, not a dropped connection.
        let closed = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead: http::Uri = format!("http://{}", closed.local_addr().unwrap())
            .parse()
            .unwrap();
        drop(closed);
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (addr, _task) = spawn_bare_proxy(listener, dead).unwrap();
        let answer = client
            .request(
                Request::get(format!("http://{addr}/health"))
                    .body(Full::default())
                    .unwrap(),
            )
            .await
            .unwrap();
        assert_eq!(answer.status(), StatusCode::BAD_GATEWAY);
    }
}
