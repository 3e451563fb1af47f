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
use super::{CallEnd, Pipeline, RetryKind, RetryableFailure, Run, permanent, store_failure};
use crate::config::LOCAL_TENANT;
use crate::contract::{ErrorCode, InvokeResult};
use crate::llm::{EventSink, LlmError, LlmEvent, ModelResponse, OutputItem};
use crate::store::TurnProgress;

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
        let body_for = |replayed: Option<&[Value]>| {
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
            })
        };
        let replay = backend.agent.replay || run.session().replay;
        let body = if replay {
            body_for(Some(&history(run, progress).await?))
        } else {
            body_for(None)
        };
        let started = std::time::Instant::now();
        let llm = &backend.agent.llm;
        let live = run.live().cloned();
        let to_live = move |e: LlmEvent| {
            if let Some(live) = &live {
                match e {
                    LlmEvent::TextDelta(t) => live.text(&t),
                    LlmEvent::Retrying { attempt } => live.progress(format!(
                        "the model call broke off and is made again (attempt {attempt}): the text streamed since the last progress note is replaced by what follows"
                    )),
                }
            }
        };
        let sink: Option<EventSink<'_>> = run.live().is_some().then_some(&to_live as EventSink<'_>);
        let sent = self
            .unless_cancelled(
                &sid,
                &tid,
                llm.create_response_streamed(backend.model(), &body, sink),
            )
            .await;
        // The transcript keeps every request sent, answered or not.
        run.note_request(body);
        let Some(mut outcome) = sent else {
            return Ok(Err(CallEnd::Cancelled));
        };
        if let Err(LlmError::PreviousResponseNotFound(msg)) = &outcome
            && !replay
        {
            warn!(%msg, "model server does not store responses; switching this session to replay");
            run.switch_to_replay();
            let body = body_for(Some(&history(run, progress).await?));
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
        let response = match outcome {
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
                    LlmError::Rejected { .. } | LlmError::PreviousResponseNotFound(_) => {
                        ErrorCode::LlmRejected
                    }
                    _ => ErrorCode::LlmBadResponse,
                };
                return Ok(Err(CallEnd::Failed(Box::new(InvokeResult::failure(
                    permanent(code, e.to_string()),
                )))));
            }
        };
        progress.usage.add(response.usage);
        let spent = Spent {
            tenant: run
                .session()
                .owner
                .clone()
                .unwrap_or_else(|| LOCAL_TENANT.to_string()),
            tokens: response.usage.total_tokens,
        };
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

    /// Runs `step` (the turn's next write) with the tokens of the answer before it counted
    /// against its tenant at the same time: one round trip for both instead of two in a row.
    pub(super) async fn counting<T>(&self, spent: Spent, step: impl Future<Output = T>) -> T {
        let (tenant, tokens) = (spent.tenant, spent.tokens);
        tokio::join!(self.quotas.spend(&tenant, tokens), step).1
    }
}

/// The tokens a model answer spent, not yet counted against the tenant: the caller counts
/// them beside the write that follows the answer ([`Pipeline::counting`]); dropped, they are
/// never counted.
pub(super) struct Spent {
    tenant: String,
    tokens: u64,
}
