//! Which agent contexts (model backend and credentials) and conversation contexts (boot prompt)
//! a deployment has (AGN-003 §2). A request may name one of each; a name that is not configured
//! is refused where the request enters (front door), and again by the worker, which fails the
//! turn in the store rather than running it against the wrong backend.
//!
//! The contexts come from `APTIX_CONTEXTS_FILE` (validated when the process starts: a bad
//! entry stops it, named) plus the built-in `default` pair made from `APTIX_LLM_BASE_URL`,
//! `OPENAI_API_KEY` and `APTIX_MODEL` unless the file defines its own `default`.
//!
//! Owns: the contexts file, the set of known ids and the check of a user turn against it.
//! Keys are read from the environment variables the file names and never printed. Must not:
//! call the model or build prompts.

mod calls;
mod file;
mod hosted;

use std::collections::BTreeSet;

use crate::contract::{ErrorCode, ErrorMessage, SessionId, UserTurn};
use crate::state::ContextIds;

pub use calls::{CallSettings, FLEX_FALLBACK_AFTER, Prices, ServiceTier};
pub use file::{AgentContext, Contexts, ContextsError, ConversationContext};
pub use hosted::HostedTool;

/// An agent context's base URL, checked: an http(s) URL with a host. `Err` says what is wrong
/// with it (the contexts file and the model client both refuse such a URL at start-up).
pub fn model_base_url(url: &str) -> Result<reqwest::Url, String> {
    let parsed = reqwest::Url::parse(url).map_err(|e| format!("it is not a URL ({e})"))?;
    if !matches!(parsed.scheme(), "http" | "https") {
        return Err(format!(
            "its scheme is {}:, not http or https",
            parsed.scheme()
        ));
    }
    if parsed.host().is_none() {
        return Err("it has no host".into());
    }
    Ok(parsed)
}

/// The id a request gets when it names no context.
pub const DEFAULT_CONTEXT: &str = "default";

/// The configured context ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KnownContexts {
    agent: BTreeSet<String>,
    conversation: BTreeSet<String>,
}

impl Default for KnownContexts {
    /// Only the built-in `default` of each kind.
    fn default() -> Self {
        Self::new([DEFAULT_CONTEXT.to_string()], [DEFAULT_CONTEXT.to_string()])
    }
}

impl KnownContexts {
    /// The given agent and conversation context ids.
    pub fn new(
        agent: impl IntoIterator<Item = String>,
        conversation: impl IntoIterator<Item = String>,
    ) -> Self {
        Self {
            agent: agent.into_iter().collect(),
            conversation: conversation.into_iter().collect(),
        }
    }

    /// The agent context ids, sorted.
    pub fn agent_ids(&self) -> impl Iterator<Item = &str> {
        self.agent.iter().map(String::as_str)
    }

    /// The conversation context ids, sorted.
    pub fn conversation_ids(&self) -> impl Iterator<Item = &str> {
        self.conversation.iter().map(String::as_str)
    }

    /// Every context id the turn names that is not configured, as `UNKNOWN_CONTEXT` errors
    /// whose messages start with the field and list what is configured.
    pub fn check(&self, turn: &UserTurn) -> Result<(), Vec<ErrorMessage>> {
        let mut errors = Vec::new();
        let mut unknown = |field: &str, id: Option<&str>, known: &BTreeSet<String>, kind: &str| {
            if let Some(id) = id
                && !known.contains(id)
            {
                let list: Vec<&str> = known.iter().map(String::as_str).collect();
                errors.push(ErrorMessage::new(
                    ErrorCode::UnknownContext,
                    format!(
                        "{field}: no {kind} context {id:?} is configured (configured: {})",
                        list.join(", ")
                    ),
                ));
            }
        };
        unknown(
            "agentContextId",
            turn.agent_context_id(),
            &self.agent,
            "agent",
        );
        unknown(
            "conversationContextId",
            turn.conversation_context_id(),
            &self.conversation,
            "conversation",
        );
        if errors.is_empty() {
            Ok(())
        } else {
            Err(errors)
        }
    }
}

/// `CONTEXT_MISMATCH` errors for the context ids a turn names that its session did not latch.
pub fn context_mismatches(
    session: &SessionId,
    latched: &ContextIds,
    agent: Option<&str>,
    conversation: Option<&str>,
) -> Vec<ErrorMessage> {
    latched
        .mismatches(agent, conversation)
        .into_iter()
        .map(|(field, named, latched)| {
            ErrorMessage::new(
                ErrorCode::ContextMismatch,
                format!(
                    "{field}: session {} runs with {latched:?} since its first turn; a later turn may leave the field out or name {latched:?}, not {named:?}",
                    session.client_id()
                ),
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mismatches_name_the_field_and_both_ids() {
        let latched = ContextIds::named_or_default(Some("fast"), None);
        let sid = SessionId::parse("s1").unwrap();
        assert!(context_mismatches(&sid, &latched, None, None).is_empty());
        assert!(context_mismatches(&sid, &latched, Some("fast"), Some("default")).is_empty());
        let errors = context_mismatches(&sid, &latched, Some("slow"), Some("ddr"));
        assert_eq!(errors.len(), 2);
        assert!(
            errors
                .iter()
                .all(|e| e.error_code == ErrorCode::ContextMismatch)
        );
        assert!(
            errors[0].message.starts_with("agentContextId")
                && errors[0].message.contains("\"slow\"")
                && errors[0].message.contains("\"fast\"")
        );
        assert!(errors[1].message.starts_with("conversationContextId"));
    }
}
