//! `AgentExecuteRequest` (AGN-034): the two request scenarios as types that are valid by
//! construction, and the parser that turns an untrusted JSON body into one of them or into the
//! full list of violations.
//!
//! Parse, don't validate: the pipeline receives a [`UserTurn`] or a [`ToolContinuation`] and never
//! re-checks the rules. The parser collects *every* violation, not just the first, and reports
//! unknown fields as warnings. Field names are accepted in camelCase and PascalCase; a JSON
//! `null` is treated as "absent" (the original platform's clients omit nulls, but some
//! serialisers write them).

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as BASE64;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::codes::ErrorCode;
use super::ids::{SessionId, ToolCallId, TurnId, check_id};
use super::invoke::{ErrorMessage, InvokeResult};

/// Size limits applied while parsing. Exceeding one is an error, never a truncation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RequestLimits {
    /// The largest whole request body, in bytes.
    pub max_body_bytes: usize,
    /// The largest instruction, in bytes of UTF-8.
    pub max_instruction_bytes: usize,
    /// The largest input artifact, in bytes after decoding.
    pub max_artifact_bytes: usize,
    /// The largest clipboard image, in bytes after decoding.
    pub max_image_bytes: usize,
}

impl Default for RequestLimits {
    fn default() -> Self {
        Self {
            max_body_bytes: 16 * 1024 * 1024,
            max_instruction_bytes: 256 * 1024,
            max_artifact_bytes: 2 * 1024 * 1024,
            max_image_bytes: 8 * 1024 * 1024,
        }
    }
}

// ---------------------------------------------------------------------------------------------
// The valid types
// ---------------------------------------------------------------------------------------------

/// A parsed, valid request: exactly one of the two AGN-034 scenarios.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum AgentExecuteRequest {
    /// Starts a new turn.
    UserTurn(Box<UserTurn>),
    /// Returns client tool results for a turn that waits for them.
    ToolContinuation(ToolContinuation),
}

impl AgentExecuteRequest {
    /// The session the request belongs to.
    pub fn session_id(&self) -> &SessionId {
        match self {
            Self::UserTurn(t) => &t.session_id,
            Self::ToolContinuation(c) => &c.session_id,
        }
    }

    /// The turn the request starts or continues.
    pub fn turn_id(&self) -> &TurnId {
        match self {
            Self::UserTurn(t) => &t.turn_id,
            Self::ToolContinuation(c) => &c.turn_id,
        }
    }
}

/// A user turn: ids plus at least one of instruction, input artifacts, clipboard images.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct UserTurn {
    session_id: SessionId,
    turn_id: TurnId,
    #[serde(skip_serializing_if = "Option::is_none")]
    instruction: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    input_artifacts: Vec<InputArtifact>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    clipboard_images: Vec<ClipboardImage>,
    #[serde(skip_serializing_if = "Option::is_none")]
    rag_scope: Option<RagScope>,
    #[serde(skip_serializing_if = "Option::is_none")]
    solution_context_text: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    workspace_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    repo: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    language: Option<String>,
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    streaming: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    agent_context_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    conversation_context_id: Option<String>,
}

impl UserTurn {
    /// The session id.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }
    /// The turn id.
    pub fn turn_id(&self) -> &TurnId {
        &self.turn_id
    }
    /// The instruction (Markdown), if any.
    pub fn instruction(&self) -> Option<&str> {
        self.instruction.as_deref()
    }
    /// Files the client supplied.
    pub fn input_artifacts(&self) -> &[InputArtifact] {
        &self.input_artifacts
    }
    /// Images pasted from the clipboard.
    pub fn clipboard_images(&self) -> &[ClipboardImage] {
        &self.clipboard_images
    }
    /// Retrieval scope hints.
    pub fn rag_scope(&self) -> Option<&RagScope> {
        self.rag_scope.as_ref()
    }
    /// Solution context; when present it replaces the session's latched one (AGN-034 §4.5).
    pub fn solution_context_text(&self) -> Option<&str> {
        self.solution_context_text.as_deref()
    }
    /// Workspace hint.
    pub fn workspace_id(&self) -> Option<&str> {
        self.workspace_id.as_deref()
    }
    /// Repository hint.
    pub fn repo(&self) -> Option<&str> {
        self.repo.as_deref()
    }
    /// Language hint.
    pub fn language(&self) -> Option<&str> {
        self.language.as_deref()
    }
    /// Whether the client asked for a streamed answer (delivery only).
    pub fn streaming(&self) -> bool {
        self.streaming
    }
    /// The configured model endpoint/credentials to use, if not the default.
    pub fn agent_context_id(&self) -> Option<&str> {
        self.agent_context_id.as_deref()
    }
    /// The configured conversation context (boot prompt) to use, if not the default.
    pub fn conversation_context_id(&self) -> Option<&str> {
        self.conversation_context_id.as_deref()
    }
}

/// A tool continuation: ids plus one or more tool results, nothing else.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolContinuation {
    session_id: SessionId,
    turn_id: TurnId,
    tool_results: Vec<ToolResult>,
}

impl ToolContinuation {
    /// The session id.
    pub fn session_id(&self) -> &SessionId {
        &self.session_id
    }
    /// The turn id.
    pub fn turn_id(&self) -> &TurnId {
        &self.turn_id
    }
    /// The submitted results, in the order the client sent them (never empty).
    pub fn tool_results(&self) -> &[ToolResult] {
        &self.tool_results
    }
}

/// Text that is known to be valid JSON (`resultJson`, `argumentsJson`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "String", into = "String")]
pub struct JsonText(String);

impl JsonText {
    /// Accepts text only if it parses as JSON.
    pub fn parse(text: impl Into<String>) -> Result<Self, serde_json::Error> {
        let text = text.into();
        serde_json::from_str::<serde::de::IgnoredAny>(&text)?;
        Ok(Self(text))
    }
    /// Serialises a JSON value (always valid).
    pub fn from_value(value: &Value) -> Self {
        Self(value.to_string())
    }
    /// The JSON text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl TryFrom<String> for JsonText {
    type Error = serde_json::Error;
    fn try_from(value: String) -> Result<Self, Self::Error> {
        Self::parse(value)
    }
}

impl From<JsonText> for String {
    fn from(value: JsonText) -> Self {
        value.0
    }
}

/// The outcome of one tool run: its JSON result or its error message (exactly one).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum ToolOutcome {
    /// The tool's result, as JSON text.
    #[serde(rename = "resultJson")]
    Result(JsonText),
    /// The tool failed with this message (a valid result, AGN-033 §3.3).
    #[serde(rename = "errorMessage")]
    Error(String),
}

/// One tool result: `{toolCallId, executionMs, resultJson | errorMessage}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolResult {
    /// The call this answers.
    pub tool_call_id: ToolCallId,
    /// How long the tool ran.
    pub execution_ms: u64,
    /// What it produced.
    #[serde(flatten)]
    pub outcome: ToolOutcome,
}

/// Where an artifact came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Picked up by the IDE (open editor, selection).
    Ide,
    /// Attached by the user.
    User,
}

/// How an artifact's `contents` are encoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Encoding {
    /// Plain UTF-8 text (the default).
    #[default]
    Utf8,
    /// Base64 of arbitrary bytes.
    Base64,
}

/// A path relative to the workspace root: no leading `/` or `\`, no drive letter, no `..`
/// segment, no NUL.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(transparent)]
pub struct RelativePath(String);

impl RelativePath {
    /// Accepts only safe relative paths; the error says which rule failed.
    pub fn parse(s: &str) -> Result<Self, &'static str> {
        if s.is_empty() {
            return Err("must not be empty");
        }
        if s.contains('\0') {
            return Err("must not contain NUL");
        }
        if s.starts_with('/') || s.starts_with('\\') {
            return Err("must be relative (it starts with a path separator)");
        }
        let b = s.as_bytes();
        if b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b':' {
            return Err("must be relative (it starts with a drive letter)");
        }
        if s.split(['/', '\\']).any(|seg| seg == "..") {
            return Err("must not contain a '..' segment");
        }
        Ok(Self(s.to_string()))
    }
    /// The path as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

/// A file the client supplied for reasoning.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct InputArtifact {
    relative_path: RelativePath,
    file_name: String,
    contents: String,
    origin: Origin,
    #[serde(skip_serializing_if = "Option::is_none")]
    mime_type: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    language: Option<String>,
    encoding: Encoding,
}

impl InputArtifact {
    /// The path relative to the workspace root.
    pub fn relative_path(&self) -> &RelativePath {
        &self.relative_path
    }
    /// The file name.
    pub fn file_name(&self) -> &str {
        &self.file_name
    }
    /// The contents as sent (base64 text when [`Encoding::Base64`]).
    pub fn contents(&self) -> &str {
        &self.contents
    }
    /// The decoded bytes (the encoding was checked when parsing).
    pub fn decoded(&self) -> Vec<u8> {
        match self.encoding {
            Encoding::Utf8 => self.contents.as_bytes().to_vec(),
            Encoding::Base64 => BASE64.decode(&self.contents).unwrap_or_default(),
        }
    }
    /// Where it came from.
    pub fn origin(&self) -> Origin {
        self.origin
    }
    /// Its MIME type, if given.
    pub fn mime_type(&self) -> Option<&str> {
        self.mime_type.as_deref()
    }
    /// Its language, if given.
    pub fn language(&self) -> Option<&str> {
        self.language.as_deref()
    }
    /// How `contents` is encoded.
    pub fn encoding(&self) -> Encoding {
        self.encoding
    }
}

/// An image pasted from the clipboard.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ClipboardImage {
    id: String,
    mime_type: String,
    data_base64: String,
}

impl ClipboardImage {
    /// The client's id for the image.
    pub fn id(&self) -> &str {
        &self.id
    }
    /// An `image/*` MIME type.
    pub fn mime_type(&self) -> &str {
        &self.mime_type
    }
    /// The image bytes, base64 (checked to decode).
    pub fn data_base64(&self) -> &str {
        &self.data_base64
    }
    /// The image as a `data:` URL, the form the Responses API accepts in `input_image`.
    pub fn data_url(&self) -> String {
        format!("data:{};base64,{}", self.mime_type, self.data_base64)
    }
}

/// A RAG scope condition operator (AGN-034 §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RagOperator {
    /// The key's value equals one of the values.
    #[serde(rename = "==")]
    Equals,
    /// The key's value equals none of the values.
    #[serde(rename = "!=")]
    NotEquals,
    /// The key's value contains one of the values.
    #[serde(rename = "contains")]
    Contains,
    /// The key's value contains none of the values.
    #[serde(rename = "does_not_contain")]
    DoesNotContain,
}

impl RagOperator {
    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "==" => Self::Equals,
            "!=" => Self::NotEquals,
            "contains" => Self::Contains,
            "does_not_contain" => Self::DoesNotContain,
            _ => return None,
        })
    }
}

/// Gives a request object the id field `camel` (e.g. `sessionId`) from `id` unless it already
/// has one in either spelling (`camel` or `pascal`); a `null` counts as absent.
pub fn default_id(
    request: &mut Map<String, Value>,
    camel: &str,
    pascal: &str,
    id: impl FnOnce() -> String,
) {
    let present = [camel, pascal]
        .iter()
        .any(|k| request.get(*k).is_some_and(|v| !v.is_null()));
    if !present {
        request.remove(pascal);
        request.insert(camel.to_string(), Value::String(id()));
    }
}

/// The chunk metadata keys a `ragScope` condition can name (DESIGN.md §7).
pub const RAG_KEYS: &[&str] = &["path", "language", "repo", "tags", "docId"];

/// One scope condition; all conditions of a scope are ANDed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RagCondition {
    /// The metadata key (non-empty).
    pub key: String,
    /// The operator.
    pub operator: RagOperator,
    /// The values (at least one).
    pub values: Vec<String>,
}

/// Retrieval scope hints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RagScope {
    /// The ANDed conditions.
    pub conditions: Vec<RagCondition>,
}

// ---------------------------------------------------------------------------------------------
// The parser
// ---------------------------------------------------------------------------------------------

/// A request that parsed, with the warnings found on the way (unknown fields).
#[derive(Debug, Clone, PartialEq)]
pub struct ParsedRequest {
    /// The valid request.
    pub request: AgentExecuteRequest,
    /// Non-fatal findings, for the `InvokeResult`'s `warnings`.
    pub warnings: Vec<ErrorMessage>,
}

/// A request that did not parse: every violation found (never empty), and the warnings.
#[derive(Debug, Clone, PartialEq)]
pub struct RequestRejected {
    /// Every violation, each with its code and a message that starts with the field path.
    pub errors: Vec<ErrorMessage>,
    /// Non-fatal findings.
    pub warnings: Vec<ErrorMessage>,
}

impl RequestRejected {
    /// True when the body as a whole was over the size limit (HTTP 413 at the front door).
    pub fn is_body_too_large(&self) -> bool {
        self.errors.len() == 1
            && self.errors[0].error_code == ErrorCode::PayloadTooLarge
            && self.errors[0].message.starts_with("$:")
    }

    /// The failed `InvokeResult` a client receives.
    pub fn into_invoke_result<T>(self) -> InvokeResult<T> {
        let warnings = self.warnings;
        match InvokeResult::failures(self.errors) {
            Some(r) => r.with_warnings(warnings),
            // A rejection always holds an error; keep the promise even if that is ever broken.
            None => InvokeResult::failure(ErrorMessage::new(
                ErrorCode::Internal,
                "request rejected without a reason",
            ))
            .with_warnings(warnings),
        }
    }
}

/// Fields the server owns; a client that sends one is told so, in either scenario.
pub const SERVER_OWNED: &[&str] = &[
    "mode",
    "modeId",
    "modeKey",
    "responseContinuationId",
    "previousResponseId",
    "continuationId",
    "tools",
    "toolsJson",
    "toolChoice",
    "toolChoiceName",
];

/// Fields of a user turn that a tool continuation must not carry (AGN-034 §2.2).
pub const USER_TURN_ONLY: &[&str] = &[
    "instruction",
    "inputArtifacts",
    "clipboardImages",
    "ragScope",
    "solutionContextText",
    "workspaceId",
    "repo",
    "language",
    "streaming",
    "agentContextId",
    "conversationContextId",
];

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
struct Report {
    errors: Vec<ErrorMessage>,
    warnings: Vec<ErrorMessage>,
}

impl Report {
    fn error(&mut self, code: ErrorCode, path: &str, msg: impl std::fmt::Display) {
        self.errors
            .push(ErrorMessage::new(code, format!("{path}: {msg}")));
    }
    fn warn(&mut self, code: ErrorCode, path: &str, msg: impl std::fmt::Display) {
        self.warnings
            .push(ErrorMessage::new(code, format!("{path}: {msg}")));
    }
}

fn join(path: &str, field: &str) -> String {
    if path.is_empty() {
        field.to_string()
    } else {
        format!("{path}.{field}")
    }
}

/// camelCase form of a key that may be PascalCase (`SessionId` → `sessionId`).
fn camel(key: &str) -> String {
    let mut chars = key.chars();
    match chars.next() {
        Some(first) => first.to_ascii_lowercase().to_string() + chars.as_str(),
        None => String::new(),
    }
}

/// A JSON object's fields, matched by camelCase name; nulls count as absent.
struct Fields<'a> {
    path: String,
    found: Vec<(&'static str, &'a Value)>,
}

impl<'a> Fields<'a> {
    /// Sorts an object's keys into known fields (kept), server-owned fields (errors) and unknown
    /// fields (warnings).
    fn collect(
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

    fn get(&self, name: &str) -> Option<&'a Value> {
        self.found.iter().find(|(f, _)| *f == name).map(|(_, v)| *v)
    }

    fn has(&self, name: &str) -> bool {
        self.get(name).is_some()
    }

    fn path(&self, name: &str) -> String {
        join(&self.path, name)
    }

    fn string(&self, name: &str, report: &mut Report) -> Option<&'a str> {
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

    fn required_string(&self, name: &str, report: &mut Report) -> Option<&'a str> {
        if !self.has(name) {
            report.error(ErrorCode::MissingField, &self.path(name), "is required");
            return None;
        }
        self.string(name, report)
    }

    fn array(&self, name: &str, report: &mut Report) -> Option<&'a Vec<Value>> {
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

    fn object(&self, name: &str, report: &mut Report) -> Option<&'a Map<String, Value>> {
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

    fn bool(&self, name: &str, report: &mut Report) -> Option<bool> {
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
    fn id<T>(
        &self,
        name: &str,
        parse: impl FnOnce(&str) -> Result<T, super::ids::IdError>,
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
    fn context_id(&self, name: &str, report: &mut Report) -> Option<String> {
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

fn kind_of(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

fn parse_envelope(
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
fn parse_list<T>(
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

fn parse_tool_results(fields: &Fields<'_>, report: &mut Report) -> Option<Vec<ToolResult>> {
    let items = fields.array("toolResults", report)?;
    if items.is_empty() {
        report.error(
            ErrorCode::InvalidToolResult,
            "toolResults",
            "must hold at least one tool result",
        );
        return None;
    }
    parse_list(items, "toolResults", report, parse_tool_result)
}

fn parse_tool_result(
    map: &Map<String, Value>,
    path: &str,
    report: &mut Report,
) -> Option<ToolResult> {
    let f = Fields::collect(
        map,
        path,
        &["toolCallId", "executionMs", "resultJson", "errorMessage"],
        &[],
        report,
    );
    let tool_call_id = f.id("toolCallId", |s| ToolCallId::parse(s), report);
    let execution_ms = match f.get("executionMs") {
        None => {
            report.error(
                ErrorCode::MissingField,
                &f.path("executionMs"),
                "is required",
            );
            None
        }
        // A whole number written with a fraction (`12.0`) is still a whole number.
        Some(Value::Number(n)) => match n.as_u64().or_else(|| {
            n.as_f64()
                .filter(|f| f.fract() == 0.0 && *f >= 0.0 && *f <= u64::MAX as f64)
                .map(|f| f as u64)
        }) {
            Some(ms) => Some(ms),
            None => {
                report.error(
                    ErrorCode::InvalidToolResult,
                    &f.path("executionMs"),
                    format!("must be a whole number of milliseconds >= 0 (got {n})"),
                );
                None
            }
        },
        Some(other) => {
            report.error(
                ErrorCode::InvalidFieldType,
                &f.path("executionMs"),
                format!("must be a number, not {}", kind_of(other)),
            );
            None
        }
    };
    let outcome = match (f.has("resultJson"), f.has("errorMessage")) {
        (true, true) => {
            report.error(
                ErrorCode::InvalidToolResult,
                path,
                "must carry exactly one of resultJson or errorMessage, not both",
            );
            None
        }
        (false, false) => {
            report.error(
                ErrorCode::InvalidToolResult,
                path,
                "must carry exactly one of resultJson or errorMessage",
            );
            None
        }
        (true, false) => f
            .string("resultJson", report)
            .and_then(|s| match JsonText::parse(s) {
                Ok(j) => Some(ToolOutcome::Result(j)),
                Err(e) => {
                    report.error(
                        ErrorCode::InvalidResultJson,
                        &f.path("resultJson"),
                        format!("is not valid JSON ({e})"),
                    );
                    None
                }
            }),
        (false, true) => f
            .string("errorMessage", report)
            .map(|s| ToolOutcome::Error(s.to_string())),
    };
    Some(ToolResult {
        tool_call_id: tool_call_id?,
        execution_ms: execution_ms?,
        outcome: outcome?,
    })
}

fn parse_artifact(
    map: &Map<String, Value>,
    path: &str,
    limits: &RequestLimits,
    report: &mut Report,
) -> Option<InputArtifact> {
    let f = Fields::collect(
        map,
        path,
        &[
            "relativePath",
            "fileName",
            "contents",
            "origin",
            "mimeType",
            "language",
            "encoding",
        ],
        &[],
        report,
    );
    let relative_path =
        f.required_string("relativePath", report)
            .and_then(|s| match RelativePath::parse(s) {
                Ok(p) => Some(p),
                Err(why) => {
                    report.error(ErrorCode::InvalidPath, &f.path("relativePath"), why);
                    None
                }
            });
    let file_name = f.required_string("fileName", report);
    let contents = f.required_string("contents", report);
    let origin = f.required_string("origin", report).and_then(|s| match s {
        "ide" => Some(Origin::Ide),
        "user" => Some(Origin::User),
        other => {
            report.error(
                ErrorCode::InvalidArtifact,
                &f.path("origin"),
                format!("must be \"ide\" or \"user\" (got {other:?})"),
            );
            None
        }
    });
    let mut encoding_ok = true;
    let encoding = match f.string("encoding", report) {
        None => Encoding::Utf8,
        Some("utf8") => Encoding::Utf8,
        Some("base64") => Encoding::Base64,
        Some(other) => {
            report.error(
                ErrorCode::InvalidArtifact,
                &f.path("encoding"),
                format!("must be \"utf8\" or \"base64\" (got {other:?})"),
            );
            encoding_ok = false;
            Encoding::Utf8
        }
    };
    let mut contents_ok = encoding_ok;
    if let (Some(text), true) = (contents, encoding_ok) {
        let size = match encoding {
            Encoding::Utf8 => Some(text.len()),
            Encoding::Base64 => match BASE64.decode(text) {
                Ok(bytes) => Some(bytes.len()),
                Err(e) => {
                    report.error(
                        ErrorCode::InvalidArtifact,
                        &f.path("contents"),
                        format!("is not valid base64 ({e})"),
                    );
                    None
                }
            },
        };
        match size {
            Some(n) if n > limits.max_artifact_bytes => {
                report.error(
                    ErrorCode::PayloadTooLarge,
                    &f.path("contents"),
                    format!(
                        "is {n} bytes; the limit per artifact is {} bytes",
                        limits.max_artifact_bytes
                    ),
                );
                contents_ok = false;
            }
            Some(_) => {}
            None => contents_ok = false,
        }
    }
    let mime_type = f.string("mimeType", report).map(str::to_string);
    let language = f.string("language", report).map(str::to_string);
    if !contents_ok {
        return None;
    }
    Some(InputArtifact {
        relative_path: relative_path?,
        file_name: file_name?.to_string(),
        contents: contents?.to_string(),
        origin: origin?,
        mime_type,
        language,
        encoding,
    })
}

fn parse_image(
    map: &Map<String, Value>,
    path: &str,
    limits: &RequestLimits,
    report: &mut Report,
) -> Option<ClipboardImage> {
    let f = Fields::collect(map, path, &["id", "mimeType", "dataBase64"], &[], report);
    let id = f.required_string("id", report).and_then(|s| {
        if s.trim().is_empty() {
            report.error(ErrorCode::InvalidImage, &f.path("id"), "must not be empty");
            None
        } else {
            Some(s.to_string())
        }
    });
    let mime_type = f.required_string("mimeType", report).and_then(|s| {
        // `image/` and a subtype name as RFC 6838 restricts them.
        let valid = s.strip_prefix("image/").is_some_and(|sub| {
            let mut chars = sub.chars();
            sub.len() <= 127
                && chars.next().is_some_and(|c| c.is_ascii_alphanumeric())
                && chars.all(|c| c.is_ascii_alphanumeric() || "!#$&^_.+-".contains(c))
        });
        if valid {
            Some(s.to_string())
        } else {
            report.error(
                ErrorCode::InvalidImage,
                &f.path("mimeType"),
                format!("must be an image/* MIME type (got {s:?})"),
            );
            None
        }
    });
    let data = f
        .required_string("dataBase64", report)
        .and_then(|s| match BASE64.decode(s) {
            Ok(bytes) if bytes.is_empty() => {
                report.error(
                    ErrorCode::InvalidImage,
                    &f.path("dataBase64"),
                    "must not be empty",
                );
                None
            }
            Ok(bytes) if bytes.len() > limits.max_image_bytes => {
                report.error(
                    ErrorCode::PayloadTooLarge,
                    &f.path("dataBase64"),
                    format!(
                        "decodes to {} bytes; the limit per image is {} bytes",
                        bytes.len(),
                        limits.max_image_bytes
                    ),
                );
                None
            }
            Ok(_) => Some(s.to_string()),
            Err(e) => {
                report.error(
                    ErrorCode::InvalidImage,
                    &f.path("dataBase64"),
                    format!("is not valid base64 ({e})"),
                );
                None
            }
        });
    Some(ClipboardImage {
        id: id?,
        mime_type: mime_type?,
        data_base64: data?,
    })
}

fn parse_rag_scope(map: &Map<String, Value>, path: &str, report: &mut Report) -> Option<RagScope> {
    let f = Fields::collect(map, path, &["conditions"], &[], report);
    let Some(items) = f.array("conditions", report) else {
        if !f.has("conditions") {
            report.error(
                ErrorCode::MissingField,
                &f.path("conditions"),
                "is required",
            );
        }
        return None;
    };
    let conditions = parse_list(items, &f.path("conditions"), report, parse_condition)?;
    Some(RagScope { conditions })
}

fn parse_condition(
    map: &Map<String, Value>,
    path: &str,
    report: &mut Report,
) -> Option<RagCondition> {
    let f = Fields::collect(map, path, &["key", "operator", "values"], &[], report);
    let key = f.required_string("key", report).and_then(|k| {
        if k.trim().is_empty() {
            report.error(
                ErrorCode::InvalidRagCondition,
                &f.path("key"),
                "must not be empty",
            );
            None
        } else {
            if !RAG_KEYS.contains(&k) {
                report.warn(
                    ErrorCode::UnknownRagKey,
                    &f.path("key"),
                    format!(
                        "{k:?} is not a chunk metadata key ({}); the condition is ignored",
                        RAG_KEYS.join(", ")
                    ),
                );
            }
            Some(k.to_string())
        }
    });
    let operator = f.required_string("operator", report).and_then(|op| {
        let parsed = RagOperator::parse(op);
        if parsed.is_none() {
            report.error(
                ErrorCode::InvalidRagCondition,
                &f.path("operator"),
                format!("must be one of ==, !=, contains, does_not_contain (got {op:?})"),
            );
        }
        parsed
    });
    let values = match f.array("values", report) {
        None => {
            if !f.has("values") {
                report.error(ErrorCode::MissingField, &f.path("values"), "is required");
            }
            None
        }
        Some(vs) if vs.is_empty() => {
            report.error(
                ErrorCode::InvalidRagCondition,
                &f.path("values"),
                "must hold at least one value",
            );
            None
        }
        Some(vs) => {
            let mut out = Vec::with_capacity(vs.len());
            for (i, v) in vs.iter().enumerate() {
                match v.as_str() {
                    Some(s) => out.push(s.to_string()),
                    None => report.error(
                        ErrorCode::InvalidFieldType,
                        &format!("{}[{i}]", f.path("values")),
                        format!("must be a string, not {}", kind_of(v)),
                    ),
                }
            }
            (out.len() == vs.len()).then_some(out)
        }
    };
    Some(RagCondition {
        key: key?,
        operator: operator?,
        values: values?,
    })
}
