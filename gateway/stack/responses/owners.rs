//! Who owns a stored response: the tenant that created it and the worker that holds it.
//!
//! Memory holds the owners this replica recorded (and Redis hands out the ones other
//! replicas recorded): at most `capacity` entries, the oldest evicted first, each gone
//! `ttl` after it was recorded. With Redis every record is written through
//! (`SET {key_prefix}:response:{id} <json> PX <ttl>`, `kvgate` by default) and a memory miss asks Redis. Redis is
//! trusted for isolation, so the store fails closed: while Redis is configured and does not
//! answer, a lookup this replica cannot settle from memory is an error (the caller answers
//! 503), never "no such response" (which would send the request to a worker chosen
//! afresh, where SGLang answers a 404 that hides the outage).
//!
//! One `Mutex` around a map and an insertion-ordered queue, not a `DashMap`: evicting the
//! oldest entry at capacity needs one order over all entries, which a sharded map does not
//! keep without a scan; every operation under the lock is O(1) amortized and the lock is
//! taken once per Responses request that names or stores a response, far from contended.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use tokio::time::Instant;

use crate::redis_link::RedisLink;

/// The longest response id accepted, in bytes: ids are client-visible (a client may set
/// `request_id`), so they are bounded before they reach memory or a Redis key.
pub const MAX_ID_BYTES: usize = 256;

/// The owner of one stored response.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResponseOwner {
    /// The tenant that created it: the only one allowed to name it.
    pub tenant: String,
    /// The pool of the worker that holds it.
    pub pool: String,
    /// The worker (its URL) that holds it: SGLang's store is per engine process.
    pub worker: String,
    /// The stored conversation's tokens when known (0: not recorded; the gateway records
    /// owners when the answer's headers arrive, before its usage).
    pub tokens: u64,
}

impl ResponseOwner {
    /// Whether `tenant` may name this response (any other tenant is told it does not exist).
    pub fn visible_to(&self, tenant: &str) -> bool {
        self.tenant == tenant
    }
}

/// Why an owner could not be recorded or looked up.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OwnersError {
    /// The id is empty, longer than [`MAX_ID_BYTES`] or holds control characters.
    #[error("response id is empty, over {MAX_ID_BYTES} bytes or holds control characters")]
    InvalidId,
    /// Redis is configured and did not answer (lookups fail closed).
    #[error("the response owner store did not answer: {0}")]
    Unavailable(String),
    /// Redis answered with a record this gateway cannot read.
    #[error("unreadable response owner record: {0}")]
    Corrupt(String),
}

/// Response id → owner, bounded and expiring, optionally shared through Redis.
pub struct ResponseOwners {
    memory: Mutex<Memory>,
    capacity: usize,
    ttl: Duration,
    redis: Option<Arc<RedisLink>>,
    /// Redis keys are `{key_prefix}:response:{id}` (`[limits] key_prefix`).
    key_prefix: String,
}

/// One recorded owner; `seq` tells it from an earlier record of the same id still queued.
struct Entry {
    owner: ResponseOwner,
    at: Instant,
    seq: u64,
}

#[derive(Default)]
struct Memory {
    entries: HashMap<String, Entry>,
    /// Ids in record order, with the `seq` they were recorded under (stale ones skipped).
    order: VecDeque<(String, u64)>,
    next_seq: u64,
}

// === impl Memory ===

impl Memory {
    fn insert(&mut self, id: &str, owner: ResponseOwner, now: Instant, capacity: usize) {
        let seq = self.next_seq;
        self.next_seq += 1;
        self.entries.insert(
            id.to_owned(),
            Entry {
                owner,
                at: now,
                seq,
            },
        );
        self.order.push_back((id.to_owned(), seq));
        while self.entries.len() > capacity {
            self.pop_oldest();
        }
        // A re-recorded id leaves a stale queue slot; bound those too.
        while self.order.len() > capacity.saturating_mul(2).max(1) {
            self.pop_oldest();
        }
    }

    /// Drop the oldest queued id (if its entry is still the one queued).
    fn pop_oldest(&mut self) {
        if let Some((id, seq)) = self.order.pop_front() {
            if self.entries.get(&id).is_some_and(|e| e.seq == seq) {
                self.entries.remove(&id);
            }
        }
    }

    /// Drop entries recorded `ttl` or more before `now` (the queue is in record order, and
    /// every entry lives the same `ttl`, so they are at its front).
    fn expire(&mut self, now: Instant, ttl: Duration) {
        while let Some((id, seq)) = self.order.front() {
            let live = match self.entries.get(id) {
                Some(e) if e.seq == *seq => now.saturating_duration_since(e.at) < ttl,
                // Stale slot: its id was re-recorded (or already evicted).
                _ => false,
            };
            if live {
                return;
            }
            self.pop_oldest();
        }
    }

    fn get(&self, id: &str, now: Instant, ttl: Duration) -> Option<ResponseOwner> {
        let entry = self.entries.get(id)?;
        (now.saturating_duration_since(entry.at) < ttl).then(|| entry.owner.clone())
    }
}

// === impl ResponseOwners ===

impl ResponseOwners {
    /// At most `capacity` owners in memory (at least one), each kept `ttl`; shared through
    /// `redis` when given.
    pub fn new(capacity: usize, ttl: Duration, redis: Option<Arc<RedisLink>>) -> Self {
        Self {
            memory: Mutex::new(Memory::default()),
            capacity: capacity.max(1),
            ttl,
            redis,
            key_prefix: "kvgate".into(),
        }
    }

    /// Name Redis keys `{prefix}:response:{id}` (deployments sharing one Redis keep
    /// apart by `[limits] key_prefix`).
    pub fn with_key_prefix(mut self, prefix: &str) -> Self {
        self.key_prefix = prefix.to_owned();
        self
    }

    fn key(&self, id: &str) -> String {
        format!("{}:response:{id}", self.key_prefix)
    }

    fn lock(&self) -> MutexGuard<'_, Memory> {
        // A panic while holding the lock leaves a cache, not invariants: keep using it.
        self.memory.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Record `owner` for `id`: in memory, then in Redis when configured. `Err` when the id
    /// is refused, or Redis did not take the record (memory holds it anyway; the caller logs
    /// and counts it: other replicas will not find this response).
    pub async fn record(&self, id: &str, owner: ResponseOwner) -> Result<(), OwnersError> {
        check_id(id)?;
        let json = self.redis.as_ref().map(|_| serde_json::to_string(&owner));
        {
            let now = Instant::now();
            let mut memory = self.lock();
            memory.expire(now, self.ttl);
            memory.insert(id, owner, now, self.capacity);
        }
        let (Some(redis), Some(json)) = (&self.redis, json) else {
            return Ok(());
        };
        let json = json.map_err(|e| OwnersError::Corrupt(e.to_string()))?;
        let ttl_ms = u64::try_from(self.ttl.as_millis())
            .unwrap_or(u64::MAX)
            .max(1);
        let result = async {
            let mut conn = redis.connection().await?;
            let mut set = redis::cmd("SET");
            set.arg(self.key(id)).arg(json).arg("PX").arg(ttl_ms);
            redis.bounded(set.query_async::<()>(&mut conn)).await
        }
        .await;
        self.settle(redis, result).await
    }

    /// The owner of `id`: from memory, else from Redis when configured. `Ok(None)`: no
    /// owner is known (a response never stored, or expired). `Err` when the id is refused,
    /// or the answer depends on a Redis that did not give it.
    pub async fn lookup(&self, id: &str) -> Result<Option<ResponseOwner>, OwnersError> {
        check_id(id)?;
        if let Some(owner) = self.lock().get(id, Instant::now(), self.ttl) {
            return Ok(Some(owner));
        }
        let Some(redis) = &self.redis else {
            return Ok(None);
        };
        let result = async {
            let mut conn = redis.connection().await?;
            let mut get = redis::cmd("GET");
            get.arg(self.key(id));
            redis
                .bounded(get.query_async::<Option<String>>(&mut conn))
                .await
        }
        .await;
        // Not cached in memory: Redis's own expiry stays the one clock for shared records.
        match self.settle(redis, result).await? {
            None => Ok(None),
            Some(json) => serde_json::from_str(&json)
                .map(Some)
                .map_err(|e| OwnersError::Corrupt(e.to_string())),
        }
    }

    /// The owner of `id` as `tenant` may see it: another tenant's response is `None`, as if
    /// it did not exist.
    pub async fn lookup_for(
        &self,
        id: &str,
        tenant: &str,
    ) -> Result<Option<ResponseOwner>, OwnersError> {
        Ok(self.lookup(id).await?.filter(|o| o.visible_to(tenant)))
    }

    /// A Redis result as the store's; a failed connection is forgotten so the next call
    /// opens a fresh one.
    async fn settle<T>(
        &self,
        redis: &RedisLink,
        result: Result<T, String>,
    ) -> Result<T, OwnersError> {
        match result {
            Ok(v) => Ok(v),
            Err(e) => {
                redis.forget().await;
                Err(OwnersError::Unavailable(e))
            }
        }
    }
}

impl std::fmt::Debug for ResponseOwners {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResponseOwners")
            .field("capacity", &self.capacity)
            .field("ttl", &self.ttl)
            .field("shared", &self.redis.is_some())
            .finish_non_exhaustive()
    }
}

/// Ids reach memory and Redis keys only when non-empty, bounded and free of control
/// characters (which would also corrupt logs).
fn check_id(id: &str) -> Result<(), OwnersError> {
    if id.is_empty() || id.len() > MAX_ID_BYTES || id.chars().any(char::is_control) {
        return Err(OwnersError::InvalidId);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner(tenant: &str, worker: &str) -> ResponseOwner {
        ResponseOwner {
            tenant: tenant.into(),
            pool: "p".into(),
            worker: worker.into(),
            tokens: 42,
        }
    }

    #[tokio::test]
    async fn responses_owner_is_recorded_with_its_tenant() {
        let owners = ResponseOwners::new(8, Duration::from_secs(60), None);
        owners
            .record("resp_a", owner("t1", "http://w1"))
            .await
            .unwrap();
        let found = owners.lookup("resp_a").await.unwrap().unwrap();
        assert_eq!(found, owner("t1", "http://w1"));
        assert!(owners.lookup_for("resp_a", "t1").await.unwrap().is_some());
        // Another tenant is told nothing exists.
        assert_eq!(owners.lookup_for("resp_a", "t2").await.unwrap(), None);
        assert_eq!(owners.lookup("resp_b").await.unwrap(), None);
    }

    #[tokio::test]
    async fn responses_owners_evict_the_oldest_at_capacity() {
        let owners = ResponseOwners::new(2, Duration::from_secs(60), None);
        for id in ["resp_1", "resp_2"] {
            owners.record(id, owner("t", id)).await.unwrap();
        }
        // Re-recording resp_1 makes resp_2 the oldest.
        owners.record("resp_1", owner("t", "again")).await.unwrap();
        owners.record("resp_3", owner("t", "w3")).await.unwrap();
        assert_eq!(owners.lookup("resp_2").await.unwrap(), None);
        assert_eq!(
            owners.lookup("resp_1").await.unwrap().map(|o| o.worker),
            Some("again".into())
        );
        assert!(owners.lookup("resp_3").await.unwrap().is_some());
        assert!(owners.lock().entries.len() <= 2);
        // Churn on one id keeps the queue bounded too.
        for _ in 0..20 {
            owners.record("resp_3", owner("t", "w3")).await.unwrap();
        }
        assert!(owners.lock().order.len() <= 4);
        assert!(owners.lookup("resp_3").await.unwrap().is_some());
    }

    #[tokio::test(start_paused = true)]
    async fn responses_owners_expire_after_ttl() {
        let owners = ResponseOwners::new(8, Duration::from_secs(10), None);
        owners.record("resp_old", owner("t", "w")).await.unwrap();
        tokio::time::advance(Duration::from_secs(6)).await;
        owners.record("resp_new", owner("t", "w")).await.unwrap();
        tokio::time::advance(Duration::from_secs(5)).await;
        assert_eq!(owners.lookup("resp_old").await.unwrap(), None);
        assert!(owners.lookup("resp_new").await.unwrap().is_some());
        // The next record drops what expired.
        owners.record("resp_next", owner("t", "w")).await.unwrap();
        assert!(!owners.lock().entries.contains_key("resp_old"));
    }

    #[tokio::test]
    async fn responses_owners_refuse_unbounded_ids() {
        let owners = ResponseOwners::new(8, Duration::from_secs(60), None);
        let long = "r".repeat(MAX_ID_BYTES + 1);
        for id in ["", long.as_str(), "resp_\n1"] {
            assert_eq!(
                owners.record(id, owner("t", "w")).await,
                Err(OwnersError::InvalidId)
            );
            assert_eq!(owners.lookup(id).await, Err(OwnersError::InvalidId));
        }
        let longest = "r".repeat(MAX_ID_BYTES);
        owners.record(&longest, owner("t", "w")).await.unwrap();
        assert!(owners.lookup(&longest).await.unwrap().is_some());
    }

    #[tokio::test]
    async fn responses_owners_fail_closed_when_redis_does_not_answer() {
        let dir = std::env::temp_dir().join(format!("kvgate-no-redis-{}", std::process::id()));
        let url = format!("unix://{}/absent.sock", dir.display());
        let target = crate::config::RedisTarget::node(url);
        let link =
            Arc::new(RedisLink::open(&target, Duration::from_millis(200), "responses").unwrap());
        let owners = ResponseOwners::new(8, Duration::from_secs(60), Some(link));
        let recorded = owners.record("resp_a", owner("t", "w")).await;
        assert!(
            matches!(recorded, Err(OwnersError::Unavailable(_))),
            "{recorded:?}"
        );
        // What memory holds is still answered; what it does not is an error, not "none".
        assert!(owners.lookup("resp_a").await.unwrap().is_some());
        let missing = owners.lookup("resp_b").await;
        assert!(
            matches!(missing, Err(OwnersError::Unavailable(_))),
            "{missing:?}"
        );
    }
}
