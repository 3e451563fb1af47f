//! Reads over many sessions: one pipelined request per few hundred keys on one server; on a
//! cluster, whose pipelines may not span slots, one request per key, sent together.

use redis::FromRedisValue;

use super::codec::{decode, runs_begun};
use super::{RedisStore, unavailable};
use crate::contract::{SessionId, TurnId};
use crate::state::RUNS_BEGUN;
use crate::store::{StoreError, TurnRecord};

/// Keys per pipelined request.
const CHUNK: usize = 500;

impl RedisStore {
    /// [`crate::store::SessionStore::get_turns`]: one pipeline of GETs per 500 turns and one
    /// of the ledgers' counts of runs begun (on a cluster, one read per key, sent together).
    /// Tool ledgers are not merged in: callers of this read statuses and results, not a
    /// turn's internals; the count is, so that a turn a run has begun reads `running`.
    pub(super) async fn turn_records(
        &self,
        ids: &[(SessionId, TurnId)],
    ) -> Result<Vec<Option<TurnRecord>>, StoreError> {
        let keys: Vec<String> = ids
            .iter()
            .map(|(sid, tid)| self.turn_key("turn", sid, tid))
            .collect();
        let ledgers: Vec<String> = ids
            .iter()
            .map(|(sid, tid)| self.turn_key("ledger", sid, tid))
            .collect();
        let (raws, runs): (Vec<Option<String>>, Vec<Option<String>>) = futures_util::try_join!(
            self.read_many("GET", &keys, None),
            self.read_many("HGET", &ledgers, Some(RUNS_BEGUN)),
        )?;
        keys.iter()
            .zip(raws.into_iter().zip(runs))
            .map(|(key, (raw, runs))| {
                let mut record: Option<TurnRecord> = decode(key, raw)?;
                if let (Some(r), Some(runs)) = (record.as_mut(), runs) {
                    r.with_runs_begun(runs_begun(key, &runs)?);
                }
                Ok(record)
            })
            .collect()
    }

    /// `command key [field]` (a one-key read: `GET`, `EXISTS`, `HGET … field`) for every
    /// key, answers in key order.
    pub(super) async fn read_many<T: FromRedisValue + Send>(
        &self,
        command: &str,
        keys: &[String],
        field: Option<&str>,
    ) -> Result<Vec<T>, StoreError> {
        let mut out = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(CHUNK) {
            if self.conn.is_cluster() {
                let each = chunk.iter().map(|key| {
                    let mut conn = self.conn();
                    async move {
                        redis::cmd(command)
                            .arg(key)
                            .arg(field)
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
                    pipe.cmd(command).arg(key).arg(field);
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
