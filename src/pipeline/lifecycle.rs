//! The turn lifecycle (AGN-027 layer F): taking the session's lease, the first shape of a
//! session, and the writes that settle a turn — completed, awaiting client tools, failed — or
//! hand it back to the queue for later.
//!
//! Owns: the turn's state transitions in the store. Must not: call the model or run tools.

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::{
    Interrupted, NoLease, Pipeline, RetryKind, RetryableFailure, Run, Settled, TurnResult,
    permanent, store_failure,
};
use crate::contract::{
    AgentExecuteResponse, ClientToolContinuation, ErrorCode, ErrorMessage, FinalResponse,
    InvokeResult, SessionId, SessionMeta, ToolCall, TurnId,
};
use crate::store::{
    ContextIds, Lease, PendingTools, SessionState, SessionStore, TurnProgress, TurnRecord,
    TurnStatus, TurnStatusView, now_rfc3339,
};
use crate::tools::ModeEffect;

/// How often a running model call looks for a cancel request.
pub(super) const CANCEL_POLL: Duration = Duration::from_millis(500);

impl Pipeline {
    /// The session part of a turn's answer.
    pub(super) fn meta(&self, session: &SessionState, turn_id: &TurnId) -> SessionMeta {
        SessionMeta {
            session_id: session.session_id.clone(),
            turn_id: turn_id.clone(),
            mode_display_name: self
                .catalog
                .by_id_or_default(&session.mode_id)
                .display_name
                .clone(),
        }
    }

    /// Takes the session's lease (one turn at a time per session) and keeps it renewed.
    pub(super) async fn lease(&self, sid: &SessionId, tid: &TurnId) -> Result<HeldLease, NoLease> {
        let holder = self.holder(tid);
        match self
            .store
            .acquire_lease(sid, &holder, self.settings.lease_ttl)
            .await
            .map_err(|e| NoLease::Failed(store_failure(e)))?
        {
            Some(lease) => Ok(self.hold(sid, lease)),
            None => Err(busy(sid)),
        }
    }

    /// The start of a user turn's run: the session's lease, taken with the turn and the
    /// session read under it in one store step (see [`SessionStore::begin_turn`]). The turn
    /// comes back even when the session is busy, for a duplicate job's stored result. A new
    /// session latches `contexts` in the same step.
    pub(super) async fn begin(
        &self,
        sid: &SessionId,
        tid: &TurnId,
        contexts: Option<&ContextIds>,
    ) -> Result<Begin, Interrupted> {
        let begun = self
            .store
            .begin_turn(
                sid,
                tid,
                &self.holder(tid),
                self.settings.lease_ttl,
                contexts,
            )
            .await
            .map_err(store_failure)?;
        Ok(Begin {
            turn: begun.turn,
            held: begun.lease.map(|lease| self.hold(sid, lease)),
            session: begun.session,
            latched: begun.latched,
        })
    }

    fn holder(&self, tid: &TurnId) -> String {
        format!("{}/{tid}", self.settings.worker_id)
    }

    /// Keeps `lease` renewed in the background until the run gives it back.
    fn hold(&self, sid: &SessionId, lease: Lease) -> HeldLease {
        let ttl = self.settings.lease_ttl;
        let store = self.store.clone();
        let (sid2, lease2) = (sid.clone(), lease.clone());
        let renewer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                match store.renew_lease(&sid2, &lease2, ttl).await {
                    Ok(true) => {}
                    Ok(false) => {
                        warn!(session_id = %sid2, "session lease lost; further writes of this turn will be rejected");
                        return;
                    }
                    Err(e) => {
                        warn!(session_id = %sid2, error = %e, "could not renew the session lease")
                    }
                }
            }
        });
        HeldLease {
            lease,
            session: sid.clone(),
            store: self.store.clone(),
            renewer,
            given_back: false,
        }
    }

    pub(super) fn new_session(&self, sid: &SessionId) -> SessionState {
        let mode = self.catalog.default_mode();
        let now = now_rfc3339();
        SessionState {
            session_id: sid.clone(),
            mode_id: mode.id.clone(),
            mode_key: mode.key.clone(),
            mode_history: Vec::new(),
            previous_response_id: None,
            conversation: Vec::new(),
            replay: false,
            solution_context: None,
            contexts: Default::default(),
            owner: None,
            created_at: now.clone(),
            updated_at: now,
        }
    }

    /// Gives the lease back after a retryable failure so a retry can proceed at once.
    pub(super) async fn retry_later<T>(
        &self,
        mut run: Run,
        failure: RetryableFailure,
    ) -> Result<T, RetryableFailure> {
        match self.store.save(None, &run.record, run.lease(), true).await {
            Ok(_) => run.held.released_by_store(),
            Err(e) => {
                warn!(error = %e, "could not save the turn before retrying it later");
                run.held.release().await;
            }
        }
        warn!(code = %failure.error.error_code, message = %failure.error.message, "turn will be retried later");
        Err(failure)
    }

    /// The stored result of `rec` if it is finished; `Err` when `rec` is another payload's turn.
    pub(super) fn finished(
        &self,
        rec: &TurnRecord,
        fp: &str,
    ) -> Result<Option<TurnResult>, Interrupted> {
        if rec.fingerprint != fp {
            return Err(Interrupted::NotTheTurns(Box::new(InvokeResult::failure(
                permanent(
                    ErrorCode::TurnConflict,
                    format!(
                        "turn {} already exists in session {} with a different payload",
                        rec.turn_id, rec.session_id
                    ),
                ),
            ))));
        }
        // A cancelled turn's status was published when it was cancelled: its job is dropped.
        if rec.status == TurnStatus::Cancelled
            && let Some(result) = &rec.result
        {
            info!("the turn was cancelled; dropping its job");
            return Err(Interrupted::NotTheTurns(Box::new(result.clone())));
        }
        let done = rec.status.is_settled() || rec.pending.is_some();
        match (&rec.result, done) {
            (Some(result), true) => {
                info!(
                    status = rec.status.as_str(),
                    "turn already ran; returning its stored result"
                );
                self.metrics.duplicate_suppressed("worker");
                Ok(Some(result.clone()))
            }
            _ => Ok(None),
        }
    }

    /// Writes the running turn (and the session, with `with_session`) under the lease, keeping
    /// the lease: the start of a run, an accepted continuation, a checkpoint before tools run.
    /// Returns whether the turn had been asked to stop, read in the same step.
    pub(super) async fn persist(
        &self,
        run: &mut Run,
        with_session: bool,
    ) -> Result<bool, RetryableFailure> {
        let session = with_session.then_some(&run.session);
        let saved = self
            .store
            .save(session, &run.record, run.lease(), false)
            .await
            .map_err(store_failure)?;
        if with_session {
            // The store holds them now.
            run.session.conversation.clear();
        }
        Ok(saved.stop_requested)
    }

    /// Records one server tool's output in the turn's ledger before the next model call, so a
    /// resumed run answers the call from the ledger instead of running the tool again.
    pub(super) async fn record_tool_output(
        &self,
        run: &mut Run,
        call_id: &str,
        output: &str,
    ) -> Result<(), RetryableFailure> {
        self.store
            .record_tool_output(
                &run.session.session_id,
                &run.record.turn_id,
                call_id,
                output,
                run.lease(),
            )
            .await
            .map_err(store_failure)?;
        run.record
            .tool_ledger
            .insert(call_id.to_string(), output.to_string());
        Ok(())
    }

    /// Writes a mode change and its history entry under the lease; the session as it now is.
    pub(super) async fn change_mode(
        &self,
        run: &Run,
        effect: ModeEffect,
    ) -> Result<SessionState, RetryableFailure> {
        self.store
            .change_mode(
                &run.session.session_id,
                &effect.mode_id,
                effect.change,
                run.lease(),
            )
            .await
            .map_err(|e| {
                tracing::error!(error = %e, session_id = %run.session.session_id, "agent_change_mode could not persist the mode");
                RetryableFailure {
                    error: permanent(
                        ErrorCode::ToolUnavailable,
                        format!(
                            "{}: ModeChangeTool failed to change the session mode.",
                            crate::catalog::CHANGE_MODE_TOOL
                        ),
                    ),
                    kind: RetryKind::Failure,
                }
            })
    }

    pub(super) async fn complete_turn(
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
        run.session.conversation.extend(progress.turn_items);
        run.session.updated_at = now_rfc3339();
        run.record.status = TurnStatus::Completed;
        run.record.completed_at = Some(now_rfc3339());
        run.record.pending = None;
        run.record.checkpoint = None;
        run.record.result = Some(result.clone());
        let result = self.settle(run, true, result).await?;
        info!(iterations, "turn completed");
        Ok(result)
    }

    pub(super) async fn await_client_tools(
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
            return Err(RetryableFailure {
                error: permanent(ErrorCode::Internal, "no client tool calls to wait for"),
                kind: RetryKind::Failure,
            });
        };
        let result =
            InvokeResult::success(AgentExecuteResponse::ClientToolContinuation(continuation));
        run.record.status = TurnStatus::AwaitingClientTools;
        run.record.pending = Some(PendingTools {
            response_id,
            client_calls,
            server_outputs,
            progress,
        });
        run.record.checkpoint = None;
        run.record.result = Some(result.clone());
        // The session's continuation id is *not* moved to this response: its calls are
        // unanswered. The session is saved for what changed (replay flag, latched context).
        let result = self.settle(run, true, result).await?;
        info!(calls = count, "turn waits for client tools");
        Ok(result)
    }

    pub(super) async fn fail_turn(
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
        run.record.result = Some(result.clone());
        // The session's continuation state is left as it was before the turn.
        self.settle(run, false, result).await
    }

    /// Ends a turn that was asked to stop: `cancelled`, its failed `TURN_CANCELLED` result
    /// stored; the session's continuation state stays as it was before the turn, so the next
    /// turn works.
    pub(super) async fn cancel_turn(&self, mut run: Run) -> Result<Settled, RetryableFailure> {
        info!("turn cancelled on request");
        run.record = Box::new(run.record.cancelled());
        let result = run.record.result.clone().unwrap_or_else(|| {
            InvokeResult::failure(permanent(ErrorCode::TurnCancelled, "turn cancelled"))
        });
        self.settle(run, false, result).await
    }

    /// Whether the turn was asked to stop (a store that cannot answer counts as "no": the
    /// next safe point asks again).
    pub(super) async fn cancel_requested(&self, sid: &SessionId, tid: &TurnId) -> bool {
        match self.store.cancel_requested(sid, tid).await {
            Ok(asked) => asked,
            Err(e) => {
                warn!(error = %e, "cannot tell whether the turn was cancelled; going on");
                false
            }
        }
    }

    /// Runs `work` unless the turn is asked to stop first (the pipeline's watch looks for every
    /// waiting turn at once, every [`CANCEL_POLL`]); `None` when it was: `work` is dropped, and
    /// with it an HTTP request in flight.
    pub(super) async fn unless_cancelled<T>(
        &self,
        sid: &SessionId,
        tid: &TurnId,
        work: impl std::future::Future<Output = T>,
    ) -> Option<T> {
        let watched = self.cancels.watch(sid, tid);
        tokio::select! {
            out = work => Some(out),
            () = watched.cancelled() => None,
        }
    }

    /// The write that ends this run of the turn: the record (and the session, with
    /// `with_session`) saved and the lease given back in one step. A write that fails hands the
    /// turn back to the queue instead.
    async fn settle(
        &self,
        mut run: Run,
        with_session: bool,
        result: TurnResult,
    ) -> Result<Settled, RetryableFailure> {
        let session = with_session.then_some(&run.session);
        let saved = match self
            .store
            .save(session, &run.record, run.lease(), true)
            .await
        {
            Ok(saved) => saved,
            Err(e) => return self.retry_later(run, store_failure(e)).await,
        };
        run.held.released_by_store();
        Ok(Settled {
            status: Some(TurnStatusView::from(run.record.as_ref())),
            result,
            watched: saved.watched,
        })
    }
}

/// Why a run cannot have the session now: another run holds its lease.
pub(super) fn busy(sid: &SessionId) -> NoLease {
    info!("session is busy with another turn");
    NoLease::Busy(RetryableFailure {
        error: permanent(
            ErrorCode::SessionBusy,
            format!("session {sid} is running another turn; this one will run after it"),
        ),
        kind: RetryKind::Failure,
    })
}

/// What a user turn's run starts from ([`Pipeline::begin`]).
pub(super) struct Begin {
    /// The turn as stored.
    pub(super) turn: Option<TurnRecord>,
    /// The session's lease, renewed; `None` when the session is busy.
    pub(super) held: Option<HeldLease>,
    /// The session as stored (read only with the lease).
    pub(super) session: Option<SessionState>,
    /// A new session's contexts, latched by the begin step.
    pub(super) latched: Option<ContextIds>,
}

/// The session's lease while a run holds it: renewed in the background until the run gives it
/// back — explicitly ([`HeldLease::release`]) or in the store's write that settles the turn
/// ([`HeldLease::released_by_store`]). A run that is abandoned without either (its task
/// cancelled, its process gone) stops renewing and leaves the lease to expire after its TTL, as
/// a crashed worker would: no write of the abandoned run can land after that (fencing).
pub(super) struct HeldLease {
    lease: Lease,
    session: SessionId,
    store: Arc<dyn SessionStore>,
    renewer: tokio::task::JoinHandle<()>,
    given_back: bool,
}

impl HeldLease {
    /// The lease, for the writes made under it.
    pub(super) fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Gives the lease back now; a store that cannot be reached lets it expire instead.
    pub(super) async fn release(mut self) {
        self.given_back = true;
        self.renewer.abort();
        if let Err(e) = self.store.release_lease(&self.session, &self.lease).await {
            warn!(session_id = %self.session, error = %e, "could not give the session lease back; it expires on its own");
        }
    }

    /// The store released the lease in the write that settled the turn.
    pub(super) fn released_by_store(&mut self) {
        self.given_back = true;
        self.renewer.abort();
    }
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.renewer.abort();
        if !self.given_back {
            tracing::debug!(session_id = %self.session, "run abandoned; its session lease expires on its own");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use super::Run;
    use crate::catalog::ModeCatalog;
    use crate::contract::{ErrorCode, SessionId, TurnId};
    use crate::llm::LlmClient;
    use crate::pipeline::{Pipeline, PipelineSettings};
    use crate::store::{MemoryStore, ModeChange, SessionStore, TurnRecord, now_rfc3339};
    use crate::tools::ModeEffect;

    /// A pipeline over a memory store, and a run of turn `t` of session `s` holding its lease.
    async fn running() -> (Arc<MemoryStore>, Pipeline, Run) {
        let store = Arc::new(MemoryStore::new());
        let catalog = Arc::new(ModeCatalog::builtin());
        let llm = LlmClient::new(
            "http://127.0.0.1:9/v1",
            None,
            Duration::from_secs(1),
            Duration::from_secs(1),
            0,
        )
        .unwrap();
        let dyn_store: Arc<dyn SessionStore> = store.clone();
        let pipeline = Pipeline::new(dyn_store, catalog, llm, PipelineSettings::new("m")).unwrap();
        let (sid, tid) = (SessionId::parse("s").unwrap(), TurnId::parse("t").unwrap());
        let held = pipeline.lease(&sid, &tid).await.unwrap();
        let mut run = Run {
            session: pipeline.new_session(&sid),
            record: Box::new(TurnRecord::queued(
                sid,
                tid,
                String::new(),
                "general".into(),
            )),
            held,
            live: None,
            stop_read: None,
        };
        pipeline.persist(&mut run, true).await.unwrap();
        (store, pipeline, run)
    }

    fn to_ddr(catalog: &ModeCatalog) -> ModeEffect {
        ModeEffect {
            mode_id: catalog.by_key("ddr_authoring").unwrap().id.clone(),
            change: ModeChange {
                previous_mode: "general".into(),
                new_mode: "ddr_authoring".into(),
                timestamp: now_rfc3339(),
                reason: "DDR work".into(),
                turn_id: TurnId::parse("t").unwrap(),
            },
        }
    }

    #[tokio::test]
    async fn a_mode_change_persists_with_its_history() {
        let (store, pipeline, run) = running().await;
        let changed = pipeline
            .change_mode(&run, to_ddr(&ModeCatalog::builtin()))
            .await
            .unwrap();
        assert_eq!(changed.mode_key, "ddr_authoring");
        let stored = store
            .get_session(&SessionId::parse("s").unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(
            (stored.mode_key.as_str(), stored.mode_history.len()),
            ("ddr_authoring", 1)
        );
        assert_eq!(stored.mode_history[0].reason, "DDR work");
    }

    #[tokio::test]
    async fn a_mode_change_that_cannot_persist_is_a_retryable_tool_failure() {
        let (store, pipeline, run) = running().await;
        // Another holder took over the session: the write is fenced.
        let sid = SessionId::parse("s").unwrap();
        store.release_lease(&sid, run.lease()).await.unwrap();
        store
            .acquire_lease(&sid, "other", Duration::from_secs(60))
            .await
            .unwrap()
            .unwrap();
        let failure = pipeline
            .change_mode(&run, to_ddr(&ModeCatalog::builtin()))
            .await
            .unwrap_err();
        assert_eq!(failure.error.error_code, ErrorCode::ToolUnavailable);
        assert_eq!(
            failure.error.message,
            "agent_change_mode: ModeChangeTool failed to change the session mode."
        );
        let stored = store.get_session(&sid).await.unwrap().unwrap();
        assert_eq!(stored.mode_key, "general", "nothing was written");
    }
}
