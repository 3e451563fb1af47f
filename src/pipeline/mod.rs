//! The agent pipeline: reasoner loop (AGN-027 layer E) and turn lifecycle (layer F), driving
//! composition ([`compose`]), the model client ([`crate::llm`]) and server tools
//! ([`crate::tools`]).
//!
//! Only [`Pipeline::run`] loops, re-invokes the model and applies mode changes. A failure fails
//! the **turn**, never the session: the session's continuation id is only moved forward when a
//! turn reaches a point where every function call of the last response has been answered.

pub mod compose;

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};
use sha2::{Digest, Sha256};
use tracing::{Instrument as _, info, info_span, warn};

use crate::catalog::{ModeCatalog, ToolDef, ToolLocation};
use crate::config::LOCAL_TENANT;
use crate::contexts::{DEFAULT_CONTEXT, KnownContexts};
use crate::contract::request::JsonText;
use crate::contract::{
    AgentExecuteRequest, AgentExecuteResponse, ClientToolContinuation, ErrorCode, ErrorMessage,
    FinalResponse, InvokeResult, SessionId, SessionMeta, ToolCall, ToolCallId, ToolContinuation,
    ToolOutcome, ToolResult, TurnId, UserTurn, check_tool_results,
};
use crate::llm::{LlmClient, LlmError, ModelResponse, OutputItem};
use crate::metrics::Metrics;
use crate::rag::{RagBudget, RagQuery, Retriever};
use crate::store::{
    Checkpoint, Lease, PendingTools, SessionState, SessionStore, StoreError, TurnProgress,
    TurnRecord, TurnStatus, now_rfc3339,
};
use crate::tools::{ToolContext, ToolRegistry, ToolRun};
use compose::{CallSpec, Continuation};

/// The boot prompt used when a turn names no conversation context.
pub const DEFAULT_BOOT_PROMPT: &str = "You are the Aptix Reasoner, an assistant for software teams working with Aptix design records (DDRs), workflows and code. Answer in Markdown. Use only the material in [CONTEXT] as authoritative source content, cite chunks by Id or number, and say so when something you need is missing. Put machine-readable payloads in fenced code blocks with a language tag.";

/// A failure that may succeed if the turn is run again later (the queue retries it).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .error)]
pub struct RetryableFailure {
    /// What went wrong, as the client would see it if retries run out.
    pub error: ErrorMessage,
}

/// Settings of the pipeline.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    /// Model name.
    pub model: String,
    /// Model calls one turn may make.
    pub max_iterations: usize,
    /// Always replay the conversation instead of using `previous_response_id`.
    pub replay: bool,
    /// Boot prompts by conversation context id (`default` is used when none is named).
    pub conversation_contexts: HashMap<String, String>,
    /// Known agent context ids (model endpoint/credentials); only `default` today.
    pub agent_contexts: Vec<String>,
    /// How long a session lease lasts without renewal (renewed every third of it).
    pub lease_ttl: std::time::Duration,
    /// This process's id, part of every lease holder name.
    pub worker_id: String,
}

impl PipelineSettings {
    /// The context ids these settings know.
    pub fn known_contexts(&self) -> KnownContexts {
        KnownContexts::new(
            self.agent_contexts.iter().cloned(),
            self.conversation_contexts.keys().cloned(),
        )
    }

    /// Defaults for a model name.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            max_iterations: 8,
            replay: false,
            conversation_contexts: HashMap::from([(
                DEFAULT_CONTEXT.to_string(),
                DEFAULT_BOOT_PROMPT.to_string(),
            )]),
            agent_contexts: vec![DEFAULT_CONTEXT.to_string()],
            lease_ttl: std::time::Duration::from_secs(30),
            worker_id: format!("worker-{}", uuid::Uuid::new_v4().simple()),
        }
    }
}

/// Runs turns.
#[derive(Clone)]
pub struct Pipeline {
    store: Arc<dyn SessionStore>,
    catalog: Arc<ModeCatalog>,
    llm: LlmClient,
    tools: ToolRegistry,
    settings: Arc<PipelineSettings>,
    /// The settings' context ids, computed once.
    contexts: Arc<KnownContexts>,
    metrics: Arc<Metrics>,
    rag: Option<Rag>,
}

/// Retrieval for the `[CONTEXT]` block.
#[derive(Clone)]
struct Rag {
    retriever: Arc<dyn Retriever>,
    budget: RagBudget,
}

type TurnResult = InvokeResult<AgentExecuteResponse>;

fn permanent(code: ErrorCode, message: impl Into<String>) -> ErrorMessage {
    ErrorMessage::new(code, message)
}

fn store_failure(e: StoreError) -> RetryableFailure {
    RetryableFailure {
        error: ErrorMessage::new(ErrorCode::Internal, format!("{e}")),
    }
}

/// A held session lease, renewed in the background until dropped.
struct HeldLease {
    lease: Lease,
    renewer: tokio::task::JoinHandle<()>,
}

impl Drop for HeldLease {
    fn drop(&mut self) {
        self.renewer.abort();
    }
}

/// Everything one run of a turn works on while it holds the session's lease.
struct Run {
    session: SessionState,
    record: TurnRecord,
    held: HeldLease,
}

impl Run {
    fn lease(&self) -> &Lease {
        &self.held.lease
    }
}

/// The request fingerprint: the same ids with another payload is a conflict.
pub fn fingerprint(turn: &UserTurn) -> String {
    sha256_hex(&serde_json::to_vec(turn).unwrap_or_default())
}

/// The fingerprint of a continuation's tool results: the front door accepts one continuation
/// per wait for client tools, and recognises the same one sent again.
pub fn continuation_fingerprint(cont: &ToolContinuation) -> String {
    sha256_hex(&serde_json::to_vec(cont.tool_results()).unwrap_or_default())
}

fn sha256_hex(bytes: &[u8]) -> String {
    use std::fmt::Write as _;
    let digest = Sha256::digest(bytes);
    digest.iter().fold(String::with_capacity(64), |mut out, b| {
        let _ = write!(out, "{b:02x}");
        out
    })
}

impl Pipeline {
    /// A pipeline over a store, catalog and model client, with the built-in server tools.
    pub fn new(
        store: Arc<dyn SessionStore>,
        catalog: Arc<ModeCatalog>,
        llm: LlmClient,
        settings: PipelineSettings,
    ) -> Result<Self, String> {
        let tools = ToolRegistry::builtin(store.clone(), catalog.clone());
        tools.check_catalog(&catalog)?;
        Ok(Self {
            store,
            catalog,
            llm,
            tools,
            contexts: Arc::new(settings.known_contexts()),
            settings: Arc::new(settings),
            metrics: Arc::default(),
            rag: None,
        })
    }

    /// Adds retrieved chunks to every user turn's `[CONTEXT]` block, within `budget`.
    pub fn with_rag(mut self, retriever: Arc<dyn Retriever>, budget: RagBudget) -> Self {
        self.rag = Some(Rag { retriever, budget });
        self
    }

    /// The request's artifacts plus, with retrieval configured, the chunks retrieved for the
    /// turn (scoped by its `ragScope`, in rank order, cut to the budget). Retrieval is
    /// advisory: when the index cannot be read the turn goes on with its artifacts alone.
    async fn context_chunks(&self, sid: &SessionId, turn: &UserTurn) -> Vec<compose::ContextChunk> {
        let artifacts = compose::artifact_chunks(turn);
        let Some(rag) = &self.rag else {
            return artifacts;
        };
        let tenant = match self.store.owner(sid).await {
            Ok(owner) => owner.unwrap_or_else(|| LOCAL_TENANT.to_string()),
            Err(e) => {
                warn!(error = %e, "cannot read the session's owner; no retrieval for this turn");
                return artifacts;
            }
        };
        let mut text = turn.instruction().unwrap_or_default().to_string();
        // Artifact names without their extensions: `.md` would match every Markdown chunk.
        for a in turn.input_artifacts() {
            let name = a
                .relative_path()
                .as_str()
                .rsplit('/')
                .next()
                .unwrap_or_default();
            text.push(' ');
            text.push_str(name.rsplit_once('.').map_or(name, |(stem, _)| stem));
        }
        let query = RagQuery {
            text,
            conditions: turn
                .rag_scope()
                .map(|s| s.conditions.clone())
                .unwrap_or_default(),
            exclude_paths: turn
                .input_artifacts()
                .iter()
                .map(|a| a.relative_path().as_str().to_string())
                .collect(),
            limit: rag.budget.max_chunks,
        };
        let retrieved = match rag.retriever.retrieve(&tenant, &query).await {
            Ok(r) => r,
            Err(e) => {
                warn!(error = %e, "retrieval failed; the turn goes on without retrieved context");
                return artifacts;
            }
        };
        let found = retrieved.len();
        let retrieved: Vec<_> = retrieved.iter().map(|s| s.chunk.to_context()).collect();
        let (chunks, cut) = crate::rag::within_budget(artifacts, retrieved, rag.budget);
        info!(
            %tenant,
            retrieved = found,
            used = found - cut.ids.len(),
            "retrieved context"
        );
        if !cut.ids.is_empty() {
            info!(
                cut_chunks = ?cut.ids,
                cut_chars = cut.chars,
                max_chars = rag.budget.max_chars,
                "context budget reached; retrieved chunks left out"
            );
        }
        chunks
    }

    /// Counts suppressed duplicates in `metrics`.
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// The context ids this pipeline can run (the front door refuses others).
    pub fn known_contexts(&self) -> KnownContexts {
        self.contexts.as_ref().clone()
    }

    /// The store (for callers that read turn status).
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// Runs one request to its next stable point: a final answer, a client tool continuation,
    /// or a failed turn (all returned as `Ok` and stored). `Err` means "try again later": the
    /// session is busy, or the model, the store or a server tool is unavailable.
    pub async fn run(&self, request: &AgentExecuteRequest) -> Result<TurnResult, RetryableFailure> {
        let span =
            info_span!("turn", session_id = %request.session_id(), turn_id = %request.turn_id());
        async {
            match request {
                AgentExecuteRequest::UserTurn(turn) => self.run_user_turn(turn).await,
                AgentExecuteRequest::ToolContinuation(c) => self.run_continuation(c).await,
            }
        }
        .instrument(span)
        .await
    }

    /// Fails a turn for good after its retries ran out (the queue calls this before it
    /// dead-letters the job), so the failure is stored and published like any result. Returns
    /// the stored result instead when the turn already finished.
    pub async fn give_up(
        &self,
        request: &AgentExecuteRequest,
        error: ErrorMessage,
    ) -> Result<TurnResult, RetryableFailure> {
        let (sid, tid) = (request.session_id(), request.turn_id());
        let held = self.lease(sid, tid).await?;
        let record = match self.store.get_turn(sid, tid).await {
            Ok(r) => r,
            Err(e) => {
                let _ = self.store.release_lease(sid, &held.lease).await;
                return Err(store_failure(e));
            }
        };
        let fp = match request {
            AgentExecuteRequest::UserTurn(t) => fingerprint(t),
            AgentExecuteRequest::ToolContinuation(_) => String::new(),
        };
        let mut record = match record {
            Some(r) => r,
            None => TurnRecord::queued(sid.clone(), tid.clone(), fp, String::new()),
        };
        if matches!(record.status, TurnStatus::Completed | TurnStatus::Failed)
            && let Some(result) = record.result.clone()
        {
            let _ = self.store.release_lease(sid, &held.lease).await;
            return Ok(result);
        }
        let session = match self.store.get_session(sid).await {
            Ok(s) => s,
            Err(e) => {
                let _ = self.store.release_lease(sid, &held.lease).await;
                return Err(store_failure(e));
            }
        };
        record.status = TurnStatus::Running;
        let run = Run {
            session: session.unwrap_or_else(|| self.new_session(sid)),
            record,
            held,
        };
        self.fail_turn(run, InvokeResult::failure(error)).await
    }

    fn new_session(&self, sid: &SessionId) -> SessionState {
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
            owner: None,
            created_at: now.clone(),
            updated_at: now,
        }
    }

    /// Takes the session's lease (one turn at a time per session) and keeps it renewed.
    async fn lease(&self, sid: &SessionId, tid: &TurnId) -> Result<HeldLease, RetryableFailure> {
        let holder = format!("{}/{tid}", self.settings.worker_id);
        let ttl = self.settings.lease_ttl;
        let Some(lease) = self
            .store
            .acquire_lease(sid, &holder, ttl)
            .await
            .map_err(store_failure)?
        else {
            info!("session is busy with another turn");
            return Err(RetryableFailure {
                error: permanent(
                    ErrorCode::SessionBusy,
                    format!("session {sid} is running another turn; this one will run after it"),
                ),
            });
        };
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
        Ok(HeldLease { lease, renewer })
    }

    /// Gives the lease back after a retryable failure so a retry can proceed at once.
    async fn retry_later(
        &self,
        run: Run,
        failure: RetryableFailure,
    ) -> Result<TurnResult, RetryableFailure> {
        if let Err(e) = self.store.save(None, &run.record, run.lease(), true).await {
            warn!(error = %e, "could not save the turn before retrying it later");
            let _ = self
                .store
                .release_lease(&run.session.session_id, run.lease())
                .await;
        }
        warn!(code = %failure.error.error_code, message = %failure.error.message, "turn will be retried later");
        Err(failure)
    }

    async fn run_user_turn(&self, turn: &UserTurn) -> Result<TurnResult, RetryableFailure> {
        let (sid, tid) = (turn.session_id(), turn.turn_id());
        let fp = fingerprint(turn);
        if let Some(done) = self.stored_outcome(sid, tid, &fp).await? {
            return Ok(done);
        }
        let held = self.lease(sid, tid).await?;
        // Another worker may have finished the turn while we waited for the lease.
        let existing = match self.store.get_turn(sid, tid).await {
            Ok(r) => r,
            Err(e) => {
                let _ = self.store.release_lease(sid, &held.lease).await;
                return Err(store_failure(e));
            }
        };
        if let Some(rec) = &existing
            && let Some(done) = self.finished(rec, &fp)
        {
            let _ = self.store.release_lease(sid, &held.lease).await;
            return Ok(done);
        }
        // The front door refuses unknown context ids; a job that names one anyway (a worker
        // configured differently from the front door) fails its turn, stored like any result.
        if let Err(errors) = self.contexts.check(turn) {
            let mut record = existing
                .unwrap_or_else(|| TurnRecord::queued(sid.clone(), tid.clone(), fp, String::new()));
            record.attempts += 1;
            let run = Run {
                session: self.new_session(sid),
                record,
                held,
            };
            let failed = InvokeResult::failures(errors).unwrap_or_else(|| {
                InvokeResult::failure(permanent(ErrorCode::UnknownContext, "unknown context"))
            });
            return self.fail_turn(run, failed).await;
        }
        let boot = turn
            .conversation_context_id()
            .and_then(|id| self.settings.conversation_contexts.get(id))
            .or_else(|| self.settings.conversation_contexts.get(DEFAULT_CONTEXT))
            .cloned()
            .unwrap_or_else(|| DEFAULT_BOOT_PROMPT.to_string());

        let now = now_rfc3339();
        let loaded = match self.store.get_session(sid).await {
            Ok(s) => s,
            Err(e) => {
                let _ = self.store.release_lease(sid, &held.lease).await;
                return Err(store_failure(e));
            }
        };
        let mut session = loaded.unwrap_or_else(|| self.new_session(sid));
        // A session whose stored mode id is no longer in the catalog continues in the default.
        let mode = self.catalog.by_id_or_default(&session.mode_id).clone();
        session.mode_key = mode.key.clone();
        if let Some(ctx) = turn.solution_context_text() {
            session.solution_context = Some(ctx.to_string());
        }
        session.updated_at = now.clone();

        let mut record = existing
            .unwrap_or_else(|| TurnRecord::queued(sid.clone(), tid.clone(), fp, mode.key.clone()));
        record.status = TurnStatus::Running;
        record.mode_key = mode.key.clone();
        record.attempts += 1;
        let run = Run {
            session,
            record,
            held,
        };
        // The session exists (and the turn is running) before any tool can touch it.
        if let Err(e) = self
            .store
            .save(Some(&run.session), &run.record, run.lease(), false)
            .await
        {
            return self.retry_later(run, store_failure(e)).await;
        }
        info!(mode = %mode.key, attempt = run.record.attempts, resumed = run.record.checkpoint.is_some(), "turn started");

        if run.record.checkpoint.is_some() {
            // A crashed or retried run left a resume point: continue from it.
            let previous = None;
            return self
                .reason(run, TurnProgress::default(), Vec::new(), previous)
                .await;
        }
        let first_call =
            run.session.previous_response_id.is_none() && run.session.conversation.is_empty();
        let mut input = Vec::new();
        if first_call {
            input.push(compose::system_message(&boot));
        }
        let chunks = self.context_chunks(sid, turn).await;
        input.push(compose::user_message(
            &run.session.mode_key,
            turn,
            run.session.solution_context.as_deref(),
            &chunks,
        ));
        let progress = TurnProgress {
            tools_mode_key: mode.key.clone(),
            ..Default::default()
        };
        let previous = run.session.previous_response_id.clone();
        self.reason(run, progress, input, previous).await
    }

    /// The stored result of a user turn that already ran (or a conflict), if any.
    async fn stored_outcome(
        &self,
        sid: &SessionId,
        tid: &TurnId,
        fp: &str,
    ) -> Result<Option<TurnResult>, RetryableFailure> {
        let existing = self.store.get_turn(sid, tid).await.map_err(store_failure)?;
        Ok(existing.and_then(|rec| self.finished(&rec, fp)))
    }

    fn finished(&self, rec: &TurnRecord, fp: &str) -> Option<TurnResult> {
        if rec.fingerprint != fp {
            return Some(InvokeResult::failure(permanent(
                ErrorCode::TurnConflict,
                format!(
                    "turn {} already exists in session {} with a different payload",
                    rec.turn_id, rec.session_id
                ),
            )));
        }
        let done = matches!(
            rec.status,
            TurnStatus::Completed | TurnStatus::Failed | TurnStatus::AwaitingClientTools
        ) || rec.pending.is_some();
        match (&rec.result, done) {
            (Some(result), true) => {
                info!(
                    status = rec.status.as_str(),
                    "turn already ran; returning its stored result"
                );
                self.metrics.duplicate_suppressed("worker");
                Some(result.clone())
            }
            _ => None,
        }
    }

    async fn run_continuation(
        &self,
        cont: &ToolContinuation,
    ) -> Result<TurnResult, RetryableFailure> {
        let (sid, tid) = (cont.session_id(), cont.turn_id());
        let fp = continuation_fingerprint(cont);
        let submitted: Vec<String> = cont
            .tool_results()
            .iter()
            .map(|r| r.tool_call_id.to_string())
            .collect();
        let check = |record: Option<TurnRecord>| -> Result<TurnRecord, Box<TurnResult>> {
            let Some(record) = record else {
                return Err(Box::new(InvokeResult::failure(permanent(
                    ErrorCode::TurnNotFound,
                    format!("turn {tid} does not exist in session {sid}"),
                ))));
            };
            // A continuation that was already applied (a redelivery) gets the turn's result.
            if submitted.iter().all(|id| record.answered.contains(id))
                && let Some(result) = &record.result
                && record.status != TurnStatus::Running
            {
                self.metrics.duplicate_suppressed("worker");
                return Err(Box::new(result.clone()));
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
                return Err(Box::new(InvokeResult::failure(permanent(
                    ErrorCode::TurnNotAwaitingTools,
                    format!(
                        "turn {tid} is {}, not awaiting_client_tools; tool results are not accepted",
                        record.status.as_str()
                    ),
                ))));
            }
            Ok(record)
        };
        if let Err(answer) = check(self.store.get_turn(sid, tid).await.map_err(store_failure)?) {
            return Ok(*answer);
        }
        let held = self.lease(sid, tid).await?;
        let reread = match self.store.get_turn(sid, tid).await {
            Ok(r) => r,
            Err(e) => {
                let _ = self.store.release_lease(sid, &held.lease).await;
                return Err(store_failure(e));
            }
        };
        let mut record = match check(reread) {
            Ok(r) => r,
            Err(answer) => {
                let _ = self.store.release_lease(sid, &held.lease).await;
                return Ok(*answer);
            }
        };
        let session = match self.store.get_session(sid).await {
            Ok(Some(s)) => s,
            other => {
                let _ = self.store.release_lease(sid, &held.lease).await;
                return Err(store_failure(match other {
                    Err(e) => e,
                    _ => StoreError::Corrupt(format!("session {sid} of a waiting turn is missing")),
                }));
            }
        };
        let Some(pending) = record.pending.clone() else {
            let _ = self.store.release_lease(sid, &held.lease).await;
            return Err(store_failure(StoreError::Corrupt(
                "pending calls vanished".into(),
            )));
        };
        let expected: Vec<ToolCallId> = pending
            .client_calls
            .iter()
            .map(|c| c.tool_call_id.clone())
            .collect();
        record.status = TurnStatus::Running;
        record.attempts += 1;
        let mut run = Run {
            session,
            record,
            held,
        };
        run.session.mode_key = self
            .catalog
            .by_id_or_default(&run.session.mode_id)
            .key
            .clone();
        if let Err(mismatch) = check_tool_results(&expected, cont.tool_results()) {
            warn!(%mismatch, "tool results do not match the pending calls; failing the turn");
            return self
                .fail_turn(run, InvokeResult::failure(mismatch.to_error()))
                .await;
        }
        run.record.answered.extend(submitted);
        if let Err(e) = self.store.save(None, &run.record, run.lease(), false).await {
            return self.retry_later(run, store_failure(e)).await;
        }
        if run.record.checkpoint.is_some() {
            return self
                .reason(run, TurnProgress::default(), Vec::new(), None)
                .await;
        }
        let mut input: Vec<Value> = pending
            .server_outputs
            .iter()
            .map(|(id, out)| compose::tool_output(id, out))
            .collect();
        for r in cont.tool_results() {
            let output = match &r.outcome {
                ToolOutcome::Result(json) => json.as_str().to_string(),
                ToolOutcome::Error(msg) => json!({"error": msg}).to_string(),
            };
            input.push(compose::tool_output(r.tool_call_id.as_str(), &output));
        }
        let previous = Some(pending.response_id.clone());
        self.reason(run, pending.progress, input, previous).await
    }

    /// Calls the model once (with the fallback to replay), accounting for the answer.
    async fn call_model(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
        tools_mode: &crate::catalog::Mode,
        tools: &[&ToolDef],
        input: Vec<Value>,
        previous: Option<&str>,
    ) -> Result<Result<ModelResponse, TurnResult>, RetryableFailure> {
        progress.iterations += 1;
        let instructions = self.catalog.system_prompt(&run.session.mode_key);
        let history: Vec<Value> = run
            .session
            .conversation
            .iter()
            .chain(progress.turn_items.iter())
            .cloned()
            .collect();
        let body_for = |replay: bool| {
            compose::request_body(&CallSpec {
                model: &self.settings.model,
                instructions: &instructions,
                tools,
                tool_choice: tools_mode.tool_choice.as_deref(),
                continuation: match (previous, replay) {
                    (_, true) => Continuation::Replay(&history),
                    (Some(id), false) => Continuation::Previous(id),
                    (None, false) => Continuation::Fresh,
                },
                input: &input,
            })
        };
        let replay = self.settings.replay || run.session.replay;
        let body = body_for(replay);
        run.record.requests.push(body.clone());
        let started = std::time::Instant::now();
        let mut outcome = self.llm.create_response(&body).await;
        if let Err(LlmError::PreviousResponseNotFound(msg)) = &outcome
            && !replay
        {
            warn!(%msg, "model server does not store responses; switching this session to replay");
            run.session.replay = true;
            let body = body_for(true);
            run.record.requests.push(body.clone());
            outcome = self.llm.create_response(&body).await;
        }
        info!(
            iteration = progress.iterations,
            elapsed_ms = started.elapsed().as_millis() as u64,
            ok = outcome.is_ok(),
            "model call"
        );
        let response = match outcome {
            Ok(r) => r,
            Err(e) if e.is_retryable() => {
                return Err(RetryableFailure {
                    error: permanent(ErrorCode::LlmUnavailable, e.to_string()),
                });
            }
            Err(e) => {
                let code = match e {
                    LlmError::Rejected { .. } | LlmError::PreviousResponseNotFound(_) => {
                        ErrorCode::LlmRejected
                    }
                    _ => ErrorCode::LlmBadResponse,
                };
                return Ok(Err(InvokeResult::failure(permanent(code, e.to_string()))));
            }
        };
        progress.usage.add(response.usage);
        progress.turn_items.extend(input);
        progress
            .turn_items
            .extend(response.replay_items.iter().cloned());
        if let Some(reason) = &response.incomplete_reason {
            progress.user_warnings.push(format!(
                "The answer is incomplete: the model stopped early ({reason})."
            ));
        }
        if response
            .items
            .iter()
            .any(|i| matches!(i, OutputItem::Refusal(_)))
        {
            progress
                .user_warnings
                .push("The model declined part of this request.".into());
        }
        Ok(Ok(response))
    }

    /// The loop: call → run server tools → call again, until text or client tools.
    async fn reason(
        &self,
        mut run: Run,
        mut progress: TurnProgress,
        mut input: Vec<Value>,
        mut previous: Option<String>,
    ) -> Result<TurnResult, RetryableFailure> {
        let mut api_warnings: Vec<ErrorMessage> = Vec::new();
        loop {
            // Resume from a checkpoint (a re-run after a crash), or ask the model.
            let response = match run.record.checkpoint.clone() {
                Some(cp) if input.is_empty() => {
                    info!(response_id = %cp.response.id, "resuming the turn from its checkpoint");
                    progress = cp.progress;
                    cp.response
                }
                _ => {
                    if progress.iterations >= self.settings.max_iterations {
                        let result = InvokeResult::failure(permanent(
                            ErrorCode::IterationLimit,
                            format!(
                                "the turn reached the limit of {} model calls without a final answer",
                                self.settings.max_iterations
                            ),
                        ));
                        return self.fail_turn(run, result).await;
                    }
                    let tools_mode = self.tools_mode(&progress);
                    let tools = self.catalog.tools_for(&tools_mode);
                    let sent = std::mem::take(&mut input);
                    match self
                        .call_model(
                            &mut run,
                            &mut progress,
                            &tools_mode,
                            &tools,
                            sent,
                            previous.as_deref(),
                        )
                        .await
                    {
                        Err(retryable) => return self.retry_later(run, retryable).await,
                        Ok(Err(failed)) => return self.fail_turn(run, failed).await,
                        Ok(Ok(response)) => {
                            // Saved before any tool runs: a re-run resumes here.
                            run.record.checkpoint = Some(Checkpoint {
                                response: response.clone(),
                                progress: progress.clone(),
                            });
                            if let Err(e) =
                                self.store.save(None, &run.record, run.lease(), false).await
                            {
                                return self.retry_later(run, store_failure(e)).await;
                            }
                            response
                        }
                    }
                }
            };
            let tools_mode = self.tools_mode(&progress);
            let tools: Vec<&ToolDef> = self.catalog.tools_for(&tools_mode);

            let mut texts = Vec::new();
            let mut refusals = Vec::new();
            let mut calls = Vec::new();
            for item in &response.items {
                match item {
                    OutputItem::Text(t) => texts.push(t.clone()),
                    OutputItem::Refusal(r) => refusals.push(r.clone()),
                    OutputItem::FunctionCall {
                        call_id,
                        name,
                        arguments,
                    } => calls.push((call_id.clone(), name.clone(), arguments.clone())),
                    OutputItem::Reasoning => {}
                    OutputItem::Unknown { item_type: kind } => {
                        warn!(kind = %kind, "ignoring an unknown output item");
                        api_warnings.push(ErrorMessage::new(
                            ErrorCode::UnknownOutputItem,
                            format!(
                                "the model returned an output item of type {kind:?}; it was ignored"
                            ),
                        ));
                    }
                }
            }

            if calls.is_empty() {
                let mut text = texts.join("\n\n");
                if text.is_empty() {
                    text = refusals.join("\n\n");
                }
                if text.is_empty() {
                    let result = InvokeResult::failure(permanent(
                        ErrorCode::LlmBadResponse,
                        "the model answered with neither text nor tool calls",
                    ));
                    return self.fail_turn(run, result).await;
                }
                return self
                    .complete_turn(run, progress, response.id, text, api_warnings)
                    .await;
            }

            // Run server tools (in order), collect client calls; AGN-011 §4.4: the tool list is
            // the one chosen before the loop.
            let mut outputs: Vec<(String, String)> = Vec::new();
            let mut client_calls: Vec<ToolCall> = Vec::new();
            for (call_id, name, arguments) in calls {
                let def = tools.iter().find(|t| t.name == name);
                match def.map(|d| d.location) {
                    None => {
                        warn!(tool = %name, "model called a tool this mode does not offer");
                        let out = json!({"error": format!("Tool '{name}' is not available in this mode.")}).to_string();
                        outputs.push((call_id, out));
                    }
                    Some(ToolLocation::Client) => {
                        match (ToolCallId::parse(&call_id), JsonText::parse(&arguments)) {
                            (Ok(id), Ok(args)) => client_calls.push(ToolCall {
                                tool_call_id: id,
                                name,
                                arguments_json: args,
                            }),
                            _ => {
                                let out = json!({"error": format!("The call to '{name}' has invalid arguments JSON or call id; call it again with valid JSON.")}).to_string();
                                outputs.push((call_id, out));
                            }
                        }
                    }
                    Some(ToolLocation::Server) => {
                        match self
                            .run_server_tool(&mut run, &mut progress, &call_id, &name, &arguments)
                            .await
                        {
                            Ok(out) => outputs.push((call_id, out)),
                            Err(retryable) => return self.retry_later(run, retryable).await,
                        }
                    }
                }
            }
            if !client_calls.is_empty() {
                return self
                    .await_client_tools(run, progress, response.id, client_calls, outputs)
                    .await;
            }
            input = outputs
                .iter()
                .map(|(id, out)| compose::tool_output(id, out))
                .collect();
            previous = Some(response.id);
        }
    }

    fn tools_mode(&self, progress: &TurnProgress) -> crate::catalog::Mode {
        self.catalog
            .by_key(&progress.tools_mode_key)
            .unwrap_or_else(|| self.catalog.default_mode())
            .clone()
    }

    /// Runs (or replays from the ledger) one server tool call; returns the output for the model.
    async fn run_server_tool(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
        call_id: &str,
        name: &str,
        arguments: &str,
    ) -> Result<String, RetryableFailure> {
        if let Some(out) = run.record.tool_ledger.get(call_id).cloned() {
            info!(tool = %name, call_id, "reusing the recorded output of a server tool");
            let listed = progress
                .server_tool_results
                .iter()
                .any(|r| r.tool_call_id.as_str() == call_id);
            if !listed && let Ok(id) = ToolCallId::parse(call_id) {
                let outcome = JsonText::parse(out.as_str())
                    .map(ToolOutcome::Result)
                    .unwrap_or_else(|_| ToolOutcome::Error(out.clone()));
                progress.server_tool_results.push(ToolResult {
                    tool_call_id: id,
                    execution_ms: 0,
                    outcome,
                });
            }
            return Ok(out);
        }
        let Some(tool) = self.tools.get(name) else {
            return Ok(
                json!({"error": format!("Tool '{name}' is not implemented on the server.")})
                    .to_string(),
            );
        };
        let ctx = ToolContext {
            session_id: run.session.session_id.clone(),
            turn_id: run.record.turn_id.clone(),
            current_mode_key: run.session.mode_key.clone(),
            lease: run.lease().clone(),
        };
        let started = std::time::Instant::now();
        let outcome = tool.run(&ctx, arguments).await;
        let execution_ms = started.elapsed().as_millis() as u64;
        let tool_call_id = ToolCallId::parse(call_id).unwrap_or_else(|_| ToolCallId::generate());
        let output = match outcome {
            ToolRun::Ok(value) => {
                if name == crate::catalog::CHANGE_MODE_TOOL {
                    self.apply_mode_change(run, progress).await?;
                }
                progress.server_tool_results.push(ToolResult {
                    tool_call_id,
                    execution_ms,
                    outcome: ToolOutcome::Result(JsonText::from_value(&value)),
                });
                value.to_string()
            }
            ToolRun::Rejected(message) => {
                info!(tool = %name, %message, "server tool rejected its arguments");
                progress.server_tool_results.push(ToolResult {
                    tool_call_id,
                    execution_ms,
                    outcome: ToolOutcome::Error(message.clone()),
                });
                json!({"success": false, "error": message}).to_string()
            }
            ToolRun::Unavailable(message) => {
                return Err(RetryableFailure {
                    error: permanent(ErrorCode::ToolUnavailable, format!("{name}: {message}")),
                });
            }
        };
        self.store
            .record_tool_output(
                &run.session.session_id,
                &run.record.turn_id,
                call_id,
                &output,
                run.lease(),
            )
            .await
            .map_err(store_failure)?;
        run.record
            .tool_ledger
            .insert(call_id.to_string(), output.clone());
        // The checkpoint's progress must include this tool's result for a resumed run.
        if let Some(cp) = run.record.checkpoint.as_mut() {
            cp.progress = progress.clone();
        }
        Ok(output)
    }

    /// After `agent_change_mode` persisted a change: the next calls of this turn carry the new
    /// mode; the last change wins.
    async fn apply_mode_change(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
    ) -> Result<(), RetryableFailure> {
        let fresh = self
            .store
            .get_session(&run.session.session_id)
            .await
            .map_err(store_failure)?;
        if let Some(fresh) = fresh {
            run.session.mode_id = fresh.mode_id;
            run.session.mode_key = fresh.mode_key;
            run.session.mode_history = fresh.mode_history;
        }
        progress.mode_changes += 1;
        if progress.mode_changes == 2 {
            warn!("several mode changes in one turn; the last one wins");
            progress.user_warnings.push(
                "The mode was changed more than once in this turn; the last change applies.".into(),
            );
        }
        Ok(())
    }

    fn meta(&self, session: &SessionState, turn_id: &TurnId) -> SessionMeta {
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

    async fn complete_turn(
        &self,
        mut run: Run,
        progress: TurnProgress,
        response_id: String,
        mut text: String,
        api_warnings: Vec<ErrorMessage>,
    ) -> Result<TurnResult, RetryableFailure> {
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
        if let Err(e) = self
            .store
            .save(Some(&run.session), &run.record, run.lease(), true)
            .await
        {
            return self.retry_later(run, store_failure(e)).await;
        }
        info!(iterations, "turn completed");
        Ok(result)
    }

    async fn await_client_tools(
        &self,
        mut run: Run,
        progress: TurnProgress,
        response_id: String,
        client_calls: Vec<ToolCall>,
        server_outputs: Vec<(String, String)>,
    ) -> Result<TurnResult, RetryableFailure> {
        let meta = self.meta(&run.session, &run.record.turn_id);
        let count = client_calls.len();
        let Some(continuation) = ClientToolContinuation::new(meta, client_calls.clone(), None)
        else {
            return Err(RetryableFailure {
                error: permanent(ErrorCode::Internal, "no client tool calls to wait for"),
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
        if let Err(e) = self
            .store
            .save(Some(&run.session), &run.record, run.lease(), true)
            .await
        {
            return self.retry_later(run, store_failure(e)).await;
        }
        info!(calls = count, "turn waits for client tools");
        Ok(result)
    }

    async fn fail_turn(
        &self,
        mut run: Run,
        result: TurnResult,
    ) -> Result<TurnResult, RetryableFailure> {
        for e in result.errors() {
            warn!(code = %e.error_code, message = %e.message, "turn failed");
        }
        run.record.status = TurnStatus::Failed;
        run.record.pending = None;
        run.record.checkpoint = None;
        run.record.completed_at = Some(now_rfc3339());
        run.record.result = Some(result.clone());
        // The session's continuation state is left as it was before the turn.
        if let Err(e) = self.store.save(None, &run.record, run.lease(), true).await {
            return self.retry_later(run, store_failure(e)).await;
        }
        Ok(result)
    }
}
