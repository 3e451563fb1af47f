//! Waiting for replicas (`APTIX_REDIS_MIN_REPLICAS`): after a turn settles and after a lease
//! is taken, `WAIT` until enough replicas hold everything written for the session so far.

use std::sync::atomic::Ordering;
use std::time::Duration;

use super::{RedisConnection, RedisOptions, RedisStore, connection, unavailable};
use crate::contract::SessionId;
use crate::store::StoreError;

/// `WAIT` for replicas (`APTIX_REDIS_MIN_REPLICAS`), on a connection of its own: `WAIT` blocks
/// the connection it is sent on until the replicas answer, and every other command of the
/// process shares the main one.
pub(super) struct Replication {
    pub(super) conn: std::sync::RwLock<RedisConnection>,
    /// When the connection was last made again (see [`Replication::renew`]).
    pub(super) renewed: tokio::sync::Mutex<std::time::Instant>,
    pub(super) url: String,
    pub(super) options: RedisOptions,
    pub(super) min: u32,
    pub(super) timeout: Duration,
}

impl Replication {
    fn conn(&self) -> RedisConnection {
        self.conn
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Makes the connection again after it failed, at most once a second. A cluster
    /// connection that mostly sends `WAIT` to a slot's primary may keep the slot map from
    /// before a failover and time out against the dead node for good (seen in
    /// `tests/it/redis_failover.rs`); a new one reads the map afresh.
    async fn renew(&self) {
        let Ok(mut renewed) = self.renewed.try_lock() else {
            return; // another caller is at it
        };
        if renewed.elapsed() < Duration::from_secs(1) {
            return;
        }
        *renewed = std::time::Instant::now();
        match connection(&self.url, &self.options).await {
            Ok(conn) => {
                *self
                    .conn
                    .write()
                    .unwrap_or_else(std::sync::PoisonError::into_inner) = conn;
                tracing::info!("made the Redis connection for replica acknowledgements again");
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot make the Redis connection for replica acknowledgements again")
            }
        }
    }
}

impl RedisStore {
    /// Writes a marker in the session's slot and `WAIT`s for `r.min` replicas: replicas that
    /// hold the marker hold every write to that primary before it (on a cluster the `WAIT`
    /// goes to the primary of the session's slot only).
    pub(super) async fn wait_for_replicas(
        &self,
        r: &Replication,
        session: &SessionId,
    ) -> Result<(), StoreError> {
        self.round_trips.fetch_add(1, Ordering::Relaxed);
        let marker = self.key("replicated", session);
        let timeout_ms = r.timeout.as_millis() as u64;
        let mut wait = redis::cmd("WAIT");
        wait.arg(r.min).arg(timeout_ms);
        let waited: Result<i64, StoreError> = async {
            Ok(match r.conn() {
                RedisConnection::Single(mut c) => {
                    let (acked,): (i64,) = redis::pipe()
                        .set_options(
                            &marker,
                            1,
                            redis::SetOptions::default()
                                .with_expiration(redis::SetExpiry::PX(5000)),
                        )
                        .ignore()
                        .add_command(wait)
                        .query_async(&mut c)
                        .await
                        .map_err(unavailable)?;
                    acked
                }
                RedisConnection::Cluster(mut c) => {
                    let _: () = redis::cmd("SET")
                        .arg(&marker)
                        .arg(1)
                        .arg("PX")
                        .arg(5000)
                        .query_async(&mut c)
                        .await
                        .map_err(unavailable)?;
                    use redis::cluster_routing::{
                        Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr,
                    };
                    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(
                        Route::with_key(&marker, SlotAddr::Master),
                    ));
                    let answer = c.route_command(wait, route).await.map_err(unavailable)?;
                    redis::from_redis_value(answer)
                        .map_err(|e| StoreError::Unavailable(format!("WAIT answered: {e}")))?
                }
            })
        }
        .await;
        let acked = match waited {
            Ok(acked) => acked,
            Err(e) => {
                r.renew().await;
                return Err(e);
            }
        };
        let acked = u32::try_from(acked).unwrap_or(0);
        if acked < r.min {
            return Err(StoreError::NotReplicated {
                session: session.to_string(),
                wanted: r.min,
                acked,
                waited: r.timeout,
            });
        }
        Ok(())
    }
}
