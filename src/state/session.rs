//! A session's state: its mode and mode history, the response it continues from (and what
//! that response carries), the contexts it latched, and replay.

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::*;
use crate::contract::{SessionId, TurnId};

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
    /// Conversation items not yet in the session's conversation list. The store keeps a
    /// session's conversation (the items a replay continuation sends to servers that do not
    /// store responses) apart from the session, append-only: a save that carries the session
    /// appends these items there (read them with [`crate::store::StoreReader::conversation`]).
    /// A session read back holds items only where its store kept them with it: a session with
    /// no list yet, whose first run's last write kept its items
    /// ([`crate::store::RunWrite::unlisted`]), or one stored before the conversation moved
    /// out. They follow the listed ones, and move to the list with the session's next save.
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
