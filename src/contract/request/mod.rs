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
use super::ids::{SessionId, ToolCallId, TurnId};
use super::invoke::{ErrorMessage, InvokeResult};

mod fields;
mod items;
mod parse;
mod rag;

pub use parse::{parse_request, parse_request_value};
pub use rag::{RAG_KEYS, RagCondition, RagOperator, RagScope};

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

    /// Makes the request `tenant`'s: its session id scoped to the tenant
    /// ([`SessionId::within`]). Whoever learns the request's tenant does this before anything
    /// is read or written for its session.
    pub fn scope_to(&mut self, tenant: &str) {
        let sid = match self {
            Self::UserTurn(t) => &mut t.session_id,
            Self::ToolContinuation(c) => &mut c.session_id,
        };
        if sid.tenant() != tenant {
            *sid = sid.within(tenant);
        }
    }

    /// The request as `tenant`'s ([`AgentExecuteRequest::scope_to`]), copied only when its
    /// scope changes.
    pub fn within(&self, tenant: &str) -> std::borrow::Cow<'_, Self> {
        if self.session_id().tenant() == tenant {
            std::borrow::Cow::Borrowed(self)
        } else {
            let mut scoped = self.clone();
            scoped.scope_to(tenant);
            std::borrow::Cow::Owned(scoped)
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
    #[serde(skip_serializing_if = "OnBusy::is_enqueue")]
    on_busy: OnBusy,
    #[serde(skip_serializing_if = "Option::is_none")]
    webhook: Option<Webhook>,
}

/// The longest webhook URL accepted.
pub const MAX_WEBHOOK_URL_BYTES: usize = 2048;

/// Where a turn's settled status is POSTed too (an extension of AGN-034): `{"url": "…"}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Webhook {
    /// The endpoint.
    pub url: String,
}

/// What a user turn does when its session already has a turn queued or running (an extension
/// of AGN-034: "double texting").
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum OnBusy {
    /// Run after the turns before it (the default, and the only behaviour AGN-034 knows).
    #[default]
    Enqueue,
    /// Refuse the turn with `409 SESSION_BUSY`.
    Reject,
    /// Cancel the session's queued and running turns; this one runs next.
    Interrupt,
}

impl OnBusy {
    /// The wire values.
    pub const VALUES: [&'static str; 3] = ["enqueue", "reject", "interrupt"];

    /// Reads a wire value.
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "enqueue" => Some(Self::Enqueue),
            "reject" => Some(Self::Reject),
            "interrupt" => Some(Self::Interrupt),
            _ => None,
        }
    }

    fn is_enqueue(&self) -> bool {
        *self == Self::Enqueue
    }
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
    /// Where the turn's settled statuses are POSTed too, if anywhere.
    pub fn webhook(&self) -> Option<&Webhook> {
        self.webhook.as_ref()
    }
    /// What to do when the session already has a turn queued or running.
    pub fn on_busy(&self) -> OnBusy {
        self.on_busy
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
    "onBusy",
    "webhook",
];
