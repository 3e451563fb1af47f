//! Layer F at the front door: the transitions of a turn that no worker holds — a new turn
//! admitted (or taken back when its job was not accepted), a continuation queued for a turn
//! that waits for client tools (or taken back), a waiting turn cancelled.
//!
//! Each is one store step, and every take-back is a compare-and-set against the record exactly
//! as the front door wrote it: when anything acted on the record since (a worker started the
//! turn, a continuation was queued, it was cancelled), the take-back writes nothing. What a
//! take-back cannot see is a job that was accepted although its confirm was lost; such a job
//! runs the turn from whatever it finds stored (a worker creates a missing record, accepts a
//! continuation for a turn still waiting), so the turn still completes exactly once.
//!
//! Owns: those writes. Must not: touch a turn a worker holds (only its run writes that).

use std::sync::Arc;

use super::GRANT;
use crate::store::{
    Admission, ContextIds, RunsNote, SessionStore, StoreError, TurnRecord, TurnStatus,
};

/// The front door's turn transitions (see the module header).
#[derive(Clone)]
pub struct Intake {
    store: Arc<dyn SessionStore>,
}

impl Intake {
    /// The transitions over `store`.
    pub fn new(store: Arc<dyn SessionStore>) -> Self {
        Self { store }
    }

    /// Admits a new user turn as `queued` in one step, noting it in the runs index as
    /// accepted at `accepted_ms` where the store can do that in the same step (see
    /// [`SessionStore::admit_and_index`]).
    pub async fn admit(
        &self,
        owner: Option<&str>,
        contexts: &ContextIds,
        turn: &TurnRecord,
        accepted_ms: i64,
    ) -> Result<(Admission, RunsNote), StoreError> {
        self.store
            .admit_and_index(&GRANT, owner, contexts, turn, accepted_ms)
            .await
    }

    /// Records a new user turn as `queued` unless it exists; returns the existing record.
    pub async fn create(&self, turn: &TurnRecord) -> Result<Option<TurnRecord>, StoreError> {
        self.store.create_turn(&GRANT, turn).await
    }

    /// Takes back a new turn whose job was not accepted (or whose admission went unanswered):
    /// deleted only while it is exactly as admitted. `false` when it moved on or is gone.
    pub async fn take_back(&self, admitted: &TurnRecord) -> Result<bool, StoreError> {
        self.store.discard_turn(&GRANT, admitted).await
    }

    /// Queues a continuation (its fingerprint `fp`) for a turn that waits for client tools:
    /// `before`, as read, becomes `queued` for it in one compare-and-set. Returns the queued
    /// record, or `None` when the turn changed since it was read (decide again). A step whose
    /// answer is lost may have been applied (or be applied later, by a stalled link): it is
    /// taken back the same way, a compare-and-set that writes nothing if anything acted on it,
    /// and the error is returned.
    pub async fn queue_continuation(
        &self,
        before: &TurnRecord,
        fp: &str,
        reply_to: Option<&str>,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let mut after = before.clone().replying_to(reply_to);
        after.status = TurnStatus::Queued;
        after.continuation = Some(fp.to_string());
        match self.store.replace_turn(&GRANT, before, &after).await {
            Ok(replaced) => Ok(replaced.then_some(after)),
            Err(e) => {
                if let Err(d) = self.take_back_continuation(&after, before).await {
                    tracing::warn!(session_id = %before.session_id, turn_id = %before.turn_id, error = %d, "could not take back a continuation whose write failed");
                }
                Err(e)
            }
        }
    }

    /// Takes back a queued continuation whose job was not accepted (or whose write went
    /// unanswered): the turn waits for its tools again, only if it is exactly as `queued`
    /// left it. `false` when it moved on.
    pub async fn take_back_continuation(
        &self,
        queued: &TurnRecord,
        waiting: &TurnRecord,
    ) -> Result<bool, StoreError> {
        self.store.replace_turn(&GRANT, queued, waiting).await
    }

    /// Cancels a turn that is queued or waits for client tools and no worker holds: `record`,
    /// as read, becomes `cancelled` in one compare-and-set. Returns the cancelled record, or
    /// `None` when the turn changed since it was read (decide again). A step whose answer is
    /// lost is not retried blindly: the record is read back, and a turn this step cancelled
    /// comes back cancelled, so its status is still published.
    pub async fn cancel_waiting(
        &self,
        record: &TurnRecord,
    ) -> Result<Option<TurnRecord>, StoreError> {
        let cancelled = record.clone().cancelled();
        match self.store.replace_turn(&GRANT, record, &cancelled).await {
            Ok(replaced) => Ok(replaced.then_some(cancelled)),
            // The answer was lost: read what is there. Cancelled by this step, it goes on as
            // cancelled (its status must still be published); otherwise it was not applied, or
            // the turn moved on.
            Err(e) => match self
                .store
                .get_turn(&record.session_id, &record.turn_id)
                .await
            {
                Ok(Some(now)) if same(&now, &cancelled) => Ok(Some(cancelled)),
                Ok(Some(now)) if !same(&now, record) => Ok(None),
                _ => Err(e),
            },
        }
    }
}

/// Whether two records are the same as stored (their JSON).
fn same(a: &TurnRecord, b: &TurnRecord) -> bool {
    match (serde_json::to_value(a), serde_json::to_value(b)) {
        (Ok(a), Ok(b)) => a == b,
        _ => false,
    }
}
