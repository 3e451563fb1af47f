//! The OpenAPI document (`GET /openapi.json`), generated from the handlers' annotations and
//! the types they answer with.
//!
//! `InvokeResult` and the request/response contract are serialized by hand (their invariants
//! live in the types, not in derive attributes), so their schemas are written here; the HTTP
//! tests validate real answers against the served document, which keeps the two from drifting.

use std::borrow::Cow;

use serde_json::json;
use utoipa::openapi::{RefOr, Schema};
use utoipa::{PartialSchema, ToSchema};

use crate::contexts::KnownContexts;
use crate::contract::ErrorMessage;
use crate::contract::request::{SERVER_OWNED, USER_TURN_ONLY};

/// The envelope of every JSON answer: `{successful, result?, errors, warnings, resultId}`. A
/// failed result has no `result` and at least one error.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // a schema, never built
pub struct InvokeResult<T: ToSchema> {
    /// Whether the call succeeded.
    successful: bool,
    /// The value, present only when successful.
    result: Option<T>,
    /// Every error (empty when successful).
    errors: Vec<ErrorMessage>,
    /// Non-fatal findings.
    warnings: Vec<ErrorMessage>,
    /// A fresh id per answer.
    result_id: String,
}

/// A turn's status as clients see it (the schema of [`crate::state::TurnStatusView`]).
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // a schema, never built
pub struct TurnStatusView {
    /// The session.
    session_id: crate::contract::SessionId,
    /// The turn.
    turn_id: crate::contract::TurnId,
    /// Lifecycle status.
    status: crate::state::TurnStatus,
    /// Runs so far.
    attempts: u32,
    /// Accepted (RFC 3339).
    submitted_at: String,
    /// Finished (RFC 3339).
    completed_at: Option<String>,
    /// The latest result, once there is one.
    result: Option<ExecuteResult>,
    /// The service tier the model server reports serving the turn's latest model call with
    /// (`flex`, `default`, …), when it reports one.
    service_tier: Option<String>,
}

/// `InvokeResult<AgentExecuteResponse>`: a turn's result (final answer, client tool
/// continuation, or failure).
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // a schema, never built
pub struct ExecuteResult {
    /// Whether the turn succeeded.
    successful: bool,
    /// The answer, present only when successful.
    result: Option<AgentExecuteResponse>,
    /// Every error (empty when successful).
    errors: Vec<ErrorMessage>,
    /// Non-fatal findings.
    warnings: Vec<ErrorMessage>,
    /// A fresh id per answer.
    result_id: String,
}

/// A failed `InvokeResult`: no `result`, at least one error.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // a schema, never built
pub struct Failure {
    /// Always false.
    successful: bool,
    /// Every error (at least one).
    errors: Vec<ErrorMessage>,
    /// Non-fatal findings.
    warnings: Vec<ErrorMessage>,
    /// A fresh id per answer.
    result_id: String,
}

/// `/healthz` and `/readyz`: `{"status": "alive" | "ready"}`, and on `/readyz` of a process
/// with MCP tool sources, each source's state.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // a schema, never built
pub struct Health {
    /// `alive` or `ready`.
    status: String,
    /// Each MCP tool source: connected and listed (`up`), its tools, why it is down.
    tool_sources: Option<Vec<ToolSourceState>>,
}

/// One MCP tool source's state.
#[derive(ToSchema)]
#[serde(rename_all = "camelCase")]
#[allow(dead_code)] // a schema, never built
pub struct ToolSourceState {
    /// Its name in the tools file.
    name: String,
    /// Connected and its tools listed.
    up: bool,
    /// The tools it offers.
    tools: u64,
    /// Why it is down.
    problem: Option<String>,
}

macro_rules! named_schema {
    ($(#[doc = $doc:literal])+ $name:ident, $build:expr) => {
        $(#[doc = $doc])+
        pub struct $name;

        impl PartialSchema for $name {
            fn schema() -> RefOr<Schema> {
                let value = $build;
                match serde_json::from_value::<Schema>(value) {
                    Ok(s) => RefOr::T(s),
                    // The schema is a literal above; a test parses every one of them.
                    Err(_) => RefOr::T(Schema::default()),
                }
            }
        }

        impl ToSchema for $name {
            fn name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }
        }
    };
}

fn id_schema() -> serde_json::Value {
    json!({"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"})
}

/// A string the parser treats as absent when `null` (every optional field).
fn nullable(schema: serde_json::Value) -> serde_json::Value {
    json!({"anyOf": [schema, {"type": "null"}]})
}

/// A field that may only be absent or `null` in this shape.
fn absent(why: &str) -> serde_json::Value {
    json!({"type": "null", "description": why})
}

/// A safe relative path: not empty, no NUL, no leading separator or drive letter, no `..`
/// segment (the rules of `RelativePath::parse`).
pub fn relative_path_schema() -> serde_json::Value {
    json!({
        "type": "string",
        "pattern": r"^(?![/\\])(?![A-Za-z]:)(?![\s\S]*(?:^|[/\\])\.\.(?:[/\\]|$))[^\x00]+$",
        "description": "Relative, '/'- or '\\'-separated, no '..' segment"
    })
}

/// Standard base64 with padding and canonical final bits (what the parser decodes), or empty.
const BASE64_OR_EMPTY: &str =
    r"^(?:[A-Za-z0-9+/]{4})*(?:[A-Za-z0-9+/][AQgw]==|[A-Za-z0-9+/]{2}[AEIMQUYcgkosw048]=)?$";

/// The request schema with the parser's rules: a user turn or a tool continuation (`oneOf`),
/// ids by pattern, non-empty inputs, `executionMs >= 0`, exactly one of `resultJson` /
/// `errorMessage`. `ids_required` is false for batch lines, which may leave the ids out.
fn execute_request_schema(ids_required: bool, contexts: &KnownContexts) -> serde_json::Value {
    let artifact = json!({
        "type": "object",
        "required": ["relativePath", "fileName", "contents", "origin"],
        "if": {"required": ["encoding"], "properties": {"encoding": {"const": "base64"}}},
        "then": {"properties": {"contents": {"type": "string", "pattern": BASE64_OR_EMPTY}}},
        "properties": {
            "relativePath": relative_path_schema(),
            "fileName": {"type": "string"},
            "contents": {"type": "string", "description": "Text, or base64 when encoding is base64; at most APTIX_MAX_ARTIFACT_BYTES bytes"},
            "origin": {"type": "string", "enum": ["ide", "user"]},
            "mimeType": nullable(json!({"type": "string"})),
            "language": nullable(json!({"type": "string"})),
            "encoding": nullable(json!({"type": "string", "enum": ["utf8", "base64"]}))
        }
    });
    let image = json!({
        "type": "object",
        "required": ["id", "mimeType", "dataBase64"],
        "properties": {
            "id": {"type": "string", "pattern": r"\S"},
            "mimeType": {"type": "string", "pattern": r"^image/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}$"},
            "dataBase64": {"type": "string", "minLength": 4, "pattern": BASE64_OR_EMPTY,
                "description": "Standard base64 with padding, not empty; decoded at most APTIX_MAX_IMAGE_BYTES bytes"}
        }
    });
    let condition = json!({
        "type": "object",
        "required": ["key", "operator", "values"],
        "properties": {
            "key": {"type": "string", "pattern": r"\S", "description": "path, language, repo, tags or docId (other keys: ignored with an UNKNOWN_RAG_KEY warning)"},
            "operator": {"type": "string", "enum": ["==", "!=", "contains", "does_not_contain"]},
            "values": {"type": "array", "minItems": 1, "items": {"type": "string"}}
        }
    });
    let tool_result = json!({
        "type": "object",
        "required": ["toolCallId", "executionMs"],
        "properties": {
            "toolCallId": id_schema(),
            "executionMs": {"type": "integer", "minimum": 0, "maximum": 9_007_199_254_740_991_u64},
            "resultJson": nullable(json!({"type": "string", "description": "A JSON text"})),
            "errorMessage": nullable(json!({"type": "string"}))
        },
        "oneOf": [
            {"required": ["resultJson"], "properties": {"resultJson": {"type": "string"}}},
            {"required": ["errorMessage"], "properties": {"errorMessage": {"type": "string"}}}
        ]
    });
    // The ids this deployment has configured: anything else is UNKNOWN_CONTEXT.
    let context_id = |ids: Vec<&str>| {
        nullable(
            json!({"type": "string", "enum": ids, "description": "A configured context id (absent: default)"}),
        )
    };
    let mut user = serde_json::Map::new();
    user.insert(
        "instruction".into(),
        nullable(
            json!({"type": "string", "description": "At most APTIX_MAX_INSTRUCTION_BYTES bytes"}),
        ),
    );
    user.insert(
        "inputArtifacts".into(),
        nullable(json!({"type": "array", "items": artifact})),
    );
    user.insert(
        "clipboardImages".into(),
        nullable(json!({"type": "array", "items": image})),
    );
    user.insert(
        "ragScope".into(),
        nullable(
            json!({"type": "object", "required": ["conditions"], "properties": {
                "conditions": {"type": "array", "items": condition}
            }}),
        ),
    );
    for field in ["solutionContextText", "workspaceId", "repo", "language"] {
        user.insert(field.into(), nullable(json!({"type": "string"})));
    }
    user.insert("streaming".into(), nullable(json!({"type": "boolean"})));
    user.insert(
        "webhook".into(),
        nullable(json!({"type": "object", "required": ["url"], "additionalProperties": false,
            "properties": {"url": {"type": "string", "format": "uri",
                "maxLength": crate::contract::request::MAX_WEBHOOK_URL_BYTES}},
            "description": "Where the turn's settled statuses are POSTed too, signed per Standard Webhooks with the tenant's secret (turn.completed, turn.failed, turn.awaiting_client_tools, turn.cancelled). https to a public address unless the server allows otherwise: INVALID_WEBHOOK for a URL that cannot be one, WEBHOOK_REFUSED for one the policy refuses, WEBHOOK_SECRET_MISSING when the tenant has no signing secret. Extends AGN-034."})),
    );
    user.insert(
        "onBusy".into(),
        nullable(json!({"type": "string", "enum": crate::contract::OnBusy::VALUES,
            "description": "When the session has a turn queued or running: enqueue (default) runs this one after it, reject answers 409 SESSION_BUSY, interrupt cancels it and runs this one next. Extends AGN-034."})),
    );
    user.insert(
        "agentContextId".into(),
        context_id(contexts.agent_ids().collect()),
    );
    user.insert(
        "conversationContextId".into(),
        context_id(contexts.conversation_ids().collect()),
    );
    user.insert("toolResults".into(), absent("Only in a tool continuation"));

    let mut continuation = serde_json::Map::new();
    // The parser's own lists, so schema and parser cannot drift apart.
    for field in USER_TURN_ONLY {
        continuation.insert(
            (*field).into(),
            absent("Not allowed in a tool continuation"),
        );
    }
    continuation.insert(
        "toolResults".into(),
        json!({"type": "array", "minItems": 1, "items": tool_result}),
    );

    let mut common = serde_json::Map::new();
    common.insert("sessionId".into(), id_schema());
    common.insert("turnId".into(), id_schema());
    for field in SERVER_OWNED {
        common.insert(
            (*field).into(),
            absent("Server-owned: rejected with FORBIDDEN_FIELD"),
        );
    }
    let required = if ids_required {
        json!(["sessionId", "turnId"])
    } else {
        json!([])
    };
    let nonblank_instruction = json!({"required": ["instruction"], "properties": {"instruction": {"type": "string", "pattern": r"\S"}}});
    json!({
        "type": "object",
        "description": "A user turn (at least one of a non-blank instruction, inputArtifacts or clipboardImages) or a tool continuation (toolResults, and none of the user-turn fields). Field names may also be PascalCase (not listed here). Server-owned fields (mode, tools, continuation ids) are rejected with FORBIDDEN_FIELD; unknown fields are ignored with an UNKNOWN_FIELD warning; null is the same as absent. Rules the schema cannot state: resultJson must hold valid JSON, base64 must decode, and the APTIX_MAX_* size limits.",
        "required": required,
        "properties": common,
        "oneOf": [
            {
                "title": "UserTurn",
                "properties": user,
                "anyOf": [
                    nonblank_instruction,
                    {"required": ["inputArtifacts"], "properties": {"inputArtifacts": {"type": "array", "minItems": 1}}},
                    {"required": ["clipboardImages"], "properties": {"clipboardImages": {"type": "array", "minItems": 1}}}
                ]
            },
            {
                "title": "ToolContinuation",
                "required": ["toolResults"],
                "properties": continuation
            }
        ],
        "examples": [
            {"sessionId": "s-1", "turnId": "t-1", "instruction": "Summarise DDR-101."},
            {"sessionId": "s-1", "turnId": "t-2", "instruction": "Review this file", "inputArtifacts": [{"relativePath": "docs/DDR-101.md", "fileName": "DDR-101.md", "contents": "# DDR-101", "origin": "ide"}], "ragScope": {"conditions": [{"key": "repo", "operator": "==", "values": ["platform"]}]}, "streaming": false},
            {"sessionId": "s-1", "turnId": "t-2", "toolResults": [{"toolCallId": "call_1", "executionMs": 12, "resultJson": "{\"contents\":\"# A\"}"}, {"toolCallId": "call_2", "executionMs": 0, "errorMessage": "file not found"}]}
        ]
    })
}

named_schema!(
    /// `AgentExecuteRequest` (DESIGN.md §2): a user turn, or a tool continuation (`toolResults`
    /// set). A placeholder in the typed document; [`raw_schemas`] puts the real one in.
    AgentExecuteRequest,
    json!({"type": "object"})
);

named_schema!(
    /// The request of a batch line: an `AgentExecuteRequest` whose ids may be left out. A
    /// placeholder in the typed document; [`raw_schemas`] puts the real one in.
    BatchRequest,
    json!({"type": "object"})
);

/// The request schemas with the parser's rules, as JSON: the typed OpenAPI model cannot hold
/// `oneOf`/`anyOf` beside `properties`, so the served document gets these in place of the
/// placeholders.
pub fn raw_schemas(contexts: &KnownContexts) -> [(&'static str, serde_json::Value); 4] {
    [
        (
            "AgentExecuteRequest",
            execute_request_schema(true, contexts),
        ),
        ("BatchRequest", execute_request_schema(false, contexts)),
        ("IndexRequest", index_request_schema()),
        ("IndexFile", index_file_schema()),
    ]
}

/// `POST /v1/index` (the derived schema cannot say that `repo` is an id or that paths are
/// relative).
fn index_request_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "description": "Files to (re)index for the caller's tenant.",
        "required": ["repo"],
        "additionalProperties": false,
        "properties": {
            "repo": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$", "description": "The repository the files belong to (chunk metadata `repo`)."},
            "tags": {"type": "array", "items": {"type": "string"}, "description": "Tags added to every chunk of these files."},
            "files": {"type": "array", "items": {"$ref": "#/components/schemas/IndexFile"}, "description": "Files to index; unchanged ones are skipped."},
            "keep": {"anyOf": [{"type": "array", "items": relative_path_schema()}, {"type": "null"}], "description": "The repository's complete file listing: indexed files not in it are removed."}
        },
        "examples": [{"repo": "platform", "tags": ["ddr"], "files": [{"path": "docs/DDR-101.md", "contents": "# DDR-101"}], "keep": ["docs/DDR-101.md"]}]
    })
}

fn index_file_schema() -> serde_json::Value {
    json!({
        "type": "object",
        "description": "A file to index.",
        "required": ["path", "contents"],
        "additionalProperties": false,
        "properties": {
            "path": relative_path_schema(),
            "contents": {"type": "string", "description": "The file's text."}
        }
    })
}

named_schema!(
    /// `AgentExecuteResponse` (DESIGN.md §2): `kind` is `final` or `client_tool_continuation`.
    AgentExecuteResponse,
    json!({
        "type": "object",
        "required": ["kind", "sessionId", "turnId", "modeDisplayName"],
        "properties": {
            "kind": {"type": "string", "enum": ["final", "client_tool_continuation"]},
            "sessionId": id_schema(),
            "turnId": id_schema(),
            "modeDisplayName": {"type": "string"},
            "primaryOutputText": {"type": "string"},
            "toolResults": {"type": "array", "items": {"type": "object"}},
            "files": {"type": "array", "items": {"type": "object"}},
            "userWarnings": {"type": "array", "items": {"type": "string"}},
            "usage": {"type": "object", "properties": {
                "promptTokens": {"type": "integer"},
                "completionTokens": {"type": "integer"},
                "totalTokens": {"type": "integer"},
                "cachedTokens": {"type": "integer", "description": "Of promptTokens, those read from the model server's prompt cache (absent when none; extends AGN-034)"},
                "reasoningTokens": {"type": "integer", "description": "Of completionTokens, those a reasoning model spent reasoning (absent when none; extends AGN-034)"},
                "estimatedCostUsd": {"type": "number", "minimum": 0, "description": "The estimated cost in US dollars at the agent context's prices (absent when it has none; extends AGN-034)"}
            }},
            "toolContinuationMessage": {"type": "string"},
            "toolCalls": {"type": "array", "items": {
                "type": "object",
                "required": ["toolCallId", "name", "argumentsJson"],
                "properties": {
                    "toolCallId": {"type": "string"},
                    "name": {"type": "string"},
                    "argumentsJson": {"type": "string"}
                }
            }}
        }
    })
);

named_schema!(
    /// One line of a batch submission.
    BatchLine,
    json!({
        "type": "object",
        "required": ["customId", "request"],
        "properties": {
            "customId": {"type": "string", "minLength": 1, "maxLength": 256},
            "request": {"$ref": "#/components/schemas/BatchRequest"}
        },
        "description": "`request` may leave out sessionId and turnId; fresh ones are assigned."
    })
);

named_schema!(
    /// A line of a streaming synchronous answer: text and progress lines as they happen, the
    /// final line last.
    StreamLine,
    json!({
        "oneOf": [
            {"type": "object", "required": ["kind", "index", "text"], "additionalProperties": false,
             "description": "Answer text as the model writes it (never function-call arguments). After a progress line saying the model call is made again, the text streamed since the previous progress line is replaced by what follows.",
             "properties": {
                "kind": {"type": "string", "enum": ["delta"]},
                "index": {"type": "integer", "minimum": 0},
                "text": {"type": "string"}}},
            {"type": "object", "required": ["kind", "index", "message"], "additionalProperties": false,
             "description": "Something happening in the turn: a server tool runs, a broken model call is made again.",
             "properties": {
                "kind": {"type": "string", "enum": ["progress"]},
                "index": {"type": "integer", "minimum": 0},
                "message": {"type": "string"}}},
            {"$ref": "#/components/schemas/StreamFinalLine"}
        ]
    })
);

/// The data of a live SSE event of a session: the turn, the event's index, and its one text
/// field (`text` of a delta, `message` of a progress note).
fn live_event_schema(field: &str) -> serde_json::Value {
    json!({
        "type": "object", "required": ["sessionId", "turnId", "index", field], "additionalProperties": false,
        "properties": {
            "sessionId": {"type": "string"}, "turnId": {"type": "string"},
            "index": {"type": "integer", "minimum": 0}, field: {"type": "string"}}
    })
}

named_schema!(
    /// The data of an SSE `delta` event of `GET /v1/sessions/{sessionId}/events`: on the
    /// first text of each model call, `call` names the call.
    SessionDeltaEvent,
    {
        let mut schema = live_event_schema("text");
        schema["properties"]["call"] = json!({
            "type": "object", "required": ["model", "agentContext", "attempt"], "additionalProperties": false,
            "description": "The model call this text is the first of: what a watcher shows as the call in flight until the turn's record lists it.",
            "properties": {
                "model": {"type": "string"}, "agentContext": {"type": "string"},
                "attempt": {"type": "integer", "minimum": 1},
                "startMs": {"type": "integer", "minimum": 0, "description": "When the call started, in milliseconds after the turn was accepted."}}
        });
        schema
    }
);

named_schema!(
    /// The data of an SSE `progress` event of `GET /v1/sessions/{sessionId}/events`.
    SessionProgressEvent,
    live_event_schema("message")
);

named_schema!(
    /// The last line of a streaming synchronous answer.
    StreamFinalLine,
    json!({
        "type": "object",
        "required": ["kind", "index", "final"],
        "properties": {
            "kind": {"type": "string", "enum": ["final"]},
            "index": {"type": "integer", "enum": [99999]},
            "final": {"$ref": "#/components/schemas/ExecuteResult"}
        }
    })
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handwritten_schemas_parse() {
        for s in [
            AgentExecuteResponse::schema(),
            BatchLine::schema(),
            StreamFinalLine::schema(),
            StreamLine::schema(),
            SessionDeltaEvent::schema(),
            SessionProgressEvent::schema(),
        ] {
            let RefOr::T(schema) = s else {
                panic!("expected an inline schema")
            };
            assert_ne!(
                serde_json::to_value(&schema).unwrap(),
                serde_json::to_value(Schema::default()).unwrap()
            );
        }
    }

    #[test]
    fn the_served_document_carries_the_raw_request_schemas() {
        let doc = crate::frontdoor::http::openapi();
        for (name, schema) in raw_schemas(&KnownContexts::default()) {
            assert_eq!(doc["components"]["schemas"][name], schema, "{name}");
        }
        assert!(doc["components"]["schemas"]["AgentExecuteRequest"]["oneOf"].is_array());
    }
}
