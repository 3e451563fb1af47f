//! Server tools (AGN-027 layer D): one call of a server-side tool, recorded in the turn's
//! ledger so a retried turn does not run it twice.
//!
//! Owns: dispatch to the tool registry and the ledger. Must not: loop or call the model.

use serde_json::json;
use tracing::info;

use super::{Pipeline, RetryableFailure, Run, permanent};
use crate::contract::request::JsonText;
use crate::contract::{ErrorCode, ToolCallId, ToolOutcome, ToolResult};
use crate::store::TurnProgress;
use crate::tools::{ToolContext, ToolRun};

impl Pipeline {
    /// Runs (or replays from the ledger) one server tool call; returns the output for the model.
    pub(super) async fn run_server_tool(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
        call_id: &str,
        name: &str,
        arguments: &str,
    ) -> Result<String, RetryableFailure> {
        if let Some(out) = run.record.tool_ledger.get(call_id).cloned() {
            info!(tool = %name, call_id, "reusing the recorded output of a server tool");
            let listed = progress
                .server_tool_results
                .iter()
                .any(|r| r.tool_call_id.as_str() == call_id);
            if !listed && let Ok(id) = ToolCallId::parse(call_id) {
                let outcome = JsonText::parse(out.as_str())
                    .map(ToolOutcome::Result)
                    .unwrap_or_else(|_| ToolOutcome::Error(out.clone()));
                progress.server_tool_results.push(ToolResult {
                    tool_call_id: id,
                    execution_ms: 0,
                    outcome,
                });
            }
            return Ok(out);
        }
        let Some(tool) = self.tools.get(name) else {
            return Ok(
                json!({"error": format!("Tool '{name}' is not implemented on the server.")})
                    .to_string(),
            );
        };
        let ctx = ToolContext {
            session_id: run.session.session_id.clone(),
            turn_id: run.record.turn_id.clone(),
            current_mode_key: run.session.mode_key.clone(),
            lease: run.lease().clone(),
        };
        let started = std::time::Instant::now();
        let outcome = tool.run(&ctx, arguments).await;
        let execution_ms = started.elapsed().as_millis() as u64;
        let tool_call_id = ToolCallId::parse(call_id).unwrap_or_else(|_| ToolCallId::generate());
        let output = match outcome {
            ToolRun::Ok(value) => {
                if name == crate::catalog::CHANGE_MODE_TOOL {
                    self.apply_mode_change(run, progress).await?;
                }
                progress.server_tool_results.push(ToolResult {
                    tool_call_id,
                    execution_ms,
                    outcome: ToolOutcome::Result(JsonText::from_value(&value)),
                });
                value.to_string()
            }
            ToolRun::Rejected(message) => {
                info!(tool = %name, %message, "server tool rejected its arguments");
                progress.server_tool_results.push(ToolResult {
                    tool_call_id,
                    execution_ms,
                    outcome: ToolOutcome::Error(message.clone()),
                });
                json!({"success": false, "error": message}).to_string()
            }
            ToolRun::Unavailable(message) => {
                return Err(RetryableFailure {
                    error: permanent(ErrorCode::ToolUnavailable, format!("{name}: {message}")),
                });
            }
        };
        self.record_tool_output(run, call_id, &output).await?;
        // The checkpoint's progress must include this tool's result for a resumed run.
        if let Some(cp) = run.record.checkpoint.as_mut() {
            cp.progress = progress.clone();
        }
        Ok(output)
    }
}
