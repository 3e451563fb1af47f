//! What a run of a turn comes to and the failures it may hand back, shared by every layer of
//! the pipeline: [`JobOutcome`] (what the worker acts on), [`Settled`], [`RetryableFailure`],
//! and the pipeline's settings. The request fingerprints live here too.
//!
//! Owns: those shapes. Must not: run anything.

use sha2::{Digest, Sha256};

use crate::contract::{
    AgentExecuteResponse, ErrorCode, ErrorMessage, InvokeResult, ToolContinuation, UserTurn,
};
use crate::store::{StoreError, TurnStatusView};

/// A failure that may succeed if the turn is run again later (the queue retries it).
#[derive(Debug, Clone, thiserror::Error)]
#[error("{}", .error)]
pub struct RetryableFailure {
    /// What went wrong, as the client would see it if retries run out.
    pub error: ErrorMessage,
    /// Whether it counts as a failed attempt.
    pub kind: RetryKind,
}

/// What kind of "later" a retryable failure asks for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RetryKind {
    /// Something failed: the attempt counts, the next one waits the next backoff delay.
    Failure,
    /// The agent context's limits left no room for a model call: nothing failed, run the job
    /// again shortly at the same attempt.
    NoCapacity,
}

/// Where a job came from, as its headers say.
#[derive(Debug, Clone, Copy, Default)]
pub struct Origin<'a> {
    /// The tenant the front door marked it with.
    pub tenant: Option<&'a str>,
    /// The direct reply address of the front door waiting for its result, if one is.
    pub reply_to: Option<&'a str>,
    /// The job's body as delivered: a user turn's fingerprint is read from it
    /// (`TurnPrint`).
    pub job: Option<&'a [u8]>,
}

/// What one run of a job came to. The worker acknowledges, retries or dead-letters a job by
/// matching on it, never by reading error codes.
#[derive(Debug)]
pub enum JobOutcome {
    /// The turn has a result, stored (a final answer, a wait for client tools, or a permanent
    /// failure): publish it, then acknowledge the job.
    Done(Box<Settled>),
    /// The job is not its turn's — a payload that conflicts with the recorded one, a
    /// continuation for an unknown turn or for a turn that does not take it. Drop it without a
    /// reply: the turn's own run publishes the turn's status.
    NotTheTurns(Vec<ErrorMessage>),
    /// Another run holds the session's lease: run the job again shortly, at the same attempt.
    Busy,
    /// The turn's agent context had no capacity for a model call within the wait bound: run
    /// the job again shortly, at the same attempt (it resumes from its checkpoint).
    NoCapacity(ErrorMessage),
    /// A failure that may pass (the model, the store, a server tool, the deadline): run the job
    /// again after the next backoff delay, or give the turn up at the attempt limit.
    Retry(ErrorMessage),
}

/// Why a model call ended the turn instead of answering.
pub(super) enum CallEnd {
    /// The turn fails with this result.
    Failed(Box<TurnResult>),
    /// The turn was asked to stop.
    Cancelled,
}

/// Why a run ended without a result of its own (inside the pipeline; see [`JobOutcome`]).
#[derive(Debug)]
pub(super) enum Interrupted {
    /// The job is not its turn's (see [`JobOutcome::NotTheTurns`]).
    NotTheTurns(Box<TurnResult>),
    /// Another run holds the session's lease.
    Busy(RetryableFailure),
    /// A failure that may pass on a later attempt.
    Failed(RetryableFailure),
    /// No capacity for a model call.
    NoCapacity(RetryableFailure),
}

impl From<RetryableFailure> for Interrupted {
    fn from(f: RetryableFailure) -> Self {
        match f.kind {
            RetryKind::Failure => Self::Failed(f),
            RetryKind::NoCapacity => Self::NoCapacity(f),
        }
    }
}

/// Why a session lease could not be taken.
#[derive(Debug)]
pub(super) enum NoLease {
    /// Another run holds it.
    Busy(RetryableFailure),
    /// The store could not be asked.
    Failed(RetryableFailure),
}

impl NoLease {
    /// The retryable failure, for callers that only retry (giving a turn up).
    pub(super) fn into_retryable(self) -> RetryableFailure {
        match self {
            Self::Busy(f) | Self::Failed(f) => f,
        }
    }
}

impl From<NoLease> for Interrupted {
    fn from(no: NoLease) -> Self {
        match no {
            NoLease::Busy(f) => Self::Busy(f),
            NoLease::Failed(f) => Self::Failed(f),
        }
    }
}

/// Settings of the pipeline.
#[derive(Debug, Clone)]
pub struct PipelineSettings {
    /// Model name.
    pub model: String,
    /// Model calls one turn may make.
    pub max_iterations: usize,
    /// Always replay the conversation instead of using `previous_response_id`.
    pub replay: bool,
    /// How long a session lease lasts without renewal (renewed every third of it).
    pub lease_ttl: std::time::Duration,
    /// This process's id, part of every lease holder name.
    pub worker_id: String,
}

impl PipelineSettings {
    /// Defaults for a model name.
    pub fn new(model: impl Into<String>) -> Self {
        Self {
            model: model.into(),
            max_iterations: 8,
            replay: false,
            lease_ttl: std::time::Duration::from_secs(30),
            worker_id: format!("worker-{}", uuid::Uuid::new_v4().simple()),
        }
    }
}

pub(super) type TurnResult = InvokeResult<AgentExecuteResponse>;

/// A turn's result as a run leaves it: stored by this run, with the turn's status as stored,
/// or found stored (a duplicate job's). The result is held once either way.
#[derive(Debug)]
pub struct Settled {
    /// The result: a final answer, a wait for client tools, or a failure.
    result: TurnResult,
    /// The turn's status exactly as this run stored it with `result` (its own `result` left
    /// empty: [`Settled::into_status`] puts it back). `None` for a result read back from the
    /// store: whoever publishes it reads the turn's current status first.
    stored: Option<TurnStatusView>,
    /// Whether the session may have watchers besides the front door waiting for the turn: it
    /// was marked watched when this run stored the result (see [`Saved::watched`]). `true`
    /// for a result read back from the store.
    ///
    /// [`Saved::watched`]: crate::store::Saved::watched
    pub watched: bool,
}

impl Settled {
    /// A result this run found stored rather than stored itself.
    pub(super) fn stored(result: TurnResult) -> Self {
        Self {
            result,
            stored: None,
            watched: true,
        }
    }

    /// The result this run stored as `status` says (its result is taken out of it, to be
    /// held once).
    pub(super) fn written(mut status: TurnStatusView, watched: bool) -> Self {
        let result = status.result.take().unwrap_or_else(|| {
            // Every settling write stores a result first; were one missing, the client is told
            // of an internal failure rather than nothing, and the operator sees why.
            tracing::error!(
                session_id = %status.session_id,
                turn_id = %status.turn_id,
                "a turn was settled without a result; publishing an internal failure"
            );
            InvokeResult::failure(permanent(
                ErrorCode::Internal,
                "the turn settled without a result",
            ))
        });
        Self {
            result,
            stored: Some(status),
            watched,
        }
    }

    /// The result.
    pub fn result(&self) -> &TurnResult {
        &self.result
    }

    /// The result, given up (without the text its settling write kept of it).
    pub fn into_result(self) -> TurnResult {
        self.result.unwritten()
    }

    /// Whether this run stored the result (rather than finding it stored).
    pub fn stored_here(&self) -> bool {
        self.stored.is_some()
    }

    /// What a publisher starts from: the turn's status as this run stored it, its result
    /// within; else the result alone (it was found stored).
    pub fn into_status(self) -> SettledAs {
        match self.stored {
            Some(mut status) => {
                status.result = Some(self.result);
                SettledAs::Stored(status)
            }
            None => SettledAs::Found(self.result),
        }
    }
}

/// A settled turn as its publisher gets it ([`Settled::into_status`]).
#[derive(Debug)]
pub enum SettledAs {
    /// Stored by this run: its status exactly as stored, published as it is.
    Stored(TurnStatusView),
    /// Found stored (a duplicate job's): the turn's current status is read before publishing.
    Found(TurnResult),
}

pub(super) fn permanent(code: ErrorCode, message: impl Into<String>) -> ErrorMessage {
    ErrorMessage::new(code, message)
}

pub(super) fn store_failure(e: StoreError) -> RetryableFailure {
    RetryableFailure {
        error: ErrorMessage::new(ErrorCode::Internal, format!("{e}")),
        kind: RetryKind::Failure,
    }
}

/// The request fingerprint: the same ids with another payload is a conflict. It is the
/// SHA-256 of the turn as serialised, which is byte for byte the body of its job (the request
/// enum is untagged, and a session id serialises as the client wrote it, whatever its scope):
/// the front door takes it from the job it publishes ([`job_fingerprint`]) and a worker tries
/// the job it was delivered first (`TurnPrint`), neither serialising the turn a second time.
pub fn fingerprint(turn: &UserTurn) -> String {
    sha256_hex(&serde_json::to_vec(turn).unwrap_or_default())
}

/// The fingerprint of a user turn from the job the front door made of it
/// (`serde_json::to_vec` of the request): the same as [`fingerprint`] of the turn.
pub fn job_fingerprint(job: &[u8]) -> String {
    sha256_hex(job)
}

/// A delivered user turn's fingerprint, compared with a stored one. The job's bytes are tried
/// first (a front door's job: no serialisation); a job whose bytes are not the front door's
/// serialisation of its turn (published by other means, with other spacing or field order) is
/// compared by the turn's own [`fingerprint`], so the answer is the same either way.
#[derive(Debug, Clone, Copy)]
pub struct TurnPrint<'a> {
    turn: &'a UserTurn,
    job: Option<&'a [u8]>,
}

impl<'a> TurnPrint<'a> {
    /// `turn`'s print, with the `job` body it was delivered in, if it came in one.
    pub fn of(turn: &'a UserTurn, job: Option<&'a [u8]>) -> Self {
        Self { turn, job }
    }

    /// The turn.
    pub fn turn(&self) -> &'a UserTurn {
        self.turn
    }

    /// Whether `stored` is this turn's fingerprint.
    pub fn matches(&self, stored: &str) -> bool {
        self.job.is_some_and(|job| job_fingerprint(job) == stored) || self.value() == stored
    }

    /// The fingerprint itself, for a record the run creates: always the turn's own, so it is
    /// the one a front door would store for the same request.
    pub fn value(&self) -> String {
        fingerprint(self.turn)
    }
}

/// The fingerprint of a continuation's tool results: the front door accepts one continuation
/// per wait for client tools, and recognises the same one sent again.
pub fn continuation_fingerprint(cont: &ToolContinuation) -> String {
    sha256_hex(&serde_json::to_vec(cont.tool_results()).unwrap_or_default())
}

fn sha256_hex(bytes: &[u8]) -> String {
    crate::hex::lower(&Sha256::digest(bytes))
}

#[cfg(test)]
mod tests {
    use super::{TurnPrint, fingerprint, job_fingerprint};
    use crate::contract::{AgentExecuteRequest, RequestLimits, parse_request};

    fn user_turn(body: &str) -> AgentExecuteRequest {
        parse_request(body.as_bytes(), &RequestLimits::default())
            .expect("a valid turn")
            .request
    }

    /// The front door's job is the turn serialised, so its digest is the turn's fingerprint,
    /// for a tenant's scoped session too (a tagged request enum would break this).
    #[test]
    fn a_turns_job_digests_to_its_fingerprint() {
        let body = r#"{"sessionId":"s-1","turnId":"t-1","instruction":"read these",
            "inputArtifacts":[{"relativePath":"a.md","fileName":"a.md","contents":"alpha","origin":"user"}],
            "streaming":true}"#;
        for tenant in [None, Some("acme")] {
            let mut request = user_turn(body);
            if let Some(t) = tenant {
                request.scope_to(t);
            }
            let AgentExecuteRequest::UserTurn(turn) = &request else {
                panic!("a user turn")
            };
            let job = serde_json::to_vec(&request).unwrap();
            assert_eq!(job_fingerprint(&job), fingerprint(turn), "{tenant:?}");
            let print = TurnPrint::of(turn, Some(&job));
            assert!(print.matches(&fingerprint(turn)));
            assert_eq!(print.value(), fingerprint(turn));
        }
    }

    /// A job in other bytes than the front door's is compared by its turn; another turn's
    /// fingerprint never matches, with or without the job's bytes.
    #[test]
    fn a_print_falls_back_to_the_turn_and_refuses_another() {
        let request = user_turn(r#"{"sessionId":"s","turnId":"t","instruction":"x"}"#);
        let AgentExecuteRequest::UserTurn(turn) = &request else {
            panic!("a user turn")
        };
        let spaced = br#"{ "turnId": "t", "sessionId": "s", "instruction": "x" }"#;
        assert_ne!(job_fingerprint(spaced), fingerprint(turn));
        assert!(TurnPrint::of(turn, Some(spaced)).matches(&fingerprint(turn)));
        assert!(TurnPrint::of(turn, None).matches(&fingerprint(turn)));
        let other = user_turn(r#"{"sessionId":"s","turnId":"t","instruction":"y"}"#);
        let AgentExecuteRequest::UserTurn(other) = &other else {
            panic!("a user turn")
        };
        let job = serde_json::to_vec(&request).unwrap();
        assert!(!TurnPrint::of(turn, Some(&job)).matches(&fingerprint(other)));
        assert!(!TurnPrint::of(turn, None).matches(&fingerprint(other)));
    }
}
