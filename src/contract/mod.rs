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
pub use ids::{SessionId, ToolCallId, TurnId};
pub use invoke::{ErrorMessage, InvokeResult};
pub use request::{
    AgentExecuteRequest, OnBusy, ParsedRequest, RequestLimits, RequestRejected, ToolContinuation,
    ToolOutcome, ToolResult, UserTurn, parse_request,
};
pub use response::{
    AgentExecuteResponse, ClientToolContinuation, FinalResponse, SessionMeta, ToolCall, Usage,
};
pub use tool_match::{ToolResultsMismatch, check_tool_results};
