//! A `redis-server` speaking TLS only (`--port 0 --tls-port …`), with certificates made by
//! the test: a CA, the server's certificate for 127.0.0.1 signed by it, a client
//! certificate signed by it (for `tls-auth-clients yes`), and an unrelated CA (to show what
//! a wrong `ca_file` does). Checked with `redis-cli --tls`.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rcgen::{BasicConstraints, CertificateParams, CertifiedIssuer, IsCa, KeyPair};

use super::server::{create_cluster, until, urls_toml, Server};
use super::topology::free_port;

/// PEM files in a temp dir.
#[derive(Clone)]
pub struct TlsFiles {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// A CA that signed none of these.
    pub other_ca: PathBuf,
}

fn ca(name: &str) -> CertifiedIssuer<'static, KeyPair> {
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, name);
    CertifiedIssuer::self_signed(params, KeyPair::generate().expect("CA key")).expect("CA")
}

impl TlsFiles {
    /// Generate everything under `dir`.
    pub fn generate(dir: &Path) -> Self {
        std::fs::create_dir_all(dir).expect("create the TLS dir");
        let write = |name: &str, text: String| {
            let path = dir.join(name);
            std::fs::write(&path, text).expect("write a PEM file");
            path
        };
        let issuer = ca("kvgate test Redis CA");
        let leaf = |names: &[&str]| {
            let key = KeyPair::generate().expect("leaf key");
            let params =
                CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                    .expect("leaf params");
            let cert = params.signed_by(&key, &issuer).expect("sign a leaf");
            (cert.pem(), key.serialize_pem())
        };
        // The address kvgate dials (and that nodes announce) is 127.0.0.1: an IP SAN.
        let (server_cert, server_key) = leaf(&["127.0.0.1", "localhost"]);
        let (client_cert, client_key) = leaf(&["kvgate-client"]);
        Self {
            dir: dir.to_owned(),
            ca: write("ca.pem", issuer.pem()),
            server_cert: write("server.pem", server_cert),
            server_key: write("server.key", server_key),
            client_cert: write("client.pem", client_cert),
            client_key: write("client.key", client_key),
            other_ca: write("other-ca.pem", ca("some other CA").pem()),
        }
    }

    /// `redis-server` arguments for TLS with these files.
    pub fn server_args(&self, auth_clients: bool) -> Vec<String> {
        [
            "--tls-cert-file",
            &self.server_cert.display().to_string(),
            "--tls-key-file",
            &self.server_key.display().to_string(),
            "--tls-ca-cert-file",
            &self.ca.display().to_string(),
            "--tls-auth-clients",
            if auth_clients { "yes" } else { "no" },
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }

    /// `redis-cli` arguments for TLS with the client certificate.
    pub fn cli_args(&self) -> Vec<String> {
        [
            "--tls",
            "--cacert",
            &self.ca.display().to_string(),
            "--cert",
            &self.client_cert.display().to_string(),
            "--key",
            &self.client_key.display().to_string(),
        ]
        .iter()
        .map(|s| s.to_string())
        .collect()
    }
}

/// Whether this `redis-server` was built with TLS; when not, says so loudly (the caller
/// then skips).
pub fn available() -> bool {
    if !super::topology::available() {
        return false;
    }
    // Listening nowhere, the server exits at once; a build without TLS refuses the
    // `tls-port` option by name first.
    let help = Command::new("redis-server")
        .args(["--port", "0", "--tls-port", "0", "--save", ""])
        .output();
    let ok = help.is_ok_and(|o| {
        let text =
            String::from_utf8_lossy(&o.stdout).to_string() + &String::from_utf8_lossy(&o.stderr);
        !text.contains("tls-port")
    });
    if !ok {
        eprintln!(
            "\n################################################################\n\
             SKIPPED: this redis-server has no TLS support (build it with BUILD_TLS=yes, or \
             use Debian's redis-server); the Redis TLS tests did NOT run\n\
             ################################################################\n"
        );
    }
    ok
}

/// One TLS-only `redis-server` on 127.0.0.1.
pub struct TlsNode {
    child: Option<Child>,
    pub port: u16,
    dir: PathBuf,
    cli: Vec<String>,
}

impl TlsNode {
    /// Start a node with `files` (asking for a client certificate with `auth_clients`),
    /// extra `args` after them; wait until it answers PING over TLS.
    pub fn start(files: &TlsFiles, name: &str, auth_clients: bool, args: &[&str]) -> Self {
        Self::start_with(files, name, auth_clients, None, args)
    }

    /// [`TlsNode::start`] with a config file of `config` first (a sentinel needs one).
    pub fn start_with(
        files: &TlsFiles,
        name: &str,
        auth_clients: bool,
        config: Option<&str>,
        args: &[&str],
    ) -> Self {
        let dir = files.dir.join(name);
        std::fs::create_dir_all(&dir).expect("create a node dir");
        for _ in 0..5 {
            let port = free_port();
            let mut cmd = Command::new("redis-server");
            if let Some(config) = config {
                let file = dir.join("node.conf");
                std::fs::write(&file, config).expect("write a node config");
                cmd.arg(&file);
            }
            let child = cmd
                .args(["--port", "0", "--tls-port", &port.to_string()])
                .args(files.server_args(auth_clients))
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
            let mut node = TlsNode {
                child: Some(child),
                port,
                dir: dir.clone(),
                cli: files.cli_args(),
            };
            if node.wait_ready() {
                return node;
            }
            node.kill();
        }
        panic!("TLS redis-server {name} did not start on 5 ports; see {dir:?}");
    }

    fn wait_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if let Some(child) = self.child.as_mut() {
                if let Ok(Some(_)) = child.try_wait() {
                    return false;
                }
            }
            if self.cli(&["PING"]).first().is_some_and(|l| l == "PONG") {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `rediss://127.0.0.1:port`.
    pub fn url(&self) -> String {
        format!("rediss://127.0.0.1:{}", self.port)
    }

    /// `redis-cli --tls … -p port args…` (with the client certificate), its stdout lines.
    pub fn cli(&self, args: &[&str]) -> Vec<String> {
        let out = Command::new("redis-cli")
            .args(&self.cli)
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

    /// SIGKILL and reap.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

impl Server for TlsNode {
    fn cli(&self, args: &[&str]) -> Vec<String> {
        TlsNode::cli(self, args)
    }

    fn log(&self) -> String {
        TlsNode::log(self)
    }

    fn url(&self) -> String {
        TlsNode::url(self)
    }
}

impl Drop for TlsNode {
    fn drop(&mut self) {
        self.kill();
    }
}

/// A 3-primary Redis Cluster over TLS only (`tls-cluster yes`: clients and the cluster
/// bus), slots spread by `redis-cli --tls --cluster create`.
pub struct TlsCluster {
    pub nodes: Vec<TlsNode>,
}

impl TlsCluster {
    pub fn start(files: &TlsFiles) -> Self {
        let nodes: Vec<TlsNode> = (0..3)
            .map(|i| {
                TlsNode::start(
                    files,
                    &format!("c{i}"),
                    false,
                    &[
                        "--cluster-enabled",
                        "yes",
                        "--cluster-config-file",
                        "nodes.conf",
                        "--cluster-node-timeout",
                        "2000",
                        "--tls-cluster",
                        "yes",
                    ],
                )
            })
            .collect();
        let addrs = nodes
            .iter()
            .map(|n| format!("127.0.0.1:{}", n.port))
            .collect();
        create_cluster(&files.cli_args(), addrs, &nodes);
        Self { nodes }
    }

    /// TOML for the `rediss://` seed list.
    pub fn urls_toml(&self) -> String {
        urls_toml(&self.nodes)
    }
}

/// The name the TLS sentinels monitor the primary under.
pub const PRIMARY_NAME: &str = "kvgate-tls-primary";

/// A primary, one replica and three sentinels, every one of them TLS only
/// (`tls-replication yes`: the replica and the sentinels reach the primary over TLS).
pub struct TlsSentinelSet {
    pub data: Vec<TlsNode>,
    pub sentinels: Vec<TlsNode>,
}

impl TlsSentinelSet {
    pub fn start(files: &TlsFiles) -> Self {
        let primary = TlsNode::start(files, "primary", false, &["--tls-replication", "yes"]);
        let port = primary.port.to_string();
        let replica = TlsNode::start(
            files,
            "replica",
            false,
            &[
                "--replicaof",
                "127.0.0.1",
                &port,
                "--tls-replication",
                "yes",
            ],
        );
        let monitor = format!(
            "sentinel monitor {PRIMARY_NAME} 127.0.0.1 {port} 2\n\
             sentinel down-after-milliseconds {PRIMARY_NAME} 1000\n\
             sentinel failover-timeout {PRIMARY_NAME} 3000\n"
        );
        let sentinels: Vec<TlsNode> = (0..3)
            .map(|i| {
                TlsNode::start_with(
                    files,
                    &format!("s{i}"),
                    false,
                    Some(&monitor),
                    &["--sentinel", "--tls-replication", "yes"],
                )
            })
            .collect();
        let set = Self {
            data: vec![primary, replica],
            sentinels,
        };
        until(
            "the TLS replica in sync and every TLS sentinel knowing it and the two others",
            || {
                let synced = set.data[1]
                    .cli(&["INFO", "replication"])
                    .iter()
                    .any(|l| l.trim() == "master_link_status:up");
                synced
                    && set.sentinels.iter().all(|s| {
                        let info = s.cli(&["SENTINEL", "MASTER", PRIMARY_NAME]);
                        let field = |name: &str| {
                            info.iter()
                                .position(|l| l.trim() == name)
                                .and_then(|i| info.get(i + 1))
                                .map(|v| v.trim().to_owned())
                        };
                        field("num-slaves").as_deref() == Some("1")
                            && field("num-other-sentinels").as_deref() == Some("2")
                    })
            },
            || {
                set.sentinels
                    .iter()
                    .chain(&set.data)
                    .map(TlsNode::log)
                    .collect::<Vec<_>>()
                    .join("\n")
            },
        );
        set
    }

    /// TOML for the `rediss://` sentinel list.
    pub fn sentinels_toml(&self) -> String {
        urls_toml(&self.sentinels)
    }
}
