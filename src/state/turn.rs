//! A turn's record: its status, progress, pending client tools, checkpoint, history and the
//! notes of its model and tool calls.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;
use crate::contract::{
    AgentExecuteResponse, ErrorCode, ErrorMessage, InvokeResult, SessionId, ToolCall, ToolResult,
    TurnId, Usage,
};

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
    pub pending: Option<Box<PendingTools>>,
    /// Client tool call ids already answered by a continuation: a redelivered continuation is
    /// recognised instead of being taken for a mismatch.
    #[serde(default)]
    pub answered: Vec<String>,
    /// Outputs of server tools already run, per `call_id`: a re-run reuses them instead of
    /// running a tool twice. An MCP call that may not be repeated is also marked here before it
    /// goes out, under [`sent_key`]: a run that finds the mark without an output knows an
    /// earlier run sent it and died before its answer was recorded.
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
    pub result: Option<Box<InvokeResult<AgentExecuteResponse>>>,
    /// The last model answer and the loop state right after it, saved before any of its tools
    /// run: a re-run after a crash resumes here instead of asking the model again, so tools
    /// recorded in the ledger are not run twice.
    #[serde(default)]
    pub checkpoint: Option<Box<Checkpoint>>,
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
    /// What the client asked (its instruction, shortened, and the files it named), kept for
    /// people looking into the turn; absent when the tenant's bodies are not kept.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub input: Option<TurnInput>,
    /// The tenant's prompts and answers are not kept (`keepBodies: false`): `requests`, each
    /// call's text and the tools' arguments were left out.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub bodies_withheld: bool,
    /// The runs of the turn begun when it was read (the ledger's [`RUNS_BEGUN`], not part of
    /// the record as stored): a compare-and-set on the record as read fails if a run has
    /// begun since, though that run has not written the record yet.
    #[serde(skip)]
    pub runs_begun: u32,
}

/// The ledger key that marks server tool call `call_id` as sent (a space cannot be in an
/// id, so it cannot be another call's key). Its value is when it was sent, or [`NOT_SENT`].
pub fn sent_key(call_id: &str) -> String {
    format!("sent {call_id}")
}

/// The value of a [`sent_key`] entry once the call is known not to have left (the mark is
/// written before the call; a call that then could not be sent takes it back).
pub const NOT_SENT: &str = "not sent";

/// The ledger field that counts the runs of a user turn begun: the step that begins a run
/// adds one as it takes the session's lease, so a run that dies before it writes the turn is
/// counted all the same, and a reader sees the turn `running` from then on (see
/// [`TurnRecord::with_runs_begun`]). The space keeps it apart from call ids.
pub const RUNS_BEGUN: &str = "runs begun";

impl TurnRecord {
    /// The record as a reader sees it beside the ledger's count of runs begun
    /// ([`RUNS_BEGUN`]): a turn not settled nor waiting whose count is ahead of the runs the
    /// record saw is `running`, in that attempt (its run writes the turn only when it has
    /// something to keep).
    pub fn with_runs_begun(&mut self, runs: u32) {
        self.runs_begun = runs;
        if runs > self.attempts && !self.status.is_settled() && self.pending.is_none() {
            self.attempts = runs;
            self.status = TurnStatus::Running;
        }
    }

    /// Whether an earlier run sent server tool call `call_id` (see [`sent_key`]).
    pub fn was_sent(&self, call_id: &str) -> bool {
        self.tool_ledger
            .get(&sent_key(call_id))
            .is_some_and(|v| v != NOT_SENT)
    }

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
            input: None,
            bodies_withheld: false,
            runs_begun: 0,
        }
    }

    /// A new user turn as the front door admits it: [`TurnRecord::queued`] with what it was
    /// accepted with. Made in one step, not through builders that each move the whole record:
    /// this runs for every turn submitted.
    pub fn admitted(
        session_id: SessionId,
        turn_id: TurnId,
        fingerprint: String,
        with: Admitted<'_>,
    ) -> Self {
        let mut record = Self::queued(session_id, turn_id, fingerprint, String::new());
        record.input = with.input;
        record.reply_to = with.reply_to.map(str::to_string);
        record.streaming = with.streaming;
        record.webhook = with.webhook.map(str::to_string);
        record.batch = with.batch.map(str::to_string);
        record.service_tier = with.service_tier.map(str::to_string);
        record
    }

    /// Milliseconds from the turn's acceptance to now, for a note of something that starts
    /// now (`None` if the acceptance time cannot be read).
    pub fn ms_since_accepted(&self) -> Option<u64> {
        use time::format_description::well_known::Rfc3339;
        let accepted = time::OffsetDateTime::parse(&self.submitted_at, &Rfc3339).ok()?;
        u64::try_from((time::OffsetDateTime::now_utc() - accepted).whole_milliseconds()).ok()
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
        self.result = Some(Box::new(InvokeResult::failure(ErrorMessage::new(
            ErrorCode::TurnCancelled,
            format!(
                "turn {} of session {} was cancelled",
                self.turn_id,
                self.session_id.client_id()
            ),
        ))));
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

/// What a new user turn was accepted with, beside its ids ([`TurnRecord::admitted`]).
#[derive(Debug)]
pub struct Admitted<'a> {
    /// What the client asked, when the tenant's bodies are kept ([`TurnRecord::input`]).
    pub input: Option<TurnInput>,
    /// The direct reply address of the front door that may wait for it.
    pub reply_to: Option<&'a str>,
    /// The request asked for its text as it is written.
    pub streaming: bool,
    /// The webhook its statuses are delivered to.
    pub webhook: Option<&'a str>,
    /// The batch it is a line of.
    pub batch: Option<&'a str>,
    /// The service tier its calls ask for.
    pub service_tier: Option<&'a str>,
}

/// What a user turn asked, as its record keeps it for people ([`TurnRecord::input`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct TurnInput {
    /// The instruction, its first [`INSTRUCTION_KEPT`] characters (then `…`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub instruction: Option<String>,
    /// The files the client supplied, by path (the first [`ARTIFACTS_NAMED`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub artifacts: Vec<String>,
    /// How many files it supplied in all.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub artifact_count: usize,
}

/// Characters of an instruction a record keeps.
pub const INSTRUCTION_KEPT: usize = 280;
/// Files a record names.
pub const ARTIFACTS_NAMED: usize = 10;

fn is_zero(n: &usize) -> bool {
    *n == 0
}

impl TurnInput {
    /// What a record keeps of `instruction` and the files at `paths`.
    pub fn of<'a>(
        instruction: Option<&str>,
        paths: impl ExactSizeIterator<Item = &'a str>,
    ) -> Self {
        let artifact_count = paths.len();
        Self {
            instruction: instruction.map(|text| shortened(text, INSTRUCTION_KEPT)),
            artifacts: paths.take(ARTIFACTS_NAMED).map(str::to_string).collect(),
            artifact_count,
        }
    }
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
    /// The MCP source that ran it (none for a built-in tool).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<String>,
    /// What an MCP call came to (`answered`, `tool_error`, `rejected`, `repeat_refused`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    /// An MCP call made again because a run that had sent it died before its answer was
    /// recorded (the tool is safe to repeat).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub repeated: bool,
    /// When it started, in milliseconds after the turn was accepted (absent in records
    /// written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<u64>,
    /// A client tool's answer as the client sent it (its first [`RESULT_KEPT`] characters):
    /// a server tool's output is in the turn's ledger instead.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub result: Option<String>,
}

/// Characters of a client tool's answer a record keeps.
pub const RESULT_KEPT: usize = 2000;

/// `text`'s first `most` characters, then `…` if there were more.
pub fn shortened(text: &str, most: usize) -> String {
    // No more bytes than `most` is no more characters: nothing to count.
    if text.len() <= most {
        return text.to_string();
    }
    match text.char_indices().nth(most) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
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
    /// When it started, in milliseconds after the turn was accepted (absent in records
    /// written before it was kept).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_ms: Option<u64>,
    /// How long of its time it waited for its agent context's capacity (concurrency or
    /// rate) before it was sent, when it waited a millisecond or more.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_wait_ms: Option<u64>,
    /// Why it got no answer (`CODE: message`): a call that failed, was given up on or goes
    /// to another run (its response id is then empty and its usage zero).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}
