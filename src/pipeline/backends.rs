//! What a turn's contexts map to (AGN-003 §2): the agent context picks the model client (base
//! URL, key, timeout, limits), the model and the replay setting; the conversation context
//! picks the boot prompt and may override the model.
//!
//! Owns: the map from context ids to clients and prompts, and resolving a user turn's contexts
//! against the ones its session latched. Must not: call the model or write turn state.

use foldhash::HashMap;
use std::sync::Arc;

use crate::contexts::{DEFAULT_CONTEXT, KnownContexts, context_mismatches};
use crate::contract::{ErrorCode, ErrorMessage, InvokeResult, UserTurn};
use crate::llm::LlmClient;
#[cfg(doc)]
use crate::store::SessionStore;
use crate::store::{ContextIds, SessionState, StoreError};

/// How the calls of one agent context are made.
#[derive(Debug, Clone)]
pub struct AgentBackend {
    /// The client for the context's model server (with its key, timeout and limiter).
    pub llm: LlmClient,
    /// The model, unless the conversation context names one.
    pub model: String,
    /// Always replay the conversation instead of `previous_response_id`.
    pub replay: bool,
    /// Send each session's `prompt_cache_key`.
    pub prompt_caching: bool,
    /// Background mode, service tier and prices.
    pub calls: crate::contexts::CallSettings,
}

/// A conversation context as the pipeline uses it.
#[derive(Debug, Clone)]
pub struct Conversation {
    /// The system message of a session's first model call (shared: a turn waiting on that
    /// call holds a reference, not a copy).
    pub boot_prompt: Arc<str>,
    /// Overrides the agent context's model.
    pub model: Option<String>,
}

/// Every context a pipeline can run turns with.
#[derive(Debug, Clone)]
pub struct Backends {
    // Looked up by name a few times a turn: foldhash rather than SipHash (the names are the
    // operator's; a request can only look one up).
    agents: HashMap<String, Arc<AgentBackend>>,
    conversations: HashMap<String, Arc<Conversation>>,
}

/// The backend, model and boot prompt of one turn.
#[derive(Debug, Clone)]
pub(super) struct Resolved {
    pub(super) agent: Arc<AgentBackend>,
    pub(super) conversation: Arc<Conversation>,
}

impl Resolved {
    /// The model sent on the turn's calls: the conversation context's, else the agent's.
    pub(super) fn model(&self) -> &str {
        self.conversation
            .model
            .as_deref()
            .unwrap_or(&self.agent.model)
    }
}

impl Backends {
    /// No contexts yet.
    pub fn empty() -> Self {
        Self {
            agents: HashMap::default(),
            conversations: HashMap::default(),
        }
    }

    /// The agent context `id`.
    pub fn agent(&self, id: &str) -> Option<&AgentBackend> {
        self.agents.get(id).map(Arc::as_ref)
    }

    /// Only the `default` pair.
    pub fn single(agent: AgentBackend, boot_prompt: &str) -> Self {
        Self {
            agents: [(DEFAULT_CONTEXT.to_string(), Arc::new(agent))]
                .into_iter()
                .collect(),
            conversations: [(
                DEFAULT_CONTEXT.to_string(),
                Arc::new(Conversation {
                    boot_prompt: boot_prompt.into(),
                    model: None,
                }),
            )]
            .into_iter()
            .collect(),
        }
    }

    /// Adds (or replaces) an agent context.
    pub fn with_agent(mut self, id: &str, backend: AgentBackend) -> Self {
        self.agents.insert(id.to_string(), Arc::new(backend));
        self
    }

    /// Adds (or replaces) a conversation context.
    pub fn with_conversation(mut self, id: &str, conversation: Conversation) -> Self {
        self.conversations
            .insert(id.to_string(), Arc::new(conversation));
        self
    }

    /// Each agent context with its `maxConcurrentCalls`, by id.
    pub fn capacities(&self) -> Vec<(String, Option<u32>)> {
        let mut out: Vec<_> = self
            .agents
            .iter()
            .map(|(id, b)| (id.clone(), b.llm.max_concurrent_calls()))
            .collect();
        out.sort();
        out
    }

    /// The ids these backends serve.
    pub fn known(&self) -> KnownContexts {
        KnownContexts::new(
            self.agents.keys().cloned(),
            self.conversations.keys().cloned(),
        )
    }

    /// The backend of `ids`, or the `UNKNOWN_CONTEXT` error naming what this process lacks
    /// (a session latched on a context that a differently configured worker does not have).
    pub(super) fn resolve(&self, ids: &ContextIds) -> Result<Resolved, Vec<ErrorMessage>> {
        let missing = |kind: &str, id: &str| {
            ErrorMessage::new(
                ErrorCode::UnknownContext,
                format!(
                    "the session runs with {kind} context {id:?}, which this worker does not have configured"
                ),
            )
        };
        match (
            self.agents.get(&ids.agent_context_id),
            self.conversations.get(&ids.conversation_context_id),
        ) {
            (Some(agent), Some(conversation)) => Ok(Resolved {
                agent: agent.clone(),
                conversation: conversation.clone(),
            }),
            (agent, conversation) => {
                let mut errors = Vec::new();
                if agent.is_none() {
                    errors.push(missing("agent", &ids.agent_context_id));
                }
                if conversation.is_none() {
                    errors.push(missing("conversation", &ids.conversation_context_id));
                }
                Err(errors)
            }
        }
    }
}

/// The failed result of a turn whose contexts cannot be used.
pub(super) fn refused(errors: Vec<ErrorMessage>) -> super::outcome::TurnResult {
    InvokeResult::failures(errors).unwrap_or_else(|| {
        InvokeResult::failure(ErrorMessage::new(
            ErrorCode::UnknownContext,
            "the turn's contexts are not configured",
        ))
    })
}

/// The contexts a user turn asks for (its named ones, the default for the rest), or why they
/// cannot be used (`UNKNOWN_CONTEXT`): what the run latches for a new session.
pub(super) fn asked_for(
    known: &KnownContexts,
    turn: &UserTurn,
) -> Result<ContextIds, Vec<ErrorMessage>> {
    known.check(turn)?;
    Ok(ContextIds::named_or_default(
        turn.agent_context_id(),
        turn.conversation_context_id(),
    ))
}

impl Backends {
    /// A user turn's contexts — the ones its session latched: the stored session's, or for a
    /// new session the ones [`SessionStore::begin_turn`] latched from `asked` — and what they
    /// map to. `Ok(Err(errors))` when the turn names unknown contexts or other ones than the
    /// session's, or this process lacks them (the front door refuses the first two; a job can
    /// still carry them when a differently configured front door accepted it, or two first
    /// turns of one session raced). `Err` only when the store broke its contract (a new
    /// session without latched contexts).
    pub(super) fn contexts_of(
        &self,
        asked: Result<ContextIds, Vec<ErrorMessage>>,
        turn: &UserTurn,
        session: Option<&SessionState>,
        latched: Option<ContextIds>,
    ) -> Result<Result<(Resolved, ContextIds), Vec<ErrorMessage>>, StoreError> {
        if let Err(errors) = asked {
            return Ok(Err(errors));
        }
        let latched = match (session, latched) {
            (Some(s), _) => s.contexts.clone(),
            (None, Some(latched)) => latched,
            (None, None) => {
                return Err(StoreError::Corrupt(format!(
                    "session {}: the turn's begin latched no contexts for a new session",
                    turn.session_id()
                )));
            }
        };
        let (agent, conversation) = (turn.agent_context_id(), turn.conversation_context_id());
        let errors = context_mismatches(turn.session_id(), &latched, agent, conversation);
        if !errors.is_empty() {
            return Ok(Err(errors));
        }
        Ok(self.resolve(&latched).map(|resolved| (resolved, latched)))
    }
}
