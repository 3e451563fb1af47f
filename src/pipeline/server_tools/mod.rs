//! Server tools (AGN-027 layer D): one call of a server-side tool — a built-in one or one of
//! an MCP server an operator plugged in ([`mcp`]) — or its output replayed from the turn's
//! ledger so a retried turn does not run it twice.
//!
//! Owns: dispatch to the built-in registry and the MCP tools, and reading the ledger, as
//! [`ServerTools`]: a type that holds the tools and nothing else (no model client, no store).
//! Must not: loop, call the model, apply a mode change (it hands the change to the reasoner)
//! or write the turn's state (the one write a call needs first, its sent mark, is asked of
//! layer F through [`mcp::SentMarks`]).

pub(super) mod mcp;

use std::sync::Arc;

use serde_json::json;
use tracing::info;

use super::lifecycle::Run;
use super::outcome::TurnResult;
use super::outcome::{RetryKind, RetryableFailure, permanent};
use crate::contract::request::JsonText;
use crate::contract::{ErrorCode, ToolCallId, ToolOutcome, ToolResult};
use crate::mcp::{McpTool, McpTools};
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
    /// For an MCP call: its source, what it came to, and whether it was a repeat.
    pub(super) mcp: Option<McpNote>,
}

/// What the turn's record keeps of an MCP call besides its output.
pub(super) struct McpNote {
    /// The source.
    pub(super) source: String,
    /// `answered`, `tool_error`, `rejected` or `repeat_refused`.
    pub(super) outcome: &'static str,
    /// Made again after a crash left its outcome unknown.
    pub(super) repeated: bool,
}

/// What a server tool call came to.
pub(super) enum ToolEnd {
    /// An output for the model (the tool's answer, or why it was not called).
    Step(ToolStep),
    /// The turn fails (an MCP call left unknown by a crash, by its source's choice).
    Fail(TurnResult),
}

/// Layer D: the server tools a turn may call.
#[derive(Clone)]
pub(super) struct ServerTools {
    registry: ToolRegistry,
    mcp: Option<McpTools>,
}

impl ServerTools {
    /// The tools of `registry`.
    pub(super) fn new(registry: ToolRegistry) -> Self {
        Self {
            registry,
            mcp: None,
        }
    }

    /// Adds the tools of MCP servers.
    pub(super) fn with_mcp(mut self, mcp: McpTools) -> Self {
        self.mcp = Some(mcp);
        self
    }

    /// The MCP tools a turn of `tenant` in mode `mode` is offered (none without sources).
    pub(super) fn offered(&self, mode: &str, tenant: &str) -> Vec<Arc<McpTool>> {
        self.mcp
            .as_ref()
            .map(|m| m.offered(mode, tenant))
            .unwrap_or_default()
    }

    /// Runs (or replays from the ledger) one server tool call; `mcp_tool` is the MCP tool of
    /// that name the turn was offered, if it is one. `run` is written only through `marks`.
    pub(super) async fn run(
        &self,
        run: &mut Run,
        progress: &mut TurnProgress,
        call_id: &str,
        (name, mcp_tool): (&str, Option<&Arc<McpTool>>),
        arguments: &str,
        marks: &dyn mcp::SentMarks,
    ) -> Result<ToolEnd, RetryableFailure> {
        let step = |output: String, effect, record| ToolStep {
            output,
            effect,
            record,
            mcp: None,
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
            return Ok(ToolEnd::Step(step(out, None, false)));
        }
        if let (Some(mcp), Some(tool)) = (&self.mcp, mcp_tool) {
            return mcp::call(mcp, tool, (run, progress), call_id, arguments, marks).await;
        }
        let Some(tool) = self.registry.get(name) else {
            let missing =
                json!({"error": format!("Tool '{name}' is not implemented on the server.")});
            return Ok(ToolEnd::Step(step(missing.to_string(), None, false)));
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
        let step = match outcome {
            ToolRun::Ok(value) => {
                progress.server_tool_results.push(result(&value));
                step(value.to_string(), None, true)
            }
            ToolRun::ChangeMode { output, effect } => {
                progress.server_tool_results.push(result(&output));
                step(output.to_string(), Some(effect), true)
            }
            ToolRun::Rejected(message) => {
                info!(tool = %name, %message, "server tool rejected its arguments");
                progress.server_tool_results.push(ToolResult {
                    tool_call_id,
                    execution_ms,
                    outcome: ToolOutcome::Error(message.clone()),
                });
                let output = json!({"success": false, "error": message}).to_string();
                step(output, None, true)
            }
            ToolRun::Unavailable(message) => {
                return Err(RetryableFailure {
                    error: permanent(ErrorCode::ToolUnavailable, format!("{name}: {message}")),
                    kind: RetryKind::Failure,
                });
            }
        };
        Ok(ToolEnd::Step(step))
    }
}
