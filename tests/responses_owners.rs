//! Response owners shared through a real `redis-server`: two gateway replicas (two
//! `ResponseOwners` on one Redis) find each other's records, keyed and expiring as
//! documented, and a Redis that dies makes a lookup memory cannot settle an error, never
//! "no such response".

mod support_redis;

use std::sync::Arc;
use std::time::Duration;

use kvgate::redis_link::RedisLink;
use kvgate::stack::responses::{OwnersError, ResponseOwner, ResponseOwners};

fn replica(redis: &support_redis::RedisServer) -> ResponseOwners {
    let target = kvgate::config::RedisTarget::node(redis.url());
    let link = RedisLink::open(&target, Duration::from_millis(500), "responses").unwrap();
    ResponseOwners::new(16, Duration::from_secs(60), Some(Arc::new(link)))
}

fn owner(tenant: &str, worker: &str, tokens: u64) -> ResponseOwner {
    ResponseOwner {
        tenant: tenant.into(),
        pool: "chat".into(),
        worker: worker.into(),
        tokens,
    }
}

#[tokio::test]
async fn replicas_sharing_redis_find_each_others_response_owners() {
    let redis = support_redis::RedisServer::start();
    let (a, b) = (replica(&redis), replica(&redis));
    a.record("resp_from_a", owner("t1", "http://w1:30000", 120))
        .await
        .unwrap();
    b.record("resp_from_b", owner("t2", "http://w2:30000", 7))
        .await
        .unwrap();
    assert_eq!(
        b.lookup("resp_from_a").await.unwrap(),
        Some(owner("t1", "http://w1:30000", 120))
    );
    assert_eq!(
        a.lookup("resp_from_b").await.unwrap(),
        Some(owner("t2", "http://w2:30000", 7))
    );
    // The tenant travels with the record: another tenant sees nothing.
    assert_eq!(a.lookup_for("resp_from_b", "t1").await.unwrap(), None);
    assert_eq!(b.lookup("resp_never").await.unwrap(), None);
    // Written through with the ttl as a PX expiry.
    let pttl = redis.command(&["PTTL", "kvgate:response:resp_from_a"]);
    let ms: i64 = pttl.trim_start_matches(':').parse().unwrap();
    assert!(ms > 50_000 && ms <= 60_000, "{pttl}");
}

#[tokio::test]
async fn a_dead_redis_fails_response_owner_lookups_closed() {
    let mut redis = support_redis::RedisServer::start();
    let (a, b) = (replica(&redis), replica(&redis));
    a.record("resp_a", owner("t1", "http://w1", 1))
        .await
        .unwrap();
    assert!(b.lookup("resp_a").await.unwrap().is_some());
    redis.kill();
    // b holds nothing of its own: it cannot say "not found" without Redis.
    let looked = b.lookup("resp_a").await;
    assert!(
        matches!(looked, Err(OwnersError::Unavailable(_))),
        "{looked:?}"
    );
    let recorded = b.record("resp_b", owner("t1", "http://w2", 1)).await;
    assert!(
        matches!(recorded, Err(OwnersError::Unavailable(_))),
        "{recorded:?}"
    );
    // a still answers for what it recorded itself.
    assert!(a.lookup("resp_a").await.unwrap().is_some());
    // Back up (empty, as after a crash): the store answers again.
    redis.restart();
    assert_eq!(b.lookup("resp_c").await.unwrap(), None);
}
