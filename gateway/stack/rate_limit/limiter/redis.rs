//! The shared backend: budgets in Redis, so every gateway replica enforces one limit.
//!
//! - **Atomicity.** `reserve` and `settle` are one Lua script each (EVALSHA through
//!   `redis::Script`, which reloads it after a Redis restart), so check-and-take cannot
//!   interleave between replicas.
//! - **Clock.** Scripts read `TIME` on the server: replicas with skewed clocks agree.
//! - **Keys.** `{prefix}:{tenant}:req`, `:tok` (hashes `{l: level, t: µs}`) and `:conc`
//!   (a sorted set of leases). The tenant is a hash tag (`{tenant}`) so one tenant's keys
//!   share a Redis Cluster slot, as a multi-key script requires. Bucket keys expire once they
//!   would have refilled, so idle tenants vanish.
//! - **Concurrency slots** are leases: a member per in-flight request, scored by its expiry.
//!   This replica renews the leases it holds every `lease_ttl / 3`, so long streams keep
//!   their slot; a crashed replica's leases expire after at most `lease_ttl` (the crash-leak
//!   bound). A plain counter could not tell a crashed replica's slots from live ones, and a
//!   TTL on it would be refreshed forever by a busy tenant. The trait's `release_slot` names
//!   no lease, so this replica remembers its own lease ids per tenant and releases one.
//!   After a Redis restart (data lost) renewals do not resurrect leases: the tenant may
//!   briefly get up to twice its slots, erring toward availability.
//! - **Connection.** One [`SharedConnection`] (a node's `ConnectionManager`, a cluster
//!   connection that follows MOVED/ASK, or the primary Sentinel names, re-asked after a
//!   failover: `crate::redis_link`) is shared by all requests; every operation is bounded
//!   by `op_timeout` so a dead Redis costs a request at most that long before the failure
//!   policy applies.
//! - **Errors.** A reply that means misconfiguration (MOVED from a node configured as one,
//!   READONLY, WRONGTYPE, CROSSSLOT, refused auth) is [`StoreError::Misconfigured`], which
//!   the guard answers fail-closed whatever the policy; every failure is counted in
//!   `kvgate_redis_problems_total{user="limits"}`.
//! - **Expiry.** Every key a script writes gets its expiry in the same script (PEXPIRE
//!   after HSET/ZADD), so no failover can leave a counter without one.
//! - **Redis down at start-up.** [`RedisStore::start`] does not wait for Redis: if the first
//!   connection fails, the store answers every operation with [`StoreError::NotConnected`]
//!   at once (so the failure policy decides, without a timeout per request) and keeps
//!   connecting in the background, backing off from 100 ms to 5 s, until Redis answers. A
//!   malformed URL is still an error: that is a config mistake, not an outage.

use dashmap::DashMap;
use futures_util::future::FutureExt;
use redis::Script;
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::task::JoinHandle;

use super::{Decision, Denied, LimitStore, StoreError, StoreFuture, TenantLimits};
use crate::config::RedisTarget;
use crate::redis_link::{self, RedisConnector, RedisProblem, SharedConnection};

const RESERVE: &str = concat!(
    include_str!("lua/bucket.lua"),
    include_str!("lua/reserve.lua")
);
const SETTLE: &str = concat!(
    include_str!("lua/bucket.lua"),
    include_str!("lua/settle.lua")
);
const ACQUIRE: &str = include_str!("lua/acquire.lua");
const RENEW: &str = include_str!("lua/renew.lua");

/// Tunables of [`RedisStore`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RedisOptions {
    /// Upper bound on one operation (connecting included) before it counts as a failure.
    pub op_timeout: Duration,
    /// How long a concurrency lease lives without renewal (the crash-leak bound).
    pub lease_ttl: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            // A local Redis answers in well under a millisecond; 250 ms is a failure.
            op_timeout: Duration::from_millis(250),
            lease_ttl: Duration::from_secs(60),
        }
    }
}

/// Per-tenant budgets in Redis, shared by every replica that uses the same prefix.
#[derive(Debug)]
pub struct RedisStore {
    inner: Arc<Inner>,
    renewer: JoinHandle<()>,
    /// Connecting in the background (only while Redis was unreachable from the start).
    connector: Option<JoinHandle<()>>,
}

/// Backoff of the background connector.
const CONNECT_RETRY_MIN: Duration = Duration::from_millis(100);
const CONNECT_RETRY_MAX: Duration = Duration::from_secs(5);

struct Inner {
    /// Set once the first connection succeeds (at start or by the background connector).
    conn: OnceLock<SharedConnection>,
    connector: RedisConnector,
    prefix: String,
    options: RedisOptions,
    reserve: Script,
    settle: Script,
    acquire: Script,
    renew: Script,
    /// Unique per store instance, so lease ids never collide across replicas.
    instance: String,
    next_lease: AtomicU64,
    /// The leases this instance holds, per tenant.
    leases: DashMap<Arc<str>, Vec<String>>,
}

impl std::fmt::Debug for Inner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisStore")
            .field("prefix", &self.prefix)
            .field("instance", &self.instance)
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

// === impl RedisStore ===

impl RedisStore {
    /// Connect to `url` (`redis://host:port`, `unix:///path/redis.sock`) with default options;
    /// fails if Redis does not answer within the operation timeout.
    pub async fn connect(url: &str, key_prefix: &str) -> Result<Self, StoreError> {
        Self::connect_with(url, key_prefix, RedisOptions::default()).await
    }

    /// [`RedisStore::connect`] with explicit options.
    pub async fn connect_with(
        url: &str,
        key_prefix: &str,
        options: RedisOptions,
    ) -> Result<Self, StoreError> {
        match Self::start_with(url, key_prefix, options).await? {
            (store, None) => Ok(store),
            (_, Some(first_error)) => Err(first_error),
        }
    }

    /// A store for `url` that serves whether or not Redis answers yet: the error of the
    /// first connection attempt, if it failed, comes back beside the store, which keeps
    /// connecting in the background. Fails only for a URL that cannot be used at all.
    pub async fn start(
        url: &str,
        key_prefix: &str,
    ) -> Result<(Self, Option<StoreError>), StoreError> {
        Self::start_with(url, key_prefix, RedisOptions::default()).await
    }

    /// [`RedisStore::start`] with explicit options.
    pub async fn start_with(
        url: &str,
        key_prefix: &str,
        options: RedisOptions,
    ) -> Result<(Self, Option<StoreError>), StoreError> {
        Self::start_target(&RedisTarget::node(url), key_prefix, options).await
    }

    /// [`RedisStore::start_with`] for any topology `[limits]` can name: one node, a Redis
    /// Cluster or a Sentinel-managed primary.
    pub async fn start_target(
        target: &RedisTarget,
        key_prefix: &str,
        options: RedisOptions,
    ) -> Result<(Self, Option<StoreError>), StoreError> {
        let connector = RedisConnector::new(target, options.op_timeout)?;
        let first = connector.connect().await;
        let inner = Arc::new(Inner {
            conn: OnceLock::new(),
            connector,
            prefix: key_prefix.to_owned(),
            options,
            reserve: Script::new(RESERVE),
            settle: Script::new(SETTLE),
            acquire: Script::new(ACQUIRE),
            renew: Script::new(RENEW),
            instance: instance_id(),
            next_lease: AtomicU64::new(0),
            leases: DashMap::new(),
        });
        let (connector, first_error) = match first {
            Ok(conn) => {
                let _ = inner.conn.set(conn);
                (None, None)
            }
            Err(e) => {
                let e = inner.error(e);
                let task = keep_connecting(Arc::downgrade(&inner));
                (Some(tokio::spawn(task)), Some(e))
            }
        };
        let renewer = tokio::spawn(renew_leases(Arc::downgrade(&inner)));
        let store = Self {
            inner,
            renewer,
            connector,
        };
        Ok((store, first_error))
    }

    /// Whether the store has a connection to Redis (it may still fail per operation).
    pub fn is_connected(&self) -> bool {
        self.inner.conn.get().is_some()
    }

    /// Slots this instance holds for `tenant` (for tests and diagnostics).
    pub fn local_leases(&self, tenant: &str) -> usize {
        self.inner.leases.get(tenant).map_or(0, |l| l.len())
    }

    /// Renew every lease this instance holds now (normally done by a background task).
    pub async fn renew_now(&self) -> Result<(), StoreError> {
        self.inner.renew_all().await
    }
}

impl Drop for RedisStore {
    fn drop(&mut self) {
        self.renewer.abort();
        if let Some(connector) = &self.connector {
            connector.abort();
        }
    }
}

/// Connect until Redis answers (the store was started while it did not), then hand the
/// connection to the store; ends early if the store is dropped.
async fn keep_connecting(inner: Weak<Inner>) {
    let mut delay = CONNECT_RETRY_MIN;
    let mut attempts: u64 = 1;
    loop {
        tokio::time::sleep(delay).await;
        let Some(connector) = inner.upgrade().map(|i| i.connector.clone()) else {
            return;
        };
        attempts += 1;
        match connector.connect().await {
            Ok(conn) => {
                if let Some(inner) = inner.upgrade() {
                    let _ = inner.conn.set(conn);
                    tracing::info!(attempts, "connected to Redis: limits are shared again");
                }
                return;
            }
            Err(e) => {
                tracing::debug!(error = %e, attempts, "Redis still unreachable");
                delay = (delay * 2).min(CONNECT_RETRY_MAX);
            }
        }
    }
}

/// A process-unique id: pid, start time and a per-process counter.
fn instance_id() -> String {
    static INSTANCES: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_nanos());
    let n = INSTANCES.fetch_add(1, Ordering::Relaxed);
    format!("{:x}-{nanos:x}-{n}", std::process::id())
}

fn micros(us: i64) -> Duration {
    Duration::from_micros(u64::try_from(us).unwrap_or(0))
}

/// `-1` means unlimited to the scripts.
fn arg(limit: Option<u64>) -> i64 {
    limit.map_or(-1, |l| i64::try_from(l).unwrap_or(i64::MAX))
}

async fn renew_leases(inner: Weak<Inner>) {
    let Some(every) = inner.upgrade().map(|i| i.options.lease_ttl / 3) else {
        return;
    };
    let mut tick = tokio::time::interval(every.max(Duration::from_millis(10)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tick.tick().await;
        let Some(inner) = inner.upgrade() else {
            return;
        };
        if let Err(error) = inner.renew_all().await {
            // Not the request path: the leases live on for the rest of their TTL, and the
            // next tick tries again. Health is tracked by GuardedStore on requests.
            tracing::debug!(%error, "renewing concurrency leases failed");
        }
    }
}

// === impl Inner ===

impl Inner {
    /// The connection, or `NotConnected` at once while the first one is still pending.
    fn conn(&self) -> Result<SharedConnection, StoreError> {
        self.conn.get().cloned().ok_or(StoreError::NotConnected)
    }

    /// A Redis error as the store's: a misconfiguration is told apart from an outage (the
    /// guard fails closed on it), and either is counted.
    fn error(&self, e: ::redis::RedisError) -> StoreError {
        let problem = RedisProblem::of(&e, self.connector.topology());
        redis_link::record(problem, "limits", &e);
        if problem.is_misconfiguration() {
            StoreError::Misconfigured {
                reason: problem.reason(),
                fix: problem.fix(),
                detail: e.to_string(),
            }
        } else {
            StoreError::Redis(e)
        }
    }

    /// Run one operation within `op_timeout`.
    async fn bounded<T>(
        &self,
        op: impl Future<Output = ::redis::RedisResult<T>>,
    ) -> Result<T, StoreError> {
        match tokio::time::timeout(self.options.op_timeout, op).await {
            Ok(result) => result.map_err(|e| self.error(e)),
            Err(_) => {
                redis_link::record(RedisProblem::Unreachable, "limits", &"no answer in time");
                Err(StoreError::Timeout(self.options.op_timeout))
            }
        }
    }

    fn key(&self, tenant: &str, dim: &str) -> String {
        format!("{}:{{{tenant}}}:{dim}", self.prefix)
    }

    async fn reserve(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        tokens: u64,
    ) -> Result<Decision, StoreError> {
        if limits.requests_per_minute.is_none() && limits.tokens_per_minute.is_none() {
            return Ok(Decision::allow_unlimited(limits));
        }
        let mut conn = self.conn()?;
        let mut call = self.reserve.key(self.key(tenant, "req"));
        call.key(self.key(tenant, "tok"))
            .arg(arg(limits.requests_per_minute.map(u64::from)))
            .arg(arg(limits.tokens_per_minute))
            .arg(tokens);
        let reply: Vec<i64> = self.bounded(call.invoke_async(&mut conn)).await?;
        let [denied, retry, req_left, req_reset, tok_left, tok_reset] = reply[..] else {
            return Err(StoreError::Protocol(format!(
                "reserve returned {} values",
                reply.len()
            )));
        };
        let denied_by = match denied {
            0 => None,
            1 => Some(Denied::Requests),
            2 => Some(Denied::Tokens),
            3 => Some(Denied::TokensOverBudget),
            other => return Err(StoreError::Protocol(format!("reserve denied_by {other}"))),
        };
        Ok(Decision {
            allowed: denied_by.is_none(),
            retry_after: micros(retry),
            limit_requests: limits.requests_per_minute,
            remaining_requests: u32::try_from(req_left).ok(),
            reset_requests: micros(req_reset),
            limit_tokens: limits.tokens_per_minute,
            remaining_tokens: u64::try_from(tok_left).ok(),
            reset_tokens: micros(tok_reset),
            denied_by,
        })
    }

    async fn settle(
        &self,
        tenant: &str,
        limits: &TenantLimits,
        reserved: u64,
        actual: u64,
    ) -> Result<(), StoreError> {
        let Some(tpm) = limits.tokens_per_minute.filter(|&t| t > 0) else {
            return Ok(());
        };
        if reserved == actual {
            return Ok(());
        }
        let delta = i128::from(actual) - i128::from(reserved);
        let delta = i64::try_from(delta).unwrap_or(if delta < 0 { i64::MIN } else { i64::MAX });
        let mut conn = self.conn()?;
        let mut call = self.settle.key(self.key(tenant, "tok"));
        call.arg(arg(Some(tpm))).arg(delta);
        let _: i64 = self.bounded(call.invoke_async(&mut conn)).await?;
        Ok(())
    }

    async fn acquire_slot(&self, tenant: &str, limits: &TenantLimits) -> Result<bool, StoreError> {
        let Some(max) = limits.max_concurrent else {
            return Ok(true);
        };
        let lease = format!(
            "{}:{}",
            self.instance,
            self.next_lease.fetch_add(1, Ordering::Relaxed)
        );
        let ttl_ms = u64::try_from(self.options.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        let mut conn = self.conn()?;
        let mut call = self.acquire.key(self.key(tenant, "conc"));
        call.arg(max).arg(&lease).arg(ttl_ms);
        let got: i64 = self.bounded(call.invoke_async(&mut conn)).await?;
        if got == 1 {
            // Recorded only after Redis said yes: a timed-out acquire leaves no local lease,
            // and the remote one (if it landed) expires unrenewed.
            self.leases
                .entry(Arc::from(tenant))
                .or_default()
                .push(lease);
        }
        Ok(got == 1)
    }

    async fn release_slot(&self, tenant: &str) -> Result<(), StoreError> {
        let lease = self.leases.get_mut(tenant).and_then(|mut l| l.pop());
        self.leases.remove_if(tenant, |_, l| l.is_empty());
        // No local lease: the slot was granted by the fail-open policy, not by Redis.
        let Some(lease) = lease else {
            return Ok(());
        };
        let mut conn = self.conn()?;
        let mut cmd = redis::cmd("ZREM");
        cmd.arg(self.key(tenant, "conc")).arg(&lease);
        let _: i64 = self.bounded(cmd.query_async(&mut conn)).await?;
        Ok(())
    }

    async fn renew_all(&self) -> Result<(), StoreError> {
        let held: Vec<(Arc<str>, Vec<String>)> = self
            .leases
            .iter()
            .filter(|e| !e.value().is_empty())
            .map(|e| (Arc::clone(e.key()), e.value().clone()))
            .collect();
        let ttl_ms = u64::try_from(self.options.lease_ttl.as_millis()).unwrap_or(u64::MAX);
        for (tenant, ids) in held {
            let mut conn = self.conn()?;
            let mut call = self.renew.key(self.key(&tenant, "conc"));
            call.arg(ttl_ms);
            for id in &ids {
                call.arg(id);
            }
            let _: i64 = self.bounded(call.invoke_async(&mut conn)).await?;
        }
        Ok(())
    }
}

impl LimitStore for RedisStore {
    fn reserve<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        tokens: u64,
    ) -> StoreFuture<'a, Decision> {
        self.inner.reserve(tenant, limits, tokens).boxed()
    }

    fn settle<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
        reserved: u64,
        actual: u64,
    ) -> StoreFuture<'a, ()> {
        self.inner.settle(tenant, limits, reserved, actual).boxed()
    }

    fn acquire_slot<'a>(
        &'a self,
        tenant: &'a str,
        limits: &'a TenantLimits,
    ) -> StoreFuture<'a, bool> {
        self.inner.acquire_slot(tenant, limits).boxed()
    }

    fn release_slot<'a>(&'a self, tenant: &'a str) -> StoreFuture<'a, ()> {
        self.inner.release_slot(tenant).boxed()
    }

    fn backend(&self) -> &'static str {
        "redis"
    }
}
