//! A continuation's run (AGN-027 layer E, like the reasoner it hands over to): the client's
//! tool results checked against the calls the turn waits for and recorded, the answers to
//! approval questions applied — an approved MCP call runs through layer D, a denied one tells
//! the model why — and the loop resumed from the waiting response.
//!
//! Owns: taking a continuation back into the loop. Must not: write the turn's state (layer F's
//! transitions do) or run a tool itself (layer D does).

use serde_json::{Value, json};
use tracing::{info, warn};

use super::Pipeline;
use super::compose;
use super::lifecycle::Run;
use super::outcome::{
    Interrupted, RetryableFailure, Settled, TurnResult, continuation_fingerprint, permanent,
    store_failure,
};
use crate::contract::{
    ErrorCode, InvokeResult, ToolCallId, ToolContinuation, ToolOutcome, check_tool_results,
};
use crate::live::LiveTurn;
use crate::mcp::approval;
use crate::metrics::ToolOutcome as Counted;
use crate::store::{StoreError, TurnProgress, TurnRecord, TurnStatus};

impl Pipeline {
    pub(super) async fn run_continuation(
        &self,
        cont: &ToolContinuation,
        tenant: Option<&str>,
        reply_to: Option<&str>,
    ) -> Result<Settled, Interrupted> {
        let (sid, tid) = (cont.session_id(), cont.turn_id());
        let fp = continuation_fingerprint(cont);
        let submitted: Vec<String> = cont
            .tool_results()
            .iter()
            .map(|r| r.tool_call_id.to_string())
            .collect();
        // Err: the job's answer without running — the turn's stored result (a redelivery), or not
        // the turn's job at all.
        type Answer = Box<Result<Settled, Interrupted>>;
        let check = |record: Option<TurnRecord>| -> Result<TurnRecord, Answer> {
            let Some(record) = record else {
                let unknown = InvokeResult::failure(permanent(
                    ErrorCode::TurnNotFound,
                    format!("turn {tid} does not exist in session {}", sid.client_id()),
                ));
                return Err(Box::new(Err(Interrupted::NotTheTurns(Box::new(unknown)))));
            };
            // A continuation that was already applied (a redelivery) gets the turn's result.
            if submitted.iter().all(|id| record.answered.contains(id))
                && let Some(result) = &record.result
                && record.status != TurnStatus::Running
            {
                self.life.metrics.duplicate_suppressed("worker");
                return Err(Box::new(Ok(Settled::stored((**result).clone()))));
            }
            // Awaiting client tools (a continuation run directly), queued for the continuation
            // the front door accepted, or running with the pending calls still recorded (a run
            // of this continuation that crashed): these accept the results. A queued turn
            // accepted another continuation than this one: this job is not the turn's.
            let accepted_other = record.status == TurnStatus::Queued
                && record.continuation.as_deref() != Some(fp.as_str());
            if record.pending.is_none()
                || accepted_other
                || !matches!(
                    record.status,
                    TurnStatus::AwaitingClientTools | TurnStatus::Queued | TurnStatus::Running
                )
            {
                let not_waiting = InvokeResult::failure(permanent(
                    ErrorCode::TurnNotAwaitingTools,
                    format!(
                        "turn {tid} is {}, not awaiting_client_tools; tool results are not accepted",
                        record.status.as_str()
                    ),
                ));
                return Err(Box::new(Err(Interrupted::NotTheTurns(Box::new(
                    not_waiting,
                )))));
            }
            Ok(record)
        };
        if let Err(answer) = check(
            self.reader
                .get_turn(sid, tid)
                .await
                .map_err(store_failure)?,
        ) {
            return *answer;
        }
        let held = self.life.lease(sid, tid).await?;
        let reread = match self.reader.get_turn(sid, tid).await {
            Ok(r) => r,
            Err(e) => {
                held.release().await;
                return Err(store_failure(e).into());
            }
        };
        let record = match check(reread) {
            Ok(r) => r,
            Err(answer) => {
                held.release().await;
                return *answer;
            }
        };
        let session = match self.reader.get_session(sid).await {
            Ok(Some(s)) => s,
            other => {
                held.release().await;
                return Err(store_failure(match other {
                    Err(e) => e,
                    _ => StoreError::Corrupt(format!(
                        "session {} of a waiting turn is missing",
                        sid.client_id()
                    )),
                })
                .into());
            }
        };
        let Some(pending) = record.pending.clone() else {
            held.release().await;
            return Err(store_failure(StoreError::Corrupt("pending calls vanished".into())).into());
        };
        let expected: Vec<ToolCallId> = pending
            .client_calls
            .iter()
            .map(|c| c.tool_call_id.clone())
            .collect();
        // A turn that streams streams its continuations' runs too; every live event is out
        // before the worker publishes the result.
        let live = match &self.life.live {
            Some((outlet, settings)) if record.streaming => Some(LiveTurn::start(
                outlet.clone(),
                sid,
                tid,
                reply_to,
                *settings,
            )),
            _ => None,
        };
        let run = self
            .life
            .open_continuation(held, record, session, tenant, live.clone());
        let settled = self
            .continue_with_results(run, cont, &expected, submitted, *pending)
            .await;
        if let Some(live) = live {
            live.finish().await;
        }
        settled
    }

    /// A continuation's run once it holds the turn: checks and records the client's results,
    /// then reasons on from them (or from the checkpoint of a run that died after a call).
    async fn continue_with_results(
        &self,
        mut run: Run,
        cont: &ToolContinuation,
        expected: &[ToolCallId],
        submitted: Vec<String>,
        pending: crate::state::PendingTools,
    ) -> Result<Settled, Interrupted> {
        if let Err(mismatch) = check_tool_results(expected, cont.tool_results()) {
            warn!(%mismatch, "tool results do not match the pending calls; failing the turn");
            return Ok(self
                .life
                .fail_turn(run, InvokeResult::failure(mismatch.to_error()))
                .await?);
        }
        note_client_results(&mut run, cont, &pending);
        if let Err(f) = self.life.accept_tool_results(&mut run, submitted).await {
            return Err(self.life.hand_back(run, f).await.into());
        }
        if run.record().checkpoint.is_some() {
            return Ok(self
                .reason(run, TurnProgress::default(), Default::default(), None)
                .await?);
        }
        let mut input: Vec<Value> = pending
            .server_outputs
            .iter()
            .map(|(id, out)| compose::tool_output(id, out))
            .collect();
        let mut progress = pending.progress;
        for r in cont.tool_results() {
            let asked = pending
                .client_calls
                .iter()
                .find(|c| c.tool_call_id == r.tool_call_id)
                .and_then(approval::asked);
            let output = match asked {
                // A hosted tool's approval: the model server runs the call (or hears why not).
                Some(approval::Asked::Hosted { source, tool }) => {
                    let metrics = &self.life.metrics;
                    input.push(super::hosted::answer(metrics, r, (&source, &tool)));
                    continue;
                }
                // An approval question's answer: the call runs (or the model hears why not).
                Some(approval::Asked::Server { tool, arguments }) => {
                    let ran = Box::pin(self.approved_call(
                        &mut run,
                        &mut progress,
                        r,
                        (&tool, &arguments),
                    ));
                    match ran.await {
                        Ok(Ok(out)) => out,
                        Ok(Err(failed)) => return Ok(self.life.fail_turn(run, *failed).await?),
                        Err(f) => return Err(self.life.hand_back(run, f).await.into()),
                    }
                }
                None => match &r.outcome {
                    ToolOutcome::Result(json) => json.as_str().to_string(),
                    ToolOutcome::Error(msg) => json!({"error": msg}).to_string(),
                },
            };
            input.push(compose::tool_output(r.tool_call_id.as_str(), &output));
        }
        // The next step is the model call, whose safe point the write above answered (kept
        // in the run by `accept_tool_results`).
        let previous = Some(pending.response_id.clone());
        Ok(self.reason(run, progress, input.into(), previous).await?)
    }

    /// The client's answer `r` to an approval question about a call of `tool` with
    /// `arguments`: approved, the call runs through layer D as the model asked it (recorded in
    /// the ledger, so a run after a crash does not run it again); denied, the model gets why.
    async fn approved_call(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
        r: &crate::contract::ToolResult,
        (tool, arguments): (&str, &str),
    ) -> Result<Result<String, Box<TurnResult>>, RetryableFailure> {
        let tools_mode = compose::tools_mode(&self.catalog, progress);
        let offered = self
            .tools
            .offered(&tools_mode.key, run.session().session_id.tenant());
        let Some(mcp_tool) = offered.iter().find(|t| t.def.name == tool) else {
            warn!(%tool, "an approved tool is no longer offered");
            let gone = json!({"error": format!("Tool '{tool}' is no longer available.")});
            return Ok(Ok(gone.to_string()));
        };
        let counted = |outcome| {
            let t = mcp_tool.as_ref();
            self.life
                .metrics
                .tools
                .call(&t.source, &t.remote, outcome, None);
        };
        let call_id = r.tool_call_id.as_str();
        match approval::answer(&r.outcome) {
            Err(reason) => {
                counted(Counted::Denied);
                info!(%tool, call_id, %reason, "a person denied the call");
                Ok(Ok(approval::denied_output(tool, &reason)))
            }
            Ok(()) => {
                counted(Counted::Approved);
                info!(%tool, call_id, "a person approved the call; running it");
                self.server_tool_call(run, progress, call_id, (tool, Some(mcp_tool)), arguments)
                    .await
            }
        }
    }
}

/// Notes the client's answers in the turn's record as tool calls of source `client` (once:
/// a run again after a crash finds them noted), for people looking into the turn.
fn note_client_results(
    run: &mut Run,
    cont: &ToolContinuation,
    pending: &crate::state::PendingTools,
) {
    use crate::state::{RESULT_KEPT, ToolNote, shortened};
    for r in cont.tool_results() {
        let id = r.tool_call_id.as_str();
        if run.record().tools.iter().any(|t| t.tool_call_id == id) {
            continue;
        }
        let asked = pending
            .client_calls
            .iter()
            .find(|c| c.tool_call_id == r.tool_call_id);
        let (answer, outcome) = match &r.outcome {
            ToolOutcome::Result(json) => (json.as_str(), "answered"),
            ToolOutcome::Error(message) => (message.as_str(), "tool_error"),
        };
        let note = ToolNote {
            tool_call_id: id.to_string(),
            name: asked.map(|c| c.name.clone()).unwrap_or_default(),
            arguments: asked
                .map(|c| c.arguments_json.as_str().to_string())
                .unwrap_or_default(),
            replayed: false,
            execution_ms: r.execution_ms,
            attempt: run.record().attempts,
            source: Some("client".into()),
            outcome: Some(outcome.into()),
            repeated: false,
            start_ms: run.record().ms_since_accepted(),
            result: Some(shortened(answer, RESULT_KEPT)),
        };
        run.note_tool(note);
    }
}
