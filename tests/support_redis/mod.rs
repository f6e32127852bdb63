//! A real `redis-server` for tests: on a unix socket in a fresh temp dir (no TCP port, so
//! tests run in parallel without port clashes), no persistence, ready when it answers PING,
//! killed on drop. Install it with `apt-get install -y redis-server`.
#![allow(dead_code)]

pub mod server;
pub mod tls;
pub mod topology;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a fresh server may take to answer PING before the test fails.
const READY_DEADLINE: Duration = Duration::from_secs(10);

/// A running `redis-server` owned by one test.
pub struct RedisServer {
    child: Option<Child>,
    dir: PathBuf,
    socket: PathBuf,
}

impl RedisServer {
    /// Whether `redis-server` can be run at all (benches skip without it; tests fail).
    pub fn available() -> bool {
        Command::new("redis-server")
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    }

    /// Start a server and wait until it answers.
    pub fn start() -> Self {
        let dir = topology::temp_dir("redis");
        let socket = dir.join("redis.sock");
        let mut server = Self {
            child: None,
            dir,
            socket,
        };
        server.spawn();
        server
    }

    /// `unix:///…/redis.sock`, for `RedisStore::connect`.
    pub fn url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The socket path.
    pub fn socket(&self) -> &Path {
        &self.socket
    }

    /// SIGKILL the server (a crash, not a shutdown) and reap it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }

    /// Start the server again on the same socket (its data is gone, as after a crash).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    /// Run one command over a raw connection and return the reply line (e.g. `:3`).
    pub fn command(&self, args: &[&str]) -> String {
        let mut stream = UnixStream::connect(&self.socket).expect("connect to redis");
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .expect("set a read timeout");
        let mut req = format!("*{}\r\n", args.len());
        for a in args {
            req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
        }
        stream.write_all(req.as_bytes()).expect("send to redis");
        read_line(&mut stream)
    }

    fn spawn(&mut self) {
        assert!(
            Self::available(),
            "redis-server is not installed: apt-get install -y redis-server"
        );
        let child = Command::new("redis-server")
            .arg("--port")
            .arg("0")
            .arg("--unixsocket")
            .arg(&self.socket)
            .arg("--unixsocketperm")
            .arg("700")
            .arg("--save")
            .arg("")
            .arg("--appendonly")
            .arg("no")
            .arg("--dir")
            .arg(&self.dir)
            .arg("--logfile")
            .arg(self.dir.join("redis.log"))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);
        self.wait_ready();
    }

    /// Retry PING until it answers or the deadline passes; a server that exits fails fast.
    fn wait_ready(&mut self) {
        let deadline = Instant::now() + READY_DEADLINE;
        loop {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(status)) = child.try_wait() {
                    panic!("redis-server exited early ({status}); see {:?}", self.log());
                }
            }
            if let Ok(mut stream) = UnixStream::connect(&self.socket) {
                let _ = stream.set_read_timeout(Some(Duration::from_secs(1)));
                if stream.write_all(b"PING\r\n").is_ok() && read_line(&mut stream) == "+PONG" {
                    return;
                }
            }
            assert!(
                Instant::now() < deadline,
                "redis-server did not answer within {READY_DEADLINE:?}: {}",
                self.log()
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_line(stream: &mut UnixStream) -> String {
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while let Ok(1) = stream.read(&mut byte) {
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
    }
    String::from_utf8_lossy(&line).trim_end().to_owned()
}
