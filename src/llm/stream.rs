//! Reading a streamed answer: the Responses API's Server-Sent Events, parsed frame by frame.
//! Text deltas go to the caller as they come; the terminal event (`response.completed`,
//! `.incomplete`, `.failed`) carries the whole response, which is parsed exactly as a
//! non-streamed answer is. A stream that ends or breaks before it, or an `error` event, is a
//! transient failure (the call is retried).

use serde_json::Value;

use super::{AttemptError, LlmEvent, parse::parse_response};
use crate::state::ModelResponse;

/// Splits a byte stream into SSE frames and yields each frame's `data` as JSON.
#[derive(Debug, Default)]
pub(super) struct Frames {
    buffer: Vec<u8>,
}

impl Frames {
    /// Adds bytes; returns the data of every frame they complete (frames without data, or
    /// whose data is not JSON, are skipped).
    pub(super) fn push(&mut self, bytes: &[u8]) -> Vec<Value> {
        self.buffer.extend_from_slice(bytes);
        let mut out = Vec::new();
        while let Some((end, sep)) = frame_end(&self.buffer) {
            let frame: Vec<u8> = self.buffer.drain(..end + sep).take(end).collect();
            let text = String::from_utf8_lossy(&frame);
            let data: Vec<&str> = text
                .lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .map(|d| d.strip_prefix(' ').unwrap_or(d))
                .collect();
            if data.is_empty() {
                continue;
            }
            if let Ok(v) = serde_json::from_str(&data.join("\n")) {
                out.push(v);
            }
        }
        out
    }
}

/// Where the first frame ends, and the length of its separator (a blank line).
fn frame_end(buffer: &[u8]) -> Option<(usize, usize)> {
    let lf = buffer.windows(2).position(|w| w == b"\n\n").map(|i| (i, 2));
    let crlf = buffer
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| (i, 4));
    match (lf, crlf) {
        (Some(a), Some(b)) => Some(if a.0 <= b.0 { a } else { b }),
        (a, b) => a.or(b),
    }
}

/// What one event means for the call.
pub(super) enum Step {
    /// Keep reading.
    More,
    /// The call's answer.
    Done(Box<Result<ModelResponse, AttemptError>>),
}

/// Handles one event: text deltas go to `sink`; a terminal event ends the call.
pub(super) fn step(event: &Value, sink: &(dyn Fn(LlmEvent) + Send + Sync)) -> Step {
    match event.get("type").and_then(Value::as_str) {
        // A refusal is shown as the answer when there is no text, so it streams like text.
        Some("response.output_text.delta" | "response.refusal.delta") => {
            if let Some(delta) = event.get("delta").and_then(Value::as_str)
                && !delta.is_empty()
            {
                sink(LlmEvent::TextDelta(delta.to_string()));
            }
            Step::More
        }
        Some("response.completed" | "response.incomplete" | "response.failed") => {
            let response = event.get("response").cloned().unwrap_or(Value::Null);
            Step::Done(Box::new(parse_response(&response)))
        }
        // An `error` event, or a bare error object framed as an event (gateways relay an
        // upstream failure so).
        Some("error") | None if event.get("type").is_some() || event.get("error").is_some() => {
            let error = event
                .get("error")
                .filter(|e| e.is_object())
                .unwrap_or(event);
            let field = |k: &str| {
                error
                    .get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            Step::Done(Box::new(Err(AttemptError::transient(format!(
                "the model server reported an error mid-stream ({}): {}",
                field("code"),
                field("message")
            )))))
        }
        _ => Step::More,
    }
}

/// Reads a streamed answer to its end.
pub(super) async fn read(
    mut body: super::body::Body,
    sink: &(dyn Fn(LlmEvent) + Send + Sync),
) -> Result<ModelResponse, AttemptError> {
    let mut frames = Frames::default();
    loop {
        let chunk = match body.chunk().await {
            Ok(Some(c)) => c,
            Ok(None) => {
                return Err(AttemptError::transient(
                    "the answer stream ended before response.completed".into(),
                ));
            }
            Err(cut) => {
                return Err(AttemptError::transient(if cut.timed_out {
                    "the model call timed out while streaming".to_string()
                } else {
                    format!("the answer stream broke off ({})", cut.message)
                }));
            }
        };
        for event in frames.push(&chunk) {
            if let Step::Done(result) = step(&event, sink) {
                body.finish();
                return *result;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn frames_are_split_on_blank_lines_across_chunks() {
        let mut f = Frames::default();
        assert!(f.push(b"event: a\ndata: {\"type\":").is_empty());
        let got = f.push(b"\"x\"}\n\nevent: b\r\ndata: {\"type\":\"y\"}\r\n\r\n: comment\n\n");
        assert_eq!(
            got,
            vec![
                serde_json::json!({"type": "x"}),
                serde_json::json!({"type": "y"})
            ]
        );
    }

    /// The official streamed example (its `...` stands for elided deltas and is skipped).
    #[test]
    fn the_official_example_stream_gives_its_deltas_and_its_response() {
        let text = include_str!("../../tests/fixtures/openai/examples/05_streaming_text.sse.txt");
        let deltas = Mutex::new(Vec::new());
        let sink = |e: LlmEvent| {
            if let LlmEvent::TextDelta(d) = e {
                deltas.lock().unwrap().push(d);
            }
        };
        let mut f = Frames::default();
        let mut done = None;
        // The file stops after the last event's data line; a server ends it with a blank line.
        for event in f.push(format!("{text}\n\n").as_bytes()) {
            if let Step::Done(r) = step(&event, &sink) {
                done = Some(r);
                break;
            }
        }
        let response = done.expect("a terminal event").expect("a usable response");
        assert_eq!(
            deltas.lock().unwrap().first().map(String::as_str),
            Some("Hi")
        );
        assert!(matches!(
            response.items.first(),
            Some(crate::state::OutputItem::Text(t)) if t == "Hi there! How can I assist you today?"
        ));
    }
}
