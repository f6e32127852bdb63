//! `kvgate load-gen`: an open-loop, fixed-rate HTTP/1.1 load generator with latency
//! percentiles, for the load harness.
//!
//! Closed-loop tools (wrk) measure throughput; latency at a given rate needs arrivals that
//! do not wait for answers. `hey -q` ticks every worker at the same instant, so its
//! "500 req/s" is bursts of all workers at once, and it measures from when a worker got to
//! send (coordinated omission). Here a dedicated thread paces arrivals evenly (one every
//! `1/rate` seconds, with `std::thread::sleep` precision, not the async timer's
//! millisecond), each request goes out on an idle keep-alive connection (a new one when
//! all are busy, up to `--connections`), and its latency runs from its *scheduled* time to
//! the end of its body, so a slow server cannot hide queueing.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use tokio::sync::{mpsc, Semaphore};

use super::cli::SimError;

/// Command-line arguments of the load generator.
#[derive(clap::Args, Clone, Debug)]
pub struct LoadArgs {
    /// Target URL (http only), e.g. http://127.0.0.1:8080/v1/chat/completions.
    #[arg(long)]
    pub url: http::Uri,
    /// Requests per second, spread evenly.
    #[arg(long)]
    pub rate: f64,
    /// Seconds to send for.
    #[arg(long, default_value_t = 5.0)]
    pub duration: f64,
    /// File whose bytes are POSTed as the body (GET without).
    #[arg(long)]
    pub body_file: Option<PathBuf>,
    /// Extra request header, `name: value` (repeatable).
    #[arg(long = "header")]
    pub headers: Vec<String>,
    /// Most connections open at once.
    #[arg(long, default_value_t = 256)]
    pub connections: usize,
}

fn failed(context: &str, e: impl std::fmt::Display) -> SimError {
    SimError::Io {
        context: context.to_string(),
        source: std::io::Error::other(e.to_string()),
    }
}

/// What a run measured.
#[derive(Debug, Clone, PartialEq)]
pub struct LoadReport {
    /// Requests sent, answered 2xx, failed (other status or transport error).
    pub sent: usize,
    pub ok: usize,
    pub errors: usize,
    /// Answers per second over the run.
    pub achieved_rps: f64,
    /// Latency percentiles from the scheduled send time, in milliseconds: 50, 90, 99, max.
    pub percentiles_ms: [f64; 4],
}

/// Runs the load described by `args` and prints one line of results:
/// `sent ok errors achieved_rps p50_ms p90_ms p99_ms max_ms`.
pub async fn run_load_cli(args: LoadArgs) -> Result<(), SimError> {
    let r = run_load(args).await?;
    let [p50, p90, p99, max] = r.percentiles_ms;
    println!(
        "{} {} {} {:.1} {p50:.3} {p90:.3} {p99:.3} {max:.3}",
        r.sent, r.ok, r.errors, r.achieved_rps
    );
    Ok(())
}

/// Runs the load described by `args`.
pub async fn run_load(args: LoadArgs) -> Result<LoadReport, SimError> {
    let authority = args
        .url
        .authority()
        .ok_or_else(|| failed("--url", "needs host:port"))?
        .to_string();
    let body = match &args.body_file {
        Some(path) => {
            Bytes::from(std::fs::read(path).map_err(|e| failed("reading --body-file", e))?)
        }
        None => Bytes::new(),
    };
    let mut headers = Vec::new();
    for h in &args.headers {
        let (name, value) = h
            .split_once(':')
            .ok_or_else(|| failed("--header", format!("{h:?} is not `name: value`")))?;
        headers.push((
            http::HeaderName::try_from(name.trim()).map_err(|e| failed("--header", e))?,
            http::HeaderValue::try_from(value.trim()).map_err(|e| failed("--header", e))?,
        ));
    }
    let target = Arc::new(Target {
        authority,
        uri: args.url.clone(),
        body,
        headers,
        idle: Mutex::new(Vec::new()),
        slots: Semaphore::new(args.connections.max(1)),
    });
    let total = (args.rate * args.duration).max(1.0) as usize;
    let interval = Duration::from_secs_f64(1.0 / args.rate.max(0.001));
    // The pacer: a plain thread, so arrivals are spaced finer than the async timer can.
    let (fire, mut fired) = mpsc::unbounded_channel::<Instant>();
    let start = Instant::now() + Duration::from_millis(20);
    std::thread::spawn(move || {
        for i in 0..total {
            let at = start + interval.mul_f64(i as f64);
            let now = Instant::now();
            if at > now {
                std::thread::sleep(at - now);
            }
            if fire.send(at).is_err() {
                return;
            }
        }
    });
    let (done, mut results) = mpsc::unbounded_channel::<Option<Duration>>();
    let mut sent = 0usize;
    while let Some(at) = fired.recv().await {
        sent += 1;
        let (target, done) = (Arc::clone(&target), done.clone());
        tokio::spawn(async move {
            let ok = target.request().await.is_ok();
            let _ = done.send(ok.then(|| at.elapsed()));
        });
    }
    drop(done);
    let mut latencies = Vec::with_capacity(sent);
    let mut errors = 0usize;
    while let Some(r) = results.recv().await {
        match r {
            Some(d) => latencies.push(d),
            None => errors += 1,
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    latencies.sort_unstable();
    let pct = |p: f64| -> f64 {
        if latencies.is_empty() {
            return f64::NAN;
        }
        let i = ((latencies.len() as f64 * p).ceil() as usize).clamp(1, latencies.len()) - 1;
        latencies
            .get(i)
            .map_or(f64::NAN, |d| d.as_secs_f64() * 1000.0)
    };
    Ok(LoadReport {
        sent,
        ok: latencies.len(),
        errors,
        achieved_rps: latencies.len() as f64 / elapsed,
        percentiles_ms: [pct(0.50), pct(0.90), pct(0.99), pct(1.0)],
    })
}

/// Where requests go, and the keep-alive connections to it.
struct Target {
    authority: String,
    uri: http::Uri,
    body: Bytes,
    headers: Vec<(http::HeaderName, http::HeaderValue)>,
    idle: Mutex<Vec<SendRequest<Full<Bytes>>>>,
    slots: Semaphore,
}

impl Target {
    /// One request on an idle connection (or a new one), its body read to the end.
    async fn request(&self) -> Result<(), Box<dyn std::error::Error + Send + Sync>> {
        let _slot = self.slots.acquire().await?;
        let idle = self.idle.lock().ok().and_then(|mut v| v.pop());
        let mut conn = match idle {
            Some(c) if !c.is_closed() => c,
            _ => self.connect().await?,
        };
        let mut req = http::Request::builder()
            .method(if self.body.is_empty() { "GET" } else { "POST" })
            .uri(self.uri.path_and_query().map_or("/", |p| p.as_str()))
            .header(http::header::HOST, &self.authority);
        for (name, value) in &self.headers {
            req = req.header(name, value);
        }
        let req = req.body(Full::new(self.body.clone()))?;
        conn.ready().await?;
        let response = conn.send_request(req).await?;
        let status = response.status();
        response.into_body().collect().await?;
        if let Ok(mut v) = self.idle.lock() {
            v.push(conn);
        }
        if status.is_success() {
            Ok(())
        } else {
            Err(format!("status {status}").into())
        }
    }

    async fn connect(
        &self,
    ) -> Result<SendRequest<Full<Bytes>>, Box<dyn std::error::Error + Send + Sync>> {
        let stream = tokio::net::TcpStream::connect(&self.authority).await?;
        stream.set_nodelay(true)?;
        let (send, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
        tokio::spawn(conn);
        Ok(send)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: LoadArgs,
    }

    #[tokio::test]
    async fn paces_requests_and_counts_answers_and_failures() {
        let dir =
            std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/tokenizers/qwen3");
        let tokenizer = kvgate_tokenize::ModelTokenizer::from_dir(&dir).unwrap();
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mock = crate::spawn_mock("qwen3", Arc::new(tokenizer), listener).unwrap();
        let body = std::env::temp_dir().join(format!("kvgate-loadgen-{}.json", std::process::id()));
        std::fs::write(
            &body,
            r#"{"model":"qwen3","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}"#,
        )
        .unwrap();
        let run = |path: &str| {
            let url = format!("http://{}{path}", mock.http_addr);
            let args = Cli::try_parse_from([
                "load-gen",
                "--url",
                &url,
                "--rate",
                "200",
                "--duration",
                "0.25",
                "--body-file",
                body.to_str().unwrap(),
                "--header",
                "content-type: application/json",
            ])
            .unwrap()
            .args;
            run_load(args)
        };
        let good = run("/v1/chat/completions").await.unwrap();
        assert_eq!((good.sent, good.ok, good.errors), (50, 50, 0), "{good:?}");
        let [p50, p90, p99, max] = good.percentiles_ms;
        assert!(
            p50 <= p90 && p90 <= p99 && p99 <= max && p50 > 0.0,
            "{good:?}"
        );
        let bad = run("/nowhere").await.unwrap();
        assert_eq!(
            (bad.sent, bad.ok, bad.errors),
            (50, 0, 50),
            "404s are errors: {bad:?}"
        );
        let _ = std::fs::remove_file(&body);
        mock.shutdown().await;
    }
}
