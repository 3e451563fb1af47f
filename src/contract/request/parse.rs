//! The parser's frame: the envelope of a request (which scenario, the common fields, unknown
//! and server-owned fields), the collected report of violations, and field access that accepts
//! camelCase and PascalCase and treats `null` as absent.

use serde_json::{Map, Value};

use super::items::{parse_artifact, parse_image, parse_rag_scope, parse_tool_results};
use super::{
    AgentExecuteRequest, ParsedRequest, RequestLimits, RequestRejected, SERVER_OWNED,
    ToolContinuation, USER_TURN_ONLY, UserTurn,
};
use crate::contract::codes::ErrorCode;
use crate::contract::ids::{SessionId, TurnId, check_id};
use crate::contract::invoke::ErrorMessage;

/// Parses a request body (bytes as received) against the limits.
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
    let value: Value = match serde_json::from_slice(body) {
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

/// Errors and warnings collected while walking the body.
#[derive(Default)]
pub(super) struct Report {
    errors: Vec<ErrorMessage>,
    warnings: Vec<ErrorMessage>,
}

impl Report {
    pub(super) fn error(&mut self, code: ErrorCode, path: &str, msg: impl std::fmt::Display) {
        self.errors
            .push(ErrorMessage::new(code, format!("{path}: {msg}")));
    }
    pub(super) fn warn(&mut self, code: ErrorCode, path: &str, msg: impl std::fmt::Display) {
        self.warnings
            .push(ErrorMessage::new(code, format!("{path}: {msg}")));
    }
}

pub(super) fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// camelCase form of a key that may be PascalCase (`SessionId` → `sessionId`).
pub(super) fn camel(key: &str) -> String {
    let mut chars = key.chars();
    match chars.next() {
        Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// A JSON object's fields, matched by camelCase name; nulls count as absent.
pub(super) struct Fields<'a> {
    path: String,
    found: Vec<(&'static str, &'a Value)>,
}

impl<'a> Fields<'a> {
    /// Sorts an object's keys into known fields (kept), server-owned fields (errors) and unknown
    /// fields (warnings).
    pub(super) fn collect(
        map: &'a Map<String, Value>,
        path: &str,
        known: &[&'static str],
        forbidden: &[&'static str],
        report: &mut Report,
    ) -> Self {
        let mut found: Vec<(&'static str, &'a Value)> = Vec::new();
        for (key, value) in map {
            let name = camel(key);
            let exact = key == &name || key.starts_with(|c: char| c.is_ascii_uppercase());
            if let Some(field) = known.iter().find(|k| **k == name).filter(|_| exact) {
                if value.is_null() {
                    continue;
                }
                if found.iter().any(|(f, _)| f == field) {
                    report.error(
                        ErrorCode::DuplicateField,
                        &join(path, field),
                        "is given twice (camelCase and PascalCase)",
                    );
                    continue;
                }
                found.push((field, value));
            } else if forbidden.contains(&name.as_str()) {
                if !value.is_null() {
                    report.error(
                        ErrorCode::ForbiddenField,
                        &join(path, &name),
                        "is server-owned state and must not be sent by clients",
                    );
                }
            } else {
                report.warn(
                    ErrorCode::UnknownField,
                    &join(path, key),
                    "is not part of the contract and was ignored",
                );
            }
        }
        Self {
            path: path.to_string(),
            found,
        }
    }

    pub(super) fn get(&self, name: &str) -> Option<&'a Value> {
        self.found.iter().find(|(f, _)| *f == name).map(|(_, v)| *v)
    }

    pub(super) fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    pub(super) fn path(&self, name: &str) -> String {
        join(&self.path, name)
    }

    pub(super) fn string(&self, name: &str, report: &mut Report) -> Option<&'a str> {
        let v = self.get(name)?;
        match v.as_str() {
            Some(s) => Some(s),
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &self.path(name),
                    format!("must be a string, not {}", kind_of(v)),
                );
                None
            }
        }
    }

    pub(super) fn required_string(&self, name: &str, report: &mut Report) -> Option<&'a str> {
        if !self.has(name) {
            report.error(ErrorCode::MissingField, &self.path(name), "is required");
            return None;
        }
        self.string(name, report)
    }

    pub(super) fn array(&self, name: &str, report: &mut Report) -> Option<&'a Vec<Value>> {
        let v = self.get(name)?;
        match v.as_array() {
            Some(a) => Some(a),
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &self.path(name),
                    format!("must be an array, not {}", kind_of(v)),
                );
                None
            }
        }
    }

    pub(super) fn object(&self, name: &str, report: &mut Report) -> Option<&'a Map<String, Value>> {
        let v = self.get(name)?;
        match v.as_object() {
            Some(o) => Some(o),
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &self.path(name),
                    format!("must be an object, not {}", kind_of(v)),
                );
                None
            }
        }
    }

    pub(super) fn bool(&self, name: &str, report: &mut Report) -> Option<bool> {
        let v = self.get(name)?;
        match v.as_bool() {
            Some(b) => Some(b),
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &self.path(name),
                    format!("must be a boolean, not {}", kind_of(v)),
                );
                None
            }
        }
    }

    /// A required id with the safe-charset rule.
    pub(super) fn id<T>(
        &self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, crate::contract::ids::IdError>,
        report: &mut Report,
    ) -> Option<T> {
        let s = self.required_string(name, report)?;
        match parse(s) {
            Ok(id) => Some(id),
            Err(e) => {
                report.error(ErrorCode::InvalidId, &self.path(name), e);
                None
            }
        }
    }

    /// An optional context id (names a configured context): same charset rule as ids.
    pub(super) fn context_id(&self, name: &str, report: &mut Report) -> Option<String> {
        let s = self.string(name, report)?;
        match check_id(s) {
            Ok(()) => Some(s.to_string()),
            Err(e) => {
                report.error(ErrorCode::InvalidId, &self.path(name), e);
                None
            }
        }
    }
}

pub(super) fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
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
    };
    Some(AgentExecuteRequest::UserTurn(Box::new(turn)))
}

/// Parses every element of an array of objects; `None` if any element was invalid.
pub(super) fn parse_list<T>(
    items: &[Value],
    name: &str,
    report: &mut Report,
    mut parse: impl FnMut(&Map<String, Value>, &str, &mut Report) -> Option<T>,
) -> Option<Vec<T>> {
    let mut out = Vec::with_capacity(items.len());
    let mut all_ok = true;
    for (i, item) in items.iter().enumerate() {
        let path = format!("{name}[{i}]");
        match item.as_object() {
            Some(m) => match parse(m, &path, report) {
                Some(t) => out.push(t),
                None => all_ok = false,
            },
            None => {
                report.error(
                    ErrorCode::InvalidFieldType,
                    &path,
                    format!("must be an object, not {}", kind_of(item)),
                );
                all_ok = false;
            }
        }
    }
    all_ok.then_some(out)
}
