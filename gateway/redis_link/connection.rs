//! One connection type for every Redis topology `[limits]` can name, so the limiter,
//! rollout decisions, prefix streams and response owners speak to a node, a cluster or a
//! Sentinel-managed primary through the same calls.
//!
//! - **Node** (`redis_url`): a `ConnectionManager` (reconnects to the one address).
//! - **Cluster** (`redis_cluster`): the `redis` crate's async cluster connection: it learns
//!   the slot map from the seed nodes, routes each command by its key (a script by its
//!   first key: kvgate's scripts keep all their keys in one hash tag), follows `MOVED` and
//!   `ASK`, and refreshes the map after a cluster failover.
//! - **Sentinel** (`[limits.redis_sentinel]`): [`SentinelConnection`].
//!
//! Every operation is bounded by the caller's timeout on top of these clients' own.
//!
//! TLS: a `rediss://` address is TLS with the system's roots (the crate's default);
//! `[limits] redis_tls` replaces the roots with its CA and adds a client certificate, for
//! every TLS connection of the topology.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager, ConnectionManagerConfig};
use redis::cluster::ClusterClient;
use redis::cluster_async::ClusterConnection;
use redis::{
    AsyncConnectionConfig, ClientTlsConfig, Cmd, ErrorKind, Pipeline, RedisError, RedisFuture,
    RedisResult, TlsCertificates, Value,
};

use super::problem::Topology;
use super::sentinel::SentinelConnection;
use crate::config::{is_tls, RedisServers, RedisTarget, RedisTlsConfig};
use crate::tls::{install_default_provider, RedisPem};

/// Builds connections to the Redis `[limits]` names.
#[derive(Clone)]
pub struct RedisConnector {
    kind: Kind,
    timeout: Duration,
}

#[derive(Clone)]
enum Kind {
    Node(redis::Client, ConnectionManagerConfig),
    Cluster(ClusterClient),
    Sentinel(SentinelConnection),
}

impl RedisConnector {
    /// A connector for `target`, each connection attempt and reply bounded by `timeout`.
    /// Fails only for an address that cannot be used at all (a malformed URL) or TLS files
    /// that cannot be read.
    pub fn new(target: &RedisTarget, timeout: Duration) -> RedisResult<Self> {
        // Before any client is built: the crate's TLS takes the process-wide provider.
        install_default_provider();
        let certs = target.tls.as_ref().map(certificates).transpose()?;
        let kind = match &target.servers {
            RedisServers::Node(url) => {
                let config = ConnectionManagerConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout))
                    // Reconnects happen in the background on the next operation; retrying
                    // inside one operation would only hold it past its timeout.
                    .set_number_of_retries(1)
                    .set_min_delay(Duration::from_millis(10))
                    .set_max_delay(Duration::from_millis(100));
                let client = match &certs {
                    Some(certs) if is_tls(url) => {
                        redis::Client::build_with_tls(url.as_str(), certs.clone())?
                    }
                    _ => redis::Client::open(url.as_str())?,
                };
                Kind::Node(client, config)
            }
            RedisServers::Cluster(nodes) => {
                let mut builder = ClusterClient::builder(nodes.iter().map(String::as_str))
                    .connection_timeout(timeout)
                    .response_timeout(timeout)
                    // Redirects and a refreshed slot map take a retry each; the caller's
                    // timeout bounds the whole operation anyway.
                    .retries(3)
                    .min_retry_wait(5)
                    .max_retry_wait(50);
                // The nodes the client discovers are reached with the seeds' TLS (and
                // these files): a cluster is TLS throughout or not at all.
                if let Some(certs) = certs.filter(|_| nodes.first().is_some_and(|u| is_tls(u))) {
                    builder = builder.certs(certs);
                }
                Kind::Cluster(builder.build()?)
            }
            RedisServers::Sentinel(config) => {
                let connection = AsyncConnectionConfig::new()
                    .set_connection_timeout(Some(timeout))
                    .set_response_timeout(Some(timeout));
                Kind::Sentinel(SentinelConnection::open(config, certs, connection)?)
            }
        };
        Ok(Self { kind, timeout })
    }

    /// How Redis is reached (for classifying its errors).
    pub fn topology(&self) -> Topology {
        match self.kind {
            Kind::Node(..) => Topology::Node,
            Kind::Cluster(_) => Topology::Cluster,
            Kind::Sentinel(_) => Topology::Sentinel,
        }
    }

    /// Connect (within the timeout): a node's or the cluster's first connection, or the
    /// primary the sentinels name.
    pub async fn connect(&self) -> RedisResult<SharedConnection> {
        let connect = async {
            match &self.kind {
                Kind::Node(client, config) => {
                    ConnectionManager::new_with_config(client.clone(), config.clone())
                        .await
                        .map(SharedConnection::Node)
                }
                Kind::Cluster(client) => client
                    .get_async_connection()
                    .await
                    .map(SharedConnection::Cluster),
                Kind::Sentinel(sentinel) => {
                    sentinel.connect().await?;
                    Ok(SharedConnection::Sentinel(sentinel.clone()))
                }
            }
        };
        match tokio::time::timeout(self.timeout, connect).await {
            Ok(result) => result,
            Err(_) => Err(redis::RedisError::from(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("connecting to Redis took over {:?}", self.timeout),
            ))),
        }
    }
}

/// `redis_tls` as the crate takes it: checked PEM (a bad file fails the start, naming it).
fn certificates(tls: &RedisTlsConfig) -> RedisResult<TlsCertificates> {
    let client = tls.cert_file.as_deref().zip(tls.key_file.as_deref());
    let pem = RedisPem::read(tls.ca_file.as_deref(), client).map_err(|e| {
        RedisError::from((
            ErrorKind::InvalidClientConfig,
            "[limits] redis_tls",
            e.to_string(),
        ))
    })?;
    Ok(TlsCertificates {
        client_tls: pem.client.map(|(client_cert, client_key)| ClientTlsConfig {
            client_cert,
            client_key,
        }),
        root_cert: pem.ca,
    })
}

impl std::fmt::Debug for RedisConnector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisConnector")
            .field("topology", &self.topology())
            .field("timeout", &self.timeout)
            .finish()
    }
}

/// A connection to the configured Redis, whatever its topology (cheap to clone: each
/// variant is a handle to a shared multiplexed connection).
#[derive(Clone)]
pub enum SharedConnection {
    /// One node.
    Node(ConnectionManager),
    /// A Redis Cluster.
    Cluster(ClusterConnection),
    /// A Sentinel-managed primary.
    Sentinel(SentinelConnection),
}

impl ConnectionLike for SharedConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            SharedConnection::Node(c) => c.req_packed_command(cmd),
            SharedConnection::Cluster(c) => c.req_packed_command(cmd),
            SharedConnection::Sentinel(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            SharedConnection::Node(c) => c.req_packed_commands(pipeline, offset, count),
            SharedConnection::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
            SharedConnection::Sentinel(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            SharedConnection::Node(c) => c.get_db(),
            SharedConnection::Cluster(c) => c.get_db(),
            SharedConnection::Sentinel(c) => c.get_db(),
        }
    }
}
