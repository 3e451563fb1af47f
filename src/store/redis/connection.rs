//! Connecting to Redis: a self-reconnecting connection to one server, or a connection to a Redis
//! Cluster that routes each command by its key's slot; connection attempts and answers are
//! bounded by our own timeout, over TLS for `rediss://` URLs. The session store, the limiter and
//! the chunk index all connect through here.
//!
//! On a cluster every script and every pipeline must touch one slot: the keys of one session
//! (`{<sessionId>}`), one limiter context (`{<context>}`) or one tenant's index (`{<tenant>}`)
//! carry a hash tag for that, and reads over several sessions are split per session.

use std::time::Duration;

use redis::aio::{ConnectionLike, ConnectionManager};
use redis::cluster_async::ClusterConnection;
use redis::{Cmd, Pipeline, RedisFuture, Value};

/// A Redis connection: to one server, or to a cluster.
#[derive(Clone)]
pub enum RedisConnection {
    /// One server (or a primary behind a stable address), reconnecting by itself.
    Single(ConnectionManager),
    /// A Redis Cluster: commands go to the primary of their key's slot.
    Cluster(ClusterConnection),
}

impl RedisConnection {
    /// Whether this is a cluster connection (multi-key work must stay within one slot).
    pub fn is_cluster(&self) -> bool {
        matches!(self, Self::Cluster(_))
    }
}

impl ConnectionLike for RedisConnection {
    fn req_packed_command<'a>(&'a mut self, cmd: &'a Cmd) -> RedisFuture<'a, Value> {
        match self {
            Self::Single(c) => c.req_packed_command(cmd),
            Self::Cluster(c) => c.req_packed_command(cmd),
        }
    }

    fn req_packed_commands<'a>(
        &'a mut self,
        pipeline: &'a Pipeline,
        offset: usize,
        count: usize,
    ) -> RedisFuture<'a, Vec<Value>> {
        match self {
            Self::Single(c) => c.req_packed_commands(pipeline, offset, count),
            Self::Cluster(c) => c.req_packed_commands(pipeline, offset, count),
        }
    }

    fn get_db(&self) -> i64 {
        match self {
            Self::Single(c) => c.get_db(),
            Self::Cluster(c) => c.get_db(),
        }
    }
}

/// How long a Redis command or connection attempt may take unless configured otherwise.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_secs(3);

/// How a Redis connection is made.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Bounds each connection attempt and each command's answer.
    pub timeout: Duration,
    /// Trusted in addition to the system's roots for `rediss://` URLs.
    pub ca: Option<crate::tls::ExtraCa>,
    /// The URL names nodes of a Redis Cluster (several, comma-separated: any reachable one
    /// is enough to find the rest).
    pub cluster: bool,
    /// Replicas that must hold a settled turn (and a new fencing token) before it counts
    /// (`WAIT`); 0: none, the primary's acknowledgement is enough.
    pub min_replicas: u32,
    /// How long to wait for them (kept below `timeout`, which bounds the answer).
    pub replica_timeout: Duration,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_REDIS_TIMEOUT,
            ca: None,
            cluster: false,
            min_replicas: 0,
            replica_timeout: DEFAULT_REPLICA_TIMEOUT,
        }
    }
}

/// How long a write may wait for its replicas unless configured otherwise.
pub const DEFAULT_REPLICA_TIMEOUT: Duration = Duration::from_secs(1);

/// A self-reconnecting connection whose connection attempts and answers are bounded by our
/// own setting, not left to the client library's defaults; `rediss://` URLs use TLS, trusting
/// the system's roots and the extra CA.
pub async fn connection(url: &str, options: &RedisOptions) -> redis::RedisResult<RedisConnection> {
    if options.cluster {
        return cluster_connection(url, options)
            .await
            .map(RedisConnection::Cluster);
    }
    single_connection(url, options)
        .await
        .map(RedisConnection::Single)
}

/// A connection to the cluster whose nodes `urls` (comma-separated) name, checked with a
/// `PING` routed to a node.
async fn cluster_connection(
    urls: &str,
    options: &RedisOptions,
) -> redis::RedisResult<ClusterConnection> {
    let nodes: Vec<&str> = urls
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .collect();
    let mut builder = redis::cluster::ClusterClient::builder(nodes.iter().copied())
        .tcp_settings(tcp_settings())
        .connection_timeout(options.timeout)
        .response_timeout(options.timeout);
    if let Some(ca) = options
        .ca
        .as_ref()
        .filter(|_| nodes.iter().any(|u| u.starts_with("rediss://")))
    {
        builder = builder.certs(redis::TlsCertificates {
            client_tls: None,
            root_cert: Some(ca.with_system_roots().into_bytes()),
        });
    }
    let client = builder.build()?;
    let mut conn = tokio::time::timeout(options.timeout, client.get_async_connection())
        .await
        .map_err(|_| timed_out(options.timeout))??;
    tokio::time::timeout(
        options.timeout,
        redis::cmd("PING").query_async::<()>(&mut conn),
    )
    .await
    .map_err(|_| timed_out(options.timeout))??;
    Ok(conn)
}

/// Every connection sends a command at once (`TCP_NODELAY`): with Nagle's algorithm a
/// command written while an earlier one is unanswered waits for that answer's ACK, and many
/// turns share one multiplexed connection.
fn tcp_settings() -> redis::io::tcp::TcpSettings {
    redis::io::tcp::TcpSettings::default().set_nodelay(true)
}

async fn single_connection(
    url: &str,
    options: &RedisOptions,
) -> redis::RedisResult<ConnectionManager> {
    use redis::IntoConnectionInfo as _;
    let info = url.into_connection_info()?.set_tcp_settings(tcp_settings());
    let client = match &options.ca {
        Some(ca) if url.starts_with("rediss://") => redis::Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.with_system_roots().into_bytes()),
            },
        )?,
        _ => redis::Client::open(info)?,
    };
    // One plain connection first: it fails fast with the real cause (refused, a certificate
    // that is not trusted, a wrong password), where the manager would keep retrying.
    let probe = redis::AsyncConnectionConfig::new()
        .set_connection_timeout(Some(options.timeout))
        .set_response_timeout(Some(options.timeout));
    let mut first = tokio::time::timeout(
        options.timeout,
        client.get_multiplexed_async_connection_with_config(&probe),
    )
    .await
    .map_err(|_| timed_out(options.timeout))??;
    tokio::time::timeout(
        options.timeout,
        redis::cmd("PING").query_async::<()>(&mut first),
    )
    .await
    .map_err(|_| timed_out(options.timeout))??;
    let config = redis::aio::ConnectionManagerConfig::new()
        .set_connection_timeout(Some(options.timeout))
        .set_response_timeout(Some(options.timeout));
    tokio::time::timeout(
        options.timeout,
        ConnectionManager::new_with_config(client, config),
    )
    .await
    .map_err(|_| timed_out(options.timeout))?
}

pub(super) fn timed_out(after: Duration) -> redis::RedisError {
    redis::RedisError::from(std::io::Error::new(
        std::io::ErrorKind::TimedOut,
        format!("Redis did not answer within {} ms", after.as_millis()),
    ))
}

#[cfg(test)]
mod tests {
    #[test]
    fn connections_to_redis_do_not_wait_to_send_commands() {
        assert!(super::tcp_settings().nodelay());
    }
}
