//! A person's approval of a server tool call, within AGN-033's closed kinds: the turn ends as a
//! `client_tool_continuation` whose pending call is the client tool [`APPROVAL_TOOL`], under
//! the model's own call id, with what is to be approved as its arguments:
//!
//! ```json
//! {"toolCallId": "call_…", "name": "aptix_approve_server_tool",
//!  "argumentsJson": "{\"tool\":\"tickets_file_ticket\",\"source\":\"tickets\",\"arguments\":{…},\"annotations\":{…}}"}
//! ```
//!
//! A hosted `mcp` tool's approval request (OpenAI's own MCP tool, run by the model server) is
//! asked the same way, under the request's id, with `"source": "openai:<server_label>"` and
//! `"hosted": true`; its answer goes back to the model server as an `mcp_approval_response`.
//!
//! The client answers it like any client tool: `resultJson` `{"approved": true}` runs the call
//! (and the model gets the tool's output), `{"approved": false, "reason": "…"}` — or an
//! `errorMessage`, or anything else — denies it (the model is told a person denied it, and
//! why).
//!
//! Owns: the shape of the question and the reading of the answer. Must not: run anything.

use serde_json::{Value, json};

use super::McpTool;
use crate::contract::request::JsonText;
use crate::contract::{ToolCall, ToolCallId, ToolOutcome};

/// The client tool that asks for a person's approval.
pub const APPROVAL_TOOL: &str = "aptix_approve_server_tool";

/// The pending call asking to approve the model's call `call_id` of `tool` with `arguments`
/// (its JSON text as the model wrote it).
pub fn question(call_id: &ToolCallId, tool: &McpTool, arguments: &str) -> ToolCall {
    let args = serde_json::from_str::<Value>(arguments)
        .unwrap_or_else(|_| Value::String(arguments.to_string()));
    ToolCall {
        tool_call_id: call_id.clone(),
        name: APPROVAL_TOOL.to_string(),
        arguments_json: JsonText::from_value(&json!({
            "tool": tool.def.name,
            "source": tool.source,
            "arguments": args,
            "annotations": tool.hints,
        })),
    }
}

/// The pending call asking to approve a hosted `mcp` tool's call: the approval request `id`
/// the model server made for `name` on `server_label` with `arguments` (JSON text).
pub fn hosted_question(
    id: &ToolCallId,
    server_label: &str,
    name: &str,
    arguments: &str,
) -> ToolCall {
    let args = serde_json::from_str::<Value>(arguments)
        .unwrap_or_else(|_| Value::String(arguments.to_string()));
    ToolCall {
        tool_call_id: id.clone(),
        name: APPROVAL_TOOL.to_string(),
        arguments_json: JsonText::from_value(&json!({
            "tool": name,
            "source": hosted_source(Some(server_label)),
            "arguments": args,
            "hosted": true,
        })),
    }
}

/// The source a hosted tool's calls are counted and recorded under: `openai`, or
/// `openai:<server_label>` for a hosted MCP server.
pub fn hosted_source(server_label: Option<&str>) -> String {
    match server_label {
        Some(label) => format!("openai:{label}"),
        None => "openai".to_string(),
    }
}

/// What an approval question asks.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Asked {
    /// A call of one of our MCP tools: its name and arguments (JSON text).
    Server {
        /// The tool as the model named it.
        tool: String,
        /// The arguments as the model wrote them.
        arguments: String,
    },
    /// A hosted `mcp` tool's call, which the model server runs once approved.
    Hosted {
        /// `openai:<server_label>`.
        source: String,
        /// The tool's name on that server.
        tool: String,
    },
}

/// What was asked, read back from the pending call; `None` when the call is not an approval
/// question.
pub fn asked(call: &ToolCall) -> Option<Asked> {
    if call.name != APPROVAL_TOOL {
        return None;
    }
    let v: Value = serde_json::from_str(call.arguments_json.as_str()).ok()?;
    let tool = v.get("tool")?.as_str()?.to_string();
    if v.get("hosted").and_then(Value::as_bool) == Some(true) {
        let source = v.get("source")?.as_str()?.to_string();
        return Some(Asked::Hosted { source, tool });
    }
    let arguments = match v.get("arguments")? {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some(Asked::Server { tool, arguments })
}

/// The input item answering the model server's approval request `id`.
pub fn hosted_answer(id: &str, answer: &Result<(), String>) -> Value {
    match answer {
        Ok(()) => {
            json!({"type": "mcp_approval_response", "approval_request_id": id, "approve": true})
        }
        Err(reason) => json!({
            "type": "mcp_approval_response", "approval_request_id": id, "approve": false,
            "reason": reason,
        }),
    }
}

/// The client's answer: `Ok(())` approved, `Err(reason)` denied.
pub fn answer(outcome: &ToolOutcome) -> Result<(), String> {
    match outcome {
        ToolOutcome::Error(message) => Err(message.clone()),
        ToolOutcome::Result(json) => {
            let v: Value = serde_json::from_str(json.as_str()).unwrap_or(Value::Null);
            match v.get("approved").and_then(Value::as_bool) {
                Some(true) => Ok(()),
                Some(false) => Err(v
                    .get("reason")
                    .and_then(Value::as_str)
                    .unwrap_or("no reason given")
                    .to_string()),
                None => Err(format!(
                    "the answer was not {{\"approved\": true}} but {}",
                    json.as_str()
                )),
            }
        }
    }
}

/// The tool output the model gets for a denied call.
pub fn denied_output(tool: &str, reason: &str) -> String {
    json!({
        "success": false,
        "denied": true,
        "error": format!("A person denied this call to {tool}: {reason}. It was not run."),
    })
    .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_approves_only_when_it_says_so() {
        let result = |t: &str| ToolOutcome::Result(JsonText::parse(t).unwrap());
        assert_eq!(answer(&result(r#"{"approved": true}"#)), Ok(()));
        assert_eq!(
            answer(&result(r#"{"approved": false, "reason": "not today"}"#)),
            Err("not today".into())
        );
        assert!(answer(&result(r#"{"ok": 1}"#)).is_err());
        assert_eq!(answer(&ToolOutcome::Error("no".into())), Err("no".into()));
    }

    #[test]
    fn a_hosted_question_reads_back_as_hosted() {
        let id = ToolCallId::parse("mcpr_1").unwrap();
        let q = hosted_question(&id, "docs", "delete_page", r#"{"page": 7}"#);
        assert_eq!(q.name, APPROVAL_TOOL);
        assert_eq!(
            asked(&q),
            Some(Asked::Hosted {
                source: "openai:docs".into(),
                tool: "delete_page".into()
            })
        );
        let v: Value = serde_json::from_str(q.arguments_json.as_str()).unwrap();
        assert_eq!(v["arguments"], json!({"page": 7}));
        assert_eq!(
            hosted_answer("mcpr_1", &Err("no".into())),
            json!({"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": false, "reason": "no"})
        );
    }
}
