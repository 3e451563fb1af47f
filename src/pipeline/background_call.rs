//! One background model call (`"background": true`) as the model call makes it: re-attached
//! to when the turn's record names one made for the same request, else made and its id
//! recorded before anything waits; followed to its end (streamed text resumes after the last
//! event the turn's live output kept); cancelled on the server when the turn is, or when its
//! deadline comes; made again when the server lost it or it failed for a reason of the
//! server's.
//!
//! Owns: that call's lifecycle. Must not: build the request or account for the answer (the
//! model call does).

use tracing::{info, warn};

use super::lifecycle::Run;
use super::model_call::{CallMarks, ModelCaller};
use super::outcome::RetryableFailure;
use crate::contract::{SessionId, TurnId};
use crate::live::{LiveBody, LiveEvent};
use crate::llm::{
    BackgroundCall, EventSink, LlmClient, LlmError, LlmEvent, ModelResponse, WireRequest,
};
use crate::state::ModelCallMark;

impl ModelCaller {
    /// One background model call ([`crate::llm::BackgroundCall`]): re-attached to when the
    /// turn's record names one made for this very request (a run that died while it waited),
    /// else made and recorded before waiting. Streamed text resumes after the last event the
    /// turn's live output kept. A turn cancelled meanwhile cancels the response on the server
    /// too; a response the server no longer has is made once more (a progress note and
    /// `aptix_model_background_calls_total{event="recalled"}` say so). Returns the outcome
    /// (`None`: cancelled) and whether the call was re-attached to.
    pub(super) async fn background_call(
        &self,
        run: &mut Run,
        llm: &LlmClient,
        body: &WireRequest,
        sink: Option<EventSink<'_>>,
        marks: &dyn CallMarks,
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
                    .start_background(run, llm, body, sink, &request, marks)
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
                        .start_background(run, llm, body, sink, &request, marks)
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
        body: &WireRequest,
        sink: Option<EventSink<'_>>,
        request: &str,
        marks: &dyn CallMarks,
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
        if let Err(f) = marks.mark_call(run, mark).await {
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
}

/// A digest of a request body (what a re-attaching run compares its own request with).
fn request_digest(body: &WireRequest) -> String {
    use sha2::Digest as _;
    let mut digest = sha2::Sha256::new();
    for piece in body.pieces() {
        digest.update(piece);
    }
    crate::hex::lower(&digest.finalize()[..16])
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
