//! The fake's Chat Completions face (`POST /v1/chat/completions`): what a chat-only model
//! server (vLLM, Ollama, any provider a gateway bridges the Responses API onto) answers. It
//! decides its answer as the Responses face does (the same script, the same default answer,
//! read from the messages), and tells it as a `chat.completion` — or, streamed, as
//! `chat.completion.chunk` events ending in `data: [DONE]`. It keeps nothing: a chat server
//! sees only the messages it is sent, which is what a test of a gateway's bridge looks at.
//!
//! Owns: the translation both ways. Must not: decide answers (the Responses face does).

use std::sync::Arc;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};

use super::reply::content_text;
use super::{Inner, Reply, answer_object, default_reply, error_response, unauthorized};

/// `POST /v1/chat/completions`.
pub(super) async fn create(
    State(inner): State<Arc<Inner>>,
    headers: HeaderMap,
    body: axum::body::Bytes,
) -> Response {
    if let Some(refused) = unauthorized(&inner, &headers) {
        return refused;
    }
    let Ok(request) = serde_json::from_slice::<Value>(&body) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "We could not parse the JSON body of your request.",
            None,
            None,
        );
    };
    let Some(messages) = request.get("messages").and_then(Value::as_array) else {
        return error_response(
            StatusCode::BAD_REQUEST,
            "Missing required parameter: 'messages'.",
            Some("messages"),
            Some("missing_required_parameter"),
        );
    };
    if !inner.options.forget_requests
        && let Ok(mut r) = inner.requests.lock()
    {
        r.push(request.clone());
    }
    let as_responses = json!({
        "model": request.get("model").cloned().unwrap_or(Value::Null),
        "input": messages.iter().flat_map(input_items).collect::<Vec<_>>(),
        "store": false,
    });
    let scripted = inner.script.lock().ok().and_then(|mut s| s.pop_front());
    let mut reply = scripted.unwrap_or_else(|| default_reply(&as_responses));
    while let Reply::Delay(d, next) = reply {
        tokio::time::sleep(d).await;
        reply = *next;
    }
    if matches!(reply, Reply::Failed(_) | Reply::BrokenStream(_)) {
        // A chat server has no failed responses: its failure is an error answer.
        return error_response(
            StatusCode::INTERNAL_SERVER_ERROR,
            "The server had an error while processing your request.",
            None,
            None,
        );
    }
    let object = match answer_object(&inner, as_responses, body.len(), reply) {
        Ok((object, _)) => object,
        Err(refused) => return refused,
    };
    let completion = completion(&object);
    if request.get("stream").and_then(Value::as_bool) == Some(true) {
        let usage = request
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let pieces = match inner.options.stream_pieces {
            0 => 4,
            n => n,
        };
        return streamed(&completion, pieces, usage);
    }
    Json(completion).into_response()
}

/// A chat message as the Responses input items it stands for.
fn input_items(message: &Value) -> Vec<Value> {
    match message.get("role").and_then(Value::as_str) {
        Some("tool") => vec![json!({
            "type": "function_call_output",
            "call_id": message.get("tool_call_id").cloned().unwrap_or(Value::Null),
            "output": content_text(message.get("content")),
        })],
        Some("assistant") => {
            let mut items = Vec::new();
            let said = content_text(message.get("content"));
            if !said.is_empty() {
                items.push(json!({"role": "assistant", "content": said}));
            }
            for call in message
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                items.push(json!({
                    "type": "function_call",
                    "call_id": call.get("id").cloned().unwrap_or(Value::Null),
                    "name": call.pointer("/function/name").cloned().unwrap_or(Value::Null),
                    "arguments": call.pointer("/function/arguments").cloned().unwrap_or(Value::Null),
                }));
            }
            items
        }
        Some(role @ ("user" | "system" | "developer")) => {
            vec![json!({"role": role, "content": content_text(message.get("content"))})]
        }
        _ => Vec::new(),
    }
}

/// A `Response` object told as a `chat.completion`.
fn completion(object: &Value) -> Value {
    let output = object["output"].as_array().cloned().unwrap_or_default();
    let mut text = String::new();
    let mut refusal = Value::Null;
    let mut calls = Vec::new();
    for item in &output {
        match item["type"].as_str() {
            Some("message") => {
                for part in item["content"].as_array().into_iter().flatten() {
                    match part["type"].as_str() {
                        Some("refusal") => refusal = part["refusal"].clone(),
                        _ => text.push_str(part["text"].as_str().unwrap_or_default()),
                    }
                }
            }
            Some("function_call") => calls.push(json!({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            })),
            _ => {}
        }
    }
    let finish_reason = if !calls.is_empty() {
        "tool_calls"
    } else if object["status"] == "incomplete" {
        "length"
    } else {
        "stop"
    };
    let mut message = json!({
        "role": "assistant",
        "content": if text.is_empty() && !calls.is_empty() { Value::Null } else { text.into() },
        "refusal": refusal,
    });
    if !calls.is_empty() {
        message["tool_calls"] = Value::Array(calls);
    }
    let usage = &object["usage"];
    json!({
        "id": object["id"].as_str().map(|id| id.replacen("resp_", "chatcmpl-", 1)),
        "object": "chat.completion",
        "created": object["created_at"],
        "model": object["model"],
        "choices": [{"index": 0, "message": message, "logprobs": null, "finish_reason": finish_reason}],
        "usage": {
            "prompt_tokens": usage["input_tokens"],
            "completion_tokens": usage["output_tokens"],
            "total_tokens": usage["total_tokens"],
        },
    })
}

/// A completion told as `chat.completion.chunk` events: the role, the text in `pieces`, each
/// tool call whole, the finish reason, the usage when asked for, then `[DONE]`.
fn streamed(completion: &Value, pieces: usize, usage: bool) -> Response {
    let head = |delta: Value, finish: Value| {
        json!({
            "id": completion["id"], "object": "chat.completion.chunk",
            "created": completion["created"], "model": completion["model"],
            "choices": [{"index": 0, "delta": delta, "logprobs": null, "finish_reason": finish}],
        })
    };
    let message = &completion["choices"][0]["message"];
    let mut chunks = vec![head(
        json!({"role": "assistant", "content": ""}),
        Value::Null,
    )];
    if let Some(text) = message["content"].as_str().filter(|t| !t.is_empty()) {
        for piece in super::stream::cut(text, pieces) {
            chunks.push(head(json!({"content": piece}), Value::Null));
        }
    }
    for (index, call) in message["tool_calls"]
        .as_array()
        .into_iter()
        .flatten()
        .enumerate()
    {
        let mut call = call.clone();
        call["index"] = json!(index);
        chunks.push(head(json!({"tool_calls": [call]}), Value::Null));
    }
    chunks.push(head(
        json!({}),
        completion["choices"][0]["finish_reason"].clone(),
    ));
    if usage {
        let mut last = head(json!({}), Value::Null);
        last["choices"] = json!([]);
        last["usage"] = completion["usage"].clone();
        chunks.push(last);
    }
    let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
    body.push_str("data: [DONE]\n\n");
    super::stream::event_stream(Body::from(body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_become_the_input_items_they_stand_for() {
        let items: Vec<Value> = [
            json!({"role": "system", "content": "Be brief."}),
            json!({"role": "user", "content": [{"type": "text", "text": "Hi"}]}),
            json!({"role": "assistant", "content": null, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}),
            json!({"role": "tool", "tool_call_id": "call_1", "content": "42"}),
        ]
        .iter()
        .flat_map(input_items)
        .collect();
        assert_eq!(items[0]["role"], "system");
        assert_eq!(items[1], json!({"role": "user", "content": "Hi"}));
        assert_eq!(items[2]["type"], "function_call");
        assert_eq!(items[2]["call_id"], "call_1");
        assert_eq!(items[3]["type"], "function_call_output");
        assert_eq!(items[3]["output"], "42");
    }

    #[test]
    fn a_response_is_told_as_a_completion() {
        let object = json!({"id": "resp_1", "created_at": 1, "model": "m", "status": "completed",
            "output": [{"type": "function_call", "call_id": "call_9", "name": "f", "arguments": "{\"a\":1}"}],
            "usage": {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}});
        let c = completion(&object);
        assert_eq!(c["object"], "chat.completion");
        assert_eq!(c["choices"][0]["finish_reason"], "tool_calls");
        assert_eq!(c["choices"][0]["message"]["content"], Value::Null);
        assert_eq!(c["choices"][0]["message"]["tool_calls"][0]["id"], "call_9");
        assert_eq!(c["usage"]["prompt_tokens"], 10);
        let text = json!({"id": "resp_2", "status": "incomplete", "output": [{"type": "message",
            "content": [{"type": "output_text", "text": "cut"}]}], "usage": {}});
        let c = completion(&text);
        assert_eq!(c["choices"][0]["message"]["content"], "cut");
        assert_eq!(c["choices"][0]["finish_reason"], "length");
    }
}
