//! What went wrong with Redis, in words an operator can act on.
//!
//! A reply kvgate does not expect is not "Redis lost": `MOVED` from a node configured as
//! `redis_url` means the node belongs to a cluster, `READONLY` that it is a replica,
//! `WRONGTYPE` that another program owns the key. Those are misconfigurations: they do not
//! heal by waiting, so the limiter refuses (fail closed, whatever `failure_policy` says)
//! rather than serving every tenant unlimited forever, and each one is logged as an error
//! naming the fix (at most once a minute per reason) and counted in
//! `kvgate_redis_problems_total{reason}`. Outages (connection refused or lost, no answer in
//! time, a cluster or failover in progress) are `unreachable` and the failure policy
//! applies.
//!
//! A TLS handshake that fails on a certificate (a CA kvgate does not trust, a name that does
//! not match, an expired certificate, a client certificate the server wants and did not
//! get or did not accept, `rediss://` to a port without TLS) is `tls`: a misconfiguration
//! like refused auth. Mostly met connecting, before a store has a connection, where the
//! failure policy decides as for any Redis not answering at start. A server that only
//! drops the connection cannot be told from an outage and stays `unreachable`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

use redis::{ErrorKind, RedisError, ServerErrorKind};

use crate::metrics::REDIS_PROBLEMS_TOTAL;

/// How kvgate was told to reach Redis (`[limits]`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Topology {
    /// `redis_url`: one node.
    Node,
    /// `redis_cluster`: a Redis Cluster (the client follows MOVED/ASK).
    Cluster,
    /// `[limits.redis_sentinel]`: the primary the sentinels name (asked again on READONLY
    /// and on a lost connection).
    Sentinel,
}

/// One kind of Redis failure (a metric label, bounded).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisProblem {
    /// No answer: refused, lost, timed out, or a cluster or failover in progress.
    Unreachable,
    /// `MOVED`/`ASK` where kvgate does not follow them (not configured as a cluster).
    Moved,
    /// `READONLY`: the node is a replica (and kvgate was not told how to find the primary).
    ReadOnly,
    /// `WRONGTYPE`: a key of kvgate's holds another type.
    WrongType,
    /// `CROSSSLOT`: one operation's keys in different cluster slots.
    CrossSlot,
    /// Authentication refused, or the user lacks a permission.
    Auth,
    /// The TLS handshake failed on a certificate (or TLS met a server without it).
    Tls,
    /// Any other error reply (a script error, an unexpected reply).
    Other,
}

impl RedisProblem {
    /// The problem an error shows, given how Redis is configured.
    pub fn of(error: &RedisError, topology: Topology) -> Self {
        if is_tls_failure(error) {
            return RedisProblem::Tls;
        }
        match error.kind() {
            ErrorKind::Server(ServerErrorKind::Moved | ServerErrorKind::Ask) => {
                // The cluster client follows redirects itself; one that still surfaces is a
                // slot migration it gave up on (retries spent): an outage, not a mistake.
                if topology == Topology::Cluster {
                    RedisProblem::Unreachable
                } else {
                    RedisProblem::Moved
                }
            }
            ErrorKind::Server(ServerErrorKind::ReadOnly) => {
                // Sentinel and cluster clients go to the new primary on their own.
                if topology == Topology::Node {
                    RedisProblem::ReadOnly
                } else {
                    RedisProblem::Unreachable
                }
            }
            ErrorKind::Server(ServerErrorKind::CrossSlot) => RedisProblem::CrossSlot,
            ErrorKind::Server(ServerErrorKind::NoPerm) | ErrorKind::AuthenticationFailed => {
                RedisProblem::Auth
            }
            ErrorKind::Server(
                ServerErrorKind::ClusterDown
                | ServerErrorKind::TryAgain
                | ServerErrorKind::MasterDown
                | ServerErrorKind::BusyLoading,
            )
            | ErrorKind::Io
            | ErrorKind::ClusterConnectionNotFound
            | ErrorKind::MasterNameNotFoundBySentinel
            | ErrorKind::NoValidReplicasFoundBySentinel => RedisProblem::Unreachable,
            _ => match error.code() {
                Some("WRONGTYPE") => RedisProblem::WrongType,
                Some("NOAUTH" | "WRONGPASS") => RedisProblem::Auth,
                _ if error.is_io_error() || error.is_timeout() => RedisProblem::Unreachable,
                _ => RedisProblem::Other,
            },
        }
    }

    /// The metric label.
    pub fn reason(self) -> &'static str {
        match self {
            RedisProblem::Unreachable => "unreachable",
            RedisProblem::Moved => "moved",
            RedisProblem::ReadOnly => "readonly",
            RedisProblem::WrongType => "wrongtype",
            RedisProblem::CrossSlot => "crossslot",
            RedisProblem::Auth => "auth",
            RedisProblem::Tls => "tls",
            RedisProblem::Other => "other",
        }
    }

    /// Whether waiting cannot fix it: the configuration (kvgate's or Redis's) must change.
    pub fn is_misconfiguration(self) -> bool {
        !matches!(self, RedisProblem::Unreachable | RedisProblem::Other)
    }

    /// What to do about it.
    pub fn fix(self) -> &'static str {
        match self {
            RedisProblem::Unreachable => "Redis does not answer; the failure policy applies until it does",
            RedisProblem::Moved => "this is a Redis Cluster: configure redis cluster mode ([limits] redis_cluster = [\"redis://node:port\", ...]) instead of redis_url",
            RedisProblem::ReadOnly => "this node is a replica: point [limits] redis_url at the primary, or configure [limits.redis_sentinel] so kvgate follows failovers",
            RedisProblem::WrongType => "a key under [limits] key_prefix holds another type: another program uses this prefix; set another key_prefix or delete the key",
            RedisProblem::CrossSlot => "one operation's keys fall in different cluster slots: [limits] key_prefix must not contain `{` or `}`",
            RedisProblem::Auth => "Redis refused the credentials or a command: check the user and password in the Redis configuration of [limits]",
            RedisProblem::Tls => "the TLS handshake with Redis failed: check that [limits] redis_tls.ca_file is the CA that signed the Redis certificates and that they name the address kvgate connects to, give redis_tls cert_file and key_file where Redis has tls-auth-clients yes, and use rediss:// only for TLS ports",
            RedisProblem::Other => "Redis answered with an error kvgate did not expect",
        }
    }
}

/// Count a problem met by `user` (`limits`, `rollout`, `prefix`, `responses`); a
/// misconfiguration is also logged as an error naming the fix, at most once a minute per
/// reason (it repeats on every operation until fixed).
pub fn record(problem: RedisProblem, user: &'static str, error: &dyn std::fmt::Display) {
    ::metrics::counter!(REDIS_PROBLEMS_TOTAL, "reason" => problem.reason(), "user" => user)
        .increment(1);
    if !problem.is_misconfiguration() {
        return;
    }
    static LAST_LOGGED: [AtomicU64; 8] = [const { AtomicU64::new(0) }; 8];
    let slot = &LAST_LOGGED[problem as usize];
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    let last = slot.load(Ordering::Relaxed);
    if (last == 0 || now.saturating_sub(last) >= 60)
        && slot
            .compare_exchange(last, now.max(1), Ordering::AcqRel, Ordering::Relaxed)
            .is_ok()
    {
        tracing::error!(
            reason = problem.reason(),
            user,
            %error,
            fix = problem.fix(),
            "Redis is misconfigured for kvgate"
        );
    }
}

/// Whether `error` is a failed TLS handshake: a rustls error under the crate's I/O error
/// (typed), or its text where a client re-wrapped it as a message (the cluster client
/// reports its initial connections as one string).
fn is_tls_failure(error: &RedisError) -> bool {
    use std::error::Error as _;
    let rustls = error
        .source()
        .and_then(|s| s.downcast_ref::<std::sync::Arc<dyn std::error::Error + Send + Sync>>())
        .and_then(|inner| inner.downcast_ref::<std::io::Error>())
        .and_then(|io| io.get_ref())
        .is_some_and(|inner| inner.is::<rustls::Error>());
    if rustls {
        return true;
    }
    // rustls's own wording (`rustls::Error`'s Display), for errors that reach here as text.
    let text = error.to_string();
    [
        "invalid peer certificate",
        "received fatal alert",
        "peer sent no certificates",
        "received corrupt message",
    ]
    .iter()
    .any(|marker| text.contains(marker))
}
