//! The steps inside a run: a checkpoint before tools run, a background call's id, a tool
//! output in the ledger, and the reads that tell the run to stop.

use super::{Lifecycle, RetryKind, RetryableFailure, permanent, store_failure};
use crate::contract::ErrorCode;
use crate::llm::ModelResponse;
use crate::store::{Checkpoint, ToolOutput, TurnProgress};
use crate::tools::ModeEffect;

use super::*;

impl Lifecycle {
    /// Saves a model answer that calls tools before any of them runs, so a re-run resumes
    /// from it instead of running them twice.
    pub(crate) async fn checkpoint(
        &self,
        run: &mut Run,
        response: &ModelResponse,
        progress: &TurnProgress,
    ) -> Result<(), RetryableFailure> {
        run.record.checkpoint = Some(Box::new(Checkpoint {
            response: response.clone(),
            progress: progress.clone(),
        }));
        // The call it answers is over: nothing to re-attach to.
        run.record.model_call = None;
        self.write(run, false, false).await.map(|_| ())
    }

    /// Records the background model call this run is about to wait for, before it waits
    /// (a fenced write like every other): a run that dies during the call is followed by one
    /// that re-attaches to it. A failed write hands the turn back.
    pub(crate) async fn note_model_call(
        &self,
        run: &mut Run,
        mark: crate::state::ModelCallMark,
    ) -> Result<(), RetryableFailure> {
        run.record.model_call = Some(mark);
        self.write(run, false, false).await.map(|_| ())
    }

    /// Records one server tool's output in the turn's ledger before the next model call and,
    /// when the tool changes the mode, the session's new mode with its history entry — one
    /// step, so a resumed run finds both (it neither runs the tool nor changes the mode again)
    /// or neither (it runs the tool again). Returns whether the mode changed.
    pub(crate) async fn record_tool_output(
        &self,
        run: &mut Run,
        call_id: &str,
        output: &str,
        effect: Option<ModeEffect>,
    ) -> Result<bool, RetryableFailure> {
        run.may_write()?;
        // The session as the run holds it, with the new mode: the run's own (only the lease
        // holder writes it), and perhaps not stored yet (a new session's first write).
        let changed = effect.map(|e| {
            let mut session = run.session.clone();
            session.apply_mode_change(&e.mode_id, e.change);
            session
        });
        let recorded = self
            .store
            .record_tool_output(
                &GRANT,
                &run.session.session_id,
                &run.record.turn_id,
                ToolOutput {
                    call_id,
                    output,
                    session: changed.as_ref(),
                },
                run.held.lease(),
            )
            .await;
        match recorded {
            Ok(()) => {}
            Err(e) if changed.is_some() => {
                run.unsure = true;
                tracing::error!(error = %e, session_id = %run.session.session_id, "agent_change_mode could not persist the mode");
                return Err(RetryableFailure {
                    error: permanent(
                        ErrorCode::ToolUnavailable,
                        format!(
                            "{}: ModeChangeTool failed to change the session mode.",
                            crate::catalog::CHANGE_MODE_TOOL
                        ),
                    ),
                    kind: RetryKind::Failure,
                });
            }
            Err(e) => {
                run.unsure = true;
                return Err(store_failure(e));
            }
        };
        run.record
            .tool_ledger
            .insert(call_id.to_string(), output.to_string());
        let Some(stored) = changed else {
            return Ok(false);
        };
        run.session = stored;
        // The step stored the session whole, any conversation items it held with it.
        run.session.conversation.clear();
        run.session_unsaved = false;
        run.unlisted = false;
        Ok(true)
    }
}
