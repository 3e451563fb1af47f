//! The client tools this CLI answers itself when it acts as the client of a turn
//! (`aptix run <files>`): `workspace_read_file` reads from a local folder, as the IDE
//! extension would.
//!
//! Owns: running one client tool call. Must not: submit anything.

use std::path::Path;
use std::time::Instant;

use serde_json::{Value, json};

use aptix_worker::catalog::READ_FILE_TOOL;
use aptix_worker::contract::ToolCall;
use aptix_worker::contract::request::RelativePath;

/// Runs one client tool call the way the IDE extension would: `workspace_read_file` reads from
/// `workspace`; other tools are reported as not implemented by this client. The answer is one
/// `toolResults` entry of a continuation.
pub fn client_tool(workspace: &Path, call: &ToolCall) -> Value {
    let id = call.tool_call_id.as_str();
    let name = call.name.as_str();
    let fail = |msg: String| json!({"toolCallId": id, "executionMs": 0, "errorMessage": msg});
    if name != READ_FILE_TOOL {
        return fail(format!("this client does not implement {name}"));
    }
    let started = Instant::now();
    let args: Value = serde_json::from_str(call.arguments_json.as_str()).unwrap_or_default();
    let Some(path) = args.get("path").and_then(Value::as_str) else {
        return fail("missing 'path'".into());
    };
    let Ok(rel) = RelativePath::parse(path) else {
        return fail(format!(
            "{path:?} is not a relative path inside the workspace"
        ));
    };
    match std::fs::read_to_string(workspace.join(rel.as_str())) {
        Ok(text) => json!({
            "toolCallId": id,
            "executionMs": u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
            "resultJson": json!({"path": path, "contents": text}).to_string(),
        }),
        Err(e) => fail(format!("cannot read {path}: {e}")),
    }
}
