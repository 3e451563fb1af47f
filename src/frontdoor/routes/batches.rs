//! `POST /v1/batches` (NDJSON in), `GET /v1/batches` (the latest, with progress),
//! `GET /v1/batches/{batchId}` (progress) and `/results` (NDJSON out), each readable only by
//! the tenant that submitted the batch, and by admins.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::contract::{ErrorCode, InvokeResult};
use crate::frontdoor::batch::BatchAccepted;
use crate::frontdoor::batch::BatchProgress;
use crate::frontdoor::batch::BatchResultLine;
use crate::frontdoor::extract::{
    ApiPath, BadParameter, BatchSized, HttpState, LimitedBody, QueryParams, Reader, Tenant, answer,
    failure, forbidden, unavailable, unavailable_unaccepted,
};
use crate::frontdoor::openapi::{self as api_doc, Failure};

/// Submit a batch: NDJSON, one `{"customId", "request"}` per line, each validated on its own.
#[utoipa::path(post, path = "/v1/batches", tag = "batches",
    params(
        ("webhook" = Option<String>, Query, description = "Where every line's turn (unless the line names a webhook of its own) and batch.completed are POSTed, signed with the tenant's secret (see docs/http-api.md, Webhooks)"),
        ("serviceTier" = Option<crate::contexts::ServiceTier>, Query, description = "The service tier of every line's model calls (auto, default, flex, priority), over the agent context's; flex is the batch tier: cheaper, slower, and made at default after the context's wait when flex capacity runs out"),
    ),
    request_body(content = api_doc::BatchLine, content_type = "application/x-ndjson",
        description = "One BatchLine per line; a request may leave out sessionId/turnId"),
    responses(
        (status = 202, description = "Good lines enqueued; bad lines listed by line number and customId", body = api_doc::InvokeResult<BatchAccepted>),
        (status = 400, description = "No lines, or not UTF-8; or the webhook is refused (INVALID_WEBHOOK, WEBHOOK_REFUSED, WEBHOOK_SECRET_MISSING)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 408, description = "The body stopped arriving for APTIX_HTTP_READ_TIMEOUT_SECS (REQUEST_TIMEOUT); the connection is closed", body = Failure),
        (status = 413, description = "More bytes or lines than the limits allow", body = Failure),
        (status = 415, description = "UNSUPPORTED_CONTENT_ENCODING: a compressed body (Content-Encoding other than identity); UNSUPPORTED_MEDIA_TYPE: a Content-Type other than NDJSON, or a charset other than UTF-8", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn post_batch(
    State(state): State<HttpState>,
    Tenant(tenant): Tenant,
    query: QueryParams,
    LimitedBody(body, _): LimitedBody<BatchSized>,
) -> Response {
    let (webhook, tier) = match asked(&query) {
        Ok(asked) => asked,
        Err(bad) => return bad.into(),
    };
    accepted(
        state
            .door
            .submit_batch(
                &tenant,
                &body,
                state.batch_limits,
                (webhook.as_deref(), tier),
            )
            .await,
    )
}

/// A batch's `?webhook=` and `?serviceTier=`, or the `400` naming the one that cannot be read.
fn asked(
    query: &QueryParams,
) -> Result<(Option<String>, Option<crate::contexts::ServiceTier>), BadParameter> {
    Ok((query.webhook()?, query.service_tier()?))
}

/// `202` with the lines accepted (and those refused), or why the whole batch was refused.
fn accepted(submitted: Result<BatchAccepted, crate::frontdoor::batch::BatchError>) -> Response {
    match submitted {
        Ok(accepted) => answer(StatusCode::ACCEPTED, InvokeResult::success(accepted)),
        Err(refused) => batch_refused(refused),
    }
}

/// The answer to a batch (or a batch's retry) refused whole.
fn batch_refused(refused: crate::frontdoor::batch::BatchError) -> Response {
    use crate::frontdoor::batch::BatchError;
    match refused {
        BatchError::TooLarge(m) => failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!("$: {m}"),
        ),
        BatchError::Invalid(m) => failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::MalformedJson,
            format!("$: {m}"),
        ),
        BatchError::Mismatch(m) => failure(StatusCode::CONFLICT, ErrorCode::BatchFileMismatch, m),
        BatchError::AlreadyRetried(m) => {
            failure(StatusCode::CONFLICT, ErrorCode::BatchAlreadyRetried, m)
        }
        BatchError::NothingToRetry(m) => {
            failure(StatusCode::CONFLICT, ErrorCode::NoLinesToRetry, m)
        }
        BatchError::NotSettled(m) => failure(StatusCode::CONFLICT, ErrorCode::BatchNotSettled, m),
        BatchError::Store(e) => unavailable(e),
        BatchError::Unrecorded(e) => unavailable_unaccepted(e),
        BatchError::Webhook(refused) => refused.into_response(),
    }
}

/// Send a batch's failed lines again: the body is the file the batch was made from; the lines
/// whose turn failed, or that were rejected, are read from it (matched by line number and
/// customId) and submitted as a new batch that names this one. Each runs as a new turn in the
/// session its first try ran in. A batch is retried once, when none of its lines is queued
/// or running.
#[utoipa::path(post, path = "/v1/batches/{batchId}/retry", tag = "batches",
    params(
        ("batchId" = String, Path, description = "The batch whose failed lines are sent again"),
        ("webhook" = Option<String>, Query, description = "Where the retry's lines and batch.completed are POSTed (default: the batch's own webhook)"),
        ("serviceTier" = Option<crate::contexts::ServiceTier>, Query, description = "The service tier of the retried lines' model calls"),
    ),
    request_body(content = api_doc::BatchLine, content_type = "application/x-ndjson",
        description = "The batch's file again: one BatchLine per line, at the same line numbers"),
    responses(
        (status = 202, description = "The failed lines, sent again as a new batch (`retryOf` names this one); lines still bad are listed", body = api_doc::InvokeResult<BatchAccepted>),
        (status = 400, description = "The body is empty or not UTF-8; or the path or webhook is refused", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such batch (or another tenant's)", body = Failure),
        (status = 408, description = "The body stopped arriving for APTIX_HTTP_READ_TIMEOUT_SECS (REQUEST_TIMEOUT); the connection is closed", body = Failure),
        (status = 409, description = "The file or the batch does not allow a retry: BATCH_FILE_MISMATCH (a failed line is missing from the file or has another customId: not the batch's file), BATCH_ALREADY_RETRIED (the message names the retry), BATCH_NOT_SETTLED (lines still queued or running) or NO_LINES_TO_RETRY", body = Failure),
        (status = 413, description = "More bytes or lines than the limits allow", body = Failure),
        (status = 415, description = "UNSUPPORTED_CONTENT_ENCODING: a compressed body (Content-Encoding other than identity); UNSUPPORTED_MEDIA_TYPE: a Content-Type other than NDJSON, or a charset other than UTF-8", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn retry_batch(
    State(state): State<HttpState>,
    CallerBatch(batch): CallerBatch,
    query: QueryParams,
    LimitedBody(body, _): LimitedBody<BatchSized>,
) -> Response {
    let (webhook, tier) = match asked(&query) {
        Ok(asked) => asked,
        Err(bad) => return bad.into(),
    };
    accepted(
        state
            .door
            .retry_batch(
                &batch,
                &body,
                state.batch_limits,
                (webhook.as_deref(), tier),
            )
            .await,
    )
}

/// The batch a request's path names, when the calling tenant submitted it (or the caller is an
/// admin): `404 BATCH_NOT_FOUND` otherwise (another tenant's batch reads as missing), after
/// the path's own `400` and the token's `401`.
pub(crate) struct CallerBatch(crate::store::BatchRecord);

impl axum::extract::FromRequestParts<HttpState> for CallerBatch {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &HttpState,
    ) -> Result<Self, Response> {
        let ApiPath(batch_id) = ApiPath::<String>::from_request_parts(parts, state).await?;
        let reader = Reader::from_request_parts(parts, state).await?;
        let missing = || {
            failure(
                StatusCode::NOT_FOUND,
                ErrorCode::BatchNotFound,
                format!("batch {batch_id:?} does not exist"),
            )
        };
        if crate::contract::ids::check_id(&batch_id).is_err() {
            return Err(missing());
        }
        match state.store.get_batch(&batch_id).await {
            Ok(Some(b)) if reader.may_see(&b.tenant) => Ok(Self(b)),
            Ok(_) => Err(missing()),
            Err(e) => Err(unavailable(e)),
        }
    }
}

/// A batch's progress: its turns counted by status.
#[utoipa::path(get, path = "/v1/batches/{batchId}", tag = "batches",
    params(("batchId" = String, Path, description = "The batch")),
    responses(
        (status = 400, description = "A path parameter cannot be read (INVALID_PARAMETER)", body = Failure),
        (status = 200, description = "Counts by status", body = api_doc::InvokeResult<BatchProgress>),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such batch (or another tenant's)", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn get_batch(
    State(state): State<HttpState>,
    CallerBatch(batch): CallerBatch,
) -> Response {
    progress(&state, &batch).await
}

/// The most batches one listing answers.
const MAX_LISTED: usize = 100;

/// One batch of a listing: its progress, when it was submitted and, while lines are still
/// open, how fast they settle and when the last should.
#[derive(Debug, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub(crate) struct BatchSummary {
    /// The tenant that submitted it.
    tenant: String,
    /// Submitted (RFC 3339).
    created_at: String,
    /// Counts by status.
    progress: BatchProgress,
    /// Lines settled (completed, failed, cancelled, expired) or rejected.
    settled: usize,
    /// Lines settled per second since submission, while some are still open.
    #[serde(skip_serializing_if = "Option::is_none")]
    settled_per_second: Option<f64>,
    /// Seconds until the last open line should settle, at that rate.
    #[serde(skip_serializing_if = "Option::is_none")]
    eta_seconds: Option<f64>,
}

impl BatchSummary {
    fn of(batch: &crate::store::BatchRecord, progress: BatchProgress) -> Self {
        let settled = progress.rejected
            + progress.completed
            + progress.failed
            + progress.cancelled
            + progress.expired;
        let open = progress.total.saturating_sub(settled);
        let elapsed = time::OffsetDateTime::parse(
            &batch.created_at,
            &time::format_description::well_known::Rfc3339,
        )
        .ok()
        .map(|t| (time::OffsetDateTime::now_utc() - t).as_seconds_f64())
        .filter(|s| *s > 0.0);
        let rate = elapsed
            .filter(|_| open > 0)
            .map(|s| (settled - progress.rejected) as f64 / s);
        Self {
            tenant: batch.tenant.clone(),
            created_at: batch.created_at.clone(),
            settled,
            settled_per_second: rate,
            eta_seconds: rate.filter(|r| *r > 0.0).map(|r| open as f64 / r),
            progress,
        }
    }
}

/// The latest batches, newest first, each with its progress: the calling tenant's; an
/// admin's token lists every tenant's, or one tenant's with `?tenant=`.
#[utoipa::path(get, path = "/v1/batches", tag = "batches",
    params(
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 100, description = "At most this many batches (default 20)"),
        ("tenant" = Option<String>, Query, pattern = "^[A-Za-z0-9._:-]{1,64}$", description = "This tenant's batches: any tenant for an admin token, only its own for a tenant's"),
    ),
    responses(
        (status = 200, description = "The batches, newest first", body = api_doc::InvokeResult<Vec<BatchSummary>>),
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER, naming it)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 403, description = "`tenant` given with a token that is not an admin's (FORBIDDEN)", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn list_batches(
    State(state): State<HttpState>,
    reader: Reader,
    query: QueryParams,
) -> Response {
    let (limit, asked) = match (query.limit(20, MAX_LISTED), query.tenant()) {
        (Ok(l), Ok(t)) => (l, t),
        (Err(bad), _) | (_, Err(bad)) => return bad.into(),
    };
    let tenants = match (asked, reader.0.admin) {
        (Some(t), true) => vec![t],
        (Some(t), false) if t == reader.0.tenant => vec![t],
        (Some(_), false) => {
            return forbidden("tenant: only admin tokens may list another tenant's batches");
        }
        (None, true) => state.known_tenants(),
        (None, false) => vec![reader.0.tenant.clone()],
    };
    let mut batches = Vec::new();
    for tenant in &tenants {
        let ids = match state.store.list_batches(tenant, limit).await {
            Ok(ids) => ids,
            Err(e) => return unavailable(e),
        };
        for id in ids {
            match state.store.get_batch(&id).await {
                Ok(Some(b)) => batches.push(b),
                Ok(None) => {} // expired
                Err(e) => return unavailable(e),
            }
        }
    }
    batches.sort_by(|a, b| b.created_at.cmp(&a.created_at));
    batches.truncate(limit);
    let mut out = Vec::with_capacity(batches.len());
    for b in &batches {
        match state.door.batch_progress(b).await {
            Ok(p) => out.push(BatchSummary::of(b, p)),
            Err(e) => return unavailable(e),
        }
    }
    answer(StatusCode::OK, InvokeResult::success(out))
}

/// `200` with the batch's progress.
async fn progress(state: &HttpState, batch: &crate::store::BatchRecord) -> Response {
    match state.door.batch_progress(batch).await {
        Ok(p) => answer(StatusCode::OK, InvokeResult::success(p)),
        Err(e) => unavailable(e),
    }
}

/// The most result lines one page (`?limit=`) asks for.
const MAX_RESULTS_PAGE: usize = 10_000;

/// A batch's results: NDJSON, one line per submitted line (accepted lines in order, then
/// rejected ones); `result` is present once the turn settled. `?from=&limit=` answer a page
/// of them (a console shows a page at a time without reading the rest).
#[utoipa::path(get, path = "/v1/batches/{batchId}/results", tag = "batches",
    params(
        ("batchId" = String, Path, description = "The batch"),
        ("from" = Option<usize>, Query, description = "Skip this many lines first (default 0)"),
        ("limit" = Option<usize>, Query, minimum = 1, maximum = 10000, description = "At most this many lines (default: every one)"),
    ),
    responses(
        (status = 400, description = "A parameter cannot be read (INVALID_PARAMETER)", body = Failure),
        (status = 200, description = "One BatchResultLine per line", content_type = "application/x-ndjson", body = BatchResultLine),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such batch (or another tenant's)", body = Failure),
    ))]
pub(crate) async fn get_batch_results(
    State(state): State<HttpState>,
    CallerBatch(mut batch): CallerBatch,
    query: QueryParams,
) -> Response {
    use futures_util::StreamExt as _;
    let from = match query.text("from") {
        Ok(None) => 0,
        Ok(Some(raw)) => match raw.trim().parse::<usize>() {
            Ok(n) => n,
            // A whole number past the largest index skips every line: an empty page.
            Err(e) if *e.kind() == std::num::IntErrorKind::PosOverflow => usize::MAX,
            Err(_) => {
                return BadParameter::new(format!(
                    "from: must be a whole number from 0, not {raw:?}"
                ))
                .into();
            }
        },
        Err(bad) => return bad.into(),
    };
    let limit = match query.text("limit") {
        Ok(None) => usize::MAX,
        Ok(Some(_)) => match query.limit(MAX_RESULTS_PAGE, MAX_RESULTS_PAGE) {
            Ok(n) => n,
            Err(bad) => return bad.into(),
        },
        Err(bad) => return bad.into(),
    };
    // The page of the lines in order: the accepted ones, then the rejected ones.
    let end = from.saturating_add(limit);
    let accepted = batch.items.len();
    let items = from.min(accepted)..end.min(accepted);
    batch.items = batch.items.drain(items).collect();
    let rejected = batch.rejected.len();
    let shown =
        from.saturating_sub(accepted).min(rejected)..end.saturating_sub(accepted).min(rejected);
    batch.rejected = batch.rejected.drain(shown).collect();
    let lines = state.door.batch_results(batch).map(|chunk| {
        let chunk = chunk.map_err(|e| {
            // Headers are sent already: end the stream early; the client sees a short body.
            tracing::warn!(error = %e, "batch results cut short");
            std::io::Error::other(e.to_string())
        })?;
        let mut out = Vec::new();
        for line in chunk {
            if serde_json::to_writer(&mut out, &line).is_ok() {
                out.push(b'\n');
            }
        }
        Ok::<_, std::io::Error>(Bytes::from(out))
    });
    (
        StatusCode::OK,
        [(axum::http::header::CONTENT_TYPE, "application/x-ndjson")],
        axum::body::Body::from_stream(lines),
    )
        .into_response()
}

/// Cancel a batch: every turn of it that has not finished is cancelled (queued and waiting
/// ones at once, running ones at their next safe point); answers the progress after.
#[utoipa::path(post, path = "/v1/batches/{batchId}/cancel", tag = "batches",
    params(("batchId" = String, Path, description = "The batch")),
    responses(
        (status = 200, description = "Counts by status after the cancel", body = api_doc::InvokeResult<BatchProgress>),
        (status = 400, description = "A path parameter cannot be read (INVALID_PARAMETER)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such batch (or another tenant's)", body = Failure),
        (status = 503, description = "Store unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn cancel_batch(
    State(state): State<HttpState>,
    CallerBatch(batch): CallerBatch,
) -> Response {
    if let Err(refused) = state.door.cancel_batch(&batch).await {
        return refused.into_response();
    }
    progress(&state, &batch).await
}
