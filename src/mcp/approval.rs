//! A person's approval of a server tool call, within AGN-033's closed kinds: the turn ends as a
//! `client_tool_continuation` whose pending call is the client tool [`APPROVAL_TOOL`], under
//! the model's own call id, with what is to be approved as its arguments:
//!
//! ```json
//! {"toolCallId": "call_…", "name": "aptix_approve_server_tool",
//!  "argumentsJson": "{\"tool\":\"tickets_file_ticket\",\"source\":\"tickets\",\"arguments\":{…},\"annotations\":{…}}"}
//! ```
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

/// What was asked: the tool's name and its arguments (JSON text), read back from the pending
/// call; `None` when the call is not an approval question.
pub fn asked(call: &ToolCall) -> Option<(String, String)> {
    if call.name != APPROVAL_TOOL {
        return None;
    }
    let v: Value = serde_json::from_str(call.arguments_json.as_str()).ok()?;
    let tool = v.get("tool")?.as_str()?.to_string();
    let arguments = match v.get("arguments")? {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    Some((tool, arguments))
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
}
