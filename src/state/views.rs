//! What clients and the console read of a turn's record: its status view and its inspection.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;
use crate::contract::{AgentExecuteResponse, InvokeResult, SessionId, TurnId};

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
    /// The service tier the model server reports serving the turn's latest model call with
    /// (`flex`, `default`, …), when it reports one.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub service_tier: Option<String>,
    /// The latest result, once there is one. Written last, after fields that hold no object:
    /// a waiter finds it in a published status without reading it
    /// ([`crate::delivery::PublishedStatus`]).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub result: Option<InvokeResult<AgentExecuteResponse>>,
}

/// The status of a record no longer needed as a record: its parts moved, not copied.
impl From<TurnRecord> for TurnStatusView {
    fn from(r: TurnRecord) -> Self {
        Self {
            service_tier: r.calls.into_iter().rev().find_map(|c| c.service_tier),
            session_id: r.session_id,
            turn_id: r.turn_id,
            status: r.status,
            attempts: r.attempts,
            submitted_at: r.submitted_at,
            completed_at: r.completed_at,
            result: r.result.map(|result| *result),
        }
    }
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
            result: r.result.as_deref().cloned(),
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
    /// The tenant whose turn it is.
    pub tenant: String,
    /// What the client asked (absent when the tenant's bodies are not kept, and for turns
    /// recorded before it was kept).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub input: Option<TurnInput>,
    /// What happened to it, in order, from `queued` on.
    pub history: Vec<TurnEvent>,
    /// Every model call, in order: those answered, and those that got no answer (failed,
    /// given up on, handed to another run) with their `error`.
    pub model_calls: Vec<CallNote>,
    /// Every model request body sent, as sent (instructions, input, tools; never a key). A
    /// request whose prompt is no longer kept names it under `aptixPrompt` instead of carrying
    /// its instructions and tools.
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

impl TurnInspection {
    /// The prompts the turn's transcript names (see [`super::Prompt`]), each once.
    pub fn prompts_named(r: &TurnRecord) -> Vec<String> {
        let mut ids: Vec<String> = r
            .requests
            .iter()
            .filter_map(|b| b.to_value().ok())
            .filter_map(|v| super::prompt_of(&v).map(str::to_string))
            .collect();
        ids.sort();
        ids.dedup();
        ids
    }

    /// The turn as the inspector shows it, its requests as sent (their prompts put back from
    /// `prompts`, by id).
    pub fn of(r: &TurnRecord, prompts: &std::collections::BTreeMap<String, String>) -> Self {
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
            tenant: r.session_id.tenant().to_string(),
            input: r.input.clone(),
            history: std::iter::once(queued)
                .chain(r.history.iter().cloned())
                .collect(),
            model_calls: r.calls.clone(),
            requests: r
                .requests
                .iter()
                .filter_map(|b| super::joined(b, prompts))
                .collect(),
            tool_calls: r
                .tools
                .iter()
                .map(|t| {
                    let mut call = t.clone();
                    // A client tool's answer is kept with its note, a server tool's in the ledger.
                    let output = call
                        .result
                        .take()
                        .or_else(|| r.tool_ledger.get(&t.tool_call_id).cloned());
                    InspectedTool { call, output }
                })
                .collect(),
            service_tier: r.service_tier.clone(),
            bodies_withheld: r.bodies_withheld,
            result: r.result.as_deref().cloned(),
        }
    }
}

impl From<&TurnRecord> for TurnInspection {
    /// The turn as kept: requests naming their prompts rather than carrying them.
    fn from(r: &TurnRecord) -> Self {
        Self::of(r, &std::collections::BTreeMap::new())
    }
}

/// One turn as the runs list shows it (`GET /v1/turns`, the console's home page): enough to
/// find a turn and see how it went, without its transcript.
#[derive(Debug, Clone, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct RunLine {
    /// The tenant whose turn it is.
    pub tenant: String,
    /// The session, as its client names it.
    pub session_id: String,
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
    /// From acceptance to the end, once it ended.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<u64>,
    /// The agent context its calls go to, once known (its first call, or the session's).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent_context: Option<String>,
    /// The batch it is a line of.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch_id: Option<String>,
    /// Model calls answered (calls that got no answer are in the inspection).
    pub model_calls: usize,
    /// Server tool calls made.
    pub tool_calls: usize,
    /// Tokens its calls spent, summed (and their estimated cost).
    #[schema(value_type = Object)]
    pub usage: crate::contract::Usage,
    /// Why it failed (`CODE: message`), when it did.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl RunLine {
    /// The list's line for `r`, a turn of `tenant`'s.
    pub fn of(r: &TurnRecord, tenant: &str) -> Self {
        let mut usage = crate::contract::Usage::default();
        for c in &r.calls {
            usage.prompt_tokens += c.usage.prompt_tokens;
            usage.completion_tokens += c.usage.completion_tokens;
            usage.total_tokens += c.usage.total_tokens;
            usage.cached_tokens += c.usage.cached_tokens;
            usage.reasoning_tokens += c.usage.reasoning_tokens;
            usage.cost_micros += c.usage.cost_micros;
        }
        let error = r
            .result
            .as_ref()
            .and_then(|res| res.errors().first().copied())
            .map(|e| format!("{}: {}", e.error_code.as_str(), e.message));
        Self {
            tenant: tenant.to_string(),
            session_id: r.session_id.client_id().to_string(),
            turn_id: r.turn_id.clone(),
            status: r.status,
            attempts: r.attempts,
            submitted_at: r.submitted_at.clone(),
            completed_at: r.completed_at.clone(),
            duration_ms: r
                .completed_at
                .as_deref()
                .and_then(|end| millis_between(&r.submitted_at, end)),
            agent_context: r.calls.first().map(|c| c.agent_context.clone()),
            batch_id: r.batch.clone(),
            model_calls: r.calls.iter().filter(|c| c.error.is_none()).count(),
            tool_calls: r.tools.len(),
            usage,
            error,
        }
    }
}

/// Milliseconds from one RFC 3339 time to a later one; `None` if either cannot be read.
pub fn millis_between(from: &str, to: &str) -> Option<u64> {
    use time::format_description::well_known::Rfc3339;
    let from = time::OffsetDateTime::parse(from, &Rfc3339).ok()?;
    let to = time::OffsetDateTime::parse(to, &Rfc3339).ok()?;
    u64::try_from((to - from).whole_milliseconds()).ok()
}
