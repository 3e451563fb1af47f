//! What the model call (layer C) reads of the store, as the store answers it: the session's
//! stored conversation (for a call that replays it), whether the turn was asked to stop, and
//! the live events kept of a streaming turn. C sees only [`CallReads`]; this file is where
//! the store is behind it, so C's file imports no store.

use serde_json::Value;

use super::model_call::CallReads;
use super::outcome::{RetryableFailure, store_failure};
use crate::contract::{SessionId, TurnId};
use crate::store::StoreReader;

/// The store, read for the model call.
pub(super) struct StoreCallReads(pub(super) std::sync::Arc<dyn StoreReader>);

#[async_trait::async_trait]
impl CallReads for StoreCallReads {
    async fn conversation(&self, session: &SessionId) -> Result<Vec<Value>, RetryableFailure> {
        self.0.conversation(session).await.map_err(store_failure)
    }

    async fn cancel_requested(&self, sid: &SessionId, tid: &TurnId) -> Result<bool, String> {
        self.0
            .cancel_requested(sid, tid)
            .await
            .map_err(|e| e.to_string())
    }

    async fn kept_live(&self, sid: &SessionId, tid: &TurnId) -> Result<Vec<Vec<u8>>, String> {
        self.0.kept_live(sid, tid).await.map_err(|e| e.to_string())
    }
}
