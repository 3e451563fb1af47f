//! The turn lifecycle (AGN-027 layer F: persistence is terminal). The one module that writes a
//! turn's state: it alone makes the store's [`Grant`], so every other module — the reasoner,
//! the model call, the server tools, the worker, the front door — moves a turn only through the
//! transitions here. A run's turn and session are held in a [`Run`] whose fields only this
//! module can change.
//!
//! The transitions, each **one atomic store step** (one Lua script on Redis, one lock on the
//! embedded store), checked against the session's lease:
//!
//! | transition | what the step writes |
//! |---|---|
//! | begin ([`Pipeline::begin`]) | the lease taken (and a new session's contexts latched), read with the turn and session |
//! | start ([`Pipeline::start_user_turn`], [`Pipeline::accept_tool_results`]) | the turn `running`, its attempt counted (and the session, when the turn changes it) |
//! | checkpoint ([`Pipeline::checkpoint`]) | a model answer that calls tools, before any of them runs |
//! | record a tool output ([`Pipeline::record_tool_output`]) | the ledger entry and, for `agent_change_mode`, the session's mode and history |
//! | complete / await client tools / fail / cancel | the turn's result and status, the session (conversation head, items, mode), the lease given back |
//! | hand back ([`Pipeline::hand_back`]) | after a failure that was not a write: the record as this run last stored it, the lease given back |
//!
//! and at the front door ([`Intake`]): admit a new turn, take back one whose job was not
//! accepted, queue a continuation (and take it back), cancel a waiting turn — each a
//! compare-and-set on the stored record.
//!
//! **A write whose answer is lost is never undone or overwritten.** When a step fails (an
//! error, a broken connection, a timeout), the store holds the turn either as it was before
//! the step or as the step left it — never half of it — and this run cannot tell which. From
//! then on the run writes nothing more of the turn: it gives the lease back by a
//! compare-and-delete on its own fencing token (a no-op when the step had already released
//! it, or when another run holds the lease) and the job runs again; the next run reads what
//! is stored and goes on from there (a stored result is published again, a checkpoint is
//! resumed, a recorded tool output is reused).
//!
//! Owns: the turn's state transitions in the store, the lease, the first shape of a session.
//! Must not: call the model or run tools.

mod intake;
mod lease;

pub mod bench;
pub use intake::Intake;
pub(super) use lease::HeldLease;

use std::sync::Arc;
use std::time::Duration;

use tracing::{info, warn};

use super::{
    Interrupted, NoLease, Pipeline, RetryKind, RetryableFailure, Settled, TurnResult, fingerprint,
    permanent, store_failure,
};
use crate::contract::{
    AgentExecuteRequest, AgentExecuteResponse, ClientToolContinuation, ErrorCode, ErrorMessage,
    FinalResponse, InvokeResult, SessionId, SessionMeta, ToolCall, TurnId,
};
use crate::live::LiveTurn;
use crate::llm::ModelResponse;
use crate::state::SentRequest;
use crate::store::{
    Checkpoint, ContextIds, Grant, Lease, PendingTools, Saved, SessionState, ToolOutput,
    TurnProgress, TurnRecord, TurnStatus, TurnStatusView, now_rfc3339,
};
use crate::tools::ModeEffect;

/// Layer F's grant: the right to call the store's turn-state writes. Nowhere else in `src/`
/// makes one (see the test `only_layer_f_makes_a_grant`).
const GRANT: Grant = Grant::layer_f();

/// How often a running model call looks for a cancel request.
pub(super) const CANCEL_POLL: Duration = Duration::from_millis(500);

/// Everything one run of a turn works on while it holds the session's lease: the turn and the
/// session as this run last stored them (plus what it has not stored yet: the requests it sent,
/// conversation items of the turn), the lease, and its live output. Other layers read it; only
/// this module changes it, in the transitions that write it.
pub(super) struct Run {
    session: SessionState,
    /// Boxed: a run moves through every step of the turn, and the record is its largest part.
    record: Box<TurnRecord>,
    held: HeldLease,
    /// The turn's live output, when its request asked for streaming.
    live: Option<Arc<LiveTurn>>,
    /// Whether the turn had been asked to stop, as the write just before the next model call
    /// read it: that call's safe point takes it instead of asking the store again (one round
    /// trip fewer before the call). Set only where nothing runs between that write and the
    /// call; taken by the call.
    stop_read: Option<bool>,
    /// A write of this run failed: the store holds the turn as it was before that step or as
    /// the step left it, and this run cannot tell which — so it writes nothing more.
    unsure: bool,
    /// See [`Run::take_reattach`].
    reattach: bool,
    /// Whether the record keeps what the model was sent and answered and the server tools'
    /// arguments (for the turn inspector); off for tenants whose `keepBodies` is false.
    keep_bodies: bool,
}

impl Run {
    fn open(
        session: SessionState,
        record: TurnRecord,
        held: HeldLease,
        live: Option<Arc<LiveTurn>>,
    ) -> Self {
        Self {
            session,
            record: Box::new(record),
            held,
            live,
            stop_read: None,
            unsure: false,
            reattach: false,
            keep_bodies: true,
        }
    }

    /// The session as the run sees it.
    pub(super) fn session(&self) -> &SessionState {
        &self.session
    }

    /// The turn as the run sees it.
    pub(super) fn record(&self) -> &TurnRecord {
        &self.record
    }

    /// The turn's live output, if it streams.
    pub(super) fn live(&self) -> Option<&Arc<LiveTurn>> {
        self.live.as_ref()
    }

    /// The lease the run holds.
    #[cfg(test)]
    fn lease(&self) -> &Lease {
        self.held.lease()
    }

    /// Whether the turn had been asked to stop, as the last write read it, if nothing has run
    /// since (see [`Run::stop_read`]).
    pub(super) fn take_stop_read(&mut self) -> Option<bool> {
        self.stop_read.take()
    }

    /// `Err` once a write of this run failed (see [`Run::unsure`]): it writes nothing more.
    fn may_write(&self) -> Result<(), RetryableFailure> {
        if self.unsure {
            return Err(store_failure(crate::store::StoreError::Unavailable(
                "an earlier write of this run went unanswered; the run writes nothing more".into(),
            )));
        }
        Ok(())
    }

    /// Whether this run took over from one that died waiting for a background model call
    /// (its live text was not replaced at the start); asked once, by the run's first call.
    pub(super) fn take_reattach(&mut self) -> bool {
        std::mem::take(&mut self.reattach)
    }

    /// Keeps a request sent to the model in the turn's transcript (stored with the next
    /// write), unless the tenant's bodies are not kept.
    pub(super) fn note_request(&mut self, body: SentRequest) {
        if self.keep_bodies {
            self.record.requests.push(body);
        } else {
            self.record.bodies_withheld = true;
        }
    }

    /// Notes what a model call came to in the turn's record (stored with the next write);
    /// without its text when the tenant's bodies are not kept.
    pub(super) fn note_call(&mut self, mut note: crate::state::CallNote) {
        if !self.keep_bodies {
            note.text = None;
        }
        self.record.calls.push(note);
    }

    /// Notes a server tool call in the turn's record (stored with the next write); without
    /// its arguments when the tenant's bodies are not kept.
    pub(super) fn note_tool(&mut self, mut note: crate::state::ToolNote) {
        if !self.keep_bodies {
            note.arguments.clear();
        }
        self.record.tools.push(note);
    }

    /// The model server does not store responses: the session replays its conversation from
    /// now on (stored with the write that settles the turn).
    pub(super) fn switch_to_replay(&mut self) {
        self.session.replay = true;
    }

    /// The turn's progress after a server tool's output was recorded, for its checkpoint
    /// (stored with the next write; a resumed run finds the output in the ledger either way).
    pub(super) fn note_progress(&mut self, progress: &TurnProgress) {
        if let Some(cp) = self.record.checkpoint.as_mut() {
            cp.progress = progress.clone();
        }
    }
}

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
            .acquire_lease(&GRANT, sid, &holder, self.settings.lease_ttl)
            .await
            .map_err(|e| NoLease::Failed(store_failure(e)))?
        {
            Some(lease) => self
                .replicated(sid, self.hold(sid, lease))
                .await
                .map_err(NoLease::Failed),
            None => Err(busy(sid)),
        }
    }

    /// `held`, once its fencing token is on as many replicas as the deployment requires
    /// ([`SessionStore::confirm_replicated`](crate::store::SessionStore::confirm_replicated));
    /// else given back.
    async fn replicated(
        &self,
        sid: &SessionId,
        held: HeldLease,
    ) -> Result<HeldLease, RetryableFailure> {
        match self.store.confirm_replicated(sid).await {
            Ok(()) => Ok(held),
            Err(e) => {
                held.release().await;
                Err(store_failure(e))
            }
        }
    }

    /// The start of a user turn's run: the session's lease, taken with the turn and the
    /// session read under it in one store step (see
    /// [`SessionStore::begin_turn`](crate::store::SessionStore::begin_turn)). The turn
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
                &GRANT,
                sid,
                tid,
                &self.holder(tid),
                self.settings.lease_ttl,
                contexts,
            )
            .await
            .map_err(store_failure)?;
        let held = match begun.lease {
            Some(lease) => Some(self.replicated(sid, self.hold(sid, lease)).await?),
            None => None,
        };
        Ok(Begin {
            turn: begun.turn,
            held,
            session: begun.session,
            latched: begun.latched,
        })
    }

    /// Who takes a lease: this worker, the turn, and this taking of it. The last part makes
    /// every lease value unique, so a run is fenced out by its own lease value, not only by its
    /// token: a failover that loses the latest fencing token (and the lease) cannot give a
    /// later run of the same turn on this worker the very value an earlier run still writes
    /// with.
    fn holder(&self, tid: &TurnId) -> String {
        format!(
            "{}/{tid}/{}",
            self.settings.worker_id,
            uuid::Uuid::new_v4().simple()
        )
    }

    /// Keeps `lease` renewed in the background until the run gives it back.
    fn hold(&self, sid: &SessionId, lease: Lease) -> HeldLease {
        let ttl = self.settings.lease_ttl;
        let store = self.store.clone();
        let (sid2, lease2) = (sid.clone(), lease.clone());
        let renewer = tokio::spawn(async move {
            loop {
                tokio::time::sleep(ttl / 3).await;
                match store.renew_lease(&GRANT, &sid2, &lease2, ttl).await {
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
            previous_call: None,
            solution_context: None,
            contexts: Default::default(),
            owner: None,
            created_at: now.clone(),
            updated_at: now,
        }
    }

    /// The one write of a run's turn (and, with `with_session`, its session) through
    /// [`SessionStore::save`](crate::store::SessionStore::save); with `release`, the lease is
    /// given back in the same step. A failure marks the run unsure (see [`Run::unsure`]).
    async fn write(
        &self,
        run: &mut Run,
        with_session: bool,
        release: bool,
    ) -> Result<Saved, RetryableFailure> {
        run.may_write()?;
        let session = with_session.then_some(&run.session);
        match self
            .store
            .save(&GRANT, session, &run.record, run.held.lease(), release)
            .await
        {
            Ok(saved) => {
                if with_session {
                    // The store holds them now.
                    run.session.conversation.clear();
                }
                if release {
                    run.held.released_by_store();
                }
                Ok(saved)
            }
            Err(e) => {
                run.unsure = true;
                Err(store_failure(e))
            }
        }
    }

    /// Starts a run of a user turn: the turn (the stored record, or a new one) becomes
    /// `running` with its attempt counted, and is written with the session when `changed` (a
    /// new session, or one the turn changes). A fresh run's next step is its model call, whose
    /// safe point this write answers (whether the turn had been asked to stop). A write that
    /// fails hands the turn back.
    pub(super) async fn start_user_turn(
        &self,
        held: HeldLease,
        mut record: TurnRecord,
        session: SessionState,
        changed: bool,
        live: Option<Arc<LiveTurn>>,
    ) -> Result<Run, RetryableFailure> {
        record.status = TurnStatus::Running;
        record.mode_key = session.mode_key.clone();
        record.attempts += 1;
        // A run that died waiting for a background call: this one re-attaches to it and its
        // text goes on where the client's stopped (the call says otherwise if it cannot).
        let reattach = record.model_call.is_some() && record.attempts > 1;
        record.note_event(
            "run_started",
            reattach.then(|| "it follows the background model call an earlier run made".into()),
        );
        if let Some(live) = &live {
            if reattach {
                live.resume(record.attempts);
            } else {
                live.rerun(record.attempts);
            }
        }
        let mut run = Run::open(session, record, held, live);
        run.reattach = reattach;
        run.keep_bodies = self.keeps_bodies(&run.session);
        match self.write(&mut run, changed, false).await {
            Ok(saved) => {
                if run.record.checkpoint.is_none() {
                    run.stop_read = Some(saved.stop_requested);
                }
                Ok(run)
            }
            Err(f) => Err(self.hand_back(run, f).await),
        }
    }

    /// Fails a user turn at the start of a run (its contexts cannot run), as an attempt.
    pub(super) async fn fail_at_start(
        &self,
        held: HeldLease,
        mut record: TurnRecord,
        session: SessionState,
        live: Option<Arc<LiveTurn>>,
        result: TurnResult,
    ) -> Result<Settled, RetryableFailure> {
        record.attempts += 1;
        self.fail_turn(Run::open(session, record, held, live), result)
            .await
    }

    /// A run of a continuation for a turn waiting for client tools (nothing written yet): the
    /// turn `running` with its attempt counted, the session's owner and mode key as the run
    /// sees them. Next: [`Pipeline::accept_tool_results`], or a failure.
    pub(super) fn open_continuation(
        &self,
        held: HeldLease,
        mut record: TurnRecord,
        mut session: SessionState,
        tenant: Option<&str>,
        live: Option<Arc<LiveTurn>>,
    ) -> Run {
        // Still running: a run of this continuation died, and this one replaces its text.
        let again = record.status == TurnStatus::Running;
        record.status = TurnStatus::Running;
        record.attempts += 1;
        record.note_event("run_started", Some("with the client's tool results".into()));
        if let Some(live) = &live {
            if again {
                live.rerun(record.attempts);
            } else {
                live.resume(record.attempts);
            }
        }
        if let Some(t) = tenant {
            session.owner = Some(t.to_string());
        }
        session.mode_key = self.catalog.by_id_or_default(&session.mode_id).key.clone();
        let mut run = Run::open(session, record, held, live);
        run.keep_bodies = self.keeps_bodies(&run.session);
        run
    }

    /// Whether turns of the session's owner keep their bodies in the record.
    fn keeps_bodies(&self, session: &SessionState) -> bool {
        session
            .owner
            .as_deref()
            .is_none_or(|t| self.quotas.tenants().keeps_bodies(t))
    }

    /// Records that the client's results for these calls were accepted, with the turn
    /// `running`. Returns whether the turn had been asked to stop, read in the same step.
    pub(super) async fn accept_tool_results(
        &self,
        run: &mut Run,
        submitted: Vec<String>,
    ) -> Result<bool, RetryableFailure> {
        run.record.answered.extend(submitted);
        let saved = self.write(run, false, false).await?;
        run.stop_read = Some(saved.stop_requested);
        Ok(saved.stop_requested)
    }

    /// Saves a model answer that calls tools before any of them runs, so a re-run resumes
    /// from it instead of running them twice.
    pub(super) async fn checkpoint(
        &self,
        run: &mut Run,
        response: &ModelResponse,
        progress: &TurnProgress,
    ) -> Result<(), RetryableFailure> {
        run.record.checkpoint = Some(Checkpoint {
            response: response.clone(),
            progress: progress.clone(),
        });
        // The call it answers is over: nothing to re-attach to.
        run.record.model_call = None;
        self.write(run, false, false).await.map(|_| ())
    }

    /// Records the background model call this run is about to wait for, before it waits
    /// (a fenced write like every other): a run that dies during the call is followed by one
    /// that re-attaches to it. A failed write hands the turn back.
    pub(super) async fn note_model_call(
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
    pub(super) async fn record_tool_output(
        &self,
        run: &mut Run,
        call_id: &str,
        output: &str,
        effect: Option<ModeEffect>,
    ) -> Result<bool, RetryableFailure> {
        run.may_write()?;
        let mode = effect.as_ref().map(|e| (e.mode_id.as_str(), &e.change));
        let recorded = self
            .store
            .record_tool_output(
                &GRANT,
                &run.session.session_id,
                &run.record.turn_id,
                ToolOutput {
                    call_id,
                    output,
                    mode_change: mode,
                },
                run.held.lease(),
            )
            .await;
        let changed = match recorded {
            Ok(changed) => changed,
            Err(e) if effect.is_some() => {
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
        run.session.mode_id = stored.mode_id;
        run.session.mode_key = stored.mode_key;
        run.session.mode_history = stored.mode_history;
        run.session.updated_at = stored.updated_at;
        // The step moved any conversation items the stored session still held inline (the
        // only items pending before the turn settles).
        run.session.conversation.clear();
        Ok(true)
    }

    /// Hands the turn back to the queue after a retryable failure, giving the lease back so a
    /// retry can proceed at once; returns the failure for the caller to report.
    ///
    /// After a failure that was not a write (the model, a tool, no capacity), the store holds
    /// exactly what this run last wrote: the record is written once more as the run holds it
    /// (with the requests it sent), releasing the lease in the same step. After a failed write
    /// the run cannot know what the store holds, so it writes nothing of the turn: it only
    /// gives the lease back if it still holds it, and the next run reads what is there.
    pub(super) async fn hand_back(
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
        run.session.previous_call = progress.last_call;
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
            let failure = RetryableFailure {
                error: permanent(ErrorCode::Internal, "no client tool calls to wait for"),
                kind: RetryKind::Failure,
            };
            return Err(self.hand_back(run, failure).await);
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
    /// turn back without writing anything more: the store holds the turn either as it was
    /// before this step or as settled by it, and the next run goes on from whichever it finds.
    async fn settle(
        &self,
        mut run: Run,
        with_session: bool,
        result: TurnResult,
    ) -> Result<Settled, RetryableFailure> {
        // A cancelled record noted its end when it was made so.
        let ended = match run.record.status {
            TurnStatus::Completed => Some("completed"),
            TurnStatus::Failed => Some("failed"),
            TurnStatus::AwaitingClientTools => Some("awaiting_client_tools"),
            TurnStatus::Cancelled | TurnStatus::Queued | TurnStatus::Running => None,
        };
        if let Some(event) = ended {
            let detail = result
                .errors()
                .first()
                .map(|e| format!("{}: {}", e.error_code, e.message));
            run.record.note_event(event, detail);
        }
        let saved = match self.write(&mut run, with_session, true).await {
            Ok(saved) => saved,
            Err(f) => return Err(self.hand_back(run, f).await),
        };
        Ok(Settled {
            status: Some(TurnStatusView::from(run.record.as_ref())),
            result,
            watched: saved.watched,
        })
    }

    /// The session's lease and, under it, the turn as stored (a run outside a job's normal
    /// path: giving a turn up, failing an unreadable job's turn).
    async fn lease_and_read(
        &self,
        sid: &SessionId,
        tid: &TurnId,
    ) -> Result<(HeldLease, Option<TurnRecord>), RetryableFailure> {
        let held = self
            .lease(sid, tid)
            .await
            .map_err(NoLease::into_retryable)?;
        match self.store.get_turn(sid, tid).await {
            Ok(record) => Ok((held, record)),
            Err(e) => {
                held.release().await;
                Err(store_failure(e))
            }
        }
    }

    /// Fails a turn for good after its retries ran out (the queue calls this before it
    /// dead-letters the job), so the failure is stored and published like any result. Returns
    /// the stored result instead when the turn already finished.
    pub async fn give_up(
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
            return Ok(Settled::stored(result));
        }
        self.fail_held(held, record, InvokeResult::failure(error))
            .await
    }

    /// Fails the turn of a job the worker cannot read (the front door accepted it under
    /// other limits, say), so that it does not stay `queued` behind a job that is gone: only a
    /// turn that is queued, or was running when a run of it died. A turn that ended already
    /// answers with its stored result (to publish again); `None` when there is no turn, or it
    /// waits for client tools.
    pub async fn fail_unreadable(
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
                Ok(record.result.map(Settled::stored))
            }
            _ => {
                held.release().await;
                Ok(None)
            }
        }
    }

    /// Fails `record`'s turn for good under `held`, with the session as stored.
    async fn fail_held(
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
        let run = Run::open(session, record, held, None);
        self.fail_turn(run, result).await
    }
}

/// Why a run cannot have the session now: another run holds its lease.
pub(super) fn busy(sid: &SessionId) -> NoLease {
    info!("session is busy with another turn");
    NoLease::Busy(RetryableFailure {
        error: permanent(
            ErrorCode::SessionBusy,
            format!(
                "session {} is running another turn; this one will run after it",
                sid.client_id()
            ),
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

#[cfg(test)]
mod tests;
