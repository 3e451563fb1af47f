//! The turn's persistent shapes: session state, the turn record with its status, progress,
//! pending client tools and checkpoint (with the model-answer data a checkpoint holds), leases
//! and batch records. The floor the store, the pipeline, the worker and the front door stand on.
//!
//! Owns: these types and their small invariants (a mode change applied to a session, a record's
//! first shape). Must not: import anything of this crate but [`crate::contract`]: no store, no
//! model client, no HTTP.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::{
    AgentExecuteResponse, ErrorCode, ErrorMessage, InvokeResult, SessionId, ToolCall, ToolResult,
    TurnId, Usage,
};

/// A session lease: while held, only its holder may write the session's state. The token grows
/// with every acquisition, so a write carrying an older token (a holder that paused past its
/// lease) is rejected.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The fencing token.
    pub token: u64,
    /// Who holds it (worker id and turn), for logs and debugging.
    pub holder: String,
}

/// One mode transition (AGN-011 §3.2), with keys rather than ids for readability.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ModeChange {
    /// Mode key before the change.
    pub previous_mode: String,
    /// Mode key after the change.
    pub new_mode: String,
    /// When (RFC 3339, UTC).
    pub timestamp: String,
    /// Why, as the model gave it.
    pub reason: String,
    /// The turn in which it happened.
    pub turn_id: TurnId,
}

/// The agent and conversation context a session runs with (AGN-003 §2).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextIds {
    /// The agent context: model backend, key, limits.
    pub agent_context_id: String,
    /// The conversation context: boot prompt, model.
    pub conversation_context_id: String,
}

impl Default for ContextIds {
    fn default() -> Self {
        Self {
            agent_context_id: "default".to_string(),
            conversation_context_id: "default".to_string(),
        }
    }
}

impl ContextIds {
    /// The ids a request names, `default` for the ones it leaves out.
    pub fn named_or_default(agent: Option<&str>, conversation: Option<&str>) -> Self {
        let d = Self::default();
        Self {
            agent_context_id: agent.map_or(d.agent_context_id, str::to_string),
            conversation_context_id: conversation.map_or(d.conversation_context_id, str::to_string),
        }
    }

    /// The fields of a request that name another context than these, as
    /// `(field, named, latched)`.
    pub fn mismatches<'a>(
        &'a self,
        agent: Option<&'a str>,
        conversation: Option<&'a str>,
    ) -> Vec<(&'static str, &'a str, &'a str)> {
        let mut out = Vec::new();
        if let Some(a) = agent
            && a != self.agent_context_id
        {
            out.push(("agentContextId", a, self.agent_context_id.as_str()));
        }
        if let Some(c) = conversation
            && c != self.conversation_context_id
        {
            out.push((
                "conversationContextId",
                c,
                self.conversation_context_id.as_str(),
            ));
        }
        out
    }
}

/// A session's server-owned state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionState {
    /// The session (scoped to its tenant).
    #[serde(with = "crate::contract::ids::scoped")]
    pub session_id: SessionId,
    /// Current mode id (what AGN-014 says sessions store).
    pub mode_id: String,
    /// Current mode key (kept beside the id for prompts and history).
    pub mode_key: String,
    /// Every mode change, oldest first.
    pub mode_history: Vec<ModeChange>,
    /// The model response the next call continues from. Only ever points at a response whose
    /// function calls were all answered (DESIGN.md §3).
    pub previous_response_id: Option<String>,
    /// Conversation items not yet in the store. The store keeps a session's conversation (the
    /// items a replay continuation sends to servers that do not store responses) apart from
    /// the session, append-only: a save that carries the session appends these items there,
    /// and a session read back has none (read the conversation with
    /// [`crate::store::SessionStore::conversation`]). Sessions stored before the conversation
    /// moved out hold it here; it moves with their next save.
    #[serde(default, skip_serializing)]
    pub conversation: Vec<Value>,
    /// Set once the model server answered `previous_response_not_found`, or answered a call
    /// without the conversation it continued from: later calls replay.
    pub replay: bool,
    /// What the response `previous_response_id` names carries into the next call.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub previous_call: Option<CallTokens>,
    /// The latched solution context (AGN-034 §4.5).
    pub solution_context: Option<String>,
    /// The agent and conversation contexts the session latched on its first turn (sessions
    /// stored before contexts existed ran on `default`).
    #[serde(default)]
    pub contexts: ContextIds,
    /// The tenant that owns the session, when the front door knows it.
    pub owner: Option<String>,
    /// Created (RFC 3339).
    pub created_at: String,
    /// Last changed (RFC 3339).
    pub updated_at: String,
}

impl SessionState {
    /// Records a mode change: the new mode, its history entry, the update time.
    pub fn apply_mode_change(&mut self, new_mode_id: &str, change: ModeChange) {
        self.mode_id = new_mode_id.to_string();
        self.mode_key = change.new_mode.clone();
        self.updated_at = now_rfc3339();
        self.mode_history.push(change);
    }
}

/// Where a turn is in its lifecycle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "snake_case")]
pub enum TurnStatus {
    /// Accepted, not yet picked up.
    Queued,
    /// A worker is running it.
    Running,
    /// Waiting for the client's tool results.
    AwaitingClientTools,
    /// Finished with a successful result.
    Completed,
    /// Finished with a failed result.
    Failed,
    /// Stopped by a cancel request; its result is a failed `TURN_CANCELLED`.
    Cancelled,
}

impl TurnStatus {
    /// Whether the turn has left `queued`/`running`: it has a result a client can act on.
    pub fn is_settled(self) -> bool {
        !matches!(self, Self::Queued | Self::Running)
    }

    /// Whether the turn is over for good (completed, failed or cancelled): nothing can move
    /// it on, a continuation included.
    pub fn is_final(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Cancelled)
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::AwaitingClientTools => "awaiting_client_tools",
            Self::Completed => "completed",
            Self::Failed => "failed",
            Self::Cancelled => "cancelled",
        }
    }
}

/// What the reasoner had accumulated when a turn paused for client tools; enough to resume it
/// on any worker.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PendingTools {
    /// The model response whose function calls are being answered.
    pub response_id: String,
    /// The client tool calls, in order: a continuation must answer exactly these.
    pub client_calls: Vec<ToolCall>,
    /// Outputs for the same response's server (or undeclared) calls: `(call_id, output)`.
    pub server_outputs: Vec<(String, String)>,
    /// The loop's state at the pause.
    pub progress: TurnProgress,
}

/// The reasoner's running totals over a turn.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnProgress {
    /// The mode whose tools the turn offers (chosen before the loop, AGN-011 §4.4).
    pub tools_mode_key: String,
    /// Model calls made so far.
    pub iterations: usize,
    /// Usage summed so far.
    pub usage: Usage,
    /// Server tools run so far (for the final `toolResults`).
    pub server_tool_results: Vec<ToolResult>,
    /// Warnings for the user so far.
    pub user_warnings: Vec<String>,
    /// Items this turn added to the conversation (inputs and outputs), for replay.
    pub turn_items: Vec<Value>,
    /// Successful mode changes in this turn.
    pub mode_changes: usize,
    /// What the turn's latest answer carries into a call that continues from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_call: Option<CallTokens>,
}

/// What a model server that keeps the conversation must count again in the input of a call
/// continuing from this response (`previous_response_id`): the input and output tokens the
/// response was given and wrote, less its reasoning (which is not carried on). A call whose
/// `input_tokens` is smaller did not see that conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CallTokens {
    /// The response.
    pub response_id: String,
    /// Its input and visible output tokens.
    pub carried: u64,
    /// The prompt's fixed part it was made with (mode and tool set): only a call with the
    /// same one must count at least `carried` (instructions and tools are not carried on).
    pub shape: String,
}

/// A model request body exactly as it was sent: JSON text, stored and read back as is (it is
/// written once, when the call is made, and never looked into by the pipeline again). Shared:
/// the HTTP request sends these bytes without copying them ([`SentRequest::bytes`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SentRequest(#[serde(with = "shared_raw")] Arc<serde_json::value::RawValue>);

impl SentRequest {
    /// Wraps a serialised body.
    pub fn new(json: Box<serde_json::value::RawValue>) -> Self {
        Self(Arc::from(json))
    }

    /// The body's JSON text.
    pub fn json(&self) -> &str {
        self.0.get()
    }

    /// The body's bytes for an HTTP request, sharing this body's memory.
    pub fn bytes(&self) -> bytes::Bytes {
        bytes::Bytes::from_owner(SharedJson(Arc::clone(&self.0)))
    }

    /// The body as a JSON value (for inspection; the pipeline does not need it).
    pub fn to_value(&self) -> Result<Value, serde_json::Error> {
        serde_json::from_str(self.0.get())
    }
}

/// A shared JSON text seen as bytes (the owner behind [`SentRequest::bytes`]).
struct SharedJson(Arc<serde_json::value::RawValue>);

impl AsRef<[u8]> for SharedJson {
    fn as_ref(&self) -> &[u8] {
        self.0.get().as_bytes()
    }
}

/// Raw JSON behind an `Arc`: written as is, read as a boxed raw value and then shared.
mod shared_raw {
    use std::sync::Arc;

    use serde::{Deserialize as _, Deserializer, Serialize as _, Serializer};
    use serde_json::value::RawValue;

    pub(super) fn serialize<S: Serializer>(raw: &Arc<RawValue>, s: S) -> Result<S::Ok, S::Error> {
        raw.as_ref().serialize(s)
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Arc<RawValue>, D::Error> {
        Box::<RawValue>::deserialize(d).map(Arc::from)
    }
}

impl PartialEq for SentRequest {
    fn eq(&self, other: &Self) -> bool {
        self.json() == other.json()
    }
}

/// A turn's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnRecord {
    /// The session (scoped to its tenant).
    #[serde(with = "crate::contract::ids::scoped")]
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// Hash of the user turn's payload: the same ids with another payload is a conflict.
    pub fingerprint: String,
    /// Lifecycle status.
    pub status: TurnStatus,
    /// The mode the turn started in (AGN-011 §3.2 snapshot).
    pub mode_key: String,
    /// Set while the turn waits for client tools (and while their results are processed).
    pub pending: Option<PendingTools>,
    /// Client tool call ids already answered by a continuation: a redelivered continuation is
    /// recognised instead of being taken for a mismatch.
    #[serde(default)]
    pub answered: Vec<String>,
    /// Outputs of server tools already run, per `call_id`: a re-run reuses them instead of
    /// running a tool twice.
    pub tool_ledger: BTreeMap<String, String>,
    /// Request transcript: the model request bodies sent, in order, as they were sent.
    pub requests: Vec<SentRequest>,
    /// Times the turn was started (including continuations and retries).
    pub attempts: u32,
    /// Accepted (RFC 3339).
    pub submitted_at: String,
    /// Finished (RFC 3339).
    pub completed_at: Option<String>,
    /// The last result (continuation or final) or the failure.
    pub result: Option<InvokeResult<AgentExecuteResponse>>,
    /// The last model answer and the loop state right after it, saved before any of its tools
    /// run: a re-run after a crash resumes here instead of asking the model again, so tools
    /// recorded in the ledger are not run twice.
    #[serde(default)]
    pub checkpoint: Option<Checkpoint>,
    /// Fingerprint of the continuation (tool results) the front door accepted for the calls
    /// in `pending`: the same continuation sent again is recognised, a different one refused.
    #[serde(default)]
    pub continuation: Option<String>,
    /// The direct reply address of the front door that accepted the turn and may wait for
    /// it (the address of its event hub, where the turn's statuses are sent directly).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reply_to: Option<String>,
    /// The turn's request asked for its text as it is written (`"streaming": true`): the runs
    /// of its continuations stream too.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub streaming: bool,
    /// The webhook URL the turn was submitted with (its continuations and a cancel deliver
    /// there too).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// The batch the turn is a line of, when that batch's completion is told of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch: Option<String>,
    /// The background model call this turn waits for, recorded before it waits: a run that
    /// dies during it is followed by one that re-attaches instead of calling again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_call: Option<ModelCallMark>,
    /// Every model call the turn's runs made, in order (what it cost, at which tier).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub calls: Vec<CallNote>,
    /// The service tier the turn's calls ask for, over its agent context's (a batch's
    /// `serviceTier`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// What happened to the turn, in order: runs started and ended (and why), settled
    /// (the first entry and the latest [`HISTORY_KEPT`] - 1).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub history: Vec<TurnEvent>,
    /// The server tool calls of the turn's runs, in order (their outputs are in the ledger).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tools: Vec<ToolNote>,
    /// The tenant's prompts and answers are not kept (`keepBodies: false`): `requests`, each
    /// call's text and the tools' arguments were left out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bodies_withheld: bool,
}

/// A turn's status as clients see it (GET, SSE events, reply messages):
/// `{sessionId, turnId, status, attempts, submittedAt, completedAt?, result?}`.
/// Its OpenAPI schema is written in the front door's document (`api_doc::TurnStatusView`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnStatusView {
    /// The session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// Lifecycle status.
    pub status: TurnStatus,
    /// Runs so far.
    pub attempts: u32,
    /// Accepted (RFC 3339).
    pub submitted_at: String,
    /// Finished (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub completed_at: Option<String>,
    /// The latest result, once there is one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub result: Option<InvokeResult<AgentExecuteResponse>>,
    /// The service tier the model server reports serving the turn's latest model call with
    /// (`flex`, `default`, …), when it reports one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub service_tier: Option<String>,
}

impl From<&TurnRecord> for TurnStatusView {
    fn from(r: &TurnRecord) -> Self {
        Self {
            session_id: r.session_id.clone(),
            turn_id: r.turn_id.clone(),
            status: r.status,
            attempts: r.attempts,
            submitted_at: r.submitted_at.clone(),
            completed_at: r.completed_at.clone(),
            result: r.result.clone(),
            service_tier: r.calls.iter().rev().find_map(|c| c.service_tier.clone()),
        }
    }
}

/// Everything kept of one turn, for a person looking into it (`GET
/// /v1/sessions/{sessionId}/turns/{turnId}/inspect`, the console's turn inspector).
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnInspection {
    /// The session.
    #[schema(value_type = String)]
    pub session_id: SessionId,
    /// The turn.
    #[schema(value_type = String)]
    pub turn_id: TurnId,
    /// Its status now.
    pub status: TurnStatus,
    /// Runs so far.
    pub attempts: u32,
    /// Accepted (RFC 3339).
    pub submitted_at: String,
    /// Finished (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub completed_at: Option<String>,
    /// What happened to it, in order, from `queued` on.
    pub history: Vec<TurnEvent>,
    /// Every model call that was answered, in order.
    pub model_calls: Vec<CallNote>,
    /// Every model request body sent, as sent (instructions, input, tools; never a key).
    #[schema(value_type = Vec<Object>)]
    pub requests: Vec<Value>,
    /// Every server tool call, in order, with its output from the turn's ledger.
    pub tool_calls: Vec<InspectedTool>,
    /// The agent context's service tier asked for this turn, if its batch asked for one.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// Prompts and answers were not kept for this turn (its tenant's `keepBodies: false`):
    /// `requests` is empty, and model calls and tool calls come without text and arguments.
    #[serde(default)]
    pub bodies_withheld: bool,
    /// The latest result, once there is one.
    #[serde(skip_serializing_if = "Option::is_none")]
    #[schema(value_type = Option<Object>)]
    pub result: Option<InvokeResult<AgentExecuteResponse>>,
}

/// A server tool call as the inspector shows it.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct InspectedTool {
    /// The call.
    #[serde(flatten)]
    pub call: ToolNote,
    /// Its output as recorded (absent when the record lost it).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub output: Option<String>,
}

impl From<&TurnRecord> for TurnInspection {
    fn from(r: &TurnRecord) -> Self {
        let queued = TurnEvent {
            at: r.submitted_at.clone(),
            event: "queued".into(),
            attempt: 0,
            detail: None,
        };
        Self {
            session_id: r.session_id.clone(),
            turn_id: r.turn_id.clone(),
            status: r.status,
            attempts: r.attempts,
            submitted_at: r.submitted_at.clone(),
            completed_at: r.completed_at.clone(),
            history: std::iter::once(queued)
                .chain(r.history.iter().cloned())
                .collect(),
            model_calls: r.calls.clone(),
            requests: r
                .requests
                .iter()
                .filter_map(|b| b.to_value().ok())
                .collect(),
            tool_calls: r
                .tools
                .iter()
                .map(|t| InspectedTool {
                    call: t.clone(),
                    output: r.tool_ledger.get(&t.tool_call_id).cloned(),
                })
                .collect(),
            service_tier: r.service_tier.clone(),
            bodies_withheld: r.bodies_withheld,
            result: r.result.clone(),
        }
    }
}

impl TurnRecord {
    /// A freshly accepted turn, not yet picked up by a worker.
    pub fn queued(
        session_id: SessionId,
        turn_id: TurnId,
        fingerprint: String,
        mode_key: String,
    ) -> Self {
        Self {
            session_id,
            turn_id,
            fingerprint,
            status: TurnStatus::Queued,
            mode_key,
            pending: None,
            answered: Vec::new(),
            tool_ledger: BTreeMap::new(),
            requests: Vec::new(),
            attempts: 0,
            submitted_at: now_rfc3339(),
            completed_at: None,
            result: None,
            checkpoint: None,
            continuation: None,
            reply_to: None,
            streaming: false,
            webhook: None,
            batch: None,
            model_call: None,
            calls: Vec::new(),
            service_tier: None,
            history: Vec::new(),
            tools: Vec::new(),
            bodies_withheld: false,
        }
    }

    /// Notes `event` of the turn's current attempt (kept with the next write): the first
    /// entry and the latest [`HISTORY_KEPT`] - 1 are kept.
    pub fn note_event(&mut self, event: &str, detail: Option<String>) {
        self.history.push(TurnEvent {
            at: now_rfc3339(),
            event: event.to_string(),
            attempt: self.attempts,
            detail,
        });
        if self.history.len() > HISTORY_KEPT {
            self.history.remove(1);
        }
    }

    /// The same record with the service tier its calls ask for (a batch's), if any.
    pub fn at_tier(mut self, tier: Option<&str>) -> Self {
        self.service_tier = tier.map(str::to_string);
        self
    }

    /// The same record with the webhook URL it was submitted with.
    pub fn with_webhook(mut self, url: Option<&str>) -> Self {
        self.webhook = url.map(str::to_string);
        self
    }

    /// The same record as a line of `batch` (one whose completion is told of).
    pub fn in_batch(mut self, batch: Option<&str>) -> Self {
        self.batch = batch.map(str::to_string);
        self
    }

    /// The same record of a turn whose request asked (`true`) or did not ask for streaming.
    pub fn with_streaming(mut self, streaming: bool) -> Self {
        self.streaming = streaming;
        self
    }

    /// The same record naming the front door that waits for it.
    pub fn replying_to(mut self, address: Option<&str>) -> Self {
        self.reply_to = address.map(str::to_string);
        self
    }

    /// The turn stopped by a cancel request: `cancelled`, with a failed `TURN_CANCELLED`
    /// result and nothing left to resume.
    pub fn cancelled(mut self) -> Self {
        self.note_event("cancelled", None);
        self.status = TurnStatus::Cancelled;
        self.pending = None;
        self.checkpoint = None;
        self.completed_at = Some(now_rfc3339());
        self.result = Some(InvokeResult::failure(ErrorMessage::new(
            ErrorCode::TurnCancelled,
            format!(
                "turn {} of session {} was cancelled",
                self.turn_id,
                self.session_id.client_id()
            ),
        )));
        self
    }
}

/// The resume point of a running turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// The model answer whose tool calls are being processed.
    pub response: ModelResponse,
    /// The loop state after that answer was accounted for.
    pub progress: TurnProgress,
}

/// Entries of a turn's history kept ([`TurnRecord::history`]).
pub const HISTORY_KEPT: usize = 32;

/// One entry of a turn's history.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnEvent {
    /// When (RFC 3339).
    pub at: String,
    /// `queued`, `run_started`, `run_ended` (it goes back to the queue), `awaiting_client_tools`,
    /// `completed`, `failed` or `cancelled`.
    pub event: String,
    /// The run it belongs to (0: before the first).
    pub attempt: u32,
    /// Why, where there is more to say (a run that ended: its error).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub detail: Option<String>,
}

/// One server tool call of a turn ([`TurnRecord::tools`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ToolNote {
    /// The call id the model gave it.
    pub tool_call_id: String,
    /// The tool.
    pub name: String,
    /// Its arguments as the model wrote them (JSON text).
    pub arguments: String,
    /// Its output came from the turn's ledger (a run after a crash) instead of running it.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub replayed: bool,
    /// How long it ran, in milliseconds (0 when replayed).
    pub execution_ms: u64,
    /// The run that made it.
    pub attempt: u32,
}

/// A background model call in flight ([`TurnRecord::model_call`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ModelCallMark {
    /// The response the model server is working on.
    pub response_id: String,
    /// A digest of the request body: only the same request re-attaches to it.
    pub request: String,
}

/// What one model call of a turn came to ([`TurnRecord::calls`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct CallNote {
    /// The run that made it.
    #[serde(default)]
    pub attempt: u32,
    /// The text of its answer, if it had any (tool calls are in the turn's tool calls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub text: Option<String>,
    /// The response id.
    pub response_id: String,
    /// The model asked for.
    pub model: String,
    /// The agent context whose server answered.
    pub agent_context: String,
    /// How long the call took, retries included (a re-attached call: since re-attaching).
    pub latency_ms: u64,
    /// Tokens it spent.
    #[schema(value_type = Object)]
    pub usage: Usage,
    /// The tier the server reports it used, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// Made in background mode.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub background: bool,
    /// Followed by a run that re-attached after the one that made it died.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub reattached: bool,
}

/// One output item of a model answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputItem {
    /// Assistant text (`output_text` parts of a `message`, joined).
    Text(String),
    /// The model declined (`refusal` part).
    Refusal(String),
    /// The model asks for a function call.
    FunctionCall {
        /// The id to answer with (`call_id`).
        call_id: String,
        /// The function name.
        name: String,
        /// The arguments as JSON text (as the model wrote them; not necessarily valid).
        arguments: String,
    },
    /// Reasoning, ignored.
    Reasoning,
    /// An item type this client does not know; ignored with a warning.
    Unknown {
        /// The item's type.
        item_type: String,
    },
}

/// A normalised model answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelResponse {
    /// The response id (`previous_response_id` for the next call).
    pub id: String,
    /// The parsed output items, in order.
    pub items: Vec<OutputItem>,
    /// The raw output items that can be replayed as input (messages and function calls).
    pub replay_items: Vec<Value>,
    /// Why the answer is incomplete (`max_output_tokens`, `content_filter`), if it is.
    pub incomplete_reason: Option<String>,
    /// Token usage of this call.
    pub usage: Usage,
    /// The service tier the server says it used, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
}

/// Why a model call failed, after retries.
/// A batch of turns submitted together (`POST /v1/batches`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchRecord {
    /// The batch id.
    pub batch_id: String,
    /// The tenant that submitted it (only it can read the batch).
    pub tenant: String,
    /// Submitted (RFC 3339).
    pub created_at: String,
    /// Lines in the submission (blank lines not counted).
    pub total: usize,
    /// Accepted lines, in line order.
    pub items: Vec<BatchItem>,
    /// Rejected lines, in line order.
    pub rejected: Vec<BatchLineError>,
    /// Where `batch.completed` (and each line's turn) is POSTed too, when the submission
    /// named a webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
}

/// A batch's progress: `total = rejected + queued + running + awaitingClientTools + completed +
/// failed + cancelled + expired` (`expired`: turns whose records are gone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchProgress {
    /// The batch id.
    pub batch_id: String,
    /// Lines submitted.
    pub total: usize,
    /// Lines rejected at submission.
    pub rejected: usize,
    /// Turns waiting for a worker.
    pub queued: usize,
    /// Turns being run.
    pub running: usize,
    /// Turns waiting for client tool results.
    pub awaiting_client_tools: usize,
    /// Turns with a final answer.
    pub completed: usize,
    /// Turns that failed.
    pub failed: usize,
    /// Turns that were cancelled.
    #[serde(default)]
    pub cancelled: usize,
    /// Turns whose records are gone (past the retention period).
    pub expired: usize,
}

/// One accepted line of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchItem {
    /// 1-based line number in the submission.
    pub line: usize,
    /// The client's id for the line.
    pub custom_id: String,
    /// The turn's session (scoped to its tenant).
    #[serde(with = "crate::contract::ids::scoped")]
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
}

/// One rejected line of a batch, with every reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchLineError {
    /// 1-based line number in the submission.
    pub line: usize,
    /// The client's id for the line, when it could be read.
    pub custom_id: Option<String>,
    /// What is wrong with it.
    pub errors: Vec<crate::contract::ErrorMessage>,
}

/// Now, as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::SentRequest;

    fn sent(text: &str) -> SentRequest {
        SentRequest::new(serde_json::value::RawValue::from_string(text.to_owned()).unwrap())
    }

    #[test]
    fn a_sent_request_is_stored_and_read_back_as_the_exact_text() {
        let text = r#"{"model":"m",  "input":[{"b":1,"a":2}]}"#;
        let stored = serde_json::to_string(&vec![sent(text)]).unwrap();
        assert_eq!(stored, format!("[{text}]"));
        let read: Vec<SentRequest> = serde_json::from_str(&stored).unwrap();
        assert_eq!(read[0].json(), text);
    }

    #[test]
    fn the_bytes_sent_are_the_body_itself_not_a_copy() {
        let body = sent(r#"{"model":"m","input":"hello"}"#);
        let bytes = body.bytes();
        assert_eq!(&bytes[..], body.json().as_bytes());
        assert_eq!(bytes.as_ptr(), body.json().as_ptr());
        // A clone of the record's body shares it too.
        assert_eq!(body.clone().bytes().as_ptr(), body.json().as_ptr());
    }
}
