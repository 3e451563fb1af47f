//! What an error answer of the model server says: its message and code (from a JSON body or
//! an error framed as a Server-Sent Event), whether it may be retried and after how long, and
//! which error of ours it is.
//!
//! Owns: that reading. Must not: retry or wait (the caller's policy does).

use std::time::Duration;

use serde_json::Value;

use super::{AttemptError, LlmError};

/// The longest server-requested wait that is honoured; beyond it the normal backoff applies.
const MAX_RETRY_AFTER: Duration = Duration::from_secs(120);

/// What an error answer (status `status`) means for the call: its message and code, and
/// whether another attempt may succeed (`streamed`: the call asked for a stream).
pub(super) fn refusal(
    status: u16,
    headers: &reqwest::header::HeaderMap,
    bytes: &[u8],
    streamed: bool,
) -> AttemptError {
    {
        let (mut message, code) = error_message(bytes, status);
        if streamed && status == 400 && message.to_ascii_lowercase().contains("stream") {
            message.push_str(
                " (the model server does not accept \"stream\": set APTIX_LLM_STREAMING=false)",
            );
        }
        if status == 400 && message.to_ascii_lowercase().contains("background") {
            message.push_str(
                " (the model server has no background mode: set \"background\": false on this agent context)",
            );
        }
        let should_retry = headers
            .get("x-should-retry")
            .and_then(|v| v.to_str().ok())
            .map(|v| v == "true");
        let retryable = should_retry.unwrap_or(matches!(status, 408 | 409 | 429) || status >= 500);
        if code.as_deref() == Some("previous_response_not_found") {
            return AttemptError {
                retryable: false,
                retry_after: None,
                rate_limited: false,
                flex_unavailable: false,
                error: LlmError::PreviousResponseNotFound(message),
            };
        }
        // Flex capacity ran out: not a rate limit of ours (the limiter is not slowed down).
        let flex_unavailable = status == 429
            && (code.as_deref() == Some("resource_unavailable")
                || message
                    .to_ascii_lowercase()
                    .contains("resource unavailable"));
        if retryable {
            AttemptError {
                retryable: true,
                retry_after: retry_after(headers),
                rate_limited: status == 429 && !flex_unavailable,
                flex_unavailable,
                error: LlmError::Unavailable {
                    attempts: 1,
                    message: format!("HTTP {status}: {message}"),
                },
            }
        } else {
            AttemptError {
                retryable: false,
                retry_after: None,
                rate_limited: false,
                flex_unavailable: false,
                error: LlmError::Rejected { status, message },
            }
        }
    }
}

/// The model's error message and code from an error body, or a generic one.
pub(super) fn error_message(bytes: &[u8], status: u16) -> (String, Option<String>) {
    let parsed = error_object(bytes);
    let err = parsed.as_ref();
    let message = err
        .and_then(|e| e.get("message"))
        .and_then(Value::as_str)
        .map(str::to_string)
        .unwrap_or_else(|| format!("HTTP {status} without an error message"));
    let code = err
        .and_then(|e| e.get("code"))
        .and_then(Value::as_str)
        .map(str::to_string);
    (message, code)
}

/// The error object of an error answer: the JSON body's `error`, or — from a server that
/// answers errors as Server-Sent Events (a gateway relaying a streamed call) — the first
/// `data:` frame's `error`, or an `error` event's own fields.
fn error_object(bytes: &[u8]) -> Option<Value> {
    let of = |mut v: Value| match v.get_mut("error").map(Value::take) {
        Some(e) if e.is_object() => Some(e),
        _ if v.get("type").and_then(Value::as_str) == Some("error") => Some(v),
        _ => None,
    };
    if let Ok(body) = serde_json::from_slice::<Value>(bytes) {
        return of(body);
    }
    String::from_utf8_lossy(bytes)
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
        .find_map(of)
}

/// `retry-after-ms`, then `retry-after` (seconds or an HTTP date), when within bounds.
pub(super) fn retry_after(headers: &reqwest::header::HeaderMap) -> Option<Duration> {
    let header = |name: &str| headers.get(name).and_then(|v| v.to_str().ok());
    let from_ms = header("retry-after-ms")
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map(|ms| ms / 1000.0);
    let from_secs = || {
        let v = header("retry-after")?.trim();
        if let Ok(secs) = v.parse::<f64>() {
            return Some(secs);
        }
        let when =
            time::OffsetDateTime::parse(v, &time::format_description::well_known::Rfc2822).ok()?;
        Some((when - time::OffsetDateTime::now_utc()).as_seconds_f64())
    };
    let secs = from_ms.or_else(from_secs)?;
    if secs.is_finite() && secs >= 0.0 && secs <= MAX_RETRY_AFTER.as_secs_f64() {
        Some(Duration::from_secs_f64(secs))
    } else {
        None
    }
}

#[cfg(test)]
mod error_tests {
    use super::*;

    #[test]
    fn an_error_answered_as_an_event_says_its_message_and_code() {
        // LiteLLM relaying a failed streamed call: HTTP 500 with the error in an SSE frame.
        let framed =
            b"data: {\"error\": {\"message\": \"upstream exploded\", \"code\": \"500\"}}\n\n";
        assert_eq!(
            error_message(framed, 500),
            ("upstream exploded".to_string(), Some("500".to_string()))
        );
        let event = b"event: error\ndata: {\"type\": \"error\", \"code\": \"server_error\", \"message\": \"try later\"}\n\n";
        assert_eq!(
            error_message(event, 502),
            ("try later".to_string(), Some("server_error".to_string()))
        );
        let plain = br#"{"error": {"message": "bad key", "code": "invalid_api_key"}}"#;
        assert_eq!(error_message(plain, 401).0, "bad key");
        assert_eq!(
            error_message(b"<html>oops</html>", 502).0,
            "HTTP 502 without an error message"
        );
        let e = refusal(500, &reqwest::header::HeaderMap::new(), framed, true);
        assert!(e.retryable);
        assert_eq!(
            e.error.to_string(),
            "model server unavailable after 1 attempt(s): HTTP 500: upstream exploded"
        );
    }
}
