//! Reads over many sessions: one pipelined request per few hundred keys on one server; on a
//! cluster, whose pipelines may not span slots, one request per key, sent together.

use redis::FromRedisValue;

use super::codec::decode;
use super::{RedisStore, unavailable};
use crate::contract::{SessionId, TurnId};
use crate::store::{StoreError, TurnRecord};

/// Keys per pipelined request.
const CHUNK: usize = 500;

impl RedisStore {
    /// [`crate::store::SessionStore::get_turns`]: one pipeline of GETs per 500 turns (on a
    /// cluster, one GET per turn, sent together). Tool ledgers are not merged in: callers of
    /// this read statuses and results, not a turn's internals.
    pub(super) async fn turn_records(
        &self,
        ids: &[(SessionId, TurnId)],
    ) -> Result<Vec<Option<TurnRecord>>, StoreError> {
        let keys: Vec<String> = ids
            .iter()
            .map(|(sid, tid)| self.turn_key("turn", sid, tid))
            .collect();
        let raws: Vec<Option<String>> = self.read_many("GET", &keys).await?;
        keys.iter()
            .zip(raws)
            .map(|(key, raw)| decode(key, raw))
            .collect()
    }

    /// `command key` (a one-key read: `GET`, `EXISTS`) for every key, answers in key order.
    pub(super) async fn read_many<T: FromRedisValue + Send>(
        &self,
        command: &str,
        keys: &[String],
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(CHUNK) {
            if self.conn.is_cluster() {
                let each = chunk.iter().map(|key| {
                    let mut conn = self.conn();
                    async move {
                        redis::cmd(command)
                            .arg(key)
                            .query_async::<T>(&mut conn)
                            .await
                    }
                });
                out.extend(
                    futures_util::future::try_join_all(each)
                        .await
                        .map_err(unavailable)?,
                );
            } else {
                let mut pipe = redis::pipe();
                for key in chunk {
                    pipe.cmd(command).arg(key);
                }
                let answers: Vec<T> = pipe
                    .query_async(&mut self.conn())
                    .await
                    .map_err(unavailable)?;
                out.extend(answers);
            }
        }
        Ok(out)
    }
}
