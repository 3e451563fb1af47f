//! The Redis store's reads: sessions, turns, the conversation, cancel requests, live events,
//! batches and heartbeats, each one command or pipeline (or one per slot on a Cluster).

use redis::AsyncCommands as _;

use std::sync::atomic::Ordering;

use super::codec::{decode, with_ledger};
use super::{RedisStore, unavailable};
use crate::contract::{SessionId, TurnId};
use crate::state::{BatchRecord, ContextIds, SessionState, TurnRecord};
use crate::store::{IndexedTurn, RunsPage, StoreError, StoreReader};

#[async_trait::async_trait]
impl StoreReader for RedisStore {
    async fn get_session(&self, id: &SessionId) -> Result<Option<SessionState>, StoreError> {
        let key = self.key("session", id);
        let raw: Option<String> = self.conn().get(&key).await.map_err(unavailable)?;
        decode(&key, raw)
    }

    async fn get_turn(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let key = self.turn_key("turn", session, turn);
        let ledger_key = self.turn_key("ledger", session, turn);
        let mut conn = self.conn();
        let (raw, ledger): (Option<String>, std::collections::BTreeMap<String, String>) =
            redis::pipe()
                .get(&key)
                .hgetall(&ledger_key)
                .query_async(&mut conn)
                .await
                .map_err(unavailable)?;
        with_ledger(&key, raw, ledger)
    }

    async fn list_turns(&self, session: &SessionId) -> Result<Vec<TurnId>, StoreError> {
        let ids: Vec<String> = self
            .conn
            .clone()
            .lrange(self.key("turns", session), 0, -1)
            .await
            .map_err(unavailable)?;
        ids.into_iter()
            .map(|s| TurnId::parse(s).map_err(|e| StoreError::Corrupt(e.to_string())))
            .collect()
    }

    async fn owner(&self, session: &SessionId) -> Result<Option<String>, StoreError> {
        self.conn()
            .get(self.key("owner", session))
            .await
            .map_err(unavailable)
    }

    async fn cancel_requested(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<bool, StoreError> {
        self.conn()
            .exists(self.turn_key("cancel", session, turn))
            .await
            .map_err(unavailable)
    }

    async fn cancels_requested(
        &self,
        turns: &[(SessionId, TurnId)],
    ) -> Result<Vec<bool>, StoreError> {
        let keys: Vec<String> = turns
            .iter()
            .map(|(sid, tid)| self.turn_key("cancel", sid, tid))
            .collect();
        self.read_many("EXISTS", &keys, None).await
    }

    async fn latched_contexts(
        &self,
        session: &SessionId,
    ) -> Result<Option<ContextIds>, StoreError> {
        let key = self.key("contexts", session);
        let raw: Option<String> = self.conn().get(&key).await.map_err(unavailable)?;
        decode(&key, raw)
    }

    async fn conversation(
        &self,
        session: &SessionId,
    ) -> Result<Vec<serde_json::Value>, StoreError> {
        let key = self.key("conversation", session);
        let raw: Vec<String> = self.conn().lrange(&key, 0, -1).await.map_err(unavailable)?;
        raw.into_iter()
            .map(|item| decode(&key, Some(item)).map(Option::unwrap_or_default))
            .collect()
    }

    async fn kept_live(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<Vec<Vec<u8>>, StoreError> {
        let key = self.turn_key("live", session, turn);
        self.conn().lrange(&key, 0, -1).await.map_err(unavailable)
    }

    fn fenced_rejections(&self) -> u64 {
        self.fenced.load(Ordering::Relaxed)
    }

    async fn prompts(
        &self,
        ids: &[String],
    ) -> Result<std::collections::BTreeMap<String, String>, StoreError> {
        let keys: Vec<String> = ids
            .iter()
            .map(|id| format!("{}:prompt:{id}", self.namespace))
            .collect();
        let found: Vec<Option<String>> = self.read_many("GET", &keys, None).await?;
        Ok(ids
            .iter()
            .zip(found)
            .filter_map(|(id, json)| Some((id.clone(), json?)))
            .collect())
    }

    async fn heartbeats(&self) -> Result<Vec<(String, Vec<u8>)>, StoreError> {
        let key = format!("{}:workers", self.namespace);
        self.conn().hgetall(&key).await.map_err(unavailable)
    }

    async fn recent_turns(
        &self,
        tenant: &str,
        page: &RunsPage,
    ) -> Result<Vec<IndexedTurn>, StoreError> {
        self.read_runs(tenant, page).await
    }

    async fn list_batches(&self, tenant: &str, max: usize) -> Result<Vec<String>, StoreError> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let index = format!("{}:batches:{{{tenant}}}", self.namespace);
        self.conn()
            .zrevrange(&index, 0, max as isize - 1)
            .await
            .map_err(unavailable)
    }

    async fn get_batch(&self, id: &str) -> Result<Option<BatchRecord>, StoreError> {
        let key = format!("{}:batch:{id}", self.namespace);
        let raw: Option<String> = self.conn().get(&key).await.map_err(unavailable)?;
        decode(&key, raw)
    }

    async fn get_turns(
        &self,
        ids: &[(SessionId, TurnId)],
    ) -> Result<Vec<Option<TurnRecord>>, StoreError> {
        self.turn_records(ids).await
    }
}
