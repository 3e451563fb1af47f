//! One model call as the reasoner (layer E) makes it through the client (layer C): the turn's
//! contexts pick the backend, the cancel safe point comes first, a streaming turn's text goes
//! to its live output, a server that does not store responses — or answers a continued call
//! without its conversation (`history.rs`) — switches the session to replay, a server that
//! cannot give back a background response gets the call in the foreground
//! (`background_call.rs` follows the others), and the answer is accounted for (usage and
//! warnings; its tokens are handed back as a [`Spent`], counted against the tenant by or beside
//! the turn's next write).
//!
//! Owns: that one call, as [`ModelCaller`]: a type that holds the model clients and no store:
//! what it reads (the conversation to replay, the cancel flag, the live events kept) comes
//! through [`CallReads`]; the one write a call needs (a background call's id, before anything waits for it) it
//! asks of the lifecycle through [`CallMarks`]. Must not: loop, run tools or settle the turn.

use std::sync::Arc;

use serde_json::Value;
use tracing::{debug, info, warn};

use super::backends::{self, Backends};
use super::cancel_watch::CancelWatch;
use super::compose::{self, CallSpec, Continuation};
use super::history;
use super::lifecycle::{Lifecycle, Run};
use super::outcome::{CallEnd, RetryKind, RetryableFailure, permanent};
use crate::catalog::ModeCatalog;
use crate::contexts::ServiceTier;
use crate::contract::{ErrorCode, InvokeResult, SessionId, TurnId};
use crate::llm::{EventSink, LlmError, LlmEvent, ModelResponse, OutputItem};
use crate::metrics::Metrics;
use crate::state::{CallNote, ModelCallMark, TurnProgress};
use crate::tenants::Spent;

/// The first pause before a flex call refused for capacity is made again; it doubles up to
/// [`FLEX_PAUSE_MAX`].
const FLEX_PAUSE_MIN: std::time::Duration = std::time::Duration::from_millis(500);
/// The longest pause between flex attempts.
const FLEX_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(8);

/// Layer C: makes the turn's model calls. Holds the model clients (by agent context), the mode
/// catalog (for the request's instructions and tools) and the reads it needs ([`CallReads`]).
#[derive(Clone)]
pub(super) struct ModelCaller {
    /// The agent contexts' clients.
    pub(super) backends: Arc<Backends>,
    catalog: Arc<ModeCatalog>,
    pub(super) metrics: Arc<Metrics>,
    pub(super) store: Arc<dyn CallReads>,
    /// The turns waiting on the model, watched for a request to stop.
    cancels: CancelWatch,
    /// The calls' prompts made so far (one per mode, tool set and conversation context).
    prompts: Arc<crate::state::Prompts>,
    /// Each mode's `instructions`, written once.
    blocks: Arc<compose::ModeBlocks>,
}

/// What a model call reads of the turn's stored state.
#[async_trait::async_trait]
pub(super) trait CallReads: Send + Sync {
    /// The session's conversation as stored, oldest item first.
    async fn conversation(&self, session: &SessionId) -> Result<Vec<Value>, RetryableFailure>;
    /// Whether the turn was asked to stop (`Err`: the store could not tell, and why).
    async fn cancel_requested(&self, sid: &SessionId, tid: &TurnId) -> Result<bool, String>;
    /// The live events kept of the turn, oldest first (`Err`: why they cannot be read).
    async fn kept_live(&self, sid: &SessionId, tid: &TurnId) -> Result<Vec<Vec<u8>>, String>;
}

/// The write a model call asks of the turn's lifecycle (layer F): recording a background
/// call's response id in the turn, so a run that takes over re-attaches to it.
#[async_trait::async_trait]
pub(super) trait CallMarks: Send + Sync {
    /// Records `mark` in the turn's record, fenced by the run's lease.
    async fn mark_call(&self, run: &mut Run, mark: ModelCallMark) -> Result<(), RetryableFailure>;
}

/// The lifecycle records the mark in the turn ([`Lifecycle::note_model_call`]).
#[async_trait::async_trait]
impl CallMarks for Lifecycle {
    async fn mark_call(&self, run: &mut Run, mark: ModelCallMark) -> Result<(), RetryableFailure> {
        self.note_model_call(run, mark).await
    }
}

/// A call's new input: its items and, on a session's first call, the boot prompt whose
/// system message opens them — made into an item only once the call is answered, so a turn
/// waiting on its first call holds the prompt's shared text, not a JSON tree of it.
#[derive(Debug, Default)]
pub(super) struct CallInput {
    pub(super) boot: Option<Arc<str>>,
    pub(super) items: Vec<Value>,
}

impl CallInput {
    /// Whether there is nothing new to send (a run resuming from its checkpoint).
    pub(super) fn is_empty(&self) -> bool {
        self.boot.is_none() && self.items.is_empty()
    }
}

impl From<Vec<Value>> for CallInput {
    fn from(items: Vec<Value>) -> Self {
        Self { boot: None, items }
    }
}

impl ModelCaller {
    /// A caller over these backends, reading through `store`, its calls watched for cancel
    /// requests by `cancels`.
    pub(super) fn new(
        backends: Backends,
        catalog: Arc<ModeCatalog>,
        metrics: Arc<Metrics>,
        store: Arc<dyn CallReads>,
        cancels: CancelWatch,
    ) -> Self {
        Self {
            cancels,
            backends: Arc::new(backends),
            blocks: Arc::new(compose::ModeBlocks::of(&catalog)),
            catalog,
            metrics,
            store,
            prompts: Arc::default(),
        }
    }

    /// Calls the model once (with the fallback to replay), accounting for the answer.
    pub(super) async fn call_model(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
        (tools_mode, mcp): (&crate::catalog::Mode, &[Arc<crate::mcp::McpTool>]),
        CallInput { boot, items: input }: CallInput,
        previous: Option<&str>,
        marks: &dyn CallMarks,
    ) -> Result<Result<(ModelResponse, Spent), CallEnd>, RetryableFailure> {
        let backend = match self.backends.resolve(&run.session().contexts) {
            Ok(b) => b,
            Err(errors) => return Ok(Err(CallEnd::Failed(Box::new(backends::refused(errors))))),
        };
        // The safe point: a turn asked to stop makes no further model call. The write just
        // before may have read that already.
        let (sid, tid) = (
            run.record().session_id.clone(),
            run.record().turn_id.clone(),
        );
        let asked = match run.take_stop_read() {
            Some(asked) => asked,
            None => self.cancel_requested(&sid, &tid).await,
        };
        if asked {
            return Ok(Err(CallEnd::Cancelled));
        }
        progress.iterations += 1;
        let instructions = self.blocks.get(&run.session().mode_key);
        // The conversation so far — as stored, then what the run has not stored yet — read
        // only when the call replays it: it grows with the session.
        let history = async |run: &Run, progress: &TurnProgress| {
            let mut items = self.store.conversation(&run.session().session_id).await?;
            items.extend(run.session().conversation.iter().cloned());
            items.extend(progress.turn_items.iter().cloned());
            Ok::<_, RetryableFailure>(items)
        };
        let tools = compose::with_tools(
            self.catalog.wire_tools(tools_mode),
            mcp,
            &backend.agent.calls.hosted_tools,
        );
        let cache_key = backend
            .agent
            .prompt_caching
            .then(|| compose::prompt_cache_key(&sid));
        // A server that could not give back a background response gets foreground calls.
        let llm = &backend.agent.llm;
        let mut background = backend.agent.calls.background && !llm.refuses_background();
        // The turn's own tier (a batch's) over its context's.
        let mut tier = run
            .record()
            .service_tier
            .as_deref()
            .and_then(ServiceTier::parse)
            .or(backend.agent.calls.service_tier);
        let body_for = |replayed: Option<&[Value]>, tier: Option<ServiceTier>, background| {
            compose::request(
                &CallSpec {
                    model: backend.model(),
                    instructions,
                    tools: tools.as_deref(),
                    tool_choice: tools_mode.tool_choice.as_deref(),
                    continuation: match (previous, replayed) {
                        (_, Some(history)) => Continuation::Replay(history),
                        (Some(id), None) => Continuation::Previous(id),
                        (None, None) => Continuation::Fresh,
                    },
                    input: &input,
                    boot: boot.as_deref(),
                    prompt_cache_key: cache_key.as_deref(),
                    background,
                    service_tier: tier.map(ServiceTier::as_str),
                },
                &self.prompts,
            )
        };
        // A server known to answer continued calls without their conversation is sent it.
        if previous.is_some() && llm.forgets_history() && !run.session().replay {
            run.switch_to_replay();
        }
        let replay = backend.agent.replay || run.session().replay;
        let replayed = match replay {
            true => Some(history(run, progress).await?),
            false => None,
        };
        let (started, start_ms) = (std::time::Instant::now(), run.record().ms_since_accepted());
        if let Some(live) = run.live() {
            live.call_started(crate::live::CallStarted {
                model: backend.model().to_string(),
                agent_context: run.session().contexts.agent_context_id.clone(),
                attempt: run.record().attempts,
                start_ms,
            });
        }
        let live = run.live().cloned();
        let to_live = move |e: LlmEvent| {
            if let Some(live) = &live {
                match e {
                    LlmEvent::TextDelta(t) => live.text(&t),
                    LlmEvent::Delta {
                        text,
                        response_id,
                        sequence,
                    } => live.text_reaching(
                        &text,
                        crate::live::Reached {
                            response_id,
                            sequence,
                        },
                    ),
                    LlmEvent::Retrying { attempt } => live.progress(format!(
                        "the model call broke off and is made again (attempt {attempt}): the text streamed since the last progress note is replaced by what follows"
                    )),
                }
            }
        };
        let sink: Option<EventSink<'_>> = run.live().is_some().then_some(&to_live as EventSink<'_>);
        // A flex call the server has no capacity for is made again after a pause, and at
        // `default` once the context's wait is over.
        let flex_since = std::time::Instant::now();
        let mut pause = FLEX_PAUSE_MIN;
        let (mut outcome, reattached) = loop {
            let body = body_for(replayed.as_deref(), tier, background);
            let sent = if background {
                // Boxed: only background turns carry its state (the following, the
                // deadline, the cancel), not every turn's future.
                Box::pin(self.background_call(run, llm, &body.sent, sink, marks)).await?
            } else {
                let call = llm.create_response_streamed(backend.model(), &body.sent, sink);
                (self.unless_cancelled(&sid, &tid, call).await, false)
            };
            // The transcript keeps every request sent, answered or not.
            run.note_request(body);
            let (Some(outcome), reattached) = sent else {
                return Ok(Err(CallEnd::Cancelled));
            };
            if let Err(LlmError::NotRetrievable { id, message }) = &outcome {
                let context = &run.session().contexts.agent_context_id;
                if llm.note_refuses_background() {
                    warn!(%context, response_id = %id, %message, "the model server cannot give back background responses; this context's calls are made in the foreground from now on");
                }
                self.metrics.background_call("foreground");
                if let Some(live) = run.live() {
                    live.progress("the model server cannot give back the background call, so it is made in the foreground: the text streamed since the last progress note is replaced by what follows");
                }
                background = false;
                continue;
            }
            let flex_refused = matches!(&outcome, Err(LlmError::FlexUnavailable { .. }))
                && tier == Some(ServiceTier::Flex);
            let fallback = backend.agent.calls.flex_fallback;
            match fallback {
                _ if !flex_refused => break (outcome, reattached),
                // Never at another tier: the turn goes back to the queue and tries later.
                None => break (outcome, reattached),
                Some(wait) if flex_since.elapsed() >= wait => {
                    warn!(
                        waited_ms = flex_since.elapsed().as_millis() as u64,
                        "no flex capacity; making the call at the default tier"
                    );
                    self.metrics.flex_fallback();
                    if let Some(live) = run.live() {
                        live.progress(
                            "no flex capacity: the model call is made at the default service tier",
                        );
                    }
                    tier = Some(ServiceTier::Default);
                }
                Some(wait) => {
                    let left = wait.saturating_sub(flex_since.elapsed());
                    let nap = tokio::time::sleep(pause.min(left));
                    if self.unless_cancelled(&sid, &tid, nap).await.is_none() {
                        return Ok(Err(CallEnd::Cancelled));
                    }
                    pause = (pause * 2).min(FLEX_PAUSE_MAX);
                }
            }
        };
        let shape = history::shape(&run.session().mode_key, &tools_mode.key);
        // Tokens spent on an answer made again with the conversation replayed.
        let mut discarded = None;
        let remake = match &outcome {
            _ if replay => false,
            Err(LlmError::PreviousResponseNotFound(msg)) => {
                warn!(%msg, "model server does not store responses; switching this session to replay");
                true
            }
            Ok(answer) => match history::prior(previous, progress, run.session()) {
                Some(prior) if history::lost(prior, &shape, &answer.usage, &input) => {
                    let context = &run.session().contexts.agent_context_id;
                    if llm.note_forgets_history() {
                        warn!(%context, input_tokens = answer.usage.prompt_tokens, carried = prior.carried, "the model server answered a continued call without its conversation (a gateway bridging onto a chat model?); this context replays the conversation from now on");
                    }
                    self.metrics.history_lost(context);
                    if let Some(live) = run.live() {
                        live.progress("the model answered without the conversation so far and is asked again with it: the text streamed since the last progress note is replaced by what follows");
                    }
                    discarded = Some(answer.usage);
                    true
                }
                _ => false,
            },
            Err(_) => false,
        };
        if remake {
            run.switch_to_replay();
            let body = body_for(Some(&history(run, progress).await?), tier, false);
            outcome = llm
                .create_response_streamed(backend.model(), &body.sent, sink)
                .await;
            run.note_request(body);
        }
        // Per call, so at debug: the model latency histogram and the turn's own lines carry
        // what an operator needs at info.
        debug!(
            iteration = progress.iterations,
            elapsed_ms = started.elapsed().as_millis() as u64,
            ok = outcome.is_ok(),
            "model call"
        );
        // A call that got no answer is noted too, with why (stored with the run's next write:
        // its hand-back or the settling write).
        let unanswered = |run: &mut Run, code: ErrorCode, message: &str| {
            run.note_call(CallNote {
                attempt: run.record().attempts,
                text: None,
                response_id: String::new(),
                model: backend.model().to_string(),
                agent_context: run.session().contexts.agent_context_id.clone(),
                latency_ms: started.elapsed().as_millis() as u64,
                usage: crate::contract::Usage::default(),
                service_tier: None,
                background,
                reattached: false,
                start_ms,
                capacity_wait_ms: None,
                error: Some(format!("{code}: {message}")),
            });
        };
        let mut response = match outcome {
            Ok(r) => r,
            Err(LlmError::NoCapacity(e)) => {
                info!(context = %e.context, waited_ms = e.waited.as_millis() as u64, "no capacity for a model call; the turn goes back to the queue");
                unanswered(run, ErrorCode::LlmUnavailable, &e.to_string());
                return Err(RetryableFailure {
                    error: permanent(ErrorCode::LlmUnavailable, e.to_string()),
                    kind: RetryKind::NoCapacity,
                });
            }
            Err(e) if e.is_retryable() => {
                unanswered(run, ErrorCode::LlmUnavailable, &e.to_string());
                return Err(RetryableFailure {
                    error: permanent(ErrorCode::LlmUnavailable, e.to_string()),
                    kind: RetryKind::Failure,
                });
            }
            Err(e) => {
                let code = match e {
                    LlmError::Rejected { .. }
                    | LlmError::PreviousResponseNotFound(_)
                    | LlmError::ResponseFailed { .. } => ErrorCode::LlmRejected,
                    _ => ErrorCode::LlmBadResponse,
                };
                unanswered(run, code, &e.to_string());
                return Ok(Err(CallEnd::Failed(Box::new(InvokeResult::failure(
                    permanent(code, e.to_string()),
                )))));
            }
        };
        if let Some(prices) = &backend.agent.calls.prices {
            response.usage.cost_micros = prices.cost_micros(&response.usage);
            let context = &run.session().contexts.agent_context_id;
            self.metrics
                .estimated_cost(context, response.usage.cost_micros);
        }
        progress.usage.add(response.usage);
        progress.last_call = Some(history::carried(&response.id, &response.usage, shape));
        let texts: Vec<&str> = response
            .items
            .iter()
            .filter_map(|i| match i {
                OutputItem::Text(t) | OutputItem::Refusal(t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        run.note_call(CallNote {
            attempt: run.record().attempts,
            text: (!texts.is_empty()).then(|| texts.join("\n\n")),
            response_id: response.id.clone(),
            model: backend.model().to_string(),
            agent_context: run.session().contexts.agent_context_id.clone(),
            latency_ms: started.elapsed().as_millis() as u64,
            usage: response.usage,
            service_tier: response.service_tier.clone(),
            background,
            reattached,
            start_ms,
            capacity_wait_ms: Some(response.capacity_waited.as_millis() as u64)
                .filter(|ms| *ms > 0),
            error: None,
        });
        let mut spent = Spent {
            tenant: run.session().session_id.tenant().to_string(),
            context: run.session().contexts.agent_context_id.clone(),
            usage: response.usage,
        };
        // The answer made without the conversation was paid for too.
        if let Some(usage) = discarded {
            progress.usage.add(usage);
            spent.usage.add(usage);
        }
        if let Some(boot) = boot {
            progress.turn_items.push(compose::system_message(&boot));
        }
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
        Ok(Ok((response, spent)))
    }

    /// Whether the turn was asked to stop (a store that cannot tell is taken as "no": the
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

    /// Runs `work` unless the turn is asked to stop first (`None`), watched with the worker's
    /// other turns in a model call.
    pub(super) fn unless_cancelled<F: Future>(
        &self,
        sid: &SessionId,
        tid: &TurnId,
        work: F,
    ) -> super::cancel_watch::UnlessCancelled<F> {
        self.cancels.watch(sid, tid).unless_cancelled(work)
    }
}

/// Whether the model's answer asks for a tool (server or client) to be run, or a hosted
/// tool's call to be approved.
pub(super) fn calls_tools(response: &ModelResponse) -> bool {
    response.items.iter().any(|i| {
        matches!(
            i,
            OutputItem::FunctionCall { .. } | OutputItem::ApprovalRequest { .. }
        )
    })
}
