//! Connecting to Redis: a self-reconnecting connection whose connection attempts and answers are
//! bounded by our own timeout, over TLS for `rediss://` URLs. The session store and the chunk
//! index both connect through here.

use std::time::Duration;

use redis::aio::ConnectionManager;

/// How long a Redis command or connection attempt may take unless configured otherwise.
pub const DEFAULT_REDIS_TIMEOUT: Duration = Duration::from_secs(3);

/// How a Redis connection is made.
#[derive(Debug, Clone)]
pub struct RedisOptions {
    /// Bounds each connection attempt and each command's answer.
    pub timeout: Duration,
    /// Trusted in addition to the system's roots for `rediss://` URLs.
    pub ca: Option<crate::tls::ExtraCa>,
}

impl Default for RedisOptions {
    fn default() -> Self {
        Self {
            timeout: DEFAULT_REDIS_TIMEOUT,
            ca: None,
        }
    }
}

/// A self-reconnecting connection whose connection attempts and answers are bounded by our
/// own setting, not left to the client library's defaults; `rediss://` URLs use TLS, trusting
/// the system's roots and the extra CA.
pub async fn connection(
    url: &str,
    options: &RedisOptions,
) -> redis::RedisResult<ConnectionManager> {
    let client = match &options.ca {
        Some(ca) if url.starts_with("rediss://") => redis::Client::build_with_tls(
            url,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(ca.with_system_roots().into_bytes()),
            },
        )?,
        _ => redis::Client::open(url)?,
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
