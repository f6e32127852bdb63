//! A connection to the primary that Redis Sentinel names, which finds the new primary after
//! a failover.
//!
//! The `redis` crate asks the sentinels for the primary (and checks with `ROLE` that it is
//! one) but hands back a plain connection that stays on that node forever, and its
//! `ConnectionManager` reconnects only to a fixed address. This wrapper keeps one
//! multiplexed connection to the current primary and forgets it when an operation shows
//! the node is no longer the primary or no longer there — `READONLY` (it was demoted), a
//! lost or refused connection, no answer in time — so the next operation asks the sentinels
//! again. The failing operation itself is not retried: it may have run (a lost reply), and
//! running a reservation twice would take twice; its caller's failure policy decides.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use redis::aio::{ConnectionLike, MultiplexedConnection};
use redis::sentinel::{SentinelClient, SentinelClientBuilder, SentinelServerType};
use redis::{
    AsyncConnectionConfig, Cmd, ErrorKind, IntoConnectionInfo, Pipeline, RedisError, RedisFuture,
    RedisResult, ServerErrorKind, TlsCertificates, TlsMode, Value,
};

use crate::config::{is_tls, SentinelConfig};

/// The primary of a Sentinel set, re-resolved after a failover (cheap to clone: shared).
#[derive(Clone)]
pub struct SentinelConnection {
    shared: Arc<Shared>,
}

struct Shared {
    /// Asks the sentinels; one lookup at a time (the others wait for its answer).
    client: tokio::sync::Mutex<SentinelClient>,
    /// The connection to the primary found last, with the generation it was found in.
    current: Mutex<Option<(u64, MultiplexedConnection)>>,
    generation: AtomicU64,
    config: AsyncConnectionConfig,
    db: i64,
}

impl SentinelConnection {
    /// A client for the primary `config` names (nothing is connected yet); `certs` (the
    /// CA and client certificate of `[limits] redis_tls`) serve the TLS connections: to
    /// `rediss://` sentinels and, with `primary_tls`, to the primary.
    ///
    /// Built with the crate's builder, the only way to hand certificates to the primary's
    /// connection; it sends one set of sentinel credentials to every sentinel, taken from
    /// the first URL (config load checks that they all carry the same).
    pub fn open(
        config: &SentinelConfig,
        certs: Option<TlsCertificates>,
        connection: AsyncConnectionConfig,
    ) -> RedisResult<Self> {
        let sentinels = config
            .sentinels
            .iter()
            .map(|url| url.as_str().into_connection_info())
            .collect::<RedisResult<Vec<_>>>()?;
        let mut builder = SentinelClientBuilder::new(
            sentinels.iter().map(|s| s.addr().clone()),
            &config.primary_name,
            SentinelServerType::Master,
        )?
        .set_client_to_redis_db(config.db);
        if let Some(user) = &config.username {
            builder = builder.set_client_to_redis_username(user);
        }
        if let Some(password) = &config.password {
            builder = builder.set_client_to_redis_password(password);
        }
        if let Some(first) = sentinels.first().map(|s| s.redis_settings()) {
            if let Some(user) = first.username() {
                builder = builder.set_client_to_sentinel_username(user);
            }
            if let Some(password) = first.password() {
                builder = builder.set_client_to_sentinel_password(password);
            }
        }
        if config.primary_tls {
            // Secure: the primary's certificate must chain to the CA and name the address
            // the sentinels announce.
            builder = builder.set_client_to_redis_tls_mode(TlsMode::Secure);
            if let Some(certs) = &certs {
                builder = builder.set_client_to_redis_certificates(certs.clone());
            }
        }
        if let Some(certs) = certs.filter(|_| config.sentinels.first().is_some_and(|u| is_tls(u))) {
            builder = builder.set_client_to_sentinel_certificates(certs);
        }
        let client = builder.build()?;
        Ok(Self {
            shared: Arc::new(Shared {
                client: tokio::sync::Mutex::new(client),
                current: Mutex::new(None),
                generation: AtomicU64::new(0),
                config: connection,
                db: config.db,
            }),
        })
    }

    /// Ask the sentinels for the primary now, and connect to it (a start that checks
    /// Redis answers).
    pub async fn connect(&self) -> RedisResult<()> {
        self.current().await.map(|_| ())
    }

    fn cached(&self) -> Option<(u64, MultiplexedConnection)> {
        // A panic under this lock leaves at worst a stale connection, which fails over.
        self.shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The primary's connection, found through the sentinels when there is none.
    async fn current(&self) -> RedisResult<(u64, MultiplexedConnection)> {
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let mut client = self.shared.client.lock().await;
        // Another operation may have found it while this one waited.
        if let Some(c) = self.cached() {
            return Ok(c);
        }
        let conn = client
            .get_async_connection_with_config(&self.shared.config)
            .await?;
        let generation = self.shared.generation.fetch_add(1, Ordering::AcqRel) + 1;
        *self
            .shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((generation, conn.clone()));
        tracing::debug!(generation, "connected to the primary the sentinels name");
        Ok((generation, conn))
    }

    /// After `error` on the connection of `generation`: forget it if the node may no longer
    /// be the primary (a later generation is kept: someone found the new one already).
    fn after_error(&self, generation: u64, error: &RedisError) {
        let stale = error.kind() == ErrorKind::Server(ServerErrorKind::ReadOnly)
            || error.is_io_error()
            || error.is_connection_dropped()
            || error.is_connection_refusal()
            || error.is_timeout()
            || error.is_unrecoverable_error();
        if !stale {
            return;
        }
        let mut current = self
            .shared
            .current
            .lock()
            .unwrap_or_else(|p| p.into_inner());
        if current.as_ref().is_some_and(|(g, _)| *g == generation) {
            *current = None;
            tracing::info!(%error, "the Redis primary failed or was demoted: asking the sentinels again");
        }
    }
}

impl ConnectionLike for SentinelConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let result = conn.req_packed_command(cmd).await;
            if let Err(e) = &result {
                self.after_error(generation, e);
            }
            result
        })
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        Box::pin(async move {
            let (generation, mut conn) = self.current().await?;
            let result = conn.req_packed_commands(pipeline, offset, count).await;
            if let Err(e) = &result {
                self.after_error(generation, e);
            }
            result
        })
    }

    fn get_db(&self) -> i64 {
        self.shared.db
    }
}
