//! The fake's streamed answers: a finished `Response` object told as the Responses API's
//! Server-Sent Events — `response.created`, `response.in_progress`, then per output item
//! `response.output_item.added`, its content (`response.content_part.added`,
//! `response.output_text.delta` …/`.done`, `response.content_part.done`, or
//! `response.function_call_arguments.delta` …/`.done`), `response.output_item.done`, and last
//! `response.completed` (`.incomplete`, `.failed` as the response's status says).

use std::time::Duration;

use axum::body::Body;
use axum::http::{HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

/// `text` cut into at most `pieces` parts on character boundaries (an empty text is one
/// empty part).
pub(super) fn cut(text: &str, pieces: usize) -> Vec<String> {
    let chars: Vec<char> = text.chars().collect();
    if chars.is_empty() {
        return vec![String::new()];
    }
    let size = chars.len().div_ceil(pieces.max(1));
    chars.chunks(size).map(|c| c.iter().collect()).collect()
}

/// The events telling `response`, in order (without sequence numbers).
pub(super) fn sequence(response: &Value, pieces: usize) -> Vec<Value> {
    let mut head = response.clone();
    head["status"] = json!("in_progress");
    head["output"] = json!([]);
    head["usage"] = Value::Null;
    let mut events = vec![
        json!({"type": "response.created", "response": head}),
        json!({"type": "response.in_progress", "response": head}),
    ];
    let output = response["output"].as_array().cloned().unwrap_or_default();
    for (index, item) in output.iter().enumerate() {
        let id = item["id"].clone();
        let mut opening = item.clone();
        opening["status"] = json!("in_progress");
        match item["type"].as_str() {
            Some("message") => opening["content"] = json!([]),
            Some("function_call") => opening["arguments"] = json!(""),
            _ => {}
        }
        events.push(
            json!({"type": "response.output_item.added", "output_index": index, "item": opening}),
        );
        match item["type"].as_str() {
            Some("message") => {
                let parts = item["content"].as_array().cloned().unwrap_or_default();
                for (content_index, part) in parts.iter().enumerate() {
                    let at = json!({"item_id": id, "output_index": index, "content_index": content_index});
                    let with = |mut event: Value| {
                        if let (Some(e), Some(a)) = (event.as_object_mut(), at.as_object()) {
                            e.extend(a.clone());
                        }
                        event
                    };
                    let (kind, full) = match part["type"].as_str() {
                        Some("refusal") => {
                            ("refusal", part["refusal"].as_str().unwrap_or_default())
                        }
                        _ => ("output_text", part["text"].as_str().unwrap_or_default()),
                    };
                    let mut empty = part.clone();
                    empty[if kind == "refusal" { "refusal" } else { "text" }] = json!("");
                    events.push(with(
                        json!({"type": "response.content_part.added", "part": empty}),
                    ));
                    for piece in cut(full, pieces) {
                        events.push(with(if kind == "refusal" {
                            json!({"type": "response.refusal.delta", "delta": piece})
                        } else {
                            json!({"type": "response.output_text.delta", "delta": piece, "logprobs": []})
                        }));
                    }
                    events.push(with(if kind == "refusal" {
                        json!({"type": "response.refusal.done", "refusal": full})
                    } else {
                        json!({"type": "response.output_text.done", "text": full, "logprobs": []})
                    }));
                    events.push(with(
                        json!({"type": "response.content_part.done", "part": part}),
                    ));
                }
            }
            Some("function_call") => {
                let arguments = item["arguments"].as_str().unwrap_or_default();
                for piece in cut(arguments, pieces) {
                    events.push(json!({"type": "response.function_call_arguments.delta", "item_id": id, "output_index": index, "delta": piece}));
                }
                events.push(json!({"type": "response.function_call_arguments.done", "item_id": id, "output_index": index, "name": item["name"], "arguments": arguments}));
            }
            _ => {}
        }
        events.push(
            json!({"type": "response.output_item.done", "output_index": index, "item": item}),
        );
    }
    let last = match response["status"].as_str() {
        Some("failed") => "response.failed",
        Some("incomplete") => "response.incomplete",
        _ => "response.completed",
    };
    events.push(json!({"type": last, "response": response}));
    events
}

/// A `text/event-stream` answer telling `response`, one event every `delay`; `broken` stops
/// it halfway through the text, breaking the connection as a failing server would.
/// `on_first_delta` runs when the first text delta is handed to the connection.
pub(super) fn events(
    response: Value,
    pieces: usize,
    delay: Duration,
    broken: bool,
    on_first_delta: Box<dyn FnOnce() + Send>,
) -> Response {
    let mut events = sequence(&response, pieces);
    for (n, e) in events.iter_mut().enumerate() {
        e["sequence_number"] = json!(n);
    }
    if broken {
        // Up to and including half of the text's deltas.
        let deltas: Vec<usize> = events
            .iter()
            .enumerate()
            .filter(|(_, e)| e["type"] == "response.output_text.delta")
            .map(|(i, _)| i)
            .collect();
        let keep = deltas
            .get(deltas.len().saturating_sub(1) / 2)
            .map_or(2, |i| i + 1);
        events.truncate(keep);
    }
    let first_delta = events
        .iter()
        .position(|e| e["type"] == "response.output_text.delta");
    let frames: Vec<(bool, String)> = events
        .into_iter()
        .enumerate()
        .map(|(i, e)| {
            let kind = e["type"].as_str().unwrap_or_default().to_string();
            (
                Some(i) == first_delta,
                format!("event: {kind}\ndata: {e}\n\n"),
            )
        })
        .collect();
    let mut on_first_delta = Some(on_first_delta);
    let body = futures_util::stream::unfold(
        (frames.into_iter(), true, broken),
        move |(mut frames, first, broken)| {
            let note = frames
                .as_slice()
                .first()
                .filter(|(is_first_delta, _)| *is_first_delta)
                .and_then(|_| on_first_delta.take());
            async move {
                match frames.next() {
                    Some((_, frame)) => {
                        if !first && !delay.is_zero() {
                            tokio::time::sleep(delay).await;
                        }
                        if let Some(note) = note {
                            note();
                        }
                        Some((Ok(frame), (frames, false, broken)))
                    }
                    // Ending the body with an error aborts the connection mid-answer; what
                    // came before is given a moment to reach the client first, as over a
                    // real network.
                    None if broken => {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        Some((
                            Err(std::io::Error::other("the fake broke the stream")),
                            (frames, false, false),
                        ))
                    }
                    None => None,
                }
            }
        },
    );
    event_stream(Body::from_stream(body))
}

/// A `200` answering `body` as Server-Sent Events.
pub(super) fn event_stream(body: Body) -> Response {
    let mut resp = (StatusCode::OK, body).into_response();
    resp.headers_mut().insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("text/event-stream; charset=utf-8"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_is_cut_on_character_boundaries_into_the_pieces_asked_for() {
        assert_eq!(cut("héllo wörld", 4).concat(), "héllo wörld");
        assert_eq!(cut("héllo wörld", 4).len(), 4);
        assert_eq!(cut("", 4), vec![String::new()]);
        assert_eq!(cut("ab", 5), vec!["a".to_string(), "b".to_string()]);
    }

    #[test]
    fn the_sequence_tells_every_item_and_ends_with_the_response() {
        let response = json!({"id": "resp_1", "status": "completed", "output": [
            {"id": "msg_1", "type": "message", "status": "completed", "role": "assistant",
             "content": [{"type": "output_text", "text": "Hello there", "annotations": []}]},
            {"id": "fc_1", "type": "function_call", "status": "completed", "call_id": "call_1",
             "name": "f", "arguments": "{\"a\":1}"}]});
        let events = sequence(&response, 3);
        let kinds: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
        assert_eq!(kinds.first(), Some(&"response.created"));
        assert_eq!(kinds.last(), Some(&"response.completed"));
        let text: String = events
            .iter()
            .filter(|e| e["type"] == "response.output_text.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(text, "Hello there");
        let args: String = events
            .iter()
            .filter(|e| e["type"] == "response.function_call_arguments.delta")
            .map(|e| e["delta"].as_str().unwrap())
            .collect();
        assert_eq!(args, "{\"a\":1}");
        assert_eq!(events.last().unwrap()["response"], response);
    }
}
