//! A continuation's acceptance at the front door: the turn waiting for client tools moved to
//! `queued` for these tool results in one compare-and-set, or the same results recognised as
//! accepted before.
//!
//! Owns: deciding whether a continuation is accepted. Must not: enqueue it (the front door's
//! core does, and takes the move back when the broker refuses the job).

use super::{FrontDoor, SubmitError};
use crate::contract::{ErrorCode, ErrorMessage, ToolContinuation};
use crate::store::{TurnRecord, TurnStatus};

/// What accepting a continuation did to its turn.
pub(super) enum Acceptance {
    /// The turn moved from `awaiting_client_tools` to `queued` for this continuation.
    Moved {
        before: Box<TurnRecord>,
        after: Box<TurnRecord>,
    },
    /// This continuation was accepted before; the turn as it is now.
    Again(Box<TurnRecord>),
}

/// How often a continuation is re-decided when its compare-and-set loses to another writer.
const ACCEPT_ATTEMPTS: usize = 8;

impl FrontDoor {
    /// Moves a turn that waits for client tools to `queued` for this continuation, in one
    /// compare-and-set on the stored record, so that of two different continuations sent at
    /// once exactly one is accepted; the same continuation sent again is recognised.
    pub(super) async fn accept_continuation(
        &self,
        cont: &ToolContinuation,
        fp: &str,
        reply_to: Option<&str>,
    ) -> Result<Acceptance, SubmitError> {
        let (sid, tid) = (cont.session_id(), cont.turn_id());
        let submitted: Vec<&str> = cont
            .tool_results()
            .iter()
            .map(|r| r.tool_call_id.as_str())
            .collect();
        for _ in 0..ACCEPT_ATTEMPTS {
            let Some(before) = self.store.get_turn(sid, tid).await? else {
                return Err(SubmitError::NotFound(ErrorMessage::new(
                    ErrorCode::TurnNotFound,
                    format!("turn {tid} does not exist in session {}", sid.client_id()),
                )));
            };
            if before.continuation.as_deref() == Some(fp) {
                return Ok(Acceptance::Again(Box::new(before)));
            }
            // Other results for calls that were answered already (an earlier round, or the
            // continuation that won) are not accepted: the turn has moved past them.
            let answered = !submitted.is_empty()
                && submitted
                    .iter()
                    .all(|id| before.answered.iter().any(|a| a == id));
            let taken = before.continuation.is_some()
                && matches!(before.status, TurnStatus::Queued | TurnStatus::Running);
            if answered
                || taken
                || before.status != TurnStatus::AwaitingClientTools
                || before.pending.is_none()
            {
                let why = if answered || taken {
                    "; other tool results were accepted for its calls"
                } else {
                    ""
                };
                return Err(SubmitError::NotAwaitingTools(ErrorMessage::new(
                    ErrorCode::TurnNotAwaitingTools,
                    format!(
                        "turn {tid} is {}, not awaiting_client_tools{why}; tool results are not accepted",
                        before.status.as_str()
                    ),
                )));
            }
            // A write that failed is taken back by the intake itself.
            let queued = self
                .intake
                .queue_continuation(&before, fp, reply_to)
                .await?;
            if let Some(after) = queued {
                return Ok(Acceptance::Moved {
                    before: Box::new(before),
                    after: Box::new(after),
                });
            }
            // Another writer changed the record between our read and write: decide again.
        }
        Err(SubmitError::Unavailable(format!(
            "turn {tid} of session {} kept changing while its tool results were accepted",
            sid.client_id()
        )))
    }
}
