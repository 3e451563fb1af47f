//! The embedded in-memory store: one process, no persistence. Same semantics as the Redis store.

use std::collections::HashMap;
use std::sync::Mutex;

use super::{ModeChange, SessionState, SessionStore, StoreError, TurnRecord, now_rfc3339};
use crate::contract::{SessionId, TurnId};

/// Sessions and turns in process memory.
#[derive(Debug, Default)]
pub struct MemoryStore {
    inner: Mutex<Inner>,
}

#[derive(Debug, Default)]
struct Inner {
    sessions: HashMap<SessionId, SessionState>,
    turns: HashMap<(SessionId, TurnId), TurnRecord>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    fn lock(&self) -> Result<std::sync::MutexGuard<'_, Inner>, StoreError> {
        self.inner
            .lock()
            .map_err(|_| StoreError::Unavailable("in-memory store lock poisoned".into()))
    }
}

#[async_trait::async_trait]
impl SessionStore for MemoryStore {
    async fn get_session(&self, id: &SessionId) -> Result<Option<SessionState>, StoreError> {
        Ok(self.lock()?.sessions.get(id).cloned())
    }

    async fn get_turn(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<Option<TurnRecord>, StoreError> {
        Ok(self
            .lock()?
            .turns
            .get(&(session.clone(), turn.clone()))
            .cloned())
    }

    async fn put_turn(&self, turn: &TurnRecord) -> Result<(), StoreError> {
        self.lock()?.turns.insert(
            (turn.session_id.clone(), turn.turn_id.clone()),
            turn.clone(),
        );
        Ok(())
    }

    async fn record_tool_output(
        &self,
        session: &SessionId,
        turn: &TurnId,
        call_id: &str,
        output: &str,
    ) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        let record = inner
            .turns
            .get_mut(&(session.clone(), turn.clone()))
            .ok_or_else(|| StoreError::Corrupt(format!("turn {session}/{turn} does not exist")))?;
        record
            .tool_ledger
            .insert(call_id.to_string(), output.to_string());
        Ok(())
    }

    async fn change_mode(
        &self,
        session: &SessionId,
        new_mode_id: &str,
        change: ModeChange,
    ) -> Result<SessionState, StoreError> {
        let mut inner = self.lock()?;
        let state = inner
            .sessions
            .get_mut(session)
            .ok_or_else(|| StoreError::Corrupt(format!("session {session} does not exist")))?;
        state.mode_id = new_mode_id.to_string();
        state.mode_key = change.new_mode.clone();
        state.updated_at = now_rfc3339();
        state.mode_history.push(change);
        Ok(state.clone())
    }

    async fn commit(&self, session: &SessionState, turn: &TurnRecord) -> Result<(), StoreError> {
        let mut inner = self.lock()?;
        inner
            .sessions
            .insert(session.session_id.clone(), session.clone());
        inner.turns.insert(
            (turn.session_id.clone(), turn.turn_id.clone()),
            turn.clone(),
        );
        Ok(())
    }
}
