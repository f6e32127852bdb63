//! kvgate's one way to Redis: everything the replicas share (tenant limits, rollout
//! decisions, prefix index streams, response owners) goes through this module, so a node,
//! a Redis Cluster and a Sentinel-managed primary are all supported by all of them.
//!
//! - [`RedisConnector`] builds a [`SharedConnection`] for the topology `[limits]` names
//!   (`connection.rs`; the Sentinel wrapper is `sentinel.rs`).
//! - [`RedisProblem`] says what an error means — an outage, or a misconfiguration such as
//!   `MOVED` from a node configured as one (`problem.rs`) — and every user counts it in
//!   `kvgate_redis_problems_total{reason,user}`.
//! - [`RedisLink`] is a connection opened on first use, for the background loops: a
//!   replica starts without Redis and connects once it answers; a loop that saw its
//!   connection fail forgets it and opens a new one next round.
//!
//! Slot safety (Redis Cluster): every multi-key operation kvgate sends — the limiter's
//! scripts — keeps its keys in one hash tag (`{prefix}:{tenant}:…`); everything else
//! (rollout decisions, prefix streams, response owners) is one key per command. No
//! command scans the keyspace.

mod connection;
mod problem;
mod sentinel;

pub use connection::{RedisConnector, SharedConnection};
pub use problem::{record, RedisProblem, Topology};
pub use sentinel::SentinelConnection;

use std::time::Duration;

use crate::config::RedisTarget;

/// A lazily opened connection to the configured Redis, every operation bounded by
/// `timeout`; its failures are counted under `user`.
pub struct RedisLink {
    connector: RedisConnector,
    conn: tokio::sync::Mutex<Option<SharedConnection>>,
    timeout: Duration,
    user: &'static str,
}

impl RedisLink {
    /// The Redis `target` names (not connected yet: see [`RedisLink::connection`]), for
    /// `user` (a metric label: `rollout`, `prefix`, `responses`).
    pub fn open(
        target: &RedisTarget,
        timeout: Duration,
        user: &'static str,
    ) -> Result<Self, redis::RedisError> {
        Ok(Self {
            connector: RedisConnector::new(target, timeout)?,
            conn: tokio::sync::Mutex::new(None),
            timeout,
            user,
        })
    }

    /// The connection, opened now if there is none (within the timeout).
    pub async fn connection(&self) -> Result<SharedConnection, String> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let conn = self
            .connector
            .connect()
            .await
            .map_err(|e| self.problem(&e))?;
        *slot = Some(conn.clone());
        Ok(conn)
    }

    /// Run one operation within the timeout.
    pub async fn bounded<T>(
        &self,
        op: impl std::future::Future<Output = redis::RedisResult<T>>,
    ) -> Result<T, String> {
        match tokio::time::timeout(self.timeout, op).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(e)) => Err(self.problem(&e)),
            Err(_) => {
                record(RedisProblem::Unreachable, self.user, &"no answer in time");
                Err(format!("no answer within {:?}", self.timeout))
            }
        }
    }

    /// Count `e` (and log it when it is a misconfiguration); its text, with the fix when
    /// there is one to name.
    fn problem(&self, e: &redis::RedisError) -> String {
        let problem = RedisProblem::of(e, self.connector.topology());
        record(problem, self.user, e);
        if problem.is_misconfiguration() {
            format!("{e} ({})", problem.fix())
        } else {
            e.to_string()
        }
    }

    /// Drop the connection (after an error): the next [`RedisLink::connection`] opens anew.
    pub async fn forget(&self) {
        self.conn.lock().await.take();
    }
}

impl std::fmt::Debug for RedisLink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisLink")
            .field("connector", &self.connector)
            .field("user", &self.user)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests;
