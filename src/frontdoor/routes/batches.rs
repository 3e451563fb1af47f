//! `POST /v1/batches` (NDJSON in), `GET /v1/batches/{batchId}` (progress) and `/results`
//! (NDJSON out), each readable only by the tenant that submitted the batch.

use axum::body::Bytes;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

use crate::contract::{ErrorCode, InvokeResult};
use crate::frontdoor::batch::BatchAccepted;
use crate::frontdoor::batch::BatchProgress;
use crate::frontdoor::batch::BatchResultLine;
use crate::frontdoor::extract::{
    ApiPath, BatchSized, HttpState, LimitedBody, QueryParams, Tenant, answer, failure, unavailable,
    unavailable_unaccepted,
};
use crate::frontdoor::openapi::{self as api_doc, Failure};

/// Submit a batch: NDJSON, one `{"customId", "request"}` per line, each validated on its own.
#[utoipa::path(post, path = "/v1/batches", tag = "batches",
    params(
        ("webhook" = Option<String>, Query, description = "Where every line's turn (unless the line names a webhook of its own) and batch.completed are POSTed, signed with the tenant's secret (see the README's Webhooks)"),
        ("serviceTier" = Option<crate::contexts::ServiceTier>, Query, description = "The service tier of every line's model calls (auto, default, flex, priority), over the agent context's; flex is the batch tier: cheaper, slower, and made at default after the context's wait when flex capacity runs out"),
    ),
    request_body(content = api_doc::BatchLine, content_type = "application/x-ndjson",
        description = "One BatchLine per line; a request may leave out sessionId/turnId"),
    responses(
        (status = 202, description = "Good lines enqueued; bad lines listed by line number and customId", body = api_doc::InvokeResult<BatchAccepted>),
        (status = 400, description = "No lines, or not UTF-8; or the webhook is refused (INVALID_WEBHOOK, WEBHOOK_REFUSED, WEBHOOK_SECRET_MISSING)", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
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
    use crate::frontdoor::batch::BatchError;
    let (webhook, tier) = match (query.webhook(), query.service_tier()) {
        (Ok(w), Ok(t)) => (w, t),
        (Err(bad), _) | (_, Err(bad)) => return bad.into(),
    };
    let asked = (webhook.as_deref(), tier);
    match state
        .door
        .submit_batch(&tenant, &body, state.batch_limits, asked)
        .await
    {
        Ok(accepted) => answer(StatusCode::ACCEPTED, InvokeResult::success(accepted)),
        Err(BatchError::TooLarge(m)) => failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!("$: {m}"),
        ),
        Err(BatchError::Invalid(m)) => failure(
            StatusCode::BAD_REQUEST,
            ErrorCode::MalformedJson,
            format!("$: {m}"),
        ),
        Err(BatchError::Store(e)) => unavailable(e),
        Err(BatchError::Unrecorded(e)) => unavailable_unaccepted(e),
        Err(BatchError::Webhook(refused)) => refused.into_response(),
    }
}

/// Looks up the caller's batch, or answers 404/503.
/// The batch a request's path names, when the calling tenant submitted it: `404
/// BATCH_NOT_FOUND` otherwise (another tenant's batch reads as missing), after the path's own
/// `400` and the token's `401`.
pub(crate) struct CallerBatch(crate::store::BatchRecord);

impl axum::extract::FromRequestParts<HttpState> for CallerBatch {
    type Rejection = Response;

    async fn from_request_parts(
        parts: &mut axum::http::request::Parts,
        state: &HttpState,
    ) -> Result<Self, Response> {
        let ApiPath(batch_id) = ApiPath::<String>::from_request_parts(parts, state).await?;
        let Tenant(tenant) = Tenant::from_request_parts(parts, state).await?;
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
        match state.door.batch(&tenant, &batch_id).await {
            Ok(Some(b)) => Ok(Self(b)),
            Ok(None) => Err(missing()),
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

/// `200` with the batch's progress.
async fn progress(state: &HttpState, batch: &crate::store::BatchRecord) -> Response {
    match state.door.batch_progress(batch).await {
        Ok(p) => answer(StatusCode::OK, InvokeResult::success(p)),
        Err(e) => unavailable(e),
    }
}

/// A batch's results: NDJSON, one line per submitted line (accepted lines in order, then
/// rejected ones); `result` is present once the turn settled.
#[utoipa::path(get, path = "/v1/batches/{batchId}/results", tag = "batches",
    params(("batchId" = String, Path, description = "The batch")),
    responses(
        (status = 400, description = "A path parameter cannot be read (INVALID_PARAMETER)", body = Failure),
        (status = 200, description = "One BatchResultLine per line", content_type = "application/x-ndjson", body = BatchResultLine),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 404, description = "No such batch (or another tenant's)", body = Failure),
    ))]
pub(crate) async fn get_batch_results(
    State(state): State<HttpState>,
    CallerBatch(batch): CallerBatch,
) -> Response {
    use futures_util::StreamExt as _;
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
