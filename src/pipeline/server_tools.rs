//! Server tools (AGN-027 layer D): one call of a server-side tool, or its output replayed from
//! the turn's ledger so a retried turn does not run it twice.
//!
//! Owns: dispatch to the tool registry and reading the ledger, as [`ServerTools`]: a type that
//! holds the tools and nothing else (no model client, no store). Must not: loop, call the
//! model, apply a mode change (it hands the change to the reasoner) or write the turn's state.

use serde_json::json;
use tracing::info;

use super::lifecycle::Run;
use super::outcome::{RetryKind, RetryableFailure, permanent};
use crate::contract::request::JsonText;
use crate::contract::{ErrorCode, ToolCallId, ToolOutcome, ToolResult};
use crate::state::TurnProgress;
use crate::tools::{ModeEffect, ToolContext, ToolRegistry, ToolRun};

/// What one server tool call came to.
pub(super) struct ToolStep {
    /// The output for the model.
    pub(super) output: String,
    /// A mode change the tool asks for, to apply before the output is recorded.
    pub(super) effect: Option<ModeEffect>,
    /// Whether the output still has to be recorded in the ledger (not when it came from
    /// there, or when no tool ran).
    pub(super) record: bool,
}

/// Layer D: the server tools a turn may call.
#[derive(Clone)]
pub(super) struct ServerTools {
    registry: ToolRegistry,
}

impl ServerTools {
    /// The tools of `registry`.
    pub(super) fn new(registry: ToolRegistry) -> Self {
        Self { registry }
    }

    /// Runs (or replays from the ledger) one server tool call; `run` is only read.
    pub(super) async fn run(
        &self,
        run: &Run,
        progress: &mut TurnProgress,
        call_id: &str,
        name: &str,
        arguments: &str,
    ) -> Result<ToolStep, RetryableFailure> {
        let step = |output: String, effect, record| ToolStep {
            output,
            effect,
            record,
        };
        if let Some(out) = run.record().tool_ledger.get(call_id).cloned() {
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
            return Ok(step(out, None, false));
        }
        let Some(tool) = self.registry.get(name) else {
            let missing =
                json!({"error": format!("Tool '{name}' is not implemented on the server.")});
            return Ok(step(missing.to_string(), None, false));
        };
        let ctx = ToolContext {
            session_id: run.session().session_id.clone(),
            turn_id: run.record().turn_id.clone(),
            current_mode_key: run.session().mode_key.clone(),
        };
        let started = std::time::Instant::now();
        let outcome = tool.run(&ctx, arguments).await;
        let execution_ms = started.elapsed().as_millis() as u64;
        let tool_call_id = ToolCallId::parse(call_id).unwrap_or_else(|_| ToolCallId::generate());
        let result = |value: &serde_json::Value| ToolResult {
            tool_call_id: tool_call_id.clone(),
            execution_ms,
            outcome: ToolOutcome::Result(JsonText::from_value(value)),
        };
        match outcome {
            ToolRun::Ok(value) => {
                progress.server_tool_results.push(result(&value));
                Ok(step(value.to_string(), None, true))
            }
            ToolRun::ChangeMode { output, effect } => {
                progress.server_tool_results.push(result(&output));
                Ok(step(output.to_string(), Some(effect), true))
            }
            ToolRun::Rejected(message) => {
                info!(tool = %name, %message, "server tool rejected its arguments");
                progress.server_tool_results.push(ToolResult {
                    tool_call_id,
                    execution_ms,
                    outcome: ToolOutcome::Error(message.clone()),
                });
                let output = json!({"success": false, "error": message}).to_string();
                Ok(step(output, None, true))
            }
            ToolRun::Unavailable(message) => Err(RetryableFailure {
                error: permanent(ErrorCode::ToolUnavailable, format!("{name}: {message}")),
                kind: RetryKind::Failure,
            }),
        }
    }
}
