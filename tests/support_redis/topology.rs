//! Real Redis topologies for tests: a 3-primary Redis Cluster and a Sentinel set (a primary,
//! a replica and three sentinels), each process on a free 127.0.0.1 port in a fresh temp dir,
//! no persistence, killed on drop. Nodes are inspected with `redis-cli` (Debian's
//! `redis-tools`, a dependency of `redis-server`).
//!
//! Cluster and Sentinel speak TCP only (nodes announce their addresses to each other), so
//! unlike [`super::RedisServer`] these take ports: a port is picked at random, checked free
//! (with its cluster-bus port, +10000), and a server that fails to start on it (a race with
//! another process) is retried on another.

use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use std::io::{Read, Write};

use super::server::{create_cluster, until, urls_toml, Server};

/// How long a topology may take to form before the test fails.

/// Whether the binaries these topologies need are installed; when not, says so loudly (the
/// caller then skips: CI installs them, see `.ci/run`).
pub fn available() -> bool {
    let ok = ["redis-server", "redis-cli"].iter().all(|b| {
        Command::new(b)
            .arg("--version")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    });
    if !ok {
        eprintln!(
            "\n################################################################\n\
             SKIPPED: redis-server / redis-cli not installed (apt-get install -y \
             redis-server redis-tools); the Redis Cluster and Sentinel tests did NOT run\n\
             ################################################################\n"
        );
    }
    ok
}

/// A fresh temp dir for one server or topology.
pub fn temp_dir(kind: &str) -> PathBuf {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    let dir = std::env::temp_dir().join(format!(
        "kvgate-{kind}-{}-{}-{nanos:x}",
        std::process::id(),
        SEQ.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).expect("create a redis temp dir");
    dir
}

/// A port in 20000..30000 whose +10000 (the cluster bus) is free too.
pub fn free_port() -> u16 {
    static SEQ: AtomicU64 = AtomicU64::new(0);
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos() as u64)
        ^ (u64::from(std::process::id()) << 16);
    loop {
        let n = seed.wrapping_add(SEQ.fetch_add(7919, Ordering::Relaxed));
        let port = 20000 + (n % 10000) as u16;
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(port) && free(port + 10000) {
            return port;
        }
    }
}

/// One redis-server process (a node, a replica or a sentinel).
pub struct Node {
    child: Option<Child>,
    /// Its TCP port on 127.0.0.1.
    pub port: u16,
    dir: PathBuf,
}

impl Node {
    /// Start `redis-server` with `args` (after the config file, if any) on a free port, and
    /// wait until it answers PING; retried on another port if it exits early.
    fn start(dir: &Path, name: &str, config: Option<&str>, args: &[&str]) -> Self {
        let dir = dir.join(name);
        std::fs::create_dir_all(&dir).expect("create a node dir");
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = Command::new("redis-server");
            if let Some(config) = config {
                let file = dir.join("node.conf");
                std::fs::write(&file, format!("port {port}\n{config}"))
                    .expect("write a node config");
                cmd.arg(&file);
            } else {
                cmd.arg("--port").arg(port.to_string());
            }
            let child = cmd
                .args(args)
                .args(["--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .arg("--dir")
                .arg(&dir)
                .arg("--logfile")
                .arg(dir.join("redis.log"))
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("spawn redis-server");
            let mut node = Node {
                child: Some(child),
                port,
                dir: dir.clone(),
            };
            if node.wait_ready() {
                return node;
            }
            node.kill();
        }
        panic!("redis-server {name} did not start on 5 ports; see {dir:?}");
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
            }
            if let Ok(reply) = try_command(self.port, &["PING"]) {
                if reply == "+PONG" {
                    return true;
                }
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    /// `host:port`.
    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// `redis://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}", self.port)
    }

    /// SIGKILL (a crash) and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// `redis-cli -p port args…`, its stdout lines.
    pub fn cli(&self, args: &[&str]) -> Vec<String> {
        let out = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", &self.port.to_string()])
            .args(args)
            .output()
            .expect("run redis-cli");
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect()
    }

    /// The log, for failure messages.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("redis.log")).unwrap_or_default()
    }
}

impl Server for Node {
    fn cli(&self, args: &[&str]) -> Vec<String> {
        Node::cli(self, args)
    }

    fn log(&self) -> String {
        Node::log(self)
    }

    fn url(&self) -> String {
        Node::url(self)
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
    }
}

/// One command over a raw connection; the first reply line.
fn try_command(port: u16, args: &[&str]) -> std::io::Result<String> {
    let mut stream = TcpStream::connect(("127.0.0.1", port))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut req = format!("*{}\r\n", args.len());
    for a in args {
        req.push_str(&format!("${}\r\n{a}\r\n", a.len()));
    }
    stream.write_all(req.as_bytes())?;
    let mut line = Vec::new();
    let mut byte = [0u8; 1];
    while let Ok(1) = stream.read(&mut byte) {
        if byte[0] == b'\n' {
            break;
        }
        line.push(byte[0]);
    }
    Ok(String::from_utf8_lossy(&line).trim_end().to_owned())
}

/// A Redis Cluster of three primaries (no replicas), slots spread by `redis-cli --cluster
/// create`.
pub struct RedisCluster {
    /// The primaries.
    pub nodes: Vec<Node>,
    dir: PathBuf,
}

impl RedisCluster {
    /// Start three nodes, create the cluster, wait until every node says `cluster_state:ok`.
    pub fn start() -> Self {
        let dir = temp_dir("cluster");
        let nodes: Vec<Node> = (0..3)
            .map(|i| {
                Node::start(
                    &dir,
                    &format!("n{i}"),
                    None,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                    ],
                )
            })
            .collect();
        let addrs = nodes.iter().map(Node::addr).collect();
        create_cluster(&[], addrs, &nodes);
        Self { nodes, dir }
    }

    /// TOML for the list of seed nodes.
    pub fn urls_toml(&self) -> String {
        urls_toml(&self.nodes)
    }

    /// Every key on every primary.
    pub fn keys(&self) -> Vec<(usize, String)> {
        let mut keys = Vec::new();
        for (i, n) in self.nodes.iter().enumerate() {
            keys.extend(n.cli(&["--scan"]).into_iter().map(|k| (i, k)));
        }
        keys
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for n in &mut self.nodes {
            n.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A primary, one replica and three sentinels monitoring it as `kvgate-primary` (down
/// after 1 s, quorum 2).
pub struct SentinelSet {
    /// The primary at the start (index 0) and its replica (index 1).
    pub data: Vec<Node>,
    /// The three sentinels.
    pub sentinels: Vec<Node>,
    dir: PathBuf,
}

/// The name the sentinels monitor the primary under.
pub const PRIMARY_NAME: &str = "kvgate-primary";

impl SentinelSet {
    /// Start everything and wait until every sentinel knows the replica and the other two
    /// sentinels (a failover needs both).
    pub fn start() -> Self {
        let dir = temp_dir("sentinel");
        let primary = Node::start(&dir, "primary", None, &[]);
        let replica = Node::start(
            &dir,
            "replica",
            None,
            &["--replicaof", "127.0.0.1", &primary.port.to_string()],
        );
        let monitor = format!(
            "sentinel monitor {PRIMARY_NAME} 127.0.0.1 {} 2\n\
             sentinel down-after-milliseconds {PRIMARY_NAME} 1000\n\
             sentinel failover-timeout {PRIMARY_NAME} 3000\n\
             sentinel parallel-syncs {PRIMARY_NAME} 1\n",
            primary.port
        );
        let sentinels: Vec<Node> = (0..3)
            .map(|i| Node::start(&dir, &format!("s{i}"), Some(&monitor), &["--sentinel"]))
            .collect();
        let set = Self {
            data: vec![primary, replica],
            sentinels,
            dir,
        };
        until(
            "the replica in sync and every sentinel knowing it and the two others",
            || {
                let synced = set.data[1]
                    .cli(&["INFO", "replication"])
                    .iter()
                    .any(|l| l.trim() == "master_link_status:up");
                synced
                    && set.sentinels.iter().all(|s| {
                        let info = s.cli(&["SENTINEL", "MASTER", PRIMARY_NAME]);
                        field(&info, "num-slaves") == Some("1")
                            && field(&info, "num-other-sentinels") == Some("2")
                    })
            },
            || {
                set.sentinels
                    .iter()
                    .map(Node::log)
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        );
        set
    }

    /// TOML for the sentinel list.
    pub fn sentinels_toml(&self) -> String {
        urls_toml(&self.sentinels)
    }

    /// The port the sentinels name as primary now.
    pub fn primary_port(&self) -> Option<u16> {
        self.sentinels.iter().find_map(|s| {
            s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", PRIMARY_NAME])
                .get(1)
                .and_then(|p| p.trim().parse().ok())
        })
    }

    /// SIGKILL the primary, then wait until every sentinel names the replica instead.
    pub fn kill_primary_and_wait_for_failover(&mut self) {
        self.data[0].kill();
        let replica = self.data[1].port;
        until(
            "the sentinels promoting the replica",
            || {
                self.sentinels.iter().all(|s| {
                    s.cli(&["SENTINEL", "GET-MASTER-ADDR-BY-NAME", PRIMARY_NAME])
                        .get(1)
                        .is_some_and(|p| p.trim() == replica.to_string())
                })
            },
            || {
                self.sentinels
                    .iter()
                    .map(Node::log)
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        );
        until(
            "the promoted replica taking writes",
            || {
                self.data[1]
                    .cli(&["ROLE"])
                    .first()
                    .is_some_and(|r| r.trim() == "master")
            },
            || self.data[1].log(),
        );
    }
}

/// A value from a flat `key value key value` reply.
fn field<'a>(lines: &'a [String], name: &str) -> Option<&'a str> {
    lines
        .iter()
        .position(|l| l.trim() == name)
        .and_then(|i| lines.get(i + 1))
        .map(|v| v.trim())
}

impl Drop for SentinelSet {
    fn drop(&mut self) {
        for n in self.sentinels.iter_mut().chain(self.data.iter_mut()) {
            n.kill();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Every key on `node` with what it holds: `(key, type, pttl, length of a stream)`.
pub fn key_report(node: &Node) -> Vec<(String, String, i64, i64)> {
    node.cli(&["--scan"])
        .into_iter()
        .map(|key| {
            let ty = node.cli(&["TYPE", &key]).concat();
            let pttl = node
                .cli(&["PTTL", &key])
                .concat()
                .trim()
                .parse()
                .unwrap_or(-3);
            let len = if ty == "stream" {
                node.cli(&["XLEN", &key])
                    .concat()
                    .trim()
                    .parse()
                    .unwrap_or(-1)
            } else {
                0
            };
            (key, ty, pttl, len)
        })
        .collect()
}

/// Assert that every key on `node` expires, except streams, which must be capped at `max`
/// entries. PTTL `-2` (expired between SCAN and PTTL) is fine.
pub fn assert_every_key_expires(node: &Node, max_stream: i64) {
    for (key, ty, pttl, len) in key_report(node) {
        if ty == "stream" {
            assert!(
                (0..=max_stream).contains(&len),
                "stream {key} on :{} has {len} entries (cap {max_stream})",
                node.port
            );
        } else if ty != "none" {
            assert!(
                pttl > 0 || pttl == -2,
                "key {key} ({ty}) on :{} has no expiry (PTTL {pttl})",
                node.port
            );
        }
    }
}
