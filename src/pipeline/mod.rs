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
use crate::contract::request::JsonText;
use crate::contract::{
    AgentExecuteRequest, AgentExecuteResponse, ClientToolContinuation, ErrorCode, ErrorMessage,
    FinalResponse, InvokeResult, SessionMeta, ToolCall, ToolCallId, ToolContinuation, ToolOutcome,
    ToolResult, TurnId, UserTurn, check_tool_results,
};
use crate::llm::{LlmClient, LlmError, ModelResponse, OutputItem};
use crate::store::{
    PendingTools, SessionState, SessionStore, StoreError, TurnProgress, TurnRecord, TurnStatus,
    now_rfc3339,
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
}

impl PipelineSettings {
    /// Defaults for a model name.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            max_iterations: 8,
            replay: false,
            conversation_contexts: HashMap::from([(
                "default".to_string(),
                DEFAULT_BOOT_PROMPT.to_string(),
            )]),
            agent_contexts: vec!["default".to_string()],
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

/// The request fingerprint: the same ids with another payload is a conflict.
pub fn fingerprint(turn: &UserTurn) -> String {
    let bytes = serde_json::to_vec(turn).unwrap_or_default();
    let digest = Sha256::digest(&bytes);
    digest.iter().map(|b| format!("{b:02x}")).collect()
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
            settings: Arc::new(settings),
        })
    }

    /// The store (for callers that read turn status).
    pub fn store(&self) -> &Arc<dyn SessionStore> {
        &self.store
    }

    /// Runs one request to its next stable point: a final answer, a client tool continuation,
    /// or a failed turn (all returned as `Ok` and stored). `Err` means "try again later".
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

    async fn run_user_turn(&self, turn: &UserTurn) -> Result<TurnResult, RetryableFailure> {
        let (sid, tid) = (turn.session_id(), turn.turn_id());
        let fp = fingerprint(turn);
        let existing = self.store.get_turn(sid, tid).await.map_err(store_failure)?;
        if let Some(rec) = &existing {
            if rec.fingerprint != fp {
                return Ok(InvokeResult::failure(permanent(
                    ErrorCode::TurnConflict,
                    format!("turn {tid} already exists in session {sid} with a different payload"),
                )));
            }
            if let (
                Some(result),
                TurnStatus::Completed | TurnStatus::Failed | TurnStatus::AwaitingClientTools,
            ) = (&rec.result, rec.status)
            {
                info!(
                    status = rec.status.as_str(),
                    "turn already ran; returning its stored result"
                );
                return Ok(result.clone());
            }
        }
        // Unknown context ids are validation errors (the turn fails, nothing is created).
        let boot = match turn.conversation_context_id() {
            None => self.settings.conversation_contexts.get("default").cloned(),
            Some(id) => self.settings.conversation_contexts.get(id).cloned(),
        };
        let Some(boot) = boot else {
            return Ok(InvokeResult::failure(permanent(
                ErrorCode::UnknownContext,
                format!(
                    "conversationContextId: no conversation context {:?} is configured",
                    turn.conversation_context_id().unwrap_or_default()
                ),
            )));
        };
        if let Some(id) = turn.agent_context_id()
            && !self.settings.agent_contexts.iter().any(|a| a == id)
        {
            return Ok(InvokeResult::failure(permanent(
                ErrorCode::UnknownContext,
                format!("agentContextId: no agent context {id:?} is configured"),
            )));
        }

        let now = now_rfc3339();
        let mut session = match self.store.get_session(sid).await.map_err(store_failure)? {
            Some(s) => s,
            None => {
                let mode = self.catalog.default_mode();
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
                    updated_at: now.clone(),
                }
            }
        };
        // A session whose stored mode id is no longer in the catalog continues in the default.
        let mode = self.catalog.by_id_or_default(&session.mode_id).clone();
        session.mode_key = mode.key.clone();
        if let Some(ctx) = turn.solution_context_text() {
            session.solution_context = Some(ctx.to_string());
        }
        session.updated_at = now.clone();

        let mut record = existing.unwrap_or_else(|| TurnRecord {
            session_id: sid.clone(),
            turn_id: tid.clone(),
            fingerprint: fp,
            status: TurnStatus::Running,
            mode_key: mode.key.clone(),
            pending: None,
            tool_ledger: Default::default(),
            requests: Vec::new(),
            attempts: 0,
            submitted_at: now.clone(),
            completed_at: None,
            result: None,
        });
        record.status = TurnStatus::Running;
        record.attempts += 1;
        // The session exists (and the turn is running) before any tool can touch it.
        self.store
            .commit(&session, &record)
            .await
            .map_err(store_failure)?;
        info!(mode = %mode.key, attempt = record.attempts, "turn started");

        let first_call = session.previous_response_id.is_none() && session.conversation.is_empty();
        let mut input = Vec::new();
        if first_call {
            input.push(compose::system_message(&boot));
        }
        let chunks = compose::artifact_chunks(turn);
        input.push(compose::user_message(
            &session.mode_key,
            turn,
            session.solution_context.as_deref(),
            &chunks,
        ));
        let progress = TurnProgress {
            tools_mode_key: mode.key.clone(),
            ..Default::default()
        };
        let previous = session.previous_response_id.clone();
        self.reason(session, record, progress, input, previous)
            .await
    }

    async fn run_continuation(
        &self,
        cont: &ToolContinuation,
    ) -> Result<TurnResult, RetryableFailure> {
        let (sid, tid) = (cont.session_id(), cont.turn_id());
        let Some(mut record) = self.store.get_turn(sid, tid).await.map_err(store_failure)? else {
            return Ok(InvokeResult::failure(permanent(
                ErrorCode::TurnNotFound,
                format!("turn {tid} does not exist in session {sid}"),
            )));
        };
        let pending = match (&record.status, record.pending.take()) {
            (TurnStatus::AwaitingClientTools, Some(p)) => p,
            (status, _) => {
                return Ok(InvokeResult::failure(permanent(
                    ErrorCode::TurnNotAwaitingTools,
                    format!(
                        "turn {tid} is {}, not awaiting_client_tools; tool results are not accepted",
                        status.as_str()
                    ),
                )));
            }
        };
        let expected: Vec<ToolCallId> = pending
            .client_calls
            .iter()
            .map(|c| c.tool_call_id.clone())
            .collect();
        if let Err(mismatch) = check_tool_results(&expected, cont.tool_results()) {
            warn!(%mismatch, "tool results do not match the pending calls; failing the turn");
            let result = InvokeResult::failure(mismatch.to_error());
            return self.fail_turn(record, result).await;
        }
        let Some(mut session) = self.store.get_session(sid).await.map_err(store_failure)? else {
            return Err(store_failure(StoreError::Corrupt(format!(
                "session {sid} of a waiting turn is missing"
            ))));
        };
        session.mode_key = self.catalog.by_id_or_default(&session.mode_id).key.clone();
        record.status = TurnStatus::Running;
        record.attempts += 1;
        self.store.put_turn(&record).await.map_err(store_failure)?;

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
        self.reason(session, record, pending.progress, input, previous)
            .await
    }

    /// The loop: call → run server tools → call again, until text or client tools.
    async fn reason(
        &self,
        mut session: SessionState,
        mut record: TurnRecord,
        mut progress: TurnProgress,
        mut input: Vec<Value>,
        mut previous: Option<String>,
    ) -> Result<TurnResult, RetryableFailure> {
        let tools_mode = self
            .catalog
            .by_key(&progress.tools_mode_key)
            .unwrap_or_else(|| self.catalog.default_mode())
            .clone();
        let tools: Vec<&ToolDef> = self.catalog.tools_for(&tools_mode);
        let mut replay = self.settings.replay || session.replay;
        let mut api_warnings: Vec<ErrorMessage> = Vec::new();
        loop {
            if progress.iterations >= self.settings.max_iterations {
                let result = InvokeResult::failure(permanent(
                    ErrorCode::IterationLimit,
                    format!(
                        "the turn reached the limit of {} model calls without a final answer",
                        self.settings.max_iterations
                    ),
                ));
                return self.fail_turn(record, result).await;
            }
            progress.iterations += 1;
            let instructions = self.catalog.system_prompt(&session.mode_key);
            let call = |replay: bool, history: &[Value]| {
                compose::request_body(&CallSpec {
                    model: &self.settings.model,
                    instructions: &instructions,
                    tools: &tools,
                    tool_choice: tools_mode.tool_choice.as_deref(),
                    continuation: match (&previous, replay) {
                        (_, true) => Continuation::Replay(history),
                        (Some(id), false) => Continuation::Previous(id),
                        (None, false) => Continuation::Fresh,
                    },
                    input: &input,
                })
            };
            let history: Vec<Value> = session
                .conversation
                .iter()
                .chain(progress.turn_items.iter())
                .cloned()
                .collect();
            let mut body = call(replay, &history);
            record.requests.push(body.clone());
            let started = std::time::Instant::now();
            let mut outcome = self.llm.create_response(&body).await;
            if let Err(LlmError::PreviousResponseNotFound(msg)) = &outcome
                && !replay
            {
                warn!(%msg, "model server does not store responses; switching this session to replay");
                replay = true;
                session.replay = true;
                body = call(true, &history);
                record.requests.push(body.clone());
                outcome = self.llm.create_response(&body).await;
            }
            info!(
                iteration = progress.iterations,
                elapsed_ms = started.elapsed().as_millis() as u64,
                ok = outcome.is_ok(),
                "model call"
            );
            let response: ModelResponse = match outcome {
                Ok(r) => r,
                Err(e) if e.is_retryable() => {
                    self.store.put_turn(&record).await.map_err(store_failure)?;
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
                    let result = InvokeResult::failure(permanent(code, e.to_string()));
                    return self.fail_turn(record, result).await;
                }
            };
            progress.usage.add(response.usage);
            progress.turn_items.append(&mut input);
            progress
                .turn_items
                .extend(response.replay_items.iter().cloned());

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
                    OutputItem::Unknown(kind) => {
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
            if let Some(reason) = &response.incomplete_reason {
                progress.user_warnings.push(format!(
                    "The answer is incomplete: the model stopped early ({reason})."
                ));
            }
            if !refusals.is_empty() {
                progress
                    .user_warnings
                    .push("The model declined part of this request.".into());
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
                    return self.fail_turn(record, result).await;
                }
                return self
                    .complete_turn(session, record, progress, response.id, text, api_warnings)
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
                        let out = self
                            .run_server_tool(
                                &mut session,
                                &mut record,
                                &mut progress,
                                &call_id,
                                &name,
                                &arguments,
                            )
                            .await?;
                        outputs.push((call_id, out));
                    }
                }
            }
            if !client_calls.is_empty() {
                return self
                    .await_client_tools(
                        session,
                        record,
                        progress,
                        response.id,
                        client_calls,
                        outputs,
                    )
                    .await;
            }
            input = outputs
                .iter()
                .map(|(id, out)| compose::tool_output(id, out))
                .collect();
            previous = Some(response.id);
            self.store.put_turn(&record).await.map_err(store_failure)?;
        }
    }

    /// Runs (or replays from the ledger) one server tool call; returns the output for the model.
    async fn run_server_tool(
        &self,
        session: &mut SessionState,
        record: &mut TurnRecord,
        progress: &mut TurnProgress,
        call_id: &str,
        name: &str,
        arguments: &str,
    ) -> Result<String, RetryableFailure> {
        if let Some(out) = record.tool_ledger.get(call_id) {
            info!(tool = %name, call_id, "reusing the recorded output of a server tool");
            return Ok(out.clone());
        }
        let Some(tool) = self.tools.get(name) else {
            return Ok(
                json!({"error": format!("Tool '{name}' is not implemented on the server.")})
                    .to_string(),
            );
        };
        let ctx = ToolContext {
            session_id: session.session_id.clone(),
            turn_id: record.turn_id.clone(),
            current_mode_key: session.mode_key.clone(),
        };
        let started = std::time::Instant::now();
        let run = tool.run(&ctx, arguments).await;
        let execution_ms = started.elapsed().as_millis() as u64;
        let tool_call_id = ToolCallId::parse(call_id).unwrap_or_else(|_| ToolCallId::generate());
        let output = match run {
            ToolRun::Ok(value) => {
                if name == crate::catalog::CHANGE_MODE_TOOL {
                    self.apply_mode_change(session, progress).await?;
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
                self.store.put_turn(record).await.map_err(store_failure)?;
                return Err(RetryableFailure {
                    error: permanent(ErrorCode::ToolUnavailable, format!("{name}: {message}")),
                });
            }
        };
        self.store
            .record_tool_output(&session.session_id, &record.turn_id, call_id, &output)
            .await
            .map_err(store_failure)?;
        record
            .tool_ledger
            .insert(call_id.to_string(), output.clone());
        Ok(output)
    }

    /// After `agent_change_mode` persisted a change: the next calls of this turn carry the new
    /// mode; the last change wins.
    async fn apply_mode_change(
        &self,
        session: &mut SessionState,
        progress: &mut TurnProgress,
    ) -> Result<(), RetryableFailure> {
        let fresh = self
            .store
            .get_session(&session.session_id)
            .await
            .map_err(store_failure)?;
        if let Some(fresh) = fresh {
            session.mode_id = fresh.mode_id;
            session.mode_key = fresh.mode_key;
            session.mode_history = fresh.mode_history;
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
        mut session: SessionState,
        mut record: TurnRecord,
        progress: TurnProgress,
        response_id: String,
        mut text: String,
        api_warnings: Vec<ErrorMessage>,
    ) -> Result<TurnResult, RetryableFailure> {
        if progress.mode_changes > 0
            && let Some(welcome) = &self
                .catalog
                .by_id_or_default(&session.mode_id)
                .welcome_message
        {
            text = format!("{welcome}\n\n{text}");
        }
        let response = AgentExecuteResponse::Final(FinalResponse {
            meta: self.meta(&session, &record.turn_id),
            primary_output_text: text,
            files: Vec::new(),
            tool_results: progress.server_tool_results,
            user_warnings: progress.user_warnings,
            usage: Some(progress.usage),
        });
        let result = InvokeResult::success(response).with_warnings(api_warnings);
        session.previous_response_id = Some(response_id);
        session.conversation.extend(progress.turn_items);
        session.updated_at = now_rfc3339();
        record.status = TurnStatus::Completed;
        record.completed_at = Some(now_rfc3339());
        record.pending = None;
        record.result = Some(result.clone());
        self.store
            .commit(&session, &record)
            .await
            .map_err(store_failure)?;
        info!(iterations = progress.iterations, "turn completed");
        Ok(result)
    }

    async fn await_client_tools(
        &self,
        session: SessionState,
        mut record: TurnRecord,
        progress: TurnProgress,
        response_id: String,
        client_calls: Vec<ToolCall>,
        server_outputs: Vec<(String, String)>,
    ) -> Result<TurnResult, RetryableFailure> {
        let meta = self.meta(&session, &record.turn_id);
        let count = client_calls.len();
        let Some(continuation) = ClientToolContinuation::new(meta, client_calls.clone(), None)
        else {
            return Err(RetryableFailure {
                error: permanent(ErrorCode::Internal, "no client tool calls to wait for"),
            });
        };
        let result =
            InvokeResult::success(AgentExecuteResponse::ClientToolContinuation(continuation));
        record.status = TurnStatus::AwaitingClientTools;
        record.pending = Some(PendingTools {
            response_id,
            client_calls,
            server_outputs,
            progress,
        });
        record.result = Some(result.clone());
        // The session's continuation id is *not* moved to this response: its calls are unanswered.
        self.store
            .commit(&session, &record)
            .await
            .map_err(store_failure)?;
        info!(calls = count, "turn waits for client tools");
        Ok(result)
    }

    async fn fail_turn(
        &self,
        mut record: TurnRecord,
        result: TurnResult,
    ) -> Result<TurnResult, RetryableFailure> {
        for e in result.errors() {
            warn!(code = %e.error_code, message = %e.message, "turn failed");
        }
        record.status = TurnStatus::Failed;
        record.pending = None;
        record.completed_at = Some(now_rfc3339());
        record.result = Some(result.clone());
        self.store.put_turn(&record).await.map_err(store_failure)?;
        Ok(result)
    }
}
