//! A batch's record, progress and lines.

use serde::{Deserialize, Serialize};

use crate::contract::{SessionId, TurnId};

/// A batch of turns submitted together (`POST /v1/batches`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchRecord {
    /// The batch id.
    pub batch_id: String,
    /// The tenant that submitted it (only it can read the batch).
    pub tenant: String,
    /// Submitted (RFC 3339).
    pub created_at: String,
    /// Lines in the submission (blank lines not counted).
    pub total: usize,
    /// Accepted lines, in line order.
    pub items: Vec<BatchItem>,
    /// Rejected lines, in line order.
    pub rejected: Vec<BatchLineError>,
    /// Where `batch.completed` (and each line's turn) is POSTed too, when the submission
    /// named a webhook.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub webhook: Option<String>,
    /// The batch whose failed lines this one sends again (`POST /v1/batches/{id}/retry`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<String>,
    /// The batch that sent this one's failed lines again: a batch is retried once (its
    /// retry's own failed lines are retried from the retry).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_as: Option<String>,
}

/// A batch's progress: `total = rejected + queued + running + awaitingClientTools + completed +
/// failed + cancelled + expired` (`expired`: turns whose records are gone).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchProgress {
    /// The batch id.
    pub batch_id: String,
    /// Lines submitted.
    pub total: usize,
    /// Lines rejected at submission.
    pub rejected: usize,
    /// Turns waiting for a worker.
    pub queued: usize,
    /// Turns being run.
    pub running: usize,
    /// Turns waiting for client tool results.
    pub awaiting_client_tools: usize,
    /// Turns with a final answer.
    pub completed: usize,
    /// Turns that failed.
    pub failed: usize,
    /// Turns that were cancelled.
    #[serde(default)]
    pub cancelled: usize,
    /// Turns whose records are gone (past the retention period).
    pub expired: usize,
    /// The batch whose failed lines this one sends again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<String>,
    /// The batch that sent this one's failed lines again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retried_as: Option<String>,
}

/// One accepted line of a batch.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BatchItem {
    /// 1-based line number in the submission.
    pub line: usize,
    /// The client's id for the line.
    pub custom_id: String,
    /// The turn's session (scoped to its tenant).
    #[serde(with = "crate::contract::ids::scoped")]
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
}

/// One rejected line of a batch, with every reason.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchLineError {
    /// 1-based line number in the submission.
    pub line: usize,
    /// The client's id for the line, when it could be read.
    pub custom_id: Option<String>,
    /// What is wrong with it.
    pub errors: Vec<crate::contract::ErrorMessage>,
}
