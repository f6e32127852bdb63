//! A raw-TCP OpenAI-style engine for the quirks of real servers that hyper would smooth
//! over: closing a keep-alive connection right after an answer (llama-server), closing after
//! reading a request, answering 500. Every exchange is recorded.
#![allow(dead_code)]

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// How the engine treats a generation request (GETs are always answered, keep-alive).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quirk {
    /// Stream the chat answer with `connection: keep-alive`, then close the connection as
    /// soon as the next request's first bytes arrive, unread: the idle-close race made
    /// deterministic.
    CloseBeforeNextRequest,
    /// Stream the chat answer with `connection: keep-alive`, then close at once, as
    /// llama-server does.
    CloseAfterAnswer,
    /// Read the request and close without a byte of answer.
    CloseAfterReading,
    /// Answer 500 with an OpenAI error body, keep-alive.
    Error500,
    /// Answer a whole chat whose `usage.prompt_tokens` is this count (an engine that
    /// tokenizes other text than kvgate counted, e.g. without NFC normalization).
    ReportPromptTokens(u64),
}

/// One request as the engine read it.
#[derive(Debug, Clone)]
pub struct Seen {
    pub method: String,
    pub path: String,
    pub headers: Vec<(String, String)>,
    pub body: String,
}

impl Seen {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }
}

pub struct RawEngine {
    pub addr: SocketAddr,
    seen: Arc<Mutex<Vec<Seen>>>,
    connections: Arc<Mutex<usize>>,
    task: tokio::task::JoinHandle<()>,
}

impl RawEngine {
    pub async fn start(quirk: Quirk) -> Self {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let seen = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(Mutex::new(0));
        let (s, c) = (seen.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((conn, _)) = listener.accept().await {
                *c.lock().unwrap() += 1;
                tokio::spawn(serve(conn, quirk, s.clone()));
            }
        });
        Self {
            addr,
            seen,
            connections,
            task,
        }
    }

    /// The generation requests read so far (GETs left out).
    pub fn generations(&self) -> Vec<Seen> {
        self.seen
            .lock()
            .unwrap()
            .iter()
            .filter(|s| s.method == "POST")
            .cloned()
            .collect()
    }

    pub fn connections(&self) -> usize {
        *self.connections.lock().unwrap()
    }
}

impl Drop for RawEngine {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn serve(mut conn: TcpStream, quirk: Quirk, seen: Arc<Mutex<Vec<Seen>>>) {
    let mut buf = Vec::new();
    loop {
        let Some(request) = read_request(&mut conn, &mut buf).await else {
            return;
        };
        let post = request.method == "POST";
        seen.lock().unwrap().push(request);
        if !post {
            let body = r#"{"object":"list","data":[{"id":"qwen3","object":"model"}]}"#;
            let head = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\ncontent-length: {}\r\n\r\n",
                body.len()
            );
            if conn
                .write_all(format!("{head}{body}").as_bytes())
                .await
                .is_err()
            {
                return;
            }
            continue;
        }
        match quirk {
            Quirk::CloseAfterReading => return,
            Quirk::Error500 => {
                let body = r#"{"error":{"message":"Internal Server Error","type":"server_error","code":500}}"#;
                let head = format!(
                    "HTTP/1.1 500 Internal Server Error\r\ncontent-type: application/json\r\nconnection: keep-alive\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if conn
                    .write_all(format!("{head}{body}").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Quirk::ReportPromptTokens(n) => {
                let body = format!(
                    r#"{{"id":"c1","object":"chat.completion","created":1,"model":"qwen3","choices":[{{"index":0,"message":{{"role":"assistant","content":"Hello"}},"finish_reason":"stop"}}],"usage":{{"prompt_tokens":{n},"completion_tokens":1,"total_tokens":{}}}}}"#,
                    n + 1
                );
                let head = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nconnection: keep-alive\r\ncontent-length: {}\r\n\r\n",
                    body.len()
                );
                if conn
                    .write_all(format!("{head}{body}").as_bytes())
                    .await
                    .is_err()
                {
                    return;
                }
            }
            Quirk::CloseAfterAnswer | Quirk::CloseBeforeNextRequest => {
                if conn.write_all(streamed_chat().as_bytes()).await.is_err() {
                    return;
                }
                let _ = conn.flush().await;
                if quirk == Quirk::CloseAfterAnswer {
                    return;
                }
                // Wait for the next request's first bytes, then close with them unread.
                let mut one = [0u8; 1];
                let _ = conn.peek(&mut one).await;
                return;
            }
        }
    }
}

fn streamed_chat() -> String {
    let events = [
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"},"finish_reason":null}]}"#,
        r#"{"id":"c1","object":"chat.completion.chunk","created":1,"model":"qwen3","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}"#,
        "[DONE]",
    ];
    let mut out = String::from(
        "HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ncache-control: no-cache\r\nconnection: keep-alive\r\ntransfer-encoding: chunked\r\n\r\n",
    );
    for e in events {
        let chunk = format!("data: {e}\n\n");
        out.push_str(&format!("{:x}\r\n{chunk}\r\n", chunk.len()));
    }
    out.push_str("0\r\n\r\n");
    out
}

/// Read one request (head and `content-length` body) from `conn`; `None` at EOF.
async fn read_request(conn: &mut TcpStream, buf: &mut Vec<u8>) -> Option<Seen> {
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let mut first = lines.next()?.split(' ');
    let method = first.next()?.to_owned();
    let path = first.next()?.to_owned();
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_owned(), v.trim().to_owned()))
        .collect();
    let len = headers
        .iter()
        .find(|(n, _)| n.eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.parse::<usize>().ok())
        .unwrap_or(0);
    while buf.len() < head_end + len {
        let n = conn.read(&mut chunk).await.ok()?;
        if n == 0 {
            return None;
        }
        buf.extend_from_slice(&chunk[..n]);
    }
    let body = String::from_utf8_lossy(&buf[head_end..head_end + len]).into_owned();
    buf.drain(..head_end + len);
    Some(Seen {
        method,
        path,
        headers,
        body,
    })
}
