//! Cancelling a turn (`POST /v1/sessions/{sid}/turns/{tid}/cancel`, `aptix cancel`).
//!
//! A queued turn, or one waiting for client tools, is cancelled here at once (compare-and-set
//! on its record, then its status is published); a running one is asked to stop and its worker
//! does so at the next safe point — before the next model call, or by dropping the model call
//! in flight — and publishes the cancelled status itself. The request is also recorded for a
//! queued turn, so a worker that picks it up in the same instant stops it too.
//!
//! A user turn's `onBusy` (`reject`, `interrupt`) is decided here too: it is about the turns
//! before it in its session.
//!
//! Owns: the cancel decision at the front door. Must not: touch a running turn's state (only
//! its worker writes that).

use crate::contract::{ErrorCode, ErrorMessage, OnBusy, SessionId, TurnId, UserTurn};
use crate::delivery::{Settling, Undelivered};
use crate::frontdoor::{FrontDoor, SubmitError};
use crate::queue::Audience;
use crate::store::{BatchRecord, TurnRecord, TurnStatus, TurnStatusView};

/// What a cancel request came to.
#[derive(Debug)]
pub enum Cancelled {
    /// The turn is cancelled (now, or before).
    Done(TurnStatusView),
    /// The turn is running; its worker stops it within about a second.
    Stopping(TurnStatusView),
}

/// A turn that does not exist (or is another tenant's).
fn missing(sid: &SessionId, tid: &TurnId) -> SubmitError {
    SubmitError::NotFound(ErrorMessage::new(
        ErrorCode::TurnNotFound,
        format!("turn {tid} does not exist in session {}", sid.client_id()),
    ))
}

impl FrontDoor {
    /// Cancels `tenant`'s turn (`sid` is the client's id, taken as `tenant`'s session).
    /// Idempotent; a finished turn is a conflict naming its status.
    pub async fn cancel(
        &self,
        tenant: &str,
        sid: &SessionId,
        tid: &TurnId,
    ) -> Result<Cancelled, SubmitError> {
        self.cancel_owned(&sid.within(tenant), tid).await
    }

    /// Cancels the turn of a session already scoped to its tenant ([`SessionId::within`]): the
    /// caller's, or any tenant's for an admin who named it.
    pub async fn cancel_owned(
        &self,
        sid: &SessionId,
        tid: &TurnId,
    ) -> Result<Cancelled, SubmitError> {
        // A compare-and-set that loses to a worker re-reads: the turn moved on.
        loop {
            let Some(record) = self.store.get_turn(sid, tid).await? else {
                return Err(missing(sid, tid));
            };
            match record.status {
                TurnStatus::Cancelled => {
                    // Delivered again: an earlier cancel may have stored the status without
                    // telling anyone (the store's replicas were behind, the broker down).
                    // Statuses are delivered at least once.
                    let view = TurnStatusView::from(&record);
                    self.deliver_cancelled(&view, &record).await?;
                    return Ok(Cancelled::Done(view));
                }
                TurnStatus::Completed | TurnStatus::Failed => {
                    return Err(SubmitError::Conflict(ErrorMessage::new(
                        ErrorCode::TurnAlreadyFinished,
                        format!(
                            "turn {tid} is {}; a finished turn cannot be cancelled",
                            record.status.as_str()
                        ),
                    )));
                }
                TurnStatus::Running => {
                    self.store.request_cancel(sid, tid).await?;
                    tracing::info!(session_id = %sid, turn_id = %tid, "cancel requested for a running turn");
                    return Ok(Cancelled::Stopping((&record).into()));
                }
                TurnStatus::Queued | TurnStatus::AwaitingClientTools => {
                    self.store.request_cancel(sid, tid).await?;
                    let Some(cancelled) = self.intake.cancel_waiting(&record).await? else {
                        continue;
                    };
                    let view = TurnStatusView::from(&cancelled);
                    self.deliver_cancelled(&view, &cancelled).await?;
                    tracing::info!(session_id = %sid, turn_id = %tid, was = record.status.as_str(), "turn cancelled");
                    self.metrics.turn_finished("cancelled");
                    return Ok(Cancelled::Done(view));
                }
            }
        }
    }
}

/// A cancel that is stored but was not told of: the status or a webhook delivery was not
/// taken, or the turn's batch could not note it. Cancelling again tells of it.
fn untold(view: &TurnStatusView, e: &dyn std::fmt::Display) -> SubmitError {
    SubmitError::Untold(format!(
        "turn {} of session {} is cancelled, but its status could not be told of ({e}); cancel it again to tell of it",
        view.turn_id,
        view.session_id.client_id()
    ))
}

impl FrontDoor {
    /// Delivers the status of a turn cancelled here (stored already). Not on the replicas the
    /// deployment requires: nobody is told (a failover could bring the turn back as waiting)
    /// and the caller is answered 503, so the client cancels again, which delivers it then. A
    /// status the broker did not take is in the store, where every waiter looks within
    /// [`crate::delivery::RECHECK`].
    async fn deliver_cancelled(
        &self,
        view: &TurnStatusView,
        record: &TurnRecord,
    ) -> Result<(), SubmitError> {
        // The tenant's webhooks too: the session's tenant is in its (scoped) id.
        let turn = Settling {
            reply_to: record.reply_to.as_deref(),
            // Whether the submitter wanted a reply queue is not in the record; a cancel is
            // rare enough to keep one wherever the topology might.
            audience: Audience::ANYONE,
            tenant: Some(record.session_id.tenant()),
            webhook: record.webhook.as_deref(),
            traceparent: None,
            batch: record.batch.as_deref(),
        };
        match self
            .delivery
            .settle(self.quotas.tenants(), view, turn)
            .await
        {
            Ok(()) => Ok(()),
            Err(Undelivered::NotReplicated(e)) => Err(e.into()),
            Err(e) => {
                // Stored: waiters find it within a recheck, but its webhooks and its batch's
                // completion would be lost: the client is told to cancel again.
                tracing::warn!(session_id = %view.session_id, turn_id = %view.turn_id, error = %e, "a cancelled turn's status could not be told of; it is stored");
                Err(untold(view, &e))
            }
        }
    }

    /// Applies a user turn's `onBusy` to the other turns of its session that are queued or
    /// running: `reject` refuses the turn with `SESSION_BUSY` (naming them), `interrupt`
    /// cancels them (this turn then runs after the running one has stopped).
    pub(super) async fn on_busy(&self, turn: &UserTurn) -> Result<(), SubmitError> {
        let (sid, tid) = (turn.session_id(), turn.turn_id());
        let ids: Vec<_> = self
            .store
            .list_turns(sid)
            .await?
            .into_iter()
            .filter(|t| t != tid)
            .map(|t| (sid.clone(), t))
            .collect();
        let busy: Vec<TurnId> = self
            .store
            .get_turns(&ids)
            .await?
            .into_iter()
            .flatten()
            .filter(|r| matches!(r.status, TurnStatus::Queued | TurnStatus::Running))
            .map(|r| r.turn_id)
            .collect();
        if busy.is_empty() {
            return Ok(());
        }
        match turn.on_busy() {
            OnBusy::Enqueue => Ok(()),
            OnBusy::Reject => {
                self.metrics.turn_refused_by_policy("session_busy");
                let list: Vec<&str> = busy.iter().map(TurnId::as_str).collect();
                Err(SubmitError::Conflict(ErrorMessage::new(
                    ErrorCode::SessionBusy,
                    format!(
                        "session {} has turn(s) {} queued or running, and this turn says onBusy: reject",
                        sid.client_id(),
                        list.join(", ")
                    ),
                )))
            }
            OnBusy::Interrupt => {
                for other in &busy {
                    match self.cancel_owned(sid, other).await {
                        // Finished in the meantime: nothing left to interrupt.
                        Ok(_) | Err(SubmitError::Conflict(_) | SubmitError::NotFound(_)) => {}
                        Err(SubmitError::Untold(m)) => {
                            return Err(SubmitError::Untold(format!(
                                "turn {tid} was not accepted: onBusy: interrupt stopped an earlier turn, but {m}; then send this turn again"
                            )));
                        }
                        Err(e) => return Err(e),
                    }
                }
                tracing::info!(session_id = %sid, turn_id = %tid, interrupted = busy.len(), "onBusy: interrupt cancelled the session's earlier turns");
                Ok(())
            }
        }
    }
}

impl FrontDoor {
    /// Cancels every turn of `batch` that has not finished (queued and waiting ones at once,
    /// running ones at their next safe point); returns how many were asked to stop.
    pub async fn cancel_batch(&self, batch: &BatchRecord) -> Result<usize, SubmitError> {
        let mut asked = 0;
        for item in &batch.items {
            match self.cancel_owned(&item.session_id, &item.turn_id).await {
                Ok(_) => asked += 1,
                // Finished already, or its record expired: nothing to stop.
                Err(SubmitError::Conflict(_) | SubmitError::NotFound(_)) => {}
                Err(e) => return Err(e),
            }
        }
        tracing::info!(batch_id = %batch.batch_id, asked, "batch cancelled");
        Ok(asked)
    }
}
