//! OpenAI's hosted tools in a model answer (layer E, beside the reasoner): what the model
//! server ran itself is recorded on the turn and counted; a hosted `mcp` tool's approval
//! request becomes an approval question to the client (the turn waits for it as for client
//! tools), and the client's answer goes back as an `mcp_approval_response`.
//!
//! Owns: those items' effect on the turn. Must not: run a tool (the model server does).

use serde_json::Value;
use tracing::{info, warn};

use super::lifecycle::Run;
use crate::contract::{ToolCall, ToolCallId, ToolResult};
use crate::mcp::approval;
use crate::metrics::{Metrics, ToolOutcome as Counted};
use crate::state::{HostedCall, ToolNote};

/// Records `call`, which the model server ran during the model call, on the turn and in the
/// tool metrics.
pub(super) fn note(run: &mut Run, metrics: &Metrics, call: &HostedCall) {
    let source = approval::hosted_source(call.server_label.as_deref());
    let outcome = if call.failed() {
        Counted::ToolError
    } else {
        Counted::Answered
    };
    if let Some(error) = &call.error {
        warn!(%source, tool = %call.name, %error, "a hosted tool reported an error");
    }
    metrics.tools.call(&source, &call.name, outcome, None);
    let attempt = run.record().attempts;
    run.note_tool(ToolNote {
        tool_call_id: call.id.clone(),
        name: call.name.clone(),
        arguments: call.detail.clone(),
        replayed: false,
        execution_ms: 0,
        attempt,
        source: Some(source),
        outcome: Some(outcome.as_str().to_string()),
        repeated: false,
        start_ms: run.record().ms_since_accepted(),
        result: None,
    });
}

/// The approval question for the model server's request `id` to run `name` on `server_label`,
/// counted as asked in `metrics` when given; `None` (with a warning) when the id cannot be a
/// tool call id.
pub(super) fn question(
    metrics: Option<&Metrics>,
    (id, server_label, name, arguments): (&str, &str, &str, &str),
) -> Option<ToolCall> {
    let source = approval::hosted_source(Some(server_label));
    let Ok(call_id) = ToolCallId::parse(id) else {
        warn!(%source, tool = %name, id, "an approval request with an unusable id; not asked");
        return None;
    };
    if let Some(metrics) = metrics {
        metrics
            .tools
            .call(&source, name, Counted::ApprovalAsked, None);
    }
    info!(%source, tool = %name, id, "a hosted tool's call waits for a person's approval");
    Some(approval::hosted_question(
        &call_id,
        server_label,
        name,
        arguments,
    ))
}

/// The input item carrying the client's answer `r` to the approval question about `tool` on
/// `source`.
pub(super) fn answer(metrics: &Metrics, r: &ToolResult, (source, tool): (&str, &str)) -> Value {
    let answer = approval::answer(&r.outcome);
    let counted = match &answer {
        Ok(()) => Counted::Approved,
        Err(_) => Counted::Denied,
    };
    metrics.tools.call(source, tool, counted, None);
    let id = r.tool_call_id.as_str();
    match &answer {
        Ok(()) => info!(%source, %tool, id, "a person approved the hosted call"),
        Err(reason) => info!(%source, %tool, id, %reason, "a person denied the hosted call"),
    }
    approval::hosted_answer(id, &answer)
}
