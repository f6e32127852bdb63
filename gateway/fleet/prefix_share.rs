//! Prefix indexes shared between replicas (issue 31, second part): several gateways in
//! front of the same engines each see only their own requests, so a conversation whose
//! turns go through different replicas would lose its affinity. With `[limits]` in Redis
//! (the store the replicas already share) and `[prefix_routing] share_with_replicas`, each
//! replica publishes what it inserts and applies what the others did — approximately, and
//! never on the request path:
//!
//! - the request path appends its inserts to the pool's [`Outbox`] (one short lock);
//! - every [`SHARE_INTERVAL`] this loop takes each outbox whole and appends it to the pool's
//!   Redis stream `{key_prefix}:prefix:{pool}` (one entry per worker and up to
//!   [`ENTRY_KEYS`] keys: the replica, the worker's `host:port`, the keys as bytes), the
//!   stream capped near [`STREAM_ENTRIES`] entries;
//! - it then reads the entries the others added since its last read (at most [`READ_COUNT`]
//!   a round) and inserts their keys into its own index for the named worker — when that
//!   worker is eligible here, dated by the entry's age, skipped when older than `max_age`;
//! - when Redis cannot be reached, each replica goes on with its own index alone (its outbox
//!   stays bounded) and catches up when Redis answers again; `kvgate_prefix_shared_ok` says
//!   which it is.
//!
//! The keys carry their cache partition already (`stack::routing::blocks`), and the hash is
//! fixed across builds, so replicas with the same salt secret agree on them.

use redis::Value;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{Fleet, Pool, PrefixIndex};
use wire::{entries, parse_id, stream_ids};

mod wire;
use crate::config::RedisTarget;
use crate::metrics;
use crate::redis_link::{RedisLink, SharedConnection};

/// How often inserts are published and the others' read.
pub const SHARE_INTERVAL: Duration = Duration::from_millis(250);
/// Keys per stream entry (8 bytes each).
pub const ENTRY_KEYS: usize = 1024;
/// Entries a pool's stream keeps (about: Redis trims in whole nodes).
pub const STREAM_ENTRIES: usize = 1000;
/// Entries read per pool and round.
pub const READ_COUNT: usize = 256;
/// One Redis operation, connecting included.
const OP_TIMEOUT: Duration = Duration::from_millis(500);

/// Why a round of sharing failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ShareError {
    /// Redis did not answer (or not in time).
    Unreachable(String),
    /// A pool's stream key holds something else than a stream (Redis's `WRONGTYPE`).
    WrongType { key: String },
}

impl std::fmt::Display for ShareError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ShareError::Unreachable(e) => write!(f, "Redis unreachable: {e}"),
            ShareError::WrongType { key } => write!(
                f,
                "the Redis key `{key}` holds another type than a stream: delete it, or set another [limits] key_prefix"
            ),
        }
    }
}

impl ShareError {
    /// A metric label.
    fn reason(&self) -> &'static str {
        match self {
            ShareError::Unreachable(_) => "unreachable",
            ShareError::WrongType { .. } => "wrong_type",
        }
    }

    /// The error of a Redis operation on `key`.
    fn of(key: &str, e: String) -> Self {
        if e.contains("WRONGTYPE") {
            ShareError::WrongType {
                key: key.to_owned(),
            }
        } else {
            ShareError::Unreachable(e)
        }
    }
}

/// The Redis side of shared prefix indexes.
pub struct PrefixShare {
    redis: RedisLink,
    prefix: String,
    replica: Arc<str>,
}

impl std::fmt::Debug for PrefixShare {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PrefixShare")
            .field("prefix", &self.prefix)
            .field("replica", &self.replica)
            .finish()
    }
}

impl PrefixShare {
    /// Streams under `prefix` in the Redis `target` names (connected on first use); this
    /// replica signs its entries `replica` and skips them when reading.
    pub fn new(
        target: &RedisTarget,
        prefix: &str,
        replica: Arc<str>,
    ) -> Result<Self, redis::RedisError> {
        Ok(Self {
            redis: RedisLink::open(target, OP_TIMEOUT, "prefix")?,
            prefix: prefix.to_owned(),
            replica,
        })
    }

    fn key(&self, pool: &str) -> String {
        format!("{}:prefix:{pool}", self.prefix)
    }

    async fn connection(&self) -> Result<SharedConnection, String> {
        self.redis.connection().await
    }

    /// One round over every pool of `fleet` with an index: publish its outbox, apply the
    /// others' entries after `cursors` (per pool name: the last entry read).
    pub async fn sync(
        &self,
        fleet: &Fleet,
        cursors: &mut HashMap<String, String>,
    ) -> Result<(), ShareError> {
        let mut conn = self.connection().await.map_err(ShareError::Unreachable)?;
        let result = self.sync_pools(&mut conn, fleet, cursors).await;
        if matches!(result, Err(ShareError::Unreachable(_))) {
            // A fresh connection next round, rather than the manager's own reconnect
            // backoff (a Redis that restarted answers at once).
            self.redis.forget().await;
        }
        result
    }

    async fn sync_pools(
        &self,
        conn: &mut SharedConnection,
        fleet: &Fleet,
        cursors: &mut HashMap<String, String>,
    ) -> Result<(), ShareError> {
        // A pool whose key is of the wrong type does not stop the others.
        let mut wrong_type = None;
        for pool in fleet.pools() {
            let Some(index) = &pool.prefix else {
                continue;
            };
            index.outbox.open(true);
            let key = self.key(&pool.name);
            let cursor = cursors
                .entry(pool.name.to_string())
                .or_insert_with(|| "0-0".to_owned());
            let shared = match self.publish(conn, &key, pool, index).await {
                Ok(()) => self.apply(conn, &key, pool, index, cursor).await,
                Err(e) => Err(e),
            };
            match shared.map_err(|e| ShareError::of(&key, e)) {
                Ok(()) => {}
                Err(e @ ShareError::WrongType { .. }) => wrong_type = Some(e),
                Err(e) => return Err(e),
            }
        }
        wrong_type.map_or(Ok(()), Err)
    }

    async fn publish(
        &self,
        conn: &mut SharedConnection,
        key: &str,
        pool: &Pool,
        index: &PrefixIndex,
    ) -> Result<(), String> {
        let taken = index.outbox.take();
        let mut by_worker: BTreeMap<usize, Vec<u8>> = BTreeMap::new();
        for (slot, keys) in &taken {
            let bytes = by_worker.entry(*slot).or_default();
            bytes.extend(keys.iter().flat_map(|k| k.to_le_bytes()));
        }
        let published = self.append(conn, key, pool, by_worker).await;
        if published.is_err() {
            // Sent again next round (what did go through is only inserted twice).
            index.outbox.put_back(taken);
        }
        published
    }

    /// Append each worker's keys to the pool's stream, [`ENTRY_KEYS`] at most per entry.
    async fn append(
        &self,
        conn: &mut SharedConnection,
        key: &str,
        pool: &Pool,
        by_worker: BTreeMap<usize, Vec<u8>>,
    ) -> Result<(), String> {
        for (slot, bytes) in by_worker {
            let Some(worker) = pool.prefix_workers().get(slot) else {
                continue;
            };
            for chunk in bytes.chunks(ENTRY_KEYS * 8) {
                let mut xadd = redis::cmd("XADD");
                xadd.arg(key)
                    .arg("MAXLEN")
                    .arg("~")
                    .arg(STREAM_ENTRIES)
                    .arg("*")
                    .arg("r")
                    .arg(&*self.replica)
                    .arg("w")
                    .arg(&worker.authority)
                    .arg("k")
                    .arg(chunk);
                let _: Value = self.redis.bounded(xadd.query_async(conn)).await?;
            }
        }
        Ok(())
    }

    async fn apply(
        &self,
        conn: &mut SharedConnection,
        key: &str,
        pool: &Pool,
        index: &PrefixIndex,
        cursor: &mut String,
    ) -> Result<(), String> {
        let mut xread = redis::cmd("XREAD");
        xread
            .arg("COUNT")
            .arg(READ_COUNT)
            .arg("STREAMS")
            .arg(key)
            .arg(&*cursor);
        let reply: Value = self.redis.bounded(xread.query_async(conn)).await?;
        let now = Instant::now();
        let now_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let (read, bad) = entries(reply);
        if bad > 0 {
            tracing::warn!(
                pool = %pool.name, stream = key, entries = bad,
                "shared prefix stream: entries that do not read as a replica's inserts, skipped"
            );
            ::metrics::counter!(metrics::PREFIX_SHARED_BAD_ENTRIES_TOTAL, "pool" => pool.name.to_string())
                .increment(bad as u64);
        }
        if read.is_empty() && bad == 0 {
            self.check_not_behind(conn, key, pool, cursor).await?;
        }
        for entry in read {
            cursor.clone_from(&entry.id);
            // A bad entry (counted above) has no keys; one of this replica's own is known.
            if entry.keys.is_empty() || entry.replica == self.replica.as_bytes() {
                continue;
            }
            let age = Duration::from_millis(now_ms.saturating_sub(entry.millis()));
            if age > index.max_age() {
                continue;
            }
            let worker = pool
                .prefix_workers()
                .iter()
                .find(|w| w.authority.as_bytes() == entry.worker.as_slice());
            let Some(worker) = worker.filter(|w| w.is_eligible()) else {
                continue;
            };
            let keys: Vec<u64> = entry
                .keys
                .chunks_exact(8)
                .map(|b| u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]]))
                .collect();
            let at = now.checked_sub(age).unwrap_or(now);
            index.insert(&keys, worker.prefix_candidate(), at);
        }
        Ok(())
    }
}

impl PrefixShare {
    /// With nothing new after `cursor`: whether the stream is behind it. A stream whose
    /// newest entry is older than what was read of it was recreated (a Redis restart
    /// without persistence, a flush) after an entry dated ahead (a replica's clock, an
    /// entry added by hand): nothing would ever be read again. The cursor then starts over
    /// (entries older than the index's `max_age` are skipped as they are read).
    async fn check_not_behind(
        &self,
        conn: &mut SharedConnection,
        key: &str,
        pool: &Pool,
        cursor: &mut String,
    ) -> Result<(), String> {
        if cursor == "0-0" {
            return Ok(());
        }
        let mut newest = redis::cmd("XREVRANGE");
        newest.arg(key).arg("+").arg("-").arg("COUNT").arg(1);
        let reply: Value = self.redis.bounded(newest.query_async(conn)).await?;
        if !matches!(reply, Value::Array(_) | Value::Nil) {
            // Not a range reply: nothing to conclude (never a reset on a misread).
            return Ok(());
        }
        let last = stream_ids(reply).into_iter().next();
        let behind = match (last.as_deref().and_then(parse_id), parse_id(cursor)) {
            (Some(last), Some(read)) => last < read,
            // An empty (or gone) stream after a read one, or a cursor that does not parse.
            (None, _) | (_, None) => true,
        };
        if behind {
            tracing::warn!(
                pool = %pool.name, stream = key, read_up_to = %cursor, newest = ?last,
                "shared prefix stream is behind what was read of it (recreated or reset): reading it again from its start"
            );
            ::metrics::counter!(metrics::PREFIX_SHARED_PROBLEMS_TOTAL, "reason" => "restarted")
                .increment(1);
            *cursor = "0-0".to_owned();
        }
        Ok(())
    }
}

/// Every [`SHARE_INTERVAL`] until `stop`: one round of [`PrefixShare::sync`] over the fleet
/// `current` gives (the config in force; `None` while `[prefix_routing]` is off or not
/// shared, when the outboxes are closed).
pub async fn share_loop(
    current: impl Fn() -> Option<Arc<Fleet>>,
    share: Arc<PrefixShare>,
    stop: impl Future<Output = ()>,
) {
    tokio::pin!(stop);
    let mut cursors: HashMap<String, String> = HashMap::new();
    // What was last logged: `None` inside for "shared", else the reason it is not.
    let mut reported: Option<Option<&'static str>> = None;
    let mut last: Option<Arc<Fleet>> = None;
    loop {
        let fleet = current();
        if let Some(old) = &last {
            if fleet.as_ref().is_none_or(|f| !Arc::ptr_eq(f, old)) {
                // Not shared any more (or a reload replaced the fleet): stop keeping inserts.
                for index in old.pools().iter().filter_map(|p| p.prefix.as_ref()) {
                    index.outbox.open(false);
                }
            }
        }
        if let Some(fleet) = &fleet {
            let result = share.sync(fleet, &mut cursors).await;
            let ok = result.is_ok();
            if let Err(e) = &result {
                ::metrics::counter!(metrics::PREFIX_SHARED_PROBLEMS_TOTAL, "reason" => e.reason())
                    .increment(1);
            }
            let state = result.as_ref().map_err(ShareError::reason).err();
            if reported != Some(state) {
                match &result {
                    Ok(()) => tracing::info!("shared prefix indexes: Redis reachable"),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "shared prefix indexes: not shared; each replica routes by its own index until this is fixed"
                    ),
                }
                reported = Some(state);
            }
            ::metrics::gauge!(metrics::PREFIX_SHARED_OK).set(if ok { 1.0 } else { 0.0 });
        }
        last = fleet;
        tokio::select! {
            () = tokio::time::sleep(SHARE_INTERVAL) => {}
            () = &mut stop => return,
        }
    }
}
