//! The Redis store's writes that are not a turn's state: watch marks, kept live events,
//! batches and their completion, heartbeats.

use std::time::{Duration, Instant};

use redis::AsyncCommands as _;

use super::codec::{decode, encode};
use super::{HEARTBEATS_KEPT_MS, RedisStore, ms, unavailable};
use crate::contract::{SessionId, TurnId};
use crate::state::{BatchRecord, ContextIds};
use crate::store::{IndexedTurn, Noting, Prompt, RecordWriter, StoreError};

/// Prompts a store remembers having written.
const PROMPTS_REMEMBERED: usize = 4096;

#[async_trait::async_trait]
impl RecordWriter for RedisStore {
    async fn claim_owner(&self, session: &SessionId, tenant: &str) -> Result<String, StoreError> {
        self.set_once(&self.key("owner", session), tenant).await
    }

    async fn latch_contexts(
        &self,
        session: &SessionId,
        contexts: &ContextIds,
    ) -> Result<ContextIds, StoreError> {
        let key = self.key("contexts", session);
        let latched = self.set_once(&key, &encode(contexts)?).await?;
        decode(&key, Some(latched))?
            .ok_or_else(|| StoreError::Corrupt(format!("{key}: no contexts latched")))
    }

    async fn keep_prompt(&self, prompt: &Prompt) -> Result<(), StoreError> {
        // Written for twice the turn retention, again once half the retention has passed: a
        // record lives a turn retention from its last write, so every record naming the prompt
        // expires before it.
        let keep = self.retention.turns.saturating_mul(2);
        let due = {
            let mut kept = self
                .prompts_kept
                .lock()
                .map_err(|_| StoreError::Unavailable("prompt cache lock poisoned".into()))?;
            let now = Instant::now();
            let due = kept
                .get(&prompt.id)
                .is_none_or(|at| now.duration_since(*at) >= self.retention.turns / 2);
            if due {
                // A handful per mode and tool set: a cache that outgrows that is dropped whole.
                if kept.len() >= PROMPTS_REMEMBERED {
                    kept.clear();
                }
                kept.insert(prompt.id.clone(), now);
            }
            due
        };
        if !due {
            return Ok(());
        }
        let written: Result<(), _> = self
            .conn()
            .pset_ex(
                format!("{}:prompt:{}", self.namespace, prompt.id),
                &*prompt.json,
                ms(keep),
            )
            .await;
        if let Err(e) = written {
            // Not kept: the next call tries again.
            if let Ok(mut kept) = self.prompts_kept.lock() {
                kept.remove(&prompt.id);
            }
            return Err(unavailable(e));
        }
        Ok(())
    }

    async fn request_cancel(&self, session: &SessionId, turn: &TurnId) -> Result<(), StoreError> {
        let _: () = self
            .conn()
            .pset_ex(
                self.turn_key("cancel", session, turn),
                "1",
                ms(self.retention.turns),
            )
            .await
            .map_err(unavailable)?;
        Ok(())
    }
    /// One write of our own to the session's primary (a marker key that lives a few seconds),
    /// then `WAIT` on the same connection: replication is one ordered stream, so once the
    /// replicas hold the marker they hold every write to that primary before it — the turn's
    /// settle or fencing token, whichever connection or process wrote it. On a cluster the
    /// `WAIT` goes to the primary of the session's slot only.
    async fn confirm_replicated(&self, session: &SessionId) -> Result<(), StoreError> {
        match &self.replication {
            Some(r) => self.wait_for_replicas(r, session).await,
            None => Ok(()),
        }
    }

    async fn keep_live(
        &self,
        session: &SessionId,
        turn: &TurnId,
        event: &[u8],
    ) -> Result<(), StoreError> {
        let key = self.turn_key("live", session, turn);
        let keep = crate::store::LIVE_EVENTS_PER_TURN as isize;
        let () = redis::pipe()
            .rpush(&key, event)
            .ignore()
            .ltrim(&key, -keep, -1)
            .ignore()
            .pexpire(&key, ms(crate::store::LIVE_KEPT) as i64)
            .ignore()
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn mark_watched(&self, session: &SessionId, ttl: Duration) -> Result<(), StoreError> {
        let _: i64 = self
            .scripts
            .mark_watched
            .key(self.key("watched", session))
            .arg(ms(ttl))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    fn index_turn(&self, entry: IndexedTurn) -> Noting {
        self.note_run(entry)
    }

    async fn put_batch(&self, batch: &BatchRecord) -> Result<(), StoreError> {
        let key = format!("{}:batch:{}", self.namespace, batch.batch_id);
        // The tenant's index first: an entry whose batch was never stored is skipped when
        // listing, a batch missing from the index would never be listed.
        let index = format!("{}:batches:{{{}}}", self.namespace, batch.tenant);
        let now = time::OffsetDateTime::now_utc();
        let created = time::OffsetDateTime::parse(
            &batch.created_at,
            &time::format_description::well_known::Rfc3339,
        )
        .unwrap_or(now);
        let millis = |t: time::OffsetDateTime| (t.unix_timestamp_nanos() / 1_000_000) as f64;
        let kept_since = now - self.retention.turns;
        let _: () = redis::pipe()
            .zadd(&index, &batch.batch_id, millis(created))
            .ignore()
            .zrembyscore(&index, "-inf", format!("({}", millis(kept_since)))
            .ignore()
            .pexpire(&index, ms(self.retention.turns) as i64)
            .ignore()
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        let _: () = self
            .conn()
            .pset_ex(&key, encode(batch)?, ms(self.retention.turns))
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn put_heartbeat(&self, worker: &str, body: &[u8]) -> Result<(), StoreError> {
        let key = format!("{}:workers", self.namespace);
        let _: () = redis::pipe()
            .hset(&key, worker, body)
            .ignore()
            // Gone with the last worker: nothing of a stopped fleet is left behind.
            .pexpire(&key, HEARTBEATS_KEPT_MS)
            .ignore()
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn drop_heartbeat(&self, worker: &str) -> Result<(), StoreError> {
        let key = format!("{}:workers", self.namespace);
        let _: () = self.conn().hdel(&key, worker).await.map_err(unavailable)?;
        Ok(())
    }

    async fn note_batch(
        &self,
        id: &str,
        settled: Option<(&SessionId, &TurnId)>,
        lines: Option<usize>,
    ) -> Result<bool, StoreError> {
        let key = |part: &str| format!("{}:batchlines:{{{id}}}:{part}", self.namespace);
        let member = settled.map_or(String::new(), |(s, t)| format!("{s}\n{t}"));
        let done: i64 = self
            .scripts
            .note_batch
            .key(key("settled"))
            .key(key("lines"))
            .key(key("done"))
            .arg(member)
            .arg(lines.map_or(String::new(), |n| n.to_string()))
            .arg(ms(self.retention.turns))
            .invoke_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(done == 1)
    }

    async fn batch_done(&self, id: &str) -> Result<(), StoreError> {
        let key = format!("{}:batchlines:{{{id}}}:done", self.namespace);
        let _: () = self
            .conn()
            .pset_ex(&key, "1", ms(self.retention.turns))
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn expect_line_events(
        &self,
        id: &str,
        line: (&SessionId, &TurnId),
        urls: &[&str],
    ) -> Result<(), StoreError> {
        if urls.is_empty() {
            return Ok(());
        }
        let key = self.line_events_key(id, line);
        let _: () = redis::pipe()
            .atomic()
            .sadd(&key, urls)
            .ignore()
            .pexpire(&key, ms(self.retention.turns) as i64)
            .ignore()
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(())
    }

    async fn line_event_finished(
        &self,
        id: &str,
        line: (&SessionId, &TurnId),
        url: &str,
    ) -> Result<bool, StoreError> {
        let key = self.line_events_key(id, line);
        let (left,): (i64,) = redis::pipe()
            .atomic()
            .srem(&key, url)
            .ignore()
            .scard(&key)
            .query_async(&mut self.conn())
            .await
            .map_err(unavailable)?;
        Ok(left == 0)
    }
}
