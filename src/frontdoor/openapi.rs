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

use crate::contract::ErrorMessage;

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

/// `/healthz` and `/readyz`: `{"status": "alive" | "ready"}`.
#[derive(ToSchema)]
#[allow(dead_code)] // a schema, never built
pub struct Health {
    /// `alive` or `ready`.
    status: String,
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

named_schema!(
    /// `AgentExecuteRequest` (DESIGN.md §2): a user turn, or a tool continuation (`toolResults`
    /// set). camelCase or PascalCase names; server-owned fields are rejected.
    AgentExecuteRequest,
    json!({
        "type": "object",
        "description": "A user turn (instruction and/or inputArtifacts/clipboardImages) or a tool continuation (toolResults). Field names may also be PascalCase. Server-owned fields (mode, tools, continuation ids) are rejected with FORBIDDEN_FIELD; unknown fields are ignored with an UNKNOWN_FIELD warning.",
        "required": ["sessionId", "turnId"],
        "properties": {
            "sessionId": id_schema(),
            "turnId": id_schema(),
            "instruction": {"type": "string"},
            "inputArtifacts": {"type": "array", "items": {
                "type": "object",
                "required": ["relativePath", "fileName", "contents", "origin"],
                "properties": {
                    "relativePath": {"type": "string", "description": "Relative, no .. segments"},
                    "fileName": {"type": "string"},
                    "contents": {"type": "string"},
                    "origin": {"type": "string", "enum": ["ide", "user"]},
                    "mimeType": {"type": "string"},
                    "language": {"type": "string"},
                    "encoding": {"type": "string", "enum": ["utf8", "base64"]}
                }
            }},
            "clipboardImages": {"type": "array", "items": {
                "type": "object",
                "required": ["id", "mimeType", "dataBase64"],
                "properties": {
                    "id": {"type": "string"},
                    "mimeType": {"type": "string"},
                    "dataBase64": {"type": "string"}
                }
            }},
            "ragScope": {"type": "object", "properties": {
                "conditions": {"type": "array", "items": {
                    "type": "object",
                    "required": ["key", "operator", "values"],
                    "properties": {
                        "key": {"type": "string"},
                        "operator": {"type": "string", "enum": ["==", "!=", "contains", "does_not_contain"]},
                        "values": {"type": "array", "items": {"type": "string"}}
                    }
                }}
            }},
            "solutionContextText": {"type": "string"},
            "workspaceId": {"type": "string"},
            "repo": {"type": "string"},
            "language": {"type": "string"},
            "streaming": {"type": "boolean"},
            "agentContextId": {"type": "string"},
            "conversationContextId": {"type": "string"},
            "toolResults": {"type": "array", "items": {
                "type": "object",
                "required": ["toolCallId", "executionMs"],
                "properties": {
                    "toolCallId": {"type": "string"},
                    "executionMs": {"type": "integer", "minimum": 0},
                    "resultJson": {"type": "string"},
                    "errorMessage": {"type": "string"}
                }
            }}
        }
    })
);

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
                "totalTokens": {"type": "integer"}
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
            "request": {"$ref": "#/components/schemas/AgentExecuteRequest"}
        },
        "description": "`request` may leave out sessionId and turnId; fresh ones are assigned."
    })
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
            AgentExecuteRequest::schema(),
            AgentExecuteResponse::schema(),
            BatchLine::schema(),
            StreamFinalLine::schema(),
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
}
