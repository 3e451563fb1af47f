//! `POST /v1/index`: files to (re)index for the caller's retrieval, checked before anything is
//! written.

use axum::extract::State;
use axum::http::StatusCode;
use axum::response::Response;
use serde::Deserialize;

use crate::contract::{ErrorCode, ErrorMessage, InvokeResult};
use crate::frontdoor::extract::{
    HttpState, IndexSized, LimitedBody, Tenant, answer, failure, unavailable,
};
use crate::frontdoor::openapi::{self as api_doc, Failure};
use crate::rag::IndexReport;

/// A file to index.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexFile {
    /// Path relative to the repository root (`/`-separated, no `..`).
    pub path: String,
    /// The file's text.
    pub contents: String,
}

/// `POST /v1/index`: files to (re)index for the caller's tenant.
#[derive(Debug, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IndexRequest {
    /// The repository the files belong to (chunk metadata `repo`).
    pub repo: String,
    /// Tags added to every chunk of these files.
    #[serde(default)]
    pub tags: Vec<String>,
    /// Files to index; unchanged ones are skipped.
    #[serde(default)]
    pub files: Vec<IndexFile>,
    /// The repository's complete file listing: indexed files not in it are removed.
    #[serde(default)]
    pub keep: Option<Vec<String>>,
}

impl IndexRequest {
    /// Reads and checks a body: JSON of this shape, `repo` an id, every path relative. The
    /// errors are what a 400 answer lists.
    pub fn parse(body: &[u8]) -> Result<Self, Vec<ErrorMessage>> {
        let req: Self =
            serde_json::from_slice(crate::contract::without_bom(body)).map_err(|e| {
                vec![ErrorMessage::new(
                    ErrorCode::MalformedJson,
                    format!("$: not an index request ({e})"),
                )]
            })?;
        let mut errors = Vec::new();
        if let Err(e) = crate::contract::ids::check_id(&req.repo) {
            errors.push(ErrorMessage::new(
                ErrorCode::InvalidId,
                format!("repo: {e}"),
            ));
        }
        let listed = req.files.iter().map(|f| f.path.as_str());
        let kept = req.keep.iter().flatten().map(String::as_str);
        for (i, path) in listed.chain(kept).enumerate() {
            if let Err(why) = crate::contract::request::RelativePath::parse(path) {
                errors.push(ErrorMessage::new(
                    ErrorCode::InvalidPath,
                    format!("path #{}: {path:?} {why}", i + 1),
                ));
            }
        }
        if errors.is_empty() {
            Ok(req)
        } else {
            Err(errors)
        }
    }
}

/// Index files for retrieval: Markdown is chunked by heading, code by a bounded number of lines;
/// a changed file's chunks are replaced; with `keep`, files not listed are removed.
#[utoipa::path(post, path = "/v1/index", tag = "retrieval",
    request_body(content = IndexRequest, content_type = "application/json"),
    responses(
        (status = 200, description = "What was indexed, left alone, removed and skipped", body = api_doc::InvokeResult<IndexReport>),
        (status = 400, description = "Malformed body, bad repo name or path", body = Failure),
        (status = 401, description = "Missing or unknown bearer token", body = Failure),
        (status = 408, description = "The body stopped arriving for APTIX_HTTP_READ_TIMEOUT_SECS (REQUEST_TIMEOUT); the connection is closed", body = Failure),
        (status = 413, description = "Body over APTIX_MAX_BATCH_BYTES", body = Failure),
        (status = 415, description = "UNSUPPORTED_CONTENT_ENCODING: a compressed body (Content-Encoding other than identity); UNSUPPORTED_MEDIA_TYPE: a Content-Type other than application/json, or a charset other than UTF-8", body = Failure),
        (status = 503, description = "Index unavailable", body = Failure,
            headers(("Retry-After" = u64, description = "Seconds to wait before trying again"))),
    ))]
pub(crate) async fn post_index(
    State(state): State<HttpState>,
    Tenant(tenant): Tenant,
    LimitedBody(body, _): LimitedBody<IndexSized>,
) -> Response {
    let req = match IndexRequest::parse(&body) {
        Ok(r) => r,
        Err(errors) => match InvokeResult::<()>::failures(errors) {
            Some(failed) => return answer(StatusCode::BAD_REQUEST, failed),
            None => {
                return failure(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::MalformedJson,
                    "$: not an index request",
                );
            }
        },
    };
    let files: Vec<(String, String)> = req
        .files
        .into_iter()
        .map(|f| (f.path, f.contents))
        .collect();
    let index = state.index.as_ref();
    let result = crate::rag::index_files(
        index,
        &tenant,
        &req.repo,
        &files,
        &req.tags,
        false,
        state.chunk_options,
        |_, _| {},
    )
    .await;
    let mut report = match result {
        Ok(r) => r,
        Err(e) => return unavailable(e),
    };
    if let Some(keep) = req.keep {
        let keep: std::collections::HashSet<String> = keep.into_iter().collect();
        let known = match index.files(&tenant, &req.repo).await {
            Ok(k) => k,
            Err(e) => return unavailable(e),
        };
        for path in known.keys().filter(|p| !keep.contains(*p)) {
            if let Err(e) = index.remove_file(&tenant, &req.repo, path).await {
                return unavailable(e);
            }
            report.removed += 1;
        }
    }
    tracing::info!(%tenant, repo = %report.repo, indexed = report.indexed, unchanged = report.unchanged, removed = report.removed, chunks = report.chunks, "index updated");
    answer(StatusCode::OK, InvokeResult::success(report))
}
