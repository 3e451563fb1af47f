//! The stable error codes every client sees in `InvokeResult.errors[].errorCode`.
//!
//! This is the one table of codes in the product; docs/internals.md mirrors it. A code, once
//! published, keeps its meaning: clients branch on codes, never on message text.

use serde::{Deserialize, Serialize};

macro_rules! error_codes {
    ($( $(#[doc = $doc:literal])+ $variant:ident = $code:literal, )+) => {
        /// A stable, documented error (or warning) code.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
        pub enum ErrorCode {
            $( $(#[doc = $doc])+ #[serde(rename = $code)] $variant, )+
        }

        impl ErrorCode {
            /// Every code, in table order (used to render the documentation table).
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant,)+];

            /// The wire spelling of the code.
            pub fn as_str(self) -> &'static str {
                match self { $(ErrorCode::$variant => $code,)+ }
            }

            /// One-line meaning of the code, as documented.
            pub fn meaning(self) -> &'static str {
                match self { $(ErrorCode::$variant => concat!($($doc),+).trim_ascii(),)+ }
            }
        }
    };
}

error_codes! {
    /// The body is not valid JSON, or not a JSON object.
    MalformedJson = "MALFORMED_JSON",
    /// The body, the instruction, an artifact or an image is larger than the configured limit.
    PayloadTooLarge = "PAYLOAD_TOO_LARGE",
    /// The request body stopped arriving: nothing came for the read timeout (`APTIX_HTTP_READ_TIMEOUT_SECS`, 15 s by default); the connection is closed.
    RequestTimeout = "REQUEST_TIMEOUT",
    /// A required field is absent (or null).
    MissingField = "MISSING_FIELD",
    /// A field has the wrong JSON type (for example a number where a string is expected).
    InvalidFieldType = "INVALID_FIELD_TYPE",
    /// The same field was sent twice, once camelCase and once PascalCase.
    DuplicateField = "DUPLICATE_FIELD",
    /// A field that is server-owned (mode, continuation ids, tools) or not allowed in this scenario.
    ForbiddenField = "FORBIDDEN_FIELD",
    /// An id is not 1-128 characters of `[A-Za-z0-9._:-]`.
    InvalidId = "INVALID_ID",
    /// A user turn carries no instruction, no input artifact and no clipboard image.
    EmptyTurn = "EMPTY_TURN",
    /// A tool result has a negative or fractional `executionMs`, or not exactly one of `resultJson` / `errorMessage`.
    InvalidToolResult = "INVALID_TOOL_RESULT",
    /// A tool result's `resultJson` is not itself valid JSON.
    InvalidResultJson = "INVALID_RESULT_JSON",
    /// An input artifact has a bad `origin`, `encoding` or contents that do not decode.
    InvalidArtifact = "INVALID_ARTIFACT",
    /// An artifact's `relativePath` is absolute, rooted, has a drive letter, a `..` segment or a NUL.
    InvalidPath = "INVALID_PATH",
    /// A clipboard image has an empty id, a non-`image/*` MIME type or data that is not base64.
    InvalidImage = "INVALID_IMAGE",
    /// A RAG scope condition has an empty key, no values or an unknown operator.
    InvalidRagCondition = "INVALID_RAG_CONDITION",
    /// Warning: a `ragScope` condition names a key chunks do not carry (path, language, repo, tags, docId); it was ignored.
    UnknownRagKey = "UNKNOWN_RAG_KEY",
    /// Warning: a field the contract does not know was ignored.
    UnknownField = "UNKNOWN_FIELD",
    /// The submitted tool results do not match the tool calls the turn waits for (count, ids, order).
    ToolResultsMismatch = "TOOL_RESULTS_MISMATCH",
    /// An `agentContextId` or `conversationContextId` names no configured context.
    UnknownContext = "UNKNOWN_CONTEXT",
    /// A turn names another context than the one its session latched on its first turn.
    ContextMismatch = "CONTEXT_MISMATCH",
    /// No turn with this id exists in this session.
    TurnNotFound = "TURN_NOT_FOUND",
    /// A turn with this id already exists with a different payload.
    TurnConflict = "TURN_CONFLICT",
    /// A tool continuation was sent for a turn that is not waiting for client tools.
    TurnNotAwaitingTools = "TURN_NOT_AWAITING_TOOLS",
    /// `onBusy` is not one of `enqueue`, `reject`, `interrupt`.
    InvalidOnBusy = "INVALID_ON_BUSY",
    /// The turn was cancelled before it finished.
    TurnCancelled = "TURN_CANCELLED",
    /// A cancel request for a turn that has finished already (the message names its status).
    TurnAlreadyFinished = "TURN_ALREADY_FINISHED",
    /// Another turn of the same session is running: the turn is retried later, or (with
    /// `onBusy: reject`) refused.
    SessionBusy = "SESSION_BUSY",
    /// The tenant's daily model-token quota is spent; the message names when it resets.
    QuotaExceeded = "QUOTA_EXCEEDED",
    /// The model server could not be reached or kept failing after retries (retryable).
    LlmUnavailable = "LLM_UNAVAILABLE",
    /// The model server rejected the request (a terminal 4xx); its message is kept.
    LlmRejected = "LLM_REJECTED",
    /// The model answered with something the pipeline cannot use (failed status, malformed body).
    LlmBadResponse = "LLM_BAD_RESPONSE",
    /// The turn called the model more times than the configured iteration limit.
    IterationLimit = "ITERATION_LIMIT",
    /// Warning: the model's answer was cut short (for example by `max_output_tokens`).
    ResponseIncomplete = "RESPONSE_INCOMPLETE",
    /// Warning: the model returned an output item type the pipeline does not know; it was ignored.
    UnknownOutputItem = "UNKNOWN_OUTPUT_ITEM",
    /// A server tool could not run (for example its store is unreachable); retryable.
    ToolUnavailable = "TOOL_UNAVAILABLE",
    /// An MCP tool call that may not be repeated was sent by an earlier run that died before its answer was recorded; the tool source asks to fail the turn rather than tell the model.
    ToolOutcomeUnknown = "TOOL_OUTCOME_UNKNOWN",
    /// The request has no valid `Authorization: Bearer <token>`.
    Unauthorized = "UNAUTHORIZED",
    /// The token is valid but the route is for admin tokens only (`token=tenant:admin` in `APTIX_API_TOKENS`).
    Forbidden = "FORBIDDEN",
    /// No such session in the caller's tenant (another tenant's session of the same id is another session).
    SessionNotFound = "SESSION_NOT_FOUND",
    /// A batch line repeats a `customId` used by an earlier line of the same batch.
    DuplicateCustomId = "DUPLICATE_CUSTOM_ID",
    /// No such batch (or it belongs to another tenant, which looks the same).
    BatchNotFound = "BATCH_NOT_FOUND",
    /// A batch's retry sent a file whose lines are not the batch's where its failed lines were (missing, or another `customId`); nothing was sent again.
    BatchFileMismatch = "BATCH_FILE_MISMATCH",
    /// The batch's failed lines were sent again already, as the batch the message names; retry that one's failed lines.
    BatchAlreadyRetried = "BATCH_ALREADY_RETRIED",
    /// The batch has no failed or rejected lines to send again.
    NoLinesToRetry = "NO_LINES_TO_RETRY",
    /// Some of the batch's lines are still queued or running; its failed lines are sent again once every line has settled (a batch is retried once).
    BatchNotSettled = "BATCH_NOT_SETTLED",
    /// A query-string or path parameter cannot be read; the message names it.
    InvalidParameter = "INVALID_PARAMETER",
    /// No route has this path.
    RouteNotFound = "ROUTE_NOT_FOUND",
    /// The route exists but not with this HTTP method.
    MethodNotAllowed = "METHOD_NOT_ALLOWED",
    /// The body is compressed (`Content-Encoding: gzip`, `br`, …); the API reads uncompressed bodies only.
    UnsupportedContentEncoding = "UNSUPPORTED_CONTENT_ENCODING",
    /// The body's `Content-Type` is not what the route reads (`application/json`; NDJSON for a batch), or names a charset other than UTF-8. A body sent without `Content-Type` is read as the route's type.
    UnsupportedMediaType = "UNSUPPORTED_MEDIA_TYPE",
    /// `webhook` is not an object with a `url` that is an absolute http(s) URL of at most 2048 bytes, without credentials.
    InvalidWebhook = "INVALID_WEBHOOK",
    /// The webhook URL is refused: not https (unless the server allows http), or its host is, or resolves to, an address that is not public (unless the server's allow-list names it); the message says which.
    WebhookRefused = "WEBHOOK_REFUSED",
    /// A webhook was asked for, but the variable with the tenant's signing secret is not set (or not a `whsec_` secret) on the server.
    WebhookSecretMissing = "WEBHOOK_SECRET_MISSING",
    /// The queue or the store is unavailable; nothing was accepted. Retry later. A cancel answered so whose message says the turn *is cancelled* was stored but not told of (its status, webhooks, batch); cancel again to tell of it.
    ServiceUnavailable = "SERVICE_UNAVAILABLE",
    /// An unexpected internal failure; details are logged, not returned.
    Internal = "INTERNAL",
}

impl utoipa::PartialSchema for ErrorCode {
    fn schema() -> utoipa::openapi::RefOr<utoipa::openapi::schema::Schema> {
        use utoipa::openapi::schema::{ObjectBuilder, SchemaType, Type};
        ObjectBuilder::new()
            .schema_type(SchemaType::Type(Type::String))
            .enum_values(Some(ErrorCode::ALL.iter().map(|c| c.as_str())))
            .description(Some(
                "A stable error or warning code (see docs/internals.md).",
            ))
            .into()
    }
}

impl utoipa::ToSchema for ErrorCode {}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Renders the code table as Markdown (docs/internals.md's table is checked against this).
pub fn markdown_table() -> String {
    let mut out = String::from("| errorCode | meaning |\n|---|---|\n");
    for code in ErrorCode::ALL {
        out.push_str(&format!("| `{}` | {} |\n", code.as_str(), code.meaning()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_are_unique_screaming_snake_case() {
        let mut seen = std::collections::HashSet::new();
        for code in ErrorCode::ALL {
            let s = code.as_str();
            assert!(seen.insert(s), "duplicate code {s}");
            assert!(s.chars().all(|c| c.is_ascii_uppercase() || c == '_'), "{s}");
            assert!(!code.meaning().is_empty());
        }
    }

    #[test]
    fn serde_uses_wire_spelling() {
        let json = serde_json::to_string(&ErrorCode::ToolResultsMismatch).unwrap();
        assert_eq!(json, "\"TOOL_RESULTS_MISMATCH\"");
        let back: ErrorCode = serde_json::from_str("\"SESSION_BUSY\"").unwrap();
        assert_eq!(back, ErrorCode::SessionBusy);
    }
}

#[cfg(test)]
mod readme {
    #[test]
    fn readme_lists_exactly_these_codes() {
        let readme = include_str!("../../docs/internals.md");
        assert!(
            readme.contains(&super::markdown_table()),
            "docs/internals.md's error code table is out of date: paste `aptix error-codes` into it"
        );
    }
}
