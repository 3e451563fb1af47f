//! One model call as the reasoner (layer E) makes it through the client (layer C): the turn's
//! contexts pick the backend, the cancel safe point comes first, a streaming turn's text goes
//! to its live output, a server that does not store responses switches the session to replay,
//! and the answer is accounted for (usage and warnings; its tokens are handed back as
//! [`Spent`], counted against the tenant beside the turn's next write).
//!
//! Owns: that one call. Must not: loop, run tools or settle the turn.

use serde_json::Value;
use tracing::{debug, info, warn};

use super::backends;
use super::compose::{self, CallSpec, Continuation};
use super::history;
use super::{CallEnd, Pipeline, RetryKind, RetryableFailure, Run, permanent, store_failure};
use crate::contexts::ServiceTier;
use crate::contract::{ErrorCode, InvokeResult};
use crate::contract::{SessionId, TurnId};
use crate::live::{LiveBody, LiveEvent};
use crate::llm::{
    BackgroundCall, EventSink, LlmClient, LlmError, LlmEvent, ModelResponse, OutputItem,
    SentRequest,
};
use crate::state::{CallNote, ModelCallMark};
use crate::store::TurnProgress;

/// The first pause before a flex call refused for capacity is made again; it doubles up to
/// [`FLEX_PAUSE_MAX`].
const FLEX_PAUSE_MIN: std::time::Duration = std::time::Duration::from_millis(500);
/// The longest pause between flex attempts.
const FLEX_PAUSE_MAX: std::time::Duration = std::time::Duration::from_secs(8);

impl Pipeline {
    /// Calls the model once (with the fallback to replay), accounting for the answer.
    pub(super) async fn call_model(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
        tools_mode: &crate::catalog::Mode,
        input: Vec<Value>,
        previous: Option<&str>,
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
        let instructions = compose::mode_block(&self.catalog, &run.session().mode_key);
        // The conversation so far — as stored, then what the run has not stored yet — read
        // only when the call replays it: it grows with the session.
        let history = async |run: &Run, progress: &TurnProgress| {
            let mut items = self
                .store
                .conversation(&run.session().session_id)
                .await
                .map_err(store_failure)?;
            items.extend(run.session().conversation.iter().cloned());
            items.extend(progress.turn_items.iter().cloned());
            Ok::<_, RetryableFailure>(items)
        };
        let tools = self.catalog.wire_tools(tools_mode);
        let cache_key = backend
            .agent
            .prompt_caching
            .then(|| compose::prompt_cache_key(&sid));
        let background = backend.agent.calls.background;
        // The turn's own tier (a batch's) over its context's.
        let mut tier = run
            .record()
            .service_tier
            .as_deref()
            .and_then(ServiceTier::parse)
            .or(backend.agent.calls.service_tier);
        let body_for = |replayed: Option<&[Value]>, tier: Option<ServiceTier>| {
            compose::request_body(&CallSpec {
                model: backend.model(),
                instructions: &instructions,
                tools: tools.as_deref(),
                tool_choice: tools_mode.tool_choice.as_deref(),
                continuation: match (previous, replayed) {
                    (_, Some(history)) => Continuation::Replay(history),
                    (Some(id), None) => Continuation::Previous(id),
                    (None, None) => Continuation::Fresh,
                },
                input: &input,
                prompt_cache_key: cache_key.as_deref(),
                background,
                service_tier: tier.map(ServiceTier::as_str),
            })
        };
        let llm = &backend.agent.llm;
        // A server known to answer continued calls without their conversation is sent it.
        if previous.is_some() && llm.forgets_history() && !run.session().replay {
            run.switch_to_replay();
        }
        let replay = backend.agent.replay || run.session().replay;
        let replayed = match replay {
            true => Some(history(run, progress).await?),
            false => None,
        };
        let started = std::time::Instant::now();
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
            let body = body_for(replayed.as_deref(), tier);
            let sent = if background {
                // Boxed: only background turns carry its state (the following, the
                // deadline, the cancel), not every turn's future.
                Box::pin(self.background_call(run, llm, &body, sink)).await?
            } else {
                let call = llm.create_response_streamed(backend.model(), &body, sink);
                (self.unless_cancelled(&sid, &tid, call).await, false)
            };
            // The transcript keeps every request sent, answered or not.
            run.note_request(body);
            let (Some(outcome), reattached) = sent else {
                return Ok(Err(CallEnd::Cancelled));
            };
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
            let body = body_for(Some(&history(run, progress).await?), tier);
            outcome = llm
                .create_response_streamed(backend.model(), &body, sink)
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
        let mut response = match outcome {
            Ok(r) => r,
            Err(LlmError::NoCapacity(e)) => {
                info!(context = %e.context, waited_ms = e.waited.as_millis() as u64, "no capacity for a model call; the turn goes back to the queue");
                return Err(RetryableFailure {
                    error: permanent(ErrorCode::LlmUnavailable, e.to_string()),
                    kind: RetryKind::NoCapacity,
                });
            }
            Err(e) if e.is_retryable() => {
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

    /// One background model call ([`crate::llm::BackgroundCall`]): re-attached to when the
    /// turn's record names one made for this very request (a run that died while it waited),
    /// else made and recorded before waiting. Streamed text resumes after the last event the
    /// turn's live output kept. A turn cancelled meanwhile cancels the response on the server
    /// too; a response the server no longer has is made once more (a progress note and
    /// `aptix_model_background_calls_total{event="recalled"}` say so). Returns the outcome
    /// (`None`: cancelled) and whether the call was re-attached to.
    async fn background_call(
        &self,
        run: &mut Run,
        llm: &LlmClient,
        body: &SentRequest,
        sink: Option<EventSink<'_>>,
    ) -> Result<(Option<Result<ModelResponse, LlmError>>, bool), RetryableFailure> {
        let (sid, tid) = (
            run.record().session_id.clone(),
            run.record().turn_id.clone(),
        );
        let request = request_digest(body);
        let found = run
            .record()
            .model_call
            .as_ref()
            .filter(|m| m.request == request)
            .map(|m| m.response_id.clone());
        // The run took over from one that died waiting for a call: its text goes on where
        // the client's stopped, unless the call cannot be followed.
        let seamless = run.take_reattach();
        let reattached = found.is_some();
        // Followed again from its start while its clients may have seen some of its text: the
        // note that it is replaced goes before the first text (none, if the call turns out to
        // be gone and is made again: that says so itself).
        let owed = std::sync::atomic::AtomicBool::new(false);
        let live = run.live().cloned();
        let noting = |e: LlmEvent| {
            if owed.swap(false, std::sync::atomic::Ordering::SeqCst)
                && let Some(live) = &live
            {
                live.progress(format!(
                    "the model call is followed again from its start: {REPLACED}"
                ));
            }
            if let Some(sink) = sink {
                sink(e);
            }
        };
        let sink: Option<EventSink<'_>> = sink.map(|_| &noting as EventSink<'_>);
        let mut call = match found {
            Some(id) => {
                let after = match run.live() {
                    Some(_) => self.relayed(&sid, &tid, &id).await,
                    None => None,
                };
                owed.store(
                    after.is_none() && seamless,
                    std::sync::atomic::Ordering::SeqCst,
                );
                info!(response_id = %id, after = ?after, "re-attaching to the turn's background model call");
                self.metrics.background_call("reattached");
                BackgroundCall::attach(id, after)
            }
            None => {
                if seamless {
                    replace_text(run, "the model call is made again");
                }
                match self
                    .start_background(run, llm, body, sink, &request)
                    .await?
                {
                    Ok(call) => call,
                    Err(e) => return Ok((Some(Err(e)), false)),
                }
            }
        };
        // A response the server lost, or that ended `failed` for a reason of its own, is made
        // again as a new call: a lost one at once the first time, then (and every failed one)
        // after the pauses of the call retry policy, as many as it allows.
        let mut remakes = llm.remake_delays();
        let mut recalled = false;
        // The turn's deadline stops the call on the server a moment before it drops the run.
        let stop_at = super::TURN_DEADLINE
            .try_with(|until| *until)
            .ok()
            .map(|until| until.checked_sub(DEADLINE_MARGIN).unwrap_or(until));
        loop {
            let id = call.id.clone();
            let follow = async {
                match stop_at {
                    None => Some(llm.follow_background(call, sink).await),
                    Some(at) => tokio::time::timeout_at(at, llm.follow_background(call, sink))
                        .await
                        .ok(),
                }
            };
            let followed = self.unless_cancelled(&sid, &tid, follow).await;
            match followed {
                Some(None) => {
                    warn!(response_id = %id, "the turn's deadline came during its background model call; cancelling it on the server");
                    self.cancel_on_server(llm, &id).await;
                    let late = LlmError::Unavailable {
                        attempts: 1,
                        message: "the turn's deadline came while the model was still answering"
                            .into(),
                    };
                    return Ok((Some(Err(late)), reattached));
                }
                None => {
                    self.cancel_on_server(llm, &id).await;
                    return Ok((None, reattached));
                }
                Some(Some(Err(
                    e @ (LlmError::Expired(_)
                    | LlmError::ResponseFailed {
                        retryable: true, ..
                    }),
                ))) => {
                    let lost = matches!(e, LlmError::Expired(_));
                    let pause = if lost && !recalled {
                        Some(std::time::Duration::ZERO)
                    } else {
                        remakes.next()
                    };
                    let Some(pause) = pause else {
                        return Ok((Some(Err(e)), reattached));
                    };
                    recalled |= lost;
                    owed.store(false, std::sync::atomic::Ordering::SeqCst);
                    let why = if lost {
                        warn!(response_id = %id, "the model server no longer has the background call; making it again");
                        self.metrics.background_call("recalled");
                        "the model server no longer had the model call, so it is made again"
                    } else {
                        warn!(response_id = %id, error = %e, retry_in_ms = pause.as_millis() as u64, "the background model call ended failed; making it again");
                        self.metrics.background_call("remade");
                        "the model call failed on the model server, so it is made again"
                    };
                    replace_text(run, why);
                    if !pause.is_zero() {
                        let waited = self
                            .unless_cancelled(&sid, &tid, tokio::time::sleep(pause))
                            .await;
                        if waited.is_none() {
                            return Ok((None, reattached));
                        }
                    }
                    call = match self
                        .start_background(run, llm, body, sink, &request)
                        .await?
                    {
                        Ok(call) => call,
                        Err(e) => return Ok((Some(Err(e)), reattached)),
                    };
                }
                Some(Some(outcome)) => return Ok((Some(outcome), reattached)),
            }
        }
    }

    /// Cancels background response `id` on the model server (a failure is logged: the
    /// server finishes it, and nobody follows it).
    async fn cancel_on_server(&self, llm: &LlmClient, id: &str) {
        match llm.cancel_background(id).await {
            Ok(()) => self.metrics.background_call("cancelled"),
            Err(e) => {
                warn!(response_id = %id, error = %e, "could not cancel the background model call on the server")
            }
        }
    }

    /// Makes a background call and records its response id in the turn before anything
    /// waits for it. If the record cannot be written, the call is cancelled on the server
    /// (nobody could re-attach to it) and the turn handed back.
    async fn start_background(
        &self,
        run: &mut Run,
        llm: &LlmClient,
        body: &SentRequest,
        sink: Option<EventSink<'_>>,
        request: &str,
    ) -> Result<Result<BackgroundCall, LlmError>, RetryableFailure> {
        let call = match llm.start_background(body, sink.is_some()).await {
            Ok(call) => call,
            Err(e) => return Ok(Err(e)),
        };
        self.metrics.background_call("started");
        let mark = ModelCallMark {
            response_id: call.id.clone(),
            request: request.to_string(),
        };
        if let Err(f) = self.note_model_call(run, mark).await {
            if let Err(e) = llm.cancel_background(&call.id).await {
                warn!(response_id = %call.id, error = %e, "could not cancel a background model call whose id could not be recorded");
            }
            return Err(f);
        }
        Ok(Ok(call))
    }

    /// The sequence number of the last event of background response `response_id` whose
    /// text the turn's live output kept (what its clients can have seen), if any.
    async fn relayed(&self, sid: &SessionId, tid: &TurnId, response_id: &str) -> Option<u64> {
        let kept = match self.store.kept_live(sid, tid).await {
            Ok(kept) => kept,
            Err(e) => {
                warn!(error = %e, "could not read the turn's kept live events; its text is streamed again from the start");
                return None;
            }
        };
        kept.iter()
            .filter_map(|event| serde_json::from_slice::<LiveEvent>(event).ok())
            .filter_map(|event| match event.body {
                LiveBody::Delta {
                    reached: Some(r), ..
                } if r.response_id == response_id => Some(r.sequence),
                _ => None,
            })
            .max()
    }

    /// Runs `step` (the turn's next write) with the tokens of the answer before it counted
    /// against its tenant at the same time: one round trip for both instead of two in a row.
    pub(super) async fn counting<T>(&self, spent: Spent, step: impl Future<Output = T>) -> T {
        let spend = self
            .quotas
            .spend(&spent.tenant, &spent.context, spent.usage);
        tokio::join!(spend, step).1
    }
}

/// A digest of a request body (what a re-attaching run compares its own request with).
fn request_digest(body: &SentRequest) -> String {
    use sha2::Digest as _;
    crate::hex::lower(&sha2::Sha256::digest(body.json().as_bytes())[..16])
}

/// Tells a streaming turn's clients that the text streamed so far is replaced by what
/// follows, and why.
fn replace_text(run: &Run, why: &str) {
    if let Some(live) = run.live() {
        live.progress(format!("{why}: {REPLACED}"));
    }
}

/// How long before the turn's deadline a background call is stopped on the server.
const DEADLINE_MARGIN: std::time::Duration = std::time::Duration::from_secs(1);

/// What a progress note says when the text streamed so far no longer counts.
const REPLACED: &str = "the text streamed so far is replaced by what follows";

/// The tokens a model answer spent, not yet counted against the tenant: the caller counts
/// them beside the write that follows the answer ([`Pipeline::counting`]); dropped, they are
/// never counted.
pub(super) struct Spent {
    tenant: String,
    /// The agent context whose server answered.
    context: String,
    usage: crate::contract::Usage,
}
