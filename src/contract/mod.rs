//! The wire contract (AGN-033, AGN-034, SYS-005; DESIGN.md §2): what clients send and receive.
//!
//! Owns: the request types and their parser, the response types, `InvokeResult`, error codes,
//! the tool-result match rule. Must not: know about queues, stores or the model.

pub mod codes;
pub mod ids;
pub mod invoke;
pub mod request;
pub mod response;
pub mod tool_match;

pub use codes::ErrorCode;
pub use ids::{LOCAL_TENANT, SessionId, ToolCallId, TurnId};
pub use invoke::{ErrorMessage, InvokeResult};
pub use request::{
    AgentExecuteRequest, OnBusy, ParsedRequest, RequestLimits, RequestRejected, ToolContinuation,
    ToolOutcome, ToolResult, UserTurn, parse_request,
};
pub use response::{
    AgentExecuteResponse, ClientToolContinuation, FinalResponse, SessionMeta, ToolCall, Usage,
};
pub use tool_match::{ToolResultsMismatch, check_tool_results};

/// The byte order mark, U+FEFF.
const BOM: &str = "\u{feff}";

/// `bytes` without the UTF-8 byte order mark it may begin with. RFC 8259 lets a JSON reader
/// skip one, the original platform's reader does, and files saved by some Windows editors and
/// by PowerShell 5 start with one: it is encoding, not content. Anywhere else it is content.
pub fn without_bom(bytes: &[u8]) -> &[u8] {
    bytes.strip_prefix(BOM.as_bytes()).unwrap_or(bytes)
}

/// `text` without the byte order mark it may begin with (see [`without_bom`]).
pub fn text_without_bom(text: &str) -> &str {
    text.strip_prefix(BOM).unwrap_or(text)
}
