//! Turns no run can finish: given up after their retries, or whose job cannot be read.

use super::{Lifecycle, RetryableFailure, Settled, TurnResult, fingerprint, store_failure};
use crate::contract::{AgentExecuteRequest, ErrorMessage, InvokeResult, SessionId, TurnId};
use crate::store::{TurnRecord, TurnStatus};

use super::*;

impl Lifecycle {
    /// Fails a turn for good after its retries ran out (the queue calls this before it
    /// dead-letters the job), so the failure is stored and published like any result. Returns
    /// the stored result instead when the turn already finished.
    pub(crate) async fn give_up(
        &self,
        request: &AgentExecuteRequest,
        error: ErrorMessage,
    ) -> Result<Settled, RetryableFailure> {
        let (sid, tid) = (request.session_id(), request.turn_id());
        let (held, record) = self.lease_and_read(sid, tid).await?;
        let fp = match request {
            AgentExecuteRequest::UserTurn(t) => fingerprint(t),
            AgentExecuteRequest::ToolContinuation(_) => String::new(),
        };
        let record = match record {
            Some(r) => r,
            None => TurnRecord::queued(sid.clone(), tid.clone(), fp, String::new()),
        };
        if record.status.is_final()
            && let Some(result) = record.result.clone()
        {
            held.release().await;
            return Ok(Settled::stored(*result));
        }
        self.fail_held(held, record, InvokeResult::failure(error))
            .await
    }

    /// Fails the turn of a job the worker cannot read (the front door accepted it under
    /// other limits, say), so that it does not stay `queued` behind a job that is gone: only a
    /// turn that is queued, or was running when a run of it died. A turn that ended already
    /// answers with its stored result (to publish again); `None` when there is no turn, or it
    /// waits for client tools.
    pub(crate) async fn fail_unreadable(
        &self,
        sid: &SessionId,
        tid: &TurnId,
        errors: Vec<ErrorMessage>,
    ) -> Result<Option<Settled>, RetryableFailure> {
        let (held, record) = self.lease_and_read(sid, tid).await?;
        match (record, InvokeResult::failures(errors)) {
            (Some(record), Some(result))
                if matches!(record.status, TurnStatus::Queued | TurnStatus::Running) =>
            {
                self.fail_held(held, record, result).await.map(Some)
            }
            // Settled already (by an earlier delivery of this job whose dead-lettering failed,
            // say): its stored result, so that it is published again rather than never.
            (Some(record), _) if record.status.is_final() => {
                held.release().await;
                Ok(record.result.map(|result| Settled::stored(*result)))
            }
            _ => {
                held.release().await;
                Ok(None)
            }
        }
    }

    /// Fails `record`'s turn for good under `held`, with the session as stored.
    pub(super) async fn fail_held(
        &self,
        held: HeldLease,
        mut record: TurnRecord,
        result: TurnResult,
    ) -> Result<Settled, RetryableFailure> {
        let sid = record.session_id.clone();
        let session = match self.store.get_session(&sid).await {
            Ok(s) => s,
            Err(e) => {
                held.release().await;
                return Err(store_failure(e));
            }
        };
        record.status = TurnStatus::Running;
        let session = session.unwrap_or_else(|| self.new_session(&sid));
        let run = Run::open(session, Box::new(record), held, None);
        self.fail_turn(run, result).await
    }
}
