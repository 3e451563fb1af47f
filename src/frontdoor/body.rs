//! Request bodies: read whole within a route's size limit, as the route's media type,
//! uncompressed, and never stalled — each piece within the read timeout of the one before
//! (`APTIX_HTTP_READ_TIMEOUT_SECS`), or the request is answered `408 REQUEST_TIMEOUT` and
//! its connection closed.
//!
//! Owns: reading a body and refusing one that cannot be read. Must not: parse what it holds.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::Request;
use axum::http::{HeaderMap, StatusCode};
use axum::response::Response;

use super::extract::{HttpState, failure};
use crate::contract::ErrorCode;
use crate::metrics::Metrics;

/// How a route reads its body: within which limit, as which media type.
pub(crate) trait BodyLimit {
    /// What the body must be sent as.
    const MEDIA: Media;
    /// The limit, in bytes.
    fn bytes(state: &HttpState) -> usize;
}

/// A single request (JSON): `APTIX_MAX_BODY_BYTES`.
pub(crate) struct RequestSized;

impl BodyLimit for RequestSized {
    const MEDIA: Media = Media::Json;
    fn bytes(state: &HttpState) -> usize {
        state.limits.max_body_bytes
    }
}

/// A batch (NDJSON): `APTIX_MAX_BATCH_BYTES`.
pub(crate) struct BatchSized;

impl BodyLimit for BatchSized {
    const MEDIA: Media = Media::Ndjson;
    fn bytes(state: &HttpState) -> usize {
        state.batch_limits.max_bytes
    }
}

/// An index upload (one JSON document): `APTIX_MAX_BATCH_BYTES`.
pub(crate) struct IndexSized;

impl BodyLimit for IndexSized {
    const MEDIA: Media = Media::Json;
    fn bytes(state: &HttpState) -> usize {
        state.batch_limits.max_bytes
    }
}

/// The request body, read whole within the route's limit `L`; a longer one is answered 413
/// `PAYLOAD_TOO_LARGE` without being read further.
pub(crate) struct LimitedBody<L>(pub(crate) Bytes, pub(crate) std::marker::PhantomData<L>);

impl<L: BodyLimit> axum::extract::FromRequest<HttpState> for LimitedBody<L> {
    type Rejection = Response;

    async fn from_request(request: Request, state: &HttpState) -> Result<Self, Response> {
        if let Some(refused) = L::MEDIA.refusal(request.headers()) {
            return Err(refused);
        }
        read_body(request, L::bytes(state), state.read_timeout, &state.metrics)
            .await
            .map(|body| Self(body, std::marker::PhantomData))
    }
}

/// Reads a body of at most `limit` bytes; a longer one is a `413` with `PAYLOAD_TOO_LARGE`, and
/// a compressed one a `415` with `UNSUPPORTED_CONTENT_ENCODING` (read as it is, it would only
/// be reported as malformed).
async fn read_body(
    request: Request,
    limit: usize,
    idle: Duration,
    metrics: &Metrics,
) -> Result<Bytes, Response> {
    use futures_util::StreamExt as _;
    if let Some(coding) = content_coding(request.headers()) {
        return Err(failure(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            ErrorCode::UnsupportedContentEncoding,
            format!(
                "the body is sent with Content-Encoding: {coding}; this API reads uncompressed bodies only (send it without Content-Encoding)"
            ),
        ));
    }
    let too_large = || {
        failure(
            StatusCode::PAYLOAD_TOO_LARGE,
            ErrorCode::PayloadTooLarge,
            format!("$: the request body is larger than the limit of {limit} bytes"),
        )
    };
    // A declared length over the limit is refused before a byte of the body is read.
    let declared = request
        .headers()
        .get(axum::http::header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<usize>().ok());
    if declared.is_some_and(|n| n > limit) {
        return Err(too_large());
    }
    // A body that comes in one piece (most) is kept as it came, without a copy.
    let mut body = Pieces::default();
    let mut pieces = request.into_body().into_data_stream();
    loop {
        // Each piece must come within `idle` of the one before: a body may be large and slow,
        // never stalled (a connection held open by a body that stops short).
        let piece = match tokio::time::timeout(idle, pieces.next()).await {
            Err(_elapsed) => {
                metrics.http_timed_out("body");
                tracing::info!(
                    received = body.len(),
                    idle_secs = idle.as_secs_f64(),
                    "a request body stopped arriving; answering 408 and closing the connection"
                );
                let mut refused = failure(
                    StatusCode::REQUEST_TIMEOUT,
                    ErrorCode::RequestTimeout,
                    format!(
                        "$: the request body stopped arriving: nothing came for {} s after {} bytes",
                        idle.as_secs_f64(),
                        body.len()
                    ),
                );
                refused.headers_mut().insert(
                    axum::http::header::CONNECTION,
                    axum::http::HeaderValue::from_static("close"),
                );
                return Err(refused);
            }
            Ok(None) => break,
            Ok(Some(Ok(piece))) => piece,
            Ok(Some(Err(e))) => {
                return Err(failure(
                    StatusCode::BAD_REQUEST,
                    ErrorCode::MalformedJson,
                    format!("$: the request body could not be read: {e}"),
                ));
            }
        };
        if body.len() + piece.len() > limit {
            return Err(too_large());
        }
        body.push(piece, declared.unwrap_or(0).min(limit));
    }
    Ok(body.into_bytes())
}

/// A body as it is read: its one piece, or its pieces copied together.
#[derive(Default)]
enum Pieces {
    #[default]
    None,
    One(Bytes),
    Many(Vec<u8>),
}

impl Pieces {
    fn len(&self) -> usize {
        match self {
            Self::None => 0,
            Self::One(b) => b.len(),
            Self::Many(v) => v.len(),
        }
    }

    fn push(&mut self, piece: Bytes, expected: usize) {
        *self = match std::mem::take(self) {
            Self::None => Self::One(piece),
            Self::One(first) => {
                let mut all = Vec::with_capacity(expected.max(first.len() + piece.len()));
                all.extend_from_slice(&first);
                all.extend_from_slice(&piece);
                Self::Many(all)
            }
            Self::Many(mut all) => {
                all.extend_from_slice(&piece);
                Self::Many(all)
            }
        }
    }

    fn into_bytes(self) -> Bytes {
        match self {
            Self::None => Bytes::new(),
            Self::One(b) => b,
            Self::Many(v) => Bytes::from(v),
        }
    }
}

/// The content coding a request body is sent with, other than `identity` (as the header
/// spells it; one that is not text is shown escaped).
fn content_coding(headers: &HeaderMap) -> Option<String> {
    let codings: Vec<String> = headers
        .get_all(axum::http::header::CONTENT_ENCODING)
        .iter()
        .flat_map(|v| match v.to_str() {
            Ok(text) => text.split(',').map(|c| c.trim().to_string()).collect(),
            Err(_) => vec![format!("{v:?}")],
        })
        .filter(|c| !c.is_empty() && !c.eq_ignore_ascii_case("identity"))
        .collect();
    (!codings.is_empty()).then(|| codings.join(", "))
}

/// The media type a route reads its body as. A request that names another one in its
/// `Content-Type` is answered `415 UNSUPPORTED_MEDIA_TYPE` before its body is read (a form or
/// a text body would otherwise only be reported as malformed JSON); one that names none is read
/// as the route's type, as clients that leave the header out expect.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Media {
    /// `application/json`, or a JSON-based `application/<name>+json`.
    Json,
    /// Newline-delimited JSON: `application/x-ndjson` (also spelt `application/ndjson`,
    /// `application/jsonl`, `application/x-jsonlines`).
    Ndjson,
}

impl Media {
    /// The type a client should send.
    fn name(self) -> &'static str {
        match self {
            Self::Json => "application/json",
            Self::Ndjson => "application/x-ndjson",
        }
    }

    /// Whether `essence` (a lowercase `type/subtype`) is this media type.
    fn is(self, essence: &str) -> bool {
        match self {
            Self::Json => {
                essence == "application/json"
                    || essence
                        .strip_prefix("application/")
                        .is_some_and(|sub| sub.len() > "+json".len() && sub.ends_with("+json"))
            }
            Self::Ndjson => matches!(
                essence,
                "application/x-ndjson"
                    | "application/ndjson"
                    | "application/jsonl"
                    | "application/x-jsonlines"
            ),
        }
    }

    /// The `415` for a request whose `Content-Type` is neither absent (or empty) nor this type
    /// with no charset other than UTF-8 (the only one the API reads); `None` when it may be
    /// read.
    pub(crate) fn refusal(self, headers: &HeaderMap) -> Option<Response> {
        let value = headers.get(axum::http::header::CONTENT_TYPE)?;
        let refuse = |sent: &str, why: &str| {
            Some(failure(
                StatusCode::UNSUPPORTED_MEDIA_TYPE,
                ErrorCode::UnsupportedMediaType,
                format!(
                    "the body is sent with Content-Type: {sent}; {why} (send it with Content-Type: {})",
                    self.name()
                ),
            ))
        };
        let Ok(text) = value.to_str() else {
            return refuse(&format!("{value:?}"), "the header is not text");
        };
        if text.trim().is_empty() {
            // An empty header names no type, as an absent one does.
            return None;
        }
        let mut parts = text.split(';');
        let essence = parts.next().unwrap_or_default().trim().to_ascii_lowercase();
        if !self.is(&essence) {
            return refuse(text, &format!("this route reads {}", self.name()));
        }
        let other_charset = parts
            .filter_map(|param| param.split_once('='))
            .filter(|(name, _)| name.trim().eq_ignore_ascii_case("charset"))
            .map(|(_, value)| value.trim().trim_matches('"'))
            .any(|charset| {
                !charset.eq_ignore_ascii_case("utf-8") && !charset.eq_ignore_ascii_case("utf8")
            });
        if other_charset {
            return refuse(text, "this API reads UTF-8 bodies only");
        }
        None
    }
}
