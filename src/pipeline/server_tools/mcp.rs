//! Layer D's executor for MCP tools: one call of a tool an operator plugged in, exactly once
//! where that matters.
//!
//! In order: the arguments are checked against the tool's schema (a mismatch answers the
//! model; the server is not called). A call the ledger marks as sent by an earlier run that
//! died before recording its answer is made again only when the tool is safe to repeat
//! (read-only or idempotent, or the operator says so); otherwise the model is told the
//! earlier attempt's outcome is unknown (or, by the source's `unknownOutcome: "fail"`, the
//! turn fails with `TOOL_OUTCOME_UNKNOWN`). Every call is marked sent (by layer F, through
//! [`SentMarks`]) before it goes out, and the mark taken back when the call is known not to
//! have left (not connected, refused, a connection that never opened): the mark of a tool
//! safe to repeat counts the repeat (`aptix_tool_calls_total{outcome="repeated"}`). Every call carries an idempotency key
//! in `_meta` so a server can de-duplicate by itself. A result with `isError` is the tool's
//! answer, for the model; a call that could not run (source down, protocol error, timeout)
//! fails the turn retryably, like a model server that is down.
//!
//! Owns: that order. Must not: write the store (the sent mark is layer F's) or call the model.

use std::sync::Arc;
use std::time::Instant;

use serde_json::{Map, Value, json};
use sha2::Digest as _;
use tracing::{info, warn};

use super::super::lifecycle::Run;
use super::super::outcome::{RetryKind, RetryableFailure, permanent};
use super::{McpNote, ToolEnd, ToolStep};
use crate::contract::request::JsonText;
use crate::contract::{ErrorCode, InvokeResult, ToolCallId, ToolOutcome, ToolResult};
use crate::mcp::sources::Unknown;
use crate::mcp::{McpTool, McpTools};
use crate::metrics::ToolOutcome as Counted;
use crate::state::TurnProgress;

/// The writes an MCP call asks of the turn's lifecycle (layer F): the mark that it was sent,
/// before it goes out, and taking the mark back when it is known not to have left.
#[async_trait::async_trait]
pub(in crate::pipeline) trait SentMarks: Send + Sync {
    /// Marks call `call_id` as sent in the turn's ledger, fenced by the run's lease.
    async fn mark_sent(&self, run: &mut Run, call_id: &str) -> Result<(), RetryableFailure>;
    /// Marks call `call_id` as not sent after all.
    async fn unmark_sent(&self, run: &mut Run, call_id: &str) -> Result<(), RetryableFailure>;
}

/// The lifecycle writes the mark as a ledger entry ([`crate::state::sent_key`]), fenced by the
/// run's lease like a tool's output.
#[async_trait::async_trait]
impl SentMarks for super::super::lifecycle::Lifecycle {
    async fn mark_sent(&self, run: &mut Run, call_id: &str) -> Result<(), RetryableFailure> {
        let sent = crate::state::sent_key(call_id);
        self.record_tool_output(run, &sent, &crate::store::now_rfc3339(), None)
            .await
            .map(|_| ())
    }

    async fn unmark_sent(&self, run: &mut Run, call_id: &str) -> Result<(), RetryableFailure> {
        let sent = crate::state::sent_key(call_id);
        self.record_tool_output(run, &sent, crate::state::NOT_SENT, None)
            .await
            .map(|_| ())
    }
}

/// The idempotency key of call `call_id` of a turn: the first 32 hex digits of the SHA-256 of
/// `<session within its tenant>/<turn>/<call_id>` (the same on every attempt of the call).
pub fn idempotency_key(session: &str, turn: &str, call_id: &str) -> String {
    let digest = sha2::Sha256::digest(format!("{session}/{turn}/{call_id}").as_bytes());
    crate::hex::lower(&digest[..16])
}

/// Runs one call of `tool` (see the module's doc).
pub(super) async fn call(
    mcp: &McpTools,
    tool: &Arc<McpTool>,
    (run, progress): (&mut Run, &mut TurnProgress),
    call_id: &str,
    arguments: &str,
    marks: &dyn SentMarks,
) -> Result<ToolEnd, RetryableFailure> {
    let counted = |outcome, took| {
        mcp.metrics()
            .tools
            .call(&tool.source, &tool.remote, outcome, took)
    };
    let tool_call_id = ToolCallId::parse(call_id).unwrap_or_else(|_| ToolCallId::generate());
    let answer = |progress: &mut TurnProgress,
                  (output, error, ms): (String, bool, u64),
                  (counted_as, repeated): (Counted, bool)| {
        let outcome = if error {
            ToolOutcome::Error(output.clone())
        } else {
            ToolOutcome::Result(
                JsonText::parse(output.as_str())
                    .unwrap_or_else(|_| JsonText::from_value(&Value::String(output.clone()))),
            )
        };
        progress.server_tool_results.push(ToolResult {
            tool_call_id: tool_call_id.clone(),
            execution_ms: ms,
            outcome,
        });
        Ok(ToolEnd::Step(ToolStep {
            output,
            effect: None,
            record: true,
            mcp: Some(McpNote {
                source: tool.source.clone(),
                outcome: counted_as.as_str(),
                repeated,
            }),
        }))
    };
    let args = match tool.arguments(arguments) {
        Ok(args) => args,
        Err(message) => {
            info!(tool = %tool.def.name, %message, "MCP tool call refused: its arguments do not match the schema");
            counted(Counted::Rejected, None);
            let output = json!({"success": false, "error": message}).to_string();
            return answer(progress, (output, true, 0), (Counted::Rejected, false));
        }
    };
    let source = mcp.source(&tool.source);
    let repeated = run.record().was_sent(call_id);
    if repeated {
        if tool.repeat_safe {
            warn!(tool = %tool.def.name, call_id, "an earlier run sent this call and died before its answer was recorded; the tool is safe to repeat, so it is called again");
            counted(Counted::Repeated, None);
        } else {
            counted(Counted::RepeatRefused, None);
            let message = format!(
                "An earlier attempt of this call to {} was sent, but the worker running it stopped before its answer was recorded: whether it took effect is unknown. It was not made again because the tool may not be safe to repeat. Check its effect before calling it again.",
                tool.def.name
            );
            warn!(tool = %tool.def.name, call_id, "an earlier run sent this call and died before its answer was recorded; the tool may not repeat, so it is not called again");
            if source.map(|s| s.unknown_outcome) == Some(Unknown::Fail) {
                return Ok(ToolEnd::Fail(InvokeResult::failure(permanent(
                    ErrorCode::ToolOutcomeUnknown,
                    message,
                ))));
            }
            let output = json!({"success": false, "outcomeUnknown": true, "error": message});
            return answer(
                progress,
                (output.to_string(), true, 0),
                (Counted::RepeatRefused, false),
            );
        }
    }
    // Nothing is marked for a call that cannot leave now: it fails as a source that is down.
    if !mcp.connected(tool) {
        counted(Counted::Failed, None);
        return Err(unavailable(tool, "its source is not connected"));
    }
    // A place among the source's calls in flight is taken before the mark: a call waiting
    // for one has not left, and a run that dies waiting must not leave it "sent".
    let slot = match mcp.reserve(tool).await {
        Ok(slot) => slot,
        Err(failure) => {
            counted(Counted::Failed, None);
            warn!(tool = %tool.def.name, error = %failure, "an MCP tool call could not be sent; the turn is tried again later");
            return Err(unavailable(tool, &failure.to_string()));
        }
    };
    marks.mark_sent(run, call_id).await?;
    let mut meta = Map::new();
    let session = run.record().session_id.to_string();
    let turn = run.record().turn_id.to_string();
    meta.insert(
        "idempotencyKey".into(),
        Value::String(idempotency_key(&session, &turn, call_id)),
    );
    if let Some(trace) = crate::trace::TraceContext::current() {
        meta.insert("traceparent".into(), Value::String(trace.header()));
    }
    let cap = source.map_or(16 * 1024, |s| s.max_output_bytes);
    let started = Instant::now();
    let result = slot.call(&tool.remote, args, meta).await;
    let took = started.elapsed();
    match result {
        Ok(result) => {
            let out = crate::mcp::output::model_output(&result, cap);
            let outcome = if out.is_error {
                Counted::ToolError
            } else {
                Counted::Answered
            };
            counted(outcome, Some(took));
            if out.cut {
                info!(tool = %tool.def.name, max_bytes = cap, "the tool's output was cut to the source's cap");
            }
            let ms = took.as_millis() as u64;
            answer(progress, (out.text, out.is_error, ms), (outcome, repeated))
        }
        Err(failure) => {
            counted(Counted::Failed, Some(took));
            warn!(tool = %tool.def.name, error = %failure, may_have_run = failure.may_have_run(), "an MCP tool could not run; the turn is tried again later");
            if !failure.may_have_run() {
                // Known not to have left (or refused unrun): the next run calls it as new.
                marks.unmark_sent(run, call_id).await?;
            }
            Err(unavailable(tool, &failure.to_string()))
        }
    }
}

/// The retryable failure of a call of `tool` that could not run.
fn unavailable(tool: &McpTool, why: &str) -> RetryableFailure {
    RetryableFailure {
        error: permanent(
            ErrorCode::ToolUnavailable,
            format!("{}: {why}", tool.def.name),
        ),
        kind: RetryKind::Failure,
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_idempotency_key_is_stable_and_per_call() {
        let k = super::idempotency_key("acme/s1", "t1", "call_1");
        assert_eq!(k.len(), 32);
        assert_eq!(k, super::idempotency_key("acme/s1", "t1", "call_1"));
        assert_ne!(k, super::idempotency_key("acme/s1", "t1", "call_2"));
        assert_ne!(k, super::idempotency_key("other/s1", "t1", "call_1"));
    }
}
