//! Ending a run: completed, waiting for client tools, failed, cancelled, or handed back — each
//! one store step that gives the lease back.

use tracing::{info, warn};

use super::{Interrupted, Lifecycle, RetryKind, RetryableFailure, Settled, TurnResult, permanent};
use crate::contract::{
    AgentExecuteResponse, ClientToolContinuation, ErrorCode, ErrorMessage, FinalResponse,
    InvokeResult, ToolCall,
};
use crate::store::{
    PendingTools, TurnProgress, TurnRecord, TurnStatus, TurnStatusView, now_rfc3339,
};

use super::*;

impl Lifecycle {
    /// Hands the turn back to the queue after a retryable failure, giving the lease back so a
    /// retry can proceed at once; returns the failure for the caller to report.
    ///
    /// After a failure that was not a write (the model, a tool, no capacity), the store holds
    /// exactly what this run last wrote: the record is written once more as the run holds it
    /// (with the requests it sent), releasing the lease in the same step. After a failed write
    /// the run cannot know what the store holds, so it writes nothing of the turn: it only
    /// gives the lease back if it still holds it, and the next run reads what is there.
    pub(crate) async fn hand_back(
        &self,
        mut run: Run,
        failure: RetryableFailure,
    ) -> RetryableFailure {
        if run.unsure {
            warn!("a write of this turn went unanswered; leaving the turn as the store holds it");
            run.held.release().await;
        } else if let Err(e) = {
            let why = format!("{}: {}", failure.error.error_code, failure.error.message);
            run.record.note_event("run_ended", Some(why));
            self.write(&mut run, false, true).await
        } {
            warn!(error = %e, "could not save the turn before handing it back");
            run.held.release().await;
        }
        warn!(code = %failure.error.error_code, message = %failure.error.message, "turn will be retried later");
        failure
    }

    /// The stored result of `rec` if it is finished; `Err` when `rec` is another payload's turn.
    pub(crate) fn finished(
        &self,
        rec: &TurnRecord,
        print: TurnPrint<'_>,
    ) -> Result<Option<TurnResult>, Interrupted> {
        if !print.matches(&rec.fingerprint) {
            return Err(Interrupted::NotTheTurns(Box::new(InvokeResult::failure(
                permanent(
                    ErrorCode::TurnConflict,
                    format!(
                        "turn {} already exists in session {} with a different payload",
                        rec.turn_id,
                        rec.session_id.client_id()
                    ),
                ),
            ))));
        }
        // A cancelled turn's status was published when it was cancelled: its job is dropped.
        if rec.status == TurnStatus::Cancelled
            && let Some(result) = &rec.result
        {
            info!("the turn was cancelled; dropping its job");
            return Err(Interrupted::NotTheTurns(result.clone()));
        }
        let done = rec.status.is_settled() || rec.pending.is_some();
        match (&rec.result, done) {
            (Some(result), true) => {
                info!(
                    status = rec.status.as_str(),
                    "turn already ran; returning its stored result"
                );
                self.metrics.duplicate_suppressed("worker");
                Ok(Some((**result).clone()))
            }
            _ => Ok(None),
        }
    }

    pub(crate) async fn complete_turn(
        &self,
        mut run: Run,
        progress: TurnProgress,
        response_id: String,
        mut text: String,
        api_warnings: Vec<ErrorMessage>,
    ) -> Result<Settled, RetryableFailure> {
        if progress.mode_changes > 0
            && let Some(welcome) = &self
                .catalog
                .by_id_or_default(&run.session.mode_id)
                .welcome_message
        {
            text = format!("{welcome}\n\n{text}");
        }
        let iterations = progress.iterations;
        let response = AgentExecuteResponse::Final(FinalResponse {
            meta: self.meta(&run.session, &run.record.turn_id),
            primary_output_text: text,
            files: Vec::new(),
            tool_results: progress.server_tool_results,
            user_warnings: progress.user_warnings,
            usage: Some(progress.usage),
        });
        let result = InvokeResult::success(response).with_warnings(api_warnings);
        run.session.previous_response_id = Some(response_id);
        run.session.previous_call = progress.last_call;
        run.session.conversation.extend(progress.turn_items);
        run.session.updated_at = now_rfc3339();
        run.record.status = TurnStatus::Completed;
        run.record.completed_at = Some(now_rfc3339());
        run.record.pending = None;
        run.record.checkpoint = None;
        run.record.result = Some(Box::new(result));
        let result = self.settle(run, true).await?;
        info!(iterations, "turn completed");
        Ok(result)
    }

    pub(crate) async fn await_client_tools(
        &self,
        mut run: Run,
        progress: TurnProgress,
        response_id: String,
        client_calls: Vec<ToolCall>,
        server_outputs: Vec<(String, String)>,
    ) -> Result<Settled, RetryableFailure> {
        let meta = self.meta(&run.session, &run.record.turn_id);
        let count = client_calls.len();
        let Some(continuation) = ClientToolContinuation::new(meta, client_calls.clone(), None)
        else {
            let failure = RetryableFailure {
                error: permanent(ErrorCode::Internal, "no client tool calls to wait for"),
                kind: RetryKind::Failure,
            };
            return Err(self.hand_back(run, failure).await);
        };
        let result =
            InvokeResult::success(AgentExecuteResponse::ClientToolContinuation(continuation));
        run.record.status = TurnStatus::AwaitingClientTools;
        run.record.pending = Some(Box::new(PendingTools {
            response_id,
            client_calls,
            server_outputs,
            progress,
        }));
        run.record.checkpoint = None;
        run.record.result = Some(Box::new(result));
        // The session's continuation id is *not* moved to this response: its calls are
        // unanswered. The session is saved for what changed (replay flag, latched context).
        let result = self.settle(run, true).await?;
        info!(calls = count, "turn waits for client tools");
        Ok(result)
    }

    pub(crate) async fn fail_turn(
        &self,
        mut run: Run,
        result: TurnResult,
    ) -> Result<Settled, RetryableFailure> {
        for e in result.errors() {
            warn!(code = %e.error_code, message = %e.message, "turn failed");
        }
        run.record.status = TurnStatus::Failed;
        run.record.pending = None;
        run.record.checkpoint = None;
        run.record.completed_at = Some(now_rfc3339());
        run.record.result = Some(Box::new(result));
        // The session's continuation state is left as it was before the turn.
        self.settle(run, false).await
    }

    /// Ends a turn that was asked to stop: `cancelled`, its failed `TURN_CANCELLED` result
    /// stored; the session's continuation state stays as it was before the turn, so the next
    /// turn works.
    pub(crate) async fn cancel_turn(&self, mut run: Run) -> Result<Settled, RetryableFailure> {
        info!("turn cancelled on request");
        run.record = Box::new(run.record.cancelled());
        self.settle(run, false).await
    }

    /// The write that ends this run of the turn: the record, holding its result (and the
    /// session, with `with_session`), saved and the lease given back in one step. A write that
    /// fails hands the turn back without writing anything more: the store holds the turn either
    /// as it was before this step or as settled by it, and the next run goes on from whichever
    /// it finds.
    pub(super) async fn settle(
        &self,
        mut run: Run,
        with_session: bool,
    ) -> Result<Settled, RetryableFailure> {
        // A cancelled record noted its end when it was made so.
        let ended = match run.record.status {
            TurnStatus::Completed => Some("completed"),
            TurnStatus::Failed => Some("failed"),
            TurnStatus::AwaitingClientTools => Some("awaiting_client_tools"),
            TurnStatus::Cancelled | TurnStatus::Queued | TurnStatus::Running => None,
        };
        if let Some(event) = ended {
            let detail = run.record.result.as_ref().and_then(|r| {
                r.errors()
                    .first()
                    .map(|e| format!("{}: {}", e.error_code, e.message))
            });
            run.record.note_event(event, detail);
        }
        // Written once here: the record stored and the status published copy the text.
        run.record.result = run.record.result.take().map(|mut result| {
            // In its box: the result moves out and back, the box stays.
            *result = (*result).written();
            result
        });
        let saved = match self.write(&mut run, with_session, true).await {
            Ok(saved) => saved,
            Err(f) => return Err(self.hand_back(run, f).await),
        };
        Ok(Settled::written(
            TurnStatusView::from(*run.record),
            saved.watched,
        ))
    }
}
