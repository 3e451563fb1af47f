//! `AgentExecuteResponse` (AGN-033): a `final` answer or a `client_tool_continuation`.
//!
//! The bucket rules are enforced by the types: each kind is its own struct that simply has no
//! field for a forbidden bucket, a final answer always has its one `primaryOutputText`, and a
//! continuation holds its first tool call apart so it can never have zero. Serialisation omits
//! empty buckets entirely (absent, not `null`, not `[]`).

use serde::ser::SerializeMap;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::ids::{SessionId, ToolCallId, TurnId};
use super::request::{JsonText, ToolResult};

/// Session metadata every successful response carries (AGN-033 §3.1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SessionMeta {
    /// The session.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// The display name of the session's mode after the turn (display only).
    pub mode_display_name: String,
}

/// A tool call the client must run: `{toolCallId, name, argumentsJson}`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ToolCall {
    /// The model's call id; the client echoes it in its tool result.
    pub tool_call_id: ToolCallId,
    /// The tool's name.
    pub name: String,
    /// The arguments, as JSON text.
    pub arguments_json: JsonText,
}

/// A file produced by the turn, by reference (AGN-033 §6.3).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct FileRef {
    /// File name.
    pub name: String,
    /// MIME type.
    pub mime_type: String,
    /// Where to fetch it.
    pub url: String,
    /// Size in bytes.
    pub size_bytes: u64,
    /// Hash of the contents.
    pub content_hash: String,
    /// Optional description.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub description: Option<String>,
    /// Optional expiry (RFC 3339).
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub content_expires: Option<String>,
}

/// Token usage summed over a turn.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Usage {
    /// Input tokens.
    pub prompt_tokens: u64,
    /// Output tokens.
    pub completion_tokens: u64,
    /// Total tokens.
    pub total_tokens: u64,
    /// Of the input tokens, those the model server read from its prompt cache (an extension
    /// of AGN-034; absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub cached_tokens: u64,
    /// Of the output tokens, those a reasoning model spent reasoning (an extension of
    /// AGN-034; absent when none).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub reasoning_tokens: u64,
    /// The estimated cost of these tokens at the agent context's prices, in millionths of a
    /// US dollar; on the wire `estimatedCostUsd` in dollars (an extension of AGN-034; absent
    /// when the context has no prices).
    #[serde(
        rename = "estimatedCostUsd",
        default,
        skip_serializing_if = "is_zero",
        with = "usd"
    )]
    pub cost_micros: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Millionths of a dollar held as an integer, written as dollars.
pub mod usd {
    use serde::{Deserialize as _, Deserializer, Serializer};

    /// Writes `micros` as dollars.
    pub fn serialize<S: Serializer>(micros: &u64, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_f64(*micros as f64 / 1e6)
    }

    /// Reads dollars as micros (rounded; negative or not finite is refused).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
        let usd = f64::deserialize(d)?;
        if !(0.0..1e12).contains(&usd) {
            return Err(serde::de::Error::custom(
                "a cost in dollars must be 0 or more",
            ));
        }
        Ok((usd * 1e6).round() as u64)
    }
}

impl Usage {
    /// Adds another call's usage.
    pub fn add(&mut self, other: Usage) {
        self.prompt_tokens += other.prompt_tokens;
        self.completion_tokens += other.completion_tokens;
        self.total_tokens += other.total_tokens;
        self.cached_tokens += other.cached_tokens;
        self.reasoning_tokens += other.reasoning_tokens;
        self.cost_micros += other.cost_micros;
    }
}

/// A completed turn, rendered to the user.
#[derive(Debug, Clone, PartialEq)]
pub struct FinalResponse {
    /// Session metadata.
    pub meta: SessionMeta,
    /// The one user-visible answer (Markdown).
    pub primary_output_text: String,
    /// Files produced, by reference.
    pub files: Vec<FileRef>,
    /// Server tools run in the turn (visibility only, AGN-033 §5.3).
    pub tool_results: Vec<ToolResult>,
    /// Non-fatal things the user should know.
    pub user_warnings: Vec<String>,
    /// Token usage over the turn.
    pub usage: Option<Usage>,
}

/// A turn that waits for the client to run tools.
#[derive(Debug, Clone, PartialEq)]
pub struct ClientToolContinuation {
    /// Session metadata.
    pub meta: SessionMeta,
    first_call: ToolCall,
    more_calls: Vec<ToolCall>,
    /// Optional informational message (never actionable).
    pub tool_continuation_message: Option<String>,
}

impl ClientToolContinuation {
    /// A continuation asking for these calls, in this order; `None` when `calls` is empty.
    pub fn new(meta: SessionMeta, calls: Vec<ToolCall>, message: Option<String>) -> Option<Self> {
        let mut iter = calls.into_iter();
        let first_call = iter.next()?;
        Some(Self {
            meta,
            first_call,
            more_calls: iter.collect(),
            tool_continuation_message: message,
        })
    }

    /// The ordered tool calls (at least one).
    pub fn tool_calls(&self) -> impl Iterator<Item = &ToolCall> {
        std::iter::once(&self.first_call).chain(self.more_calls.iter())
    }

    /// The ids of the calls, in order (what a continuation must answer, AGN-033 §3.3).
    pub fn tool_call_ids(&self) -> Vec<ToolCallId> {
        self.tool_calls().map(|c| c.tool_call_id.clone()).collect()
    }
}

/// The response of a successful turn: exactly one of the two kinds.
#[derive(Debug, Clone, PartialEq)]
pub enum AgentExecuteResponse {
    /// `kind: final`.
    Final(FinalResponse),
    /// `kind: client_tool_continuation`.
    ClientToolContinuation(ClientToolContinuation),
}

impl AgentExecuteResponse {
    /// The wire value of `kind`.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Final(_) => "final",
            Self::ClientToolContinuation(_) => "client_tool_continuation",
        }
    }

    /// The session metadata.
    pub fn meta(&self) -> &SessionMeta {
        match self {
            Self::Final(f) => &f.meta,
            Self::ClientToolContinuation(c) => &c.meta,
        }
    }
}

impl Serialize for AgentExecuteResponse {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        let mut map = serializer.serialize_map(None)?;
        map.serialize_entry("kind", self.kind())?;
        let meta = self.meta();
        map.serialize_entry("sessionId", &meta.session_id)?;
        map.serialize_entry("turnId", &meta.turn_id)?;
        map.serialize_entry("modeDisplayName", &meta.mode_display_name)?;
        match self {
            Self::Final(f) => {
                map.serialize_entry("primaryOutputText", &f.primary_output_text)?;
                if !f.tool_results.is_empty() {
                    map.serialize_entry("toolResults", &f.tool_results)?;
                }
                if !f.files.is_empty() {
                    map.serialize_entry("files", &f.files)?;
                }
                if !f.user_warnings.is_empty() {
                    map.serialize_entry("userWarnings", &f.user_warnings)?;
                }
                if let Some(usage) = &f.usage {
                    map.serialize_entry("usage", usage)?;
                }
            }
            Self::ClientToolContinuation(c) => {
                if let Some(msg) = &c.tool_continuation_message {
                    map.serialize_entry("toolContinuationMessage", msg)?;
                }
                let calls: Vec<&ToolCall> = c.tool_calls().collect();
                map.serialize_entry("toolCalls", &calls)?;
            }
        }
        map.end()
    }
}

/// Every field either kind may carry; used to read responses back (stored results, CLI clients)
/// and to reject bodies that break the bucket rules.
#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct RawResponse {
    kind: String,
    session_id: SessionId,
    turn_id: TurnId,
    mode_display_name: String,
    primary_output_text: Option<String>,
    tool_continuation_message: Option<String>,
    tool_calls: Option<Vec<ToolCall>>,
    tool_results: Option<Vec<ToolResult>>,
    files: Option<Vec<FileRef>>,
    user_warnings: Option<Vec<String>>,
    usage: Option<Usage>,
}

impl<'de> Deserialize<'de> for AgentExecuteResponse {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        use serde::de::Error;
        let raw = RawResponse::deserialize(deserializer)?;
        let meta = SessionMeta {
            session_id: raw.session_id,
            turn_id: raw.turn_id,
            mode_display_name: raw.mode_display_name,
        };
        match raw.kind.as_str() {
            "final" => {
                if raw.tool_calls.is_some() || raw.tool_continuation_message.is_some() {
                    return Err(D::Error::custom(
                        "a final response must not carry toolCalls or toolContinuationMessage",
                    ));
                }
                let primary_output_text = raw
                    .primary_output_text
                    .ok_or_else(|| D::Error::custom("a final response needs primaryOutputText"))?;
                Ok(Self::Final(FinalResponse {
                    meta,
                    primary_output_text,
                    files: raw.files.unwrap_or_default(),
                    tool_results: raw.tool_results.unwrap_or_default(),
                    user_warnings: raw.user_warnings.unwrap_or_default(),
                    usage: raw.usage,
                }))
            }
            "client_tool_continuation" => {
                if raw.primary_output_text.is_some()
                    || raw.tool_results.is_some()
                    || raw.files.is_some()
                    || raw.user_warnings.is_some()
                    || raw.usage.is_some()
                {
                    return Err(D::Error::custom(
                        "a client_tool_continuation must not carry primaryOutputText, toolResults, files, userWarnings or usage",
                    ));
                }
                ClientToolContinuation::new(
                    meta,
                    raw.tool_calls.unwrap_or_default(),
                    raw.tool_continuation_message,
                )
                .map(Self::ClientToolContinuation)
                .ok_or_else(|| {
                    D::Error::custom("a client_tool_continuation needs at least one tool call")
                })
            }
            other => Err(D::Error::custom(format!("unknown response kind {other:?}"))),
        }
    }
}
