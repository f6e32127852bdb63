//! What the plain and the TLS topologies share: a running server as the cluster and
//! sentinel helpers use it, creating a cluster of them and waiting for it to form.

use std::process::Command;
use std::time::{Duration, Instant};

/// How long a topology may take to form.
const FORM_DEADLINE: Duration = Duration::from_secs(30);

/// A running redis-server (or sentinel), plain or TLS.
pub trait Server {
    /// `redis-cli` against it: the reply's lines.
    fn cli(&self, args: &[&str]) -> Vec<String>;
    /// Its log, for a failure's message.
    fn log(&self) -> String;
    /// Its URL as kvgate's config names it.
    fn url(&self) -> String;
}

/// TOML for a list of `servers`' URLs.
pub fn urls_toml<S: Server>(servers: &[S]) -> String {
    let urls: Vec<String> = servers.iter().map(|n| format!("\"{}\"", n.url())).collect();
    format!("[{}]", urls.join(", "))
}

/// `redis-cli [cli_args] --cluster create <addrs> --cluster-yes`, then wait until every
/// node says `cluster_state:ok`.
pub fn create_cluster<S: Server>(cli_args: &[String], addrs: Vec<String>, nodes: &[S]) {
    let out = Command::new("redis-cli")
        .args(cli_args)
        .arg("--cluster")
        .arg("create")
        .args(addrs)
        .arg("--cluster-yes")
        .output()
        .expect("run redis-cli --cluster create");
    assert!(
        out.status.success(),
        "redis-cli --cluster create failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    until(
        "cluster_state:ok on every node",
        || {
            nodes.iter().all(|n| {
                n.cli(&["CLUSTER", "INFO"])
                    .iter()
                    .any(|l| l.trim() == "cluster_state:ok")
            })
        },
        || nodes.iter().map(Server::log).collect::<Vec<_>>().join("\n"),
    );
}

/// Poll `ok` until [`FORM_DEADLINE`] (a topology forming), failing with `diagnose()`.
pub fn until(what: &str, mut ok: impl FnMut() -> bool, diagnose: impl Fn() -> String) {
    let deadline = Instant::now() + FORM_DEADLINE;
    while !ok() {
        assert!(
            Instant::now() < deadline,
            "{what} not within {FORM_DEADLINE:?}\n{}",
            diagnose()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}
