//! One Redis connection opened on first use, for the background loops that share state
//! across replicas (rollout decisions, prefix indexes): a replica starts without Redis and
//! connects once it answers; a loop that saw its connection fail forgets it and opens a new
//! one next round.

use redis::aio::{ConnectionManager, ConnectionManagerConfig};
use std::time::Duration;

/// A lazily opened connection to one Redis, every operation bounded by `timeout`.
pub struct RedisLink {
    client: redis::Client,
    conn: tokio::sync::Mutex<Option<ConnectionManager>>,
    timeout: Duration,
}

impl RedisLink {
    /// The Redis at `url` (not connected yet: see [`RedisLink::connection`]).
    pub fn open(url: &str, timeout: Duration) -> Result<Self, redis::RedisError> {
        Ok(Self {
            client: redis::Client::open(url)?,
            conn: tokio::sync::Mutex::new(None),
            timeout,
        })
    }

    /// The connection, opened now if there is none (within the timeout).
    pub async fn connection(&self) -> Result<ConnectionManager, String> {
        let mut slot = self.conn.lock().await;
        if let Some(c) = slot.as_ref() {
            return Ok(c.clone());
        }
        let config = ConnectionManagerConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout))
            .set_number_of_retries(1);
        let conn = tokio::time::timeout(
            self.timeout,
            ConnectionManager::new_with_config(self.client.clone(), config),
        )
        .await
        .map_err(|_| "connecting timed out".to_owned())?
        .map_err(|e| e.to_string())?;
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
            Ok(Err(e)) => Err(e.to_string()),
            Err(_) => Err(format!("no answer within {:?}", self.timeout)),
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
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}
