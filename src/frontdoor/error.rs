//! Why a request was not accepted, and how each reason answers: its HTTP status, its
//! invoke result, its retry hint.

use crate::contract::{ErrorCode, ErrorMessage, InvokeResult, RequestRejected};
use crate::queue::QueueError;
use crate::store::StoreError;
use crate::tenants::{QuotaError, QuotaExceeded};

/// Why a request was not accepted.
#[derive(Debug, thiserror::Error)]
pub enum SubmitError {
    /// The body broke the contract (every violation listed).
    #[error("invalid request")]
    Invalid(RequestRejected),
    /// Same ids, different payload.
    #[error("{}", .0.message)]
    Conflict(ErrorMessage),
    /// A continuation for an unknown turn.
    #[error("{}", .0.message)]
    NotFound(ErrorMessage),
    /// A continuation for a turn that is not waiting for client tools.
    #[error("{}", .0.message)]
    NotAwaitingTools(ErrorMessage),
    /// The tenant's daily token quota is spent (the message names when it resets).
    #[error(transparent)]
    QuotaExceeded(QuotaExceeded),
    /// The store or the broker is unavailable; nothing was accepted.
    #[error("{0}")]
    Unavailable(String),
    /// What was asked is done and stored, but telling of it failed (the broker did not take
    /// the status or its webhook deliveries): asking again tells of it. The message says so.
    #[error("{0}")]
    Untold(String),
}

impl SubmitError {
    /// The HTTP status this refusal answers with.
    pub fn http_status(&self) -> u16 {
        match self {
            Self::Invalid(_) => 400,
            Self::NotFound(_) => 404,
            Self::Conflict(_) | Self::NotAwaitingTools(_) => 409,
            Self::QuotaExceeded(_) => 429,
            Self::Unavailable(_) | Self::Untold(_) => 503,
        }
    }

    /// The failed `InvokeResult` a client gets for it (the CLI, the synchronous endpoint).
    pub fn into_invoke_result<T>(self) -> InvokeResult<T> {
        match self {
            Self::Invalid(rejected) => rejected.into_invoke_result(),
            Self::Conflict(m) | Self::NotFound(m) | Self::NotAwaitingTools(m) => {
                InvokeResult::failure(m)
            }
            Self::QuotaExceeded(q) => {
                InvokeResult::failure(ErrorMessage::new(ErrorCode::QuotaExceeded, q.to_string()))
            }
            Self::Unavailable(m) | Self::Untold(m) => {
                InvokeResult::failure(ErrorMessage::new(ErrorCode::ServiceUnavailable, m))
            }
        }
    }

    /// Seconds a client should wait before trying again, when that is known.
    pub fn retry_after_secs(&self) -> Option<u64> {
        match self {
            Self::QuotaExceeded(q) => Some(q.retry_after_secs),
            _ => None,
        }
    }
}

impl From<QuotaError> for SubmitError {
    fn from(e: QuotaError) -> Self {
        match e {
            QuotaError::Exceeded(q) => Self::QuotaExceeded(q),
            QuotaError::Unavailable(e) => Self::Unavailable(e.to_string()),
        }
    }
}

impl From<StoreError> for SubmitError {
    fn from(e: StoreError) -> Self {
        Self::Unavailable(e.to_string())
    }
}

impl From<QueueError> for SubmitError {
    fn from(e: QueueError) -> Self {
        Self::Unavailable(e.to_string())
    }
}
