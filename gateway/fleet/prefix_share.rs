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

use redis::aio::ConnectionManager;
use redis::Value;
use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use super::{Fleet, Pool, PrefixIndex};
use crate::metrics;
use crate::redis_link::RedisLink;

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
    /// Streams under `prefix` in the Redis at `url` (connected on first use); this replica
    /// signs its entries `replica` and skips them when reading.
    pub fn new(url: &str, prefix: &str, replica: Arc<str>) -> Result<Self, redis::RedisError> {
        Ok(Self {
            redis: RedisLink::open(url, OP_TIMEOUT)?,
            prefix: prefix.to_owned(),
            replica,
        })
    }

    fn key(&self, pool: &str) -> String {
        format!("{}:prefix:{pool}", self.prefix)
    }

    async fn connection(&self) -> Result<ConnectionManager, String> {
        self.redis.connection().await
    }

    /// One round over every pool of `fleet` with an index: publish its outbox, apply the
    /// others' entries after `cursors` (per pool name: the last entry read).
    pub async fn sync(
        &self,
        fleet: &Fleet,
        cursors: &mut HashMap<String, String>,
    ) -> Result<(), String> {
        let mut conn = self.connection().await?;
        let result = self.sync_pools(&mut conn, fleet, cursors).await;
        if result.is_err() {
            // A fresh connection next round, rather than the manager's own reconnect
            // backoff (a Redis that restarted answers at once).
            self.redis.forget().await;
        }
        result
    }

    async fn sync_pools(
        &self,
        conn: &mut ConnectionManager,
        fleet: &Fleet,
        cursors: &mut HashMap<String, String>,
    ) -> Result<(), String> {
        for pool in fleet.pools() {
            let Some(index) = &pool.prefix else {
                continue;
            };
            index.outbox.open(true);
            let key = self.key(&pool.name);
            self.publish(conn, &key, pool, index).await?;
            let cursor = cursors
                .entry(pool.name.to_string())
                .or_insert_with(|| "0-0".to_owned());
            self.apply(conn, &key, pool, index, cursor).await?;
        }
        Ok(())
    }

    async fn publish(
        &self,
        conn: &mut ConnectionManager,
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
        conn: &mut ConnectionManager,
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
        conn: &mut ConnectionManager,
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
        for entry in entries(reply) {
            cursor.clone_from(&entry.id);
            if entry.replica == self.replica.as_bytes() {
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

/// One stream entry as another replica wrote it.
#[derive(Debug, Default)]
struct Entry {
    id: String,
    replica: Vec<u8>,
    worker: Vec<u8>,
    keys: Vec<u8>,
}

impl Entry {
    /// When Redis added it (the id's milliseconds).
    fn millis(&self) -> u64 {
        self.id
            .split('-')
            .next()
            .and_then(|ms| ms.parse().ok())
            .unwrap_or(0)
    }
}

/// The entries of an `XREAD` reply of one stream (RESP2 arrays or RESP3 maps); whatever
/// does not read as one is left out.
fn entries(reply: Value) -> Vec<Entry> {
    let streams: Vec<Value> = match reply {
        Value::Array(streams) => streams
            .into_iter()
            .filter_map(|s| match s {
                Value::Array(mut pair) if pair.len() == 2 => pair.pop(),
                _ => None,
            })
            .collect(),
        Value::Map(streams) => streams.into_iter().map(|(_, v)| v).collect(),
        _ => Vec::new(),
    };
    let bytes = |v: Value| match v {
        Value::BulkString(b) => Some(b),
        Value::SimpleString(s) => Some(s.into_bytes()),
        _ => None,
    };
    let mut out = Vec::new();
    for stream in streams {
        let Value::Array(list) = stream else {
            continue;
        };
        for item in list {
            let Value::Array(mut pair) = item else {
                continue;
            };
            let (Some(Value::Array(fields)), Some(id)) = (pair.pop(), pair.pop()) else {
                continue;
            };
            let Some(id) = bytes(id).and_then(|b| String::from_utf8(b).ok()) else {
                continue;
            };
            let mut entry = Entry {
                id,
                ..Entry::default()
            };
            let mut fields = fields.into_iter();
            while let (Some(name), Some(value)) = (fields.next(), fields.next()) {
                let (Some(name), Some(value)) = (bytes(name), bytes(value)) else {
                    continue;
                };
                match name.as_slice() {
                    b"r" => entry.replica = value,
                    b"w" => entry.worker = value,
                    b"k" => entry.keys = value,
                    _ => {}
                }
            }
            out.push(entry);
        }
    }
    out
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
    let mut reachable: Option<bool> = None;
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
            if reachable != Some(ok) {
                match &result {
                    Ok(()) => tracing::info!("shared prefix indexes: Redis reachable"),
                    Err(e) => tracing::warn!(
                        error = %e,
                        "shared prefix indexes: Redis unreachable; each replica routes by its own index until it answers"
                    ),
                }
                reachable = Some(ok);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn xread_replies_are_read_as_entries_and_anything_else_left_out() {
        let bulk = |s: &[u8]| Value::BulkString(s.to_vec());
        let entry = |id: &str, r: &[u8]| {
            Value::Array(vec![
                bulk(id.as_bytes()),
                Value::Array(vec![
                    bulk(b"r"),
                    bulk(r),
                    bulk(b"w"),
                    bulk(b"10.0.0.1:30000"),
                    bulk(b"k"),
                    bulk(&[1, 0, 0, 0, 0, 0, 0, 0]),
                    bulk(b"odd"),
                ]),
            ])
        };
        let reply = Value::Array(vec![Value::Array(vec![
            bulk(b"kvgate:prefix:p"),
            Value::Array(vec![
                entry("1700000000000-0", b"a"),
                Value::Int(3),
                entry("1700000000001-4", b"b"),
            ]),
        ])]);
        let read = entries(reply);
        assert_eq!(read.len(), 2);
        assert_eq!(read[0].id, "1700000000000-0");
        assert_eq!(read[0].millis(), 1_700_000_000_000);
        assert_eq!(read[1].replica, b"b");
        assert_eq!(read[1].worker, b"10.0.0.1:30000");
        assert_eq!(read[1].keys.len(), 8);
        assert!(entries(Value::Nil).is_empty());
        assert!(entries(Value::Okay).is_empty());
    }
}
