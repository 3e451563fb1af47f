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

/// A turn's result as a run leaves it.
#[derive(Debug)]
pub struct Settled {
    /// The result: a final answer, a wait for client tools, or a failure.
    pub result: TurnResult,
    /// The turn's status exactly as this run stored it with the result, when this run stored
    /// it. `None` for a result read back from the store (a duplicate job's): whoever publishes
    /// it reads the turn's current status first.
    pub status: Option<TurnStatusView>,
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
            status: None,
            watched: true,
        }
    }
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

/// The request fingerprint: the same ids with another payload is a conflict.
pub fn fingerprint(turn: &UserTurn) -> String {
    sha256_hex(&serde_json::to_vec(turn).unwrap_or_default())
}

/// The fingerprint of a continuation's tool results: the front door accepts one continuation
/// per wait for client tools, and recognises the same one sent again.
pub fn continuation_fingerprint(cont: &ToolContinuation) -> String {
    sha256_hex(&serde_json::to_vec(cont.tool_results()).unwrap_or_default())
}

fn sha256_hex(bytes: &[u8]) -> String {
    crate::hex::lower(&Sha256::digest(bytes))
}
