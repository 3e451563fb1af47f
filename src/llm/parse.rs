//! Normalising a Responses API `Response` object: output items (text, refusals, function
//! calls, reasoning, unknown types), the items kept for replay, usage, and `failed` /
//! `incomplete` statuses.

use serde_json::Value;

use super::{AttemptError, LlmError, ModelResponse, OutputItem};
use crate::contract::Usage;

/// Normalises a `Response` object.
pub(super) fn parse_response(v: &Value) -> Result<ModelResponse, AttemptError> {
    let bad = |m: String| AttemptError {
        retryable: false,
        retry_after: None,
        rate_limited: false,
        error: LlmError::BadResponse(m),
    };
    let id = v
        .get("id")
        .and_then(Value::as_str)
        .ok_or_else(|| bad("the answer has no response id".into()))?
        .to_string();
    let status = v
        .get("status")
        .and_then(Value::as_str)
        .unwrap_or("completed");
    let mut incomplete_reason = None;
    match status {
        "completed" => {}
        "incomplete" => {
            incomplete_reason = Some(
                v.pointer("/incomplete_details/reason")
                    .and_then(Value::as_str)
                    .unwrap_or("unknown")
                    .to_string(),
            );
        }
        "failed" => {
            let code = v
                .pointer("/error/code")
                .and_then(Value::as_str)
                .unwrap_or("unknown");
            let message = v
                .pointer("/error/message")
                .and_then(Value::as_str)
                .unwrap_or("the model reported a failure");
            let retryable = matches!(code, "server_error" | "rate_limit_exceeded");
            return Err(AttemptError {
                retryable,
                retry_after: None,
                rate_limited: false,
                error: if retryable {
                    LlmError::Unavailable {
                        attempts: 1,
                        message: format!("response failed ({code}): {message}"),
                    }
                } else {
                    LlmError::BadResponse(format!("response failed ({code}): {message}"))
                },
            });
        }
        other => return Err(bad(format!("unexpected response status {other:?}"))),
    }
    let output = v
        .get("output")
        .and_then(Value::as_array)
        .ok_or_else(|| bad("the answer has no output array".into()))?;
    let mut items = Vec::new();
    let mut replay_items = Vec::new();
    for item in output {
        let kind = item.get("type").and_then(Value::as_str).unwrap_or("");
        match kind {
            "message" => {
                let parts = item
                    .get("content")
                    .and_then(Value::as_array)
                    .ok_or_else(|| bad("a message item has no content".into()))?;
                let mut text = String::new();
                for part in parts {
                    match part.get("type").and_then(Value::as_str) {
                        Some("output_text") => {
                            text.push_str(part.get("text").and_then(Value::as_str).unwrap_or(""))
                        }
                        Some("refusal") => items.push(OutputItem::Refusal(
                            part.get("refusal")
                                .and_then(Value::as_str)
                                .unwrap_or("")
                                .to_string(),
                        )),
                        other => items.push(OutputItem::Unknown {
                            item_type: format!("message part {}", other.unwrap_or("(none)")),
                        }),
                    }
                }
                if !text.is_empty() {
                    replay_items.push(serde_json::json!({"role": "assistant", "content": text}));
                    items.push(OutputItem::Text(text));
                }
            }
            "function_call" => {
                let field = |k: &str| {
                    item.get(k)
                        .and_then(Value::as_str)
                        .map(str::to_string)
                        .ok_or_else(|| bad(format!("a function_call item has no {k}")))
                };
                let (call_id, name, arguments) =
                    (field("call_id")?, field("name")?, field("arguments")?);
                replay_items.push(serde_json::json!({
                    "type": "function_call", "call_id": call_id, "name": name, "arguments": arguments
                }));
                items.push(OutputItem::FunctionCall {
                    call_id,
                    name,
                    arguments,
                });
            }
            "reasoning" => items.push(OutputItem::Reasoning),
            other => items.push(OutputItem::Unknown {
                item_type: other.to_string(),
            }),
        }
    }
    let n = |k: &str| {
        v.pointer(&format!("/usage/{k}"))
            .and_then(Value::as_u64)
            .unwrap_or(0)
    };
    Ok(ModelResponse {
        id,
        items,
        replay_items,
        incomplete_reason,
        usage: Usage {
            prompt_tokens: n("input_tokens"),
            completion_tokens: n("output_tokens"),
            total_tokens: n("total_tokens"),
        },
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::super::{error_message, retry_after};
    use super::*;

    fn fixture(name: &str) -> Value {
        let path = format!(
            "{}/tests/fixtures/openai/examples/{name}",
            env!("CARGO_MANIFEST_DIR")
        );
        serde_json::from_str(&std::fs::read_to_string(&path).expect("fixture")).expect("json")
    }

    #[test]
    fn parses_the_real_text_answer() {
        let r = parse_response(&fixture(
            "01_text_response_openai_python_live_snapshot.json",
        ))
        .expect("parses");
        assert!(
            matches!(&r.items[..], [OutputItem::Text(t)] if t.starts_with("I can't provide real-time updates"))
        );
        assert_eq!(
            r.usage,
            Usage {
                prompt_tokens: 14,
                completion_tokens: 50,
                total_tokens: 64
            }
        );
        assert_eq!(r.incomplete_reason, None);
    }

    #[test]
    fn parses_the_function_call_answer() {
        let r = parse_response(&fixture("02_function_call_response.json")).expect("parses");
        assert_eq!(
            r.items,
            vec![OutputItem::FunctionCall {
                call_id: "call_unLAR8MvFNptuiZK6K6HCy5k".into(),
                name: "get_current_weather".into(),
                arguments: "{\"location\":\"Boston, MA\",\"unit\":\"celsius\"}".into(),
            }]
        );
        assert_eq!(
            r.replay_items[0]["call_id"],
            "call_unLAR8MvFNptuiZK6K6HCy5k"
        );
    }

    #[test]
    fn failed_status_is_classified() {
        let event = fixture("04_response_failed_event.json");
        let e = parse_response(&event["response"]).unwrap_err();
        assert!(e.retryable, "server_error is transient");
        let mut v = event["response"].clone();
        v["error"]["code"] = "invalid_prompt".into();
        let e = parse_response(&v).unwrap_err();
        assert!(!e.retryable);
        assert!(matches!(e.error, LlmError::BadResponse(m) if m.contains("invalid_prompt")));
    }

    #[test]
    fn error_bodies_keep_the_model_message() {
        let (m, code) = error_message(
            br#"{"error": {"message": "Unauthorized", "type": "invalid_request_error"}}"#,
            401,
        );
        assert_eq!(m, "Unauthorized");
        assert_eq!(code, None);
        let (m, _) = error_message(b"<html>bad gateway</html>", 502);
        assert_eq!(m, "HTTP 502 without an error message");
    }

    #[test]
    fn retry_after_headers() {
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("retry-after", "2".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_secs(2)));
        h.insert("retry-after-ms", "250".parse().unwrap());
        assert_eq!(retry_after(&h), Some(Duration::from_millis(250)), "ms wins");
        let mut h = reqwest::header::HeaderMap::new();
        h.insert("retry-after", "9999".parse().unwrap());
        assert_eq!(retry_after(&h), None, "too long: use the normal backoff");
        let mut h = reqwest::header::HeaderMap::new();
        let soon = time::OffsetDateTime::now_utc() + time::Duration::seconds(30);
        let date = soon
            .format(&time::format_description::well_known::Rfc2822)
            .unwrap();
        h.insert("retry-after", date.parse().unwrap());
        let d = retry_after(&h).expect("http date");
        assert!(
            d <= Duration::from_secs(31) && d >= Duration::from_secs(25),
            "{d:?}"
        );
    }
}
