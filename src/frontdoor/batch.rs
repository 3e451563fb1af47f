//! Batches: many turns submitted as one NDJSON body, tracked and read back together.
//!
//! Each line is `{"customId": "...", "request": <AgentExecuteRequest>}` and is validated on its
//! own: good lines are enqueued like single turns, bad lines are reported with their 1-based
//! line number and customId. A request may leave out `sessionId` and `turnId`; fresh ones are
//! assigned. The batch record (which lines became which turns) is stored once every line was
//! handled; the turns themselves carry all state, so a batch's progress is read from them.

use backon::Retryable as _;
use futures_util::StreamExt as _;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::{FrontDoor, SubmitError};
use crate::config::BatchLimits;
use crate::contract::request::default_id;
use crate::contract::{
    AgentExecuteResponse, ErrorCode, ErrorMessage, InvokeResult, ParsedRequest, SessionId, TurnId,
    parse_request,
};
use crate::store::{BatchItem, BatchLineError, BatchRecord, StoreError, now_rfc3339};

/// The longest `customId` accepted.
pub const MAX_CUSTOM_ID_CHARS: usize = 256;

/// Lines validated and enqueued at once.
const SUBMIT_CONCURRENCY: usize = 16;

/// The answer to a batch submission.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchAccepted {
    /// The new batch's id.
    pub batch_id: String,
    /// Lines submitted (blank lines not counted).
    pub total: usize,
    /// Lines enqueued.
    pub accepted: usize,
    /// Lines not enqueued, each with every reason.
    pub errors: Vec<BatchLineError>,
    /// The batch whose failed lines this one sends again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retry_of: Option<String>,
}

pub use crate::state::BatchProgress;

/// One line of `GET /v1/batches/{id}/results`.
#[derive(Debug, Clone, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct BatchResultLine {
    /// The client's id for the line.
    pub custom_id: Option<String>,
    /// 1-based line number in the submission.
    pub line: usize,
    /// The turn's session (absent for rejected lines).
    pub session_id: Option<SessionId>,
    /// The turn (absent for rejected lines).
    pub turn_id: Option<TurnId>,
    /// The turn's status, or `rejected` / `expired`.
    #[schema(example = "completed")]
    pub status: String,
    /// The turn's result; for a rejected line, the failed result naming every violation.
    #[schema(value_type = Option<crate::frontdoor::openapi::ExecuteResult>)]
    #[serde(default)]
    pub result: Option<InvokeResult<AgentExecuteResponse>>,
}

/// Why a whole batch was refused.
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// More bytes or lines than the limits allow.
    #[error("{0}")]
    TooLarge(String),
    /// The body is not UTF-8 or has no lines.
    #[error("{0}")]
    Invalid(String),
    /// The store is unavailable.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The store did not take the batch's line count (its completion could not be told
    /// of): nothing was enqueued.
    #[error("{0}")]
    Unrecorded(String),
    /// The batch's webhook is refused (or its tenant cannot sign): nothing was accepted.
    #[error("{0}")]
    Webhook(SubmitError),
    /// A retry's file does not match the batch it retries: nothing was accepted.
    #[error("{0}")]
    Mismatch(String),
    /// The batch was retried already.
    #[error("{0}")]
    AlreadyRetried(String),
    /// The batch has no failed lines to send again.
    #[error("{0}")]
    NothingToRetry(String),
    /// Some of the batch's lines are still queued or running: it is retried once they settle.
    #[error("{0}")]
    NotSettled(String),
}

fn line_error(line: usize, custom_id: Option<String>, errors: Vec<ErrorMessage>) -> BatchLineError {
    BatchLineError {
        line,
        custom_id,
        errors,
    }
}

/// Gives a request object fresh ids where it has none.
fn fill_ids(request: &mut Map<String, Value>) {
    default_id(request, "sessionId", "SessionId", || {
        SessionId::generate().to_string()
    });
    default_id(request, "turnId", "TurnId", || {
        TurnId::generate().to_string()
    });
}

/// The ids a line's request is given before it is read (a retried line's: its new turn, in
/// its first try's session).
#[derive(Debug, Clone, PartialEq)]
pub(super) struct LineIds {
    /// The session it must run in (the one its first try ran in), whatever the line names.
    pub session: Option<String>,
    /// The session it runs in when it names none.
    pub default_session: String,
    /// Its new turn's id.
    pub turn: String,
}

impl LineIds {
    /// Writes the ids into a line's request object.
    pub(super) fn apply(self, request: &mut Map<String, Value>) {
        match self.session {
            Some(session) => {
                request.remove("SessionId");
                request.insert("sessionId".into(), Value::String(session));
            }
            None => default_id(request, "sessionId", "SessionId", || self.default_session),
        }
        request.remove("TurnId");
        request.insert("turnId".into(), Value::String(self.turn));
    }
}

/// A batch about to be stored: its id, its line count, and the batch whose failed lines it
/// sends again, if it does.
pub(super) struct NewBatch<'a> {
    pub id: String,
    pub total: usize,
    pub retry_of: Option<&'a str>,
}

/// A line read: its number, customId and request, or why it is refused.
pub(super) type PreparedLine = Result<(usize, String, ParsedRequest), BatchLineError>;

/// The body's lines that are not blank, numbered from 1 as they stand in the body (blank
/// lines count), within the limits.
pub(super) fn read_lines(
    body: &[u8],
    limits: BatchLimits,
) -> Result<Vec<(usize, &str)>, BatchError> {
    if body.len() > limits.max_bytes {
        return Err(BatchError::TooLarge(format!(
            "the batch is larger than the limit of {} bytes",
            limits.max_bytes
        )));
    }
    let text = std::str::from_utf8(crate::contract::without_bom(body))
        .map_err(|e| BatchError::Invalid(format!("the batch is not UTF-8 text: {e}")))?;
    let lines: Vec<(usize, &str)> = text
        .lines()
        .enumerate()
        .map(|(i, l)| (i + 1, l.trim()))
        .filter(|(_, l)| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return Err(BatchError::Invalid(
            "the batch has no lines; send one {\"customId\", \"request\"} object per line".into(),
        ));
    }
    if lines.len() > limits.max_lines {
        return Err(BatchError::TooLarge(format!(
            "the batch has {} lines; the limit is {}",
            lines.len(),
            limits.max_lines
        )));
    }
    Ok(lines)
}

impl FrontDoor {
    /// Validates every line of an NDJSON batch on its own, enqueues the good ones for `tenant`,
    /// and stores the batch. A line's turn joins a session of another tenant only as a
    /// "does not exist" error.
    pub async fn submit_batch(
        &self,
        tenant: &str,
        body: &[u8],
        limits: BatchLimits,
        asked: (Option<&str>, Option<crate::contexts::ServiceTier>),
    ) -> Result<BatchAccepted, BatchError> {
        let lines = read_lines(body, limits)?;
        let prepared = self.prepare_lines(&lines, |_| None);
        let batch = NewBatch {
            id: format!("batch-{}", uuid::Uuid::new_v4().simple()),
            total: lines.len(),
            retry_of: None,
        };
        self.accept_batch(tenant, prepared, batch, asked).await
    }

    /// Reads each line into its customId and request (its ids set by `ids` when it names
    /// them), refusing a `customId` an earlier line used, whether or not that line was valid:
    /// results are keyed by them.
    pub(super) fn prepare_lines(
        &self,
        lines: &[(usize, &str)],
        ids: impl Fn(usize) -> Option<LineIds>,
    ) -> Vec<PreparedLine> {
        let mut seen = std::collections::HashSet::new();
        lines
            .iter()
            .map(|&(line, raw)| {
                let prepared = self.prepare_line(line, raw, ids(line));
                let custom_id = match &prepared {
                    Ok((_, id, _)) => Some(id.clone()),
                    Err(e) => e.custom_id.clone(),
                };
                let Some(id) = custom_id.filter(|id| !seen.insert(id.clone())) else {
                    return prepared;
                };
                let duplicate = ErrorMessage::new(
                    ErrorCode::DuplicateCustomId,
                    format!("customId: {id:?} is used by an earlier line"),
                );
                match prepared {
                    Err(mut e) => {
                        e.errors.push(duplicate);
                        Err(e)
                    }
                    Ok(_) => Err(line_error(line, Some(id), vec![duplicate])),
                }
            })
            .collect()
    }

    /// Stores `batch` and enqueues its good lines; the bad ones are listed with why.
    pub(super) async fn accept_batch(
        &self,
        tenant: &str,
        prepared: Vec<PreparedLine>,
        NewBatch {
            id: batch_id,
            total,
            retry_of,
        }: NewBatch<'_>,
        (webhook, tier): (Option<&str>, Option<crate::contexts::ServiceTier>),
    ) -> Result<BatchAccepted, BatchError> {
        if let Some(url) = webhook {
            self.admit_webhook(Some(tenant), url)
                .await
                .map_err(BatchError::Webhook)?;
        }
        // The batch is stored before anything is enqueued, so a turn is never running for a
        // batch nobody can read back; lines that then fail to enqueue are moved to `rejected`.
        let mut record = BatchRecord {
            batch_id,
            tenant: tenant.to_string(),
            created_at: now_rfc3339(),
            total,
            items: Vec::new(),
            rejected: Vec::new(),
            webhook: webhook.map(str::to_string),
            retry_of: retry_of.map(str::to_string),
            retried_as: None,
        };
        // Its completion is told of (batch.completed) only to whom it goes to: none of the
        // per-line bookkeeping for a batch that nobody hears of.
        let targets = |b: &BatchRecord| self.batch_targets(b);
        let tracked = !targets(&record).is_empty();
        let mut valid = Vec::new();
        for p in prepared {
            match p {
                Ok((line, custom_id, mut request)) => {
                    // The lines' sessions are the tenant's.
                    request.request.scope_to(tenant);
                    record.items.push(BatchItem {
                        line,
                        custom_id: custom_id.clone(),
                        session_id: request.request.session_id().clone(),
                        turn_id: request.request.turn_id().clone(),
                    });
                    valid.push((line, custom_id, request));
                }
                Err(e) => record.rejected.push(e),
            }
        }
        self.store.put_batch(&record).await?;
        if tracked {
            // How many lines have turns is noted before any is enqueued, so whichever line
            // settles last completes the batch; if the store cannot take it, nothing was
            // enqueued and the client is told to send the batch again.
            // Counted by turn, as settling is: lines that repeat a turn are one.
            let turns: std::collections::HashSet<_> = record
                .items
                .iter()
                .map(|i| (&i.session_id, &i.turn_id))
                .collect();
            self.delivery
                .batch_settled(&record.batch_id, (None, Some(turns.len())), targets)
                .await
                .map_err(|e| BatchError::Unrecorded(e.to_string()))?;
        }
        let pickup = if tracked {
            super::Pickup::in_tracked_batch(&record.batch_id, webhook)
        } else {
            super::Pickup::in_batch()
        }
        .at_tier(tier);
        let outcomes: Vec<Result<(), BatchLineError>> = futures_util::stream::iter(valid)
            .map(|(line, custom_id, request)| {
                self.enqueue_line(tenant, (line, custom_id), request, pickup)
            })
            .buffered(SUBMIT_CONCURRENCY)
            .collect()
            .await;
        let failed: Vec<BatchLineError> = outcomes.into_iter().filter_map(Result::err).collect();
        let mut failed_items: Vec<BatchItem> = Vec::new();
        if !failed.is_empty() {
            let lines: std::collections::HashSet<usize> = failed.iter().map(|e| e.line).collect();
            let (gone, kept) = std::mem::take(&mut record.items)
                .into_iter()
                .partition(|i| lines.contains(&i.line));
            failed_items = gone;
            record.items = kept;
            record.rejected.extend(failed);
            record.rejected.sort_by_key(|e| e.line);
            if let Err(e) = self.store.put_batch(&record).await {
                // The answer below is still exact; only a later GET of the batch would show
                // the lines that failed to enqueue as expired instead of rejected.
                tracing::error!(batch_id = %record.batch_id, error = %e, "could not record the lines that failed to enqueue");
            }
        }
        if tracked {
            // A line that failed to enqueue never settles: it counts as settled, so the
            // batch still completes with the lines that run.
            let running: std::collections::HashSet<_> = record
                .items
                .iter()
                .map(|i| (&i.session_id, &i.turn_id))
                .collect();
            for item in &failed_items {
                if running.contains(&(&item.session_id, &item.turn_id)) {
                    // Another line of this turn was enqueued: its settling counts for both.
                    continue;
                }
                let line_turn = Some((&item.session_id, &item.turn_id));
                self.note_line(&record.batch_id, item.line, line_turn).await;
            }
        }
        tracing::info!(
            batch_id = %record.batch_id,
            retry_of = record.retry_of.as_deref(),
            total = record.total,
            accepted = record.items.len(),
            rejected = record.rejected.len(),
            "batch accepted"
        );
        Ok(BatchAccepted {
            batch_id: record.batch_id,
            total: record.total,
            accepted: record.items.len(),
            errors: record.rejected,
            retry_of: record.retry_of,
        })
    }

    /// Notes a line of tracked batch `batch` that no worker will settle (its turn had settled
    /// before, or never enqueued), trying a few times over about two seconds: the store
    /// refused the line count a moment ago or the batch would not have been accepted.
    async fn note_line(&self, batch: &str, line: usize, turn: Option<(&SessionId, &TurnId)>) {
        let note = || async {
            self.delivery
                .batch_settled(batch, (turn, None), |b| self.batch_targets(b))
                .await
        };
        let noted = note
            .retry(
                backon::ExponentialBuilder::default()
                    .with_min_delay(std::time::Duration::from_millis(100))
                    .with_max_times(4),
            )
            .await;
        if let Err(e) = noted {
            tracing::error!(batch_id = %batch, line, error = %e, "could not note a batch line that will not run; batch.completed will not be sent for this batch");
        }
    }

    /// Reads one line into its customId and a parsed request (ids filled in).
    fn prepare_line(&self, line: usize, raw: &str, ids: Option<LineIds>) -> PreparedLine {
        let value: Value = serde_json::from_str(raw).map_err(|e| {
            line_error(
                line,
                None,
                vec![ErrorMessage::new(
                    ErrorCode::MalformedJson,
                    format!("$: the line is not valid JSON ({e})"),
                )],
            )
        })?;
        let Value::Object(mut obj) = value else {
            return Err(line_error(
                line,
                None,
                vec![ErrorMessage::new(
                    ErrorCode::MalformedJson,
                    "$: the line must be a JSON object {\"customId\", \"request\"}",
                )],
            ));
        };
        let custom_id = match obj.remove("customId") {
            Some(Value::String(s))
                if !s.trim().is_empty() && s.chars().count() <= MAX_CUSTOM_ID_CHARS =>
            {
                Some(s)
            }
            Some(Value::String(_)) => {
                return Err(line_error(
                    line,
                    None,
                    vec![ErrorMessage::new(
                        ErrorCode::InvalidId,
                        format!("customId: must be 1-{MAX_CUSTOM_ID_CHARS} characters, not blank"),
                    )],
                ));
            }
            Some(Value::Null) | None => None,
            Some(_) => {
                return Err(line_error(
                    line,
                    None,
                    vec![ErrorMessage::new(
                        ErrorCode::InvalidFieldType,
                        "customId: must be a string",
                    )],
                ));
            }
        };
        let mut errors = Vec::new();
        if custom_id.is_none() {
            errors.push(ErrorMessage::new(
                ErrorCode::MissingField,
                "customId: is required",
            ));
        }
        let request = match obj.remove("request") {
            Some(Value::Object(mut r)) => {
                if let Some(ids) = ids {
                    ids.apply(&mut r);
                }
                fill_ids(&mut r);
                Some(r)
            }
            Some(Value::Null) | None => {
                errors.push(ErrorMessage::new(
                    ErrorCode::MissingField,
                    "request: is required",
                ));
                None
            }
            Some(_) => {
                errors.push(ErrorMessage::new(
                    ErrorCode::InvalidFieldType,
                    "request: must be an AgentExecuteRequest object",
                ));
                None
            }
        };
        let (Some(custom_id), Some(request), true) =
            (custom_id.clone(), request, errors.is_empty())
        else {
            return Err(line_error(line, custom_id, errors));
        };
        let body = serde_json::to_vec(&Value::Object(request)).unwrap_or_default();
        let checked = parse_request(&body, &self.limits)
            .and_then(|parsed| self.check_configured(&parsed.request).map(|()| parsed));
        match checked {
            Ok(parsed) => Ok((line, custom_id, parsed)),
            Err(rejected) => Err(line_error(
                line,
                Some(custom_id),
                rejected
                    .errors
                    .into_iter()
                    .map(|mut e| {
                        e.message = match e.message.strip_prefix("$:") {
                            Some(rest) => format!("request:{rest}"),
                            None => format!("request.{}", e.message),
                        };
                        e
                    })
                    .collect(),
            )),
        }
    }

    /// Where `batch.completed` of `batch` goes.
    fn batch_targets(&self, batch: &BatchRecord) -> Vec<crate::webhooks::Target> {
        self.quotas.tenants().batch_targets(batch)
    }

    /// Enqueues one valid line for `tenant`; the error names why it was not accepted.
    async fn enqueue_line(
        &self,
        tenant: &str,
        (line, custom_id): (usize, String),
        parsed: ParsedRequest,
        pickup: super::Pickup<'_>,
    ) -> Result<(), BatchLineError> {
        let request = parsed.request;
        let submitted = self
            .submit(
                tenant,
                &request,
                &crate::trace::TraceContext::new_root(),
                pickup,
            )
            .await;
        let errors = match submitted {
            // A line whose turn had settled already (its ids and payload were submitted
            // before): no worker will settle it again, so it is noted here.
            Ok(view) if view.status.is_settled() => {
                if let Some((batch, _)) = pickup.batch {
                    let line_turn = Some((&view.session_id, &view.turn_id));
                    self.note_line(batch, line, line_turn).await;
                }
                return Ok(());
            }
            Ok(_) => return Ok(()),
            Err(SubmitError::Invalid(r)) => r.errors,
            Err(
                SubmitError::Conflict(m)
                | SubmitError::NotFound(m)
                | SubmitError::NotAwaitingTools(m),
            ) => vec![m],
            Err(SubmitError::QuotaExceeded(q)) => {
                vec![ErrorMessage::new(ErrorCode::QuotaExceeded, q.to_string())]
            }
            Err(SubmitError::Untold(m)) => {
                tracing::warn!(line, error = %m, "a batch line could not be enqueued");
                vec![ErrorMessage::new(ErrorCode::ServiceUnavailable, m)]
            }
            Err(SubmitError::Unavailable(m)) => {
                tracing::warn!(line, error = %m, "a batch line could not be enqueued");
                vec![ErrorMessage::new(
                    ErrorCode::ServiceUnavailable,
                    "the service is temporarily unavailable; this line was not enqueued, submit it again",
                )]
            }
        };
        Err(line_error(line, Some(custom_id), errors))
    }
}
