//! The parser's frame: the envelope of a request (which scenario, the common fields, unknown
//! and server-owned fields), the collected report of violations, and field access that accepts
//! camelCase and PascalCase and treats `null` as absent.

use serde_json::{Map, Value};

use super::fields::{Fields, Report, parse_list};
use super::items::{parse_artifact, parse_image, parse_rag_scope, parse_tool_results};
use super::{
    AgentExecuteRequest, ParsedRequest, RequestLimits, RequestRejected, SERVER_OWNED,
    ToolContinuation, USER_TURN_ONLY, UserTurn,
};
use crate::contract::codes::ErrorCode;
use crate::contract::ids::{SessionId, TurnId};
use crate::contract::invoke::ErrorMessage;

/// Parses a request body (bytes as received, a leading byte order mark skipped) against the
/// limits.
pub fn parse_request(
    body: &[u8],
    limits: &RequestLimits,
) -> Result<ParsedRequest, RequestRejected> {
    if body.len() > limits.max_body_bytes {
        return Err(RequestRejected {
            errors: vec![ErrorMessage::new(
                ErrorCode::PayloadTooLarge,
                format!(
                    "$: the request body is {} bytes; the limit is {} bytes",
                    body.len(),
                    limits.max_body_bytes
                ),
            )],
            warnings: Vec::new(),
        });
    }
    let value: Value = match serde_json::from_slice(crate::contract::without_bom(body)) {
        Ok(v) => v,
        Err(e) => {
            return Err(RequestRejected {
                errors: vec![ErrorMessage::new(
                    ErrorCode::MalformedJson,
                    format!("$: the body is not valid JSON ({e})"),
                )],
                warnings: Vec::new(),
            });
        }
    };
    parse_request_value(&value, limits)
}

/// Parses an already-decoded JSON value (the body-size limit is not applied here).
pub fn parse_request_value(
    value: &Value,
    limits: &RequestLimits,
) -> Result<ParsedRequest, RequestRejected> {
    let mut report = Report::default();
    let parsed = match value.as_object() {
        Some(map) => parse_envelope(map, limits, &mut report),
        None => {
            report.error(
                ErrorCode::MalformedJson,
                "$",
                "the body must be a JSON object",
            );
            None
        }
    };
    match parsed {
        Some(request) if report.errors.is_empty() => Ok(ParsedRequest {
            request,
            warnings: report.warnings,
        }),
        _ => {
            if report.errors.is_empty() {
                report.error(ErrorCode::Internal, "$", "the request could not be parsed");
            }
            Err(RequestRejected {
                errors: report.errors,
                warnings: report.warnings,
            })
        }
    }
}

pub(super) fn parse_envelope(
    map: &Map<String, Value>,
    limits: &RequestLimits,
    report: &mut Report,
) -> Option<AgentExecuteRequest> {
    let mut known: Vec<&'static str> = vec!["sessionId", "turnId", "toolResults"];
    known.extend_from_slice(USER_TURN_ONLY);
    let fields = Fields::collect(map, "", &known, SERVER_OWNED, report);

    let session_id = fields.id("sessionId", |s| SessionId::parse(s), report);
    let turn_id = fields.id("turnId", |s| TurnId::parse(s), report);

    // The scenario is decided by field presence (AGN-034 §3): tool results make a continuation.
    if fields.has("toolResults") {
        for name in USER_TURN_ONLY {
            if fields.has(name) {
                report.error(
                    ErrorCode::ForbiddenField,
                    name,
                    "is not allowed in a tool continuation (it carries only sessionId, turnId and toolResults)",
                );
            }
        }
        let tool_results = parse_tool_results(&fields, report);
        return Some(AgentExecuteRequest::ToolContinuation(ToolContinuation {
            session_id: session_id?,
            turn_id: turn_id?,
            tool_results: tool_results?,
        }));
    }

    let instruction = fields.string("instruction", report).and_then(|s| {
        if s.len() > limits.max_instruction_bytes {
            report.error(
                ErrorCode::PayloadTooLarge,
                "instruction",
                format!(
                    "is {} bytes; the limit is {} bytes",
                    s.len(),
                    limits.max_instruction_bytes
                ),
            );
            None
        } else {
            Some(s.to_string())
        }
    });
    let input_artifacts = fields.array("inputArtifacts", report).map(|items| {
        parse_list(items, "inputArtifacts", report, |m, p, r| {
            parse_artifact(m, p, limits, r)
        })
    });
    let clipboard_images = fields.array("clipboardImages", report).map(|items| {
        parse_list(items, "clipboardImages", report, |m, p, r| {
            parse_image(m, p, limits, r)
        })
    });
    let rag_scope = fields
        .object("ragScope", report)
        .map(|m| parse_rag_scope(m, "ragScope", report));

    // "At least one input" counts what was sent, even if it was itself invalid: the client then
    // sees the precise error about that input rather than a misleading "empty turn".
    let has_instruction = fields.has("instruction")
        && fields
            .get("instruction")
            .and_then(Value::as_str)
            .is_none_or(|s| !s.trim().is_empty());
    let has_artifacts = fields
        .get("inputArtifacts")
        .is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()));
    let has_images = fields
        .get("clipboardImages")
        .is_some_and(|v| v.as_array().is_none_or(|a| !a.is_empty()));
    if !(has_instruction || has_artifacts || has_images) {
        report.error(
            ErrorCode::EmptyTurn,
            "$",
            "a user turn needs at least one of instruction, inputArtifacts or clipboardImages",
        );
    }

    let turn = UserTurn {
        session_id: session_id?,
        turn_id: turn_id?,
        instruction,
        input_artifacts: input_artifacts.flatten().unwrap_or_default(),
        clipboard_images: clipboard_images.flatten().unwrap_or_default(),
        rag_scope: rag_scope.flatten(),
        solution_context_text: fields
            .string("solutionContextText", report)
            .map(str::to_string),
        workspace_id: fields.string("workspaceId", report).map(str::to_string),
        repo: fields.string("repo", report).map(str::to_string),
        language: fields.string("language", report).map(str::to_string),
        streaming: fields.bool("streaming", report).unwrap_or(false),
        agent_context_id: fields.context_id("agentContextId", report),
        conversation_context_id: fields.context_id("conversationContextId", report),
        on_busy: fields.on_busy(report),
        webhook: fields
            .object("webhook", report)
            .and_then(|m| parse_webhook(m, "webhook", report)),
    };
    Some(AgentExecuteRequest::UserTurn(Box::new(turn)))
}

/// `{"url": "<absolute http(s) URL>"}`: what can be told without the server's policy (the
/// front door holds the URL to it, with DNS).
fn parse_webhook(
    map: &serde_json::Map<String, Value>,
    path: &str,
    report: &mut Report,
) -> Option<super::Webhook> {
    let f = Fields::collect(map, path, &["url"], &[], report);
    let url = f.required_string("url", report)?;
    let problem = if url.len() > super::MAX_WEBHOOK_URL_BYTES {
        Some(format!(
            "is {} bytes; the limit is {}",
            url.len(),
            super::MAX_WEBHOOK_URL_BYTES
        ))
    } else {
        match reqwest::Url::parse(url) {
            Err(e) => Some(format!("is not an absolute URL: {e}")),
            // Which of the two the deployment takes is the front door's to say (it knows
            // whether http is allowed); neither is what this URL names.
            Ok(u) if !matches!(u.scheme(), "https" | "http") => Some(format!(
                "has the scheme {:?}; a webhook is an https URL (http where the deployment allows it)",
                u.scheme()
            )),
            Ok(u) if u.host_str().is_none() => Some("has no host".to_string()),
            Ok(u) if !u.username().is_empty() || u.password().is_some() => {
                Some("must not carry credentials".to_string())
            }
            Ok(_) => None,
        }
    };
    match problem {
        Some(p) => {
            report.error(ErrorCode::InvalidWebhook, &f.path("url"), p);
            None
        }
        None => Some(super::Webhook {
            url: url.to_string(),
        }),
    }
}
