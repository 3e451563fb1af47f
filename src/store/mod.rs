//! Session and turn state (AGN-027 layer F): what the pipeline reads before a turn and writes
//! while and after it runs.
//!
//! Owns: the stored shapes and the [`SessionStore`] trait; the in-memory implementation lives in
//! [`memory`]. Must not: call the model or run tools. Workers are stateless: everything a turn
//! needs to resume (pending client tool calls, recorded server tool outputs) is stored here.

pub mod bench;
pub mod memory;
pub mod redis;

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::contract::{
    AgentExecuteResponse, InvokeResult, SessionId, ToolCall, ToolResult, TurnId, Usage,
};

pub use memory::MemoryStore;
pub use redis::RedisStore;

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

/// Retention of stored state.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Turn records and their results expire this long after their last write.
    pub turns: Duration,
    /// Sessions expire this long after their last write (idle sessions).
    pub sessions: Duration,
}

impl Default for Retention {
    fn default() -> Self {
        Self {
            turns: Duration::from_secs(7 * 24 * 3600),
            sessions: Duration::from_secs(30 * 24 * 3600),
        }
    }
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

/// A session's server-owned state.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SessionState {
    /// The session.
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
    /// Conversation items so far, for replay continuation (servers that do not store responses).
    pub conversation: Vec<Value>,
    /// Set once the model server answered `previous_response_not_found`: later calls replay.
    pub replay: bool,
    /// The latched solution context (AGN-034 §4.5).
    pub solution_context: Option<String>,
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
}

impl TurnStatus {
    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Queued => "queued",
            Self::Running => "running",
            Self::AwaitingClientTools => "awaiting_client_tools",
            Self::Completed => "completed",
            Self::Failed => "failed",
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
}

/// A turn's record.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TurnRecord {
    /// The session.
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
    /// Request transcript: the model request bodies sent, in order.
    pub requests: Vec<Value>,
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
}

/// A turn's status as clients see it (GET, SSE events, reply messages):
/// `{sessionId, turnId, status, attempts, submittedAt, completedAt?, result?}`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
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
    #[schema(value_type = Option<crate::frontdoor::openapi::ExecuteResult>)]
    pub result: Option<InvokeResult<AgentExecuteResponse>>,
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
        }
    }
}

/// The resume point of a running turn.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Checkpoint {
    /// The model answer whose tool calls are being processed.
    pub response: crate::llm::ModelResponse,
    /// The loop state after that answer was accounted for.
    pub progress: TurnProgress,
}

/// A store operation that could not be done.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// The backend is unreachable or failed; the operation may succeed if retried.
    #[error("session store unavailable: {0}")]
    Unavailable(String),
    /// Stored data could not be read back.
    #[error("session store data is corrupt: {0}")]
    Corrupt(String),
    /// The writer no longer holds the session's lease; its write was rejected.
    #[error("the lease on session {0} was lost; the write was rejected")]
    Fenced(String),
}

/// Session and turn persistence. Implementations: [`MemoryStore`] (embedded, tests) and
/// [`RedisStore`]; both pass one conformance suite (`tests/it/store_conformance.rs`).
///
/// Every write a worker makes during a turn carries its [`Lease`] and is rejected if that lease
/// is no longer the session's current one.
#[async_trait::async_trait]
pub trait SessionStore: Send + Sync + 'static {
    /// The session, if it exists.
    async fn get_session(&self, id: &SessionId) -> Result<Option<SessionState>, StoreError>;
    /// The turn, if it exists in that session.
    async fn get_turn(
        &self,
        session: &SessionId,
        turn: &TurnId,
    ) -> Result<Option<TurnRecord>, StoreError>;
    /// The session's turn ids with their status, oldest first.
    async fn list_turns(&self, session: &SessionId) -> Result<Vec<TurnId>, StoreError>;
    /// Creates the record of a newly accepted turn unless one exists; returns the existing one
    /// otherwise. Not fenced: the front door writes it without holding the session's lease.
    async fn create_turn(&self, turn: &TurnRecord) -> Result<Option<TurnRecord>, StoreError>;
    /// Deletes a turn record that is still exactly as [`SessionStore::create_turn`] wrote it
    /// (its job was never confirmed, so nothing will run it); `false` when it changed or is
    /// gone. Not fenced, like `create_turn`.
    async fn discard_turn(&self, turn: &TurnRecord) -> Result<bool, StoreError>;
    /// Replaces a turn record only if it is still exactly `current` (compare-and-set); `false`
    /// when it changed or is gone, and nothing was written. Not fenced: the front door uses it
    /// to move a turn that waits for client tools back to `queued` when it accepts their
    /// results, and to undo that when the job was not accepted.
    async fn replace_turn(
        &self,
        current: &TurnRecord,
        new: &TurnRecord,
    ) -> Result<bool, StoreError>;
    /// The tenant that owns the session, if any.
    async fn owner(&self, session: &SessionId) -> Result<Option<String>, StoreError>;
    /// Makes `tenant` the session's owner unless it has one; returns the owner.
    async fn claim_owner(&self, session: &SessionId, tenant: &str) -> Result<String, StoreError>;
    /// Takes the session's lease for `ttl`; `None` when another holder has it (session busy).
    async fn acquire_lease(
        &self,
        session: &SessionId,
        holder: &str,
        ttl: Duration,
    ) -> Result<Option<Lease>, StoreError>;
    /// Extends a held lease; `false` when it was lost (expired and maybe taken by another).
    async fn renew_lease(
        &self,
        session: &SessionId,
        lease: &Lease,
        ttl: Duration,
    ) -> Result<bool, StoreError>;
    /// Gives a lease back (no effect when it was already lost).
    async fn release_lease(&self, session: &SessionId, lease: &Lease) -> Result<(), StoreError>;
    /// Writes the turn record and, when given, the session state, in one atomic step checked
    /// against the lease; with `release`, the lease is released in the same step.
    async fn save(
        &self,
        session: Option<&SessionState>,
        turn: &TurnRecord,
        lease: &Lease,
        release: bool,
    ) -> Result<(), StoreError>;
    /// Records one server tool's output before the next model call (fenced).
    async fn record_tool_output(
        &self,
        session: &SessionId,
        turn: &TurnId,
        call_id: &str,
        output: &str,
        lease: &Lease,
    ) -> Result<(), StoreError>;
    /// Changes the session's mode and appends the history entry (fenced); returns the new
    /// state. The session must exist.
    async fn change_mode(
        &self,
        session: &SessionId,
        new_mode_id: &str,
        change: ModeChange,
        lease: &Lease,
    ) -> Result<SessionState, StoreError>;
    /// How many writes were rejected because their lease was stale.
    fn fenced_rejections(&self) -> u64;
    /// Stores a batch (kept as long as turn records).
    async fn put_batch(&self, batch: &BatchRecord) -> Result<(), StoreError>;
    /// The batch, if it exists.
    async fn get_batch(&self, id: &str) -> Result<Option<BatchRecord>, StoreError>;
    /// Several turns at once, in the order asked (`None` where absent); one round trip where
    /// the backend allows it.
    async fn get_turns(
        &self,
        ids: &[(SessionId, TurnId)],
    ) -> Result<Vec<Option<TurnRecord>>, StoreError> {
        let mut out = Vec::with_capacity(ids.len());
        for (sid, tid) in ids {
            out.push(self.get_turn(sid, tid).await?);
        }
        Ok(out)
    }
}

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
}

/// One accepted line of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchItem {
    /// 1-based line number in the submission.
    pub line: usize,
    /// The client's id for the line.
    pub custom_id: String,
    /// The turn's session.
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
