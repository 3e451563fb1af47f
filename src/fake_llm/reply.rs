//! What the fake answers: the replies a test scripts, and the deterministic answer when none
//! is scripted (read from the request's last user message: `#fake:call <tool> <json>` lines
//! make it call tools; tool outputs without a new user message end the loop).
//!
//! Owns: choosing the answer. Must not: shape it as a `Response` (the caller does).

use std::time::Duration;

use serde_json::Value;

/// One scripted answer.
#[derive(Debug, Clone)]
pub enum Reply {
    /// A completed text answer.
    Text(String),
    /// Function calls `(name, arguments)`, in order, each with a fresh `call_id`.
    Calls(Vec<(String, Value)>),
    /// A refusal.
    Refusal(String),
    /// Text cut short (`status: incomplete`, reason `max_output_tokens`).
    Incomplete(String),
    /// An output item of a type clients do not handle, followed by text.
    UnknownItemThenText(String),
    /// The model uses one of OpenAI's hosted tools (see [`super::HostedUse`]).
    Hosted(super::HostedUse),
    /// An answer with no usable output (an empty output array).
    Empty,
    /// An HTTP error with an OpenAI-style error body and optional retry headers.
    Error {
        /// HTTP status.
        status: u16,
        /// The error message.
        message: String,
        /// `retry-after-ms` header.
        retry_after_ms: Option<u64>,
    },
    /// A 200 whose body is not JSON.
    Malformed,
    /// A `status: failed` response with this error code.
    Failed(String),
    /// Wait, then give the inner reply (for timeouts).
    Delay(Duration, Box<Reply>),
    /// To a `stream: true` request: half of this text's deltas, then the connection breaks
    /// (no `response.completed`); without streaming, a 500.
    BrokenStream(String),
}

/// A message's text: its string content, or its parts' texts one per line.
pub(super) fn content_text(content: Option<&Value>) -> String {
    match content {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Array(parts)) => parts
            .iter()
            .filter_map(|p| p.get("text").and_then(Value::as_str))
            .collect::<Vec<_>>()
            .join("\n"),
        _ => String::new(),
    }
}

/// The text of the last user message (for the default reply).
fn last_user_text(req: &Value) -> String {
    let items = req
        .get("input")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    for item in items.iter().rev() {
        if item.get("role").and_then(Value::as_str) == Some("user") {
            return content_text(item.get("content"));
        }
    }
    String::new()
}

/// The deterministic answer when no reply is scripted.
pub(super) fn default_reply(req: &Value) -> Reply {
    // Tool outputs sent after the last user message (a replayed conversation carries the
    // earlier ones and the message that asked for them).
    let items = req
        .get("input")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let since_user = items
        .iter()
        .rposition(|i| i.get("role").and_then(Value::as_str) == Some("user"))
        .map_or(items, |at| &items[at + 1..]);
    let outputs = since_user
        .iter()
        .filter(|i| i.get("type").and_then(Value::as_str) == Some("function_call_output"))
        .count();
    if outputs > 0 {
        return Reply::Text(format!("Received {outputs} tool output(s); done."));
    }
    if let Some(answered) = super::hosted::answered(since_user) {
        return Reply::Hosted(answered);
    }
    let text = last_user_text(req);
    if let Some(used) = text.lines().find_map(super::hosted::asked) {
        return Reply::Hosted(used);
    }
    let calls: Vec<(String, Value)> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("#fake:call "))
        .filter_map(|rest| {
            let (name, args) = rest.split_once(' ').unwrap_or((rest, "{}"));
            Some((name.to_string(), serde_json::from_str(args).ok()?))
        })
        .collect();
    if !calls.is_empty() && outputs == 0 {
        return Reply::Calls(calls);
    }
    let mode = text
        .lines()
        .next()
        .and_then(|l| l.strip_prefix("[MODE: "))
        .and_then(|l| l.strip_suffix(']'))
        .unwrap_or("?");
    let instruction = text
        .split("[INSTRUCTION]\n")
        .nth(1)
        .and_then(|s| s.lines().next())
        .unwrap_or("")
        .trim();
    let chunks = text.matches("=== CHUNK ").count();
    Reply::Text(format!(
        "Fake answer in mode {mode} to: {instruction} ({chunks} context chunk(s) seen)"
    ))
}
