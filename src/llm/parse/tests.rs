use std::time::Duration;

use super::super::refusal::{error_message, retry_after};
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
            total_tokens: 64,
            ..Usage::default()
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
fn bytes_and_parsed_values_read_alike() {
    for name in [
        "01_text_response_openai_python_live_snapshot.json",
        "02_function_call_response.json",
    ] {
        let v = fixture(name);
        let bytes = serde_json::to_vec(&v).expect("encodes");
        assert_eq!(
            parse_bytes(&bytes).expect("bytes parse"),
            parse_response(&v).expect("value parses"),
            "{name}"
        );
    }
}

/// An answer is read from its members' text, the echoed tools and instructions skimmed
/// over, and reads as it does parsed whole; where a skim cannot go, the whole parse names
/// the fault as before.
#[test]
fn a_skimmed_answer_reads_as_one_parsed_whole() {
    for name in [
        "01_text_response_openai_python_live_snapshot.json",
        "01b_text_response_spec_example.json",
        "02_function_call_response.json",
    ] {
        let bytes = serde_json::to_vec_pretty(&fixture(name)).expect("encodes");
        let skimmed = Wire::skimmed(&bytes).expect("a skim walks the example");
        let whole: Wire<'_> = serde_json::from_slice(&bytes).expect("parses");
        assert_eq!(
            normalise(skimmed).expect("reads"),
            normalise(whole).expect("reads"),
            "{name}"
        );
    }
    // A field twice (even null first) is the parser's error, not the last one read; a
    // field of the wrong type gets the same message as parsed whole; brackets that do not
    // match in a member no one reads are still not JSON.
    for (body, expected) in [
        (
            &br#"{"id":"a","output":[],"id":"b"}"#[..],
            "duplicate field `id`",
        ),
        (
            br#"{"id":null,"output":[],"id":"b"}"#,
            "duplicate field `id`",
        ),
        (
            br#"{"tools":[],"id":7,"output":[]}"#,
            "the answer is not a Responses API response (invalid type: integer `7`",
        ),
        (
            br#"{"id":"r","tools":[{"type":"x"]],"output":[]}"#,
            "the answer is not JSON",
        ),
    ] {
        assert!(Wire::skimmed(body).is_none());
        let e = parse_bytes(body).unwrap_err();
        assert!(
            matches!(&e.error, LlmError::BadResponse(m) if m.contains(expected)),
            "{e:?}"
        );
    }
    // A name written with an escape is read whole, as the parser reads it.
    let r = parse_bytes(br#"{"\u0069d":"r","output":[]}"#).expect("parses");
    assert_eq!(r.id, "r");
}

#[test]
fn escaped_text_is_unescaped_and_unknown_fields_are_skipped() {
    let body = br#"{"id":"resp_1","object":"response","status":"completed",
        "tools":[{"type":"function","name":"x","parameters":{"type":"object"}}],
        "metadata":{"k":"v"},"incomplete_details":null,"error":null,
        "output":[
          {"type":"web_search_call","id":"ws_1","status":"completed","action":{"query":"q"}},
          {"type":"message","role":"assistant","content":[
            {"type":"output_text","text":"line \"one\"\nline \u00e9","annotations":[{"type":"url_citation"}]},
            {"type":"output_text","text":" and two"}]},
          {"type":"function_call","call_id":"c\\1","name":"f","arguments":"{\"a\":1}"}],
        "usage":{"input_tokens":3,"output_tokens":4,"total_tokens":7,"input_tokens_details":{"cached_tokens":0}}}"#;
    let r = parse_bytes(body).expect("parses");
    assert_eq!(
        r.items,
        vec![
            OutputItem::Hosted(crate::state::HostedCall {
                item_type: "web_search_call".into(),
                id: "ws_1".into(),
                status: "completed".into(),
                server_label: None,
                name: "web_search".into(),
                detail: "q".into(),
                error: None,
            }),
            OutputItem::Text("line \"one\"\nline \u{e9} and two".into()),
            OutputItem::FunctionCall {
                call_id: "c\\1".into(),
                name: "f".into(),
                arguments: "{\"a\":1}".into(),
            },
        ]
    );
    assert_eq!(r.usage.total_tokens, 7);
    // The hosted call is replayed whole, with the message and the function call.
    assert_eq!(r.replay_items.len(), 3);
    assert_eq!(r.replay_items[0]["action"]["query"], "q");
}

#[test]
fn an_item_of_an_unknown_kind_may_have_any_shape() {
    let body = br#"{"id":"r","output":[
        {"type":"future_call","content":"a string","name":7,"arguments":{"x":[1]}},
        {"type":"message","content":[{"type":"output_text","text":"ok"}]}]}"#;
    let r = parse_bytes(body).expect("parses");
    assert_eq!(
        r.items,
        vec![
            OutputItem::Unknown {
                item_type: "future_call".into()
            },
            OutputItem::Text("ok".into())
        ]
    );
    // A kind this client handles must have its shape.
    let e =
        parse_bytes(br#"{"id":"r","output":[{"type":"message","content":"text"}]}"#).unwrap_err();
    assert!(
        matches!(&e.error, LlmError::BadResponse(m) if m.starts_with("a message item does not match")),
        "{e:?}"
    );
}

#[test]
fn answers_that_are_not_responses_are_named() {
    let e = parse_bytes(b"<html>ok</html>").unwrap_err();
    assert!(
        matches!(&e.error, LlmError::BadResponse(m) if m.starts_with("the answer is not JSON")),
        "{e:?}"
    );
    assert!(!e.retryable);
    let e = parse_bytes(br#"{"id":"r","output":"text"}"#).unwrap_err();
    assert!(
        matches!(&e.error, LlmError::BadResponse(m) if m.starts_with("the answer is not a Responses API response")),
        "{e:?}"
    );
    let e = parse_bytes(br#"{"output":[]}"#).unwrap_err();
    assert!(matches!(&e.error, LlmError::BadResponse(m) if m.contains("no response id")));
    let e = parse_bytes(br#"{"id":"r","status":"completed"}"#).unwrap_err();
    assert!(matches!(&e.error, LlmError::BadResponse(m) if m.contains("no output array")));
    let e = parse_bytes(
        br#"{"id":"r","output":[{"type":"function_call","name":"f","arguments":"{}"}]}"#,
    )
    .unwrap_err();
    assert!(matches!(&e.error, LlmError::BadResponse(m) if m.contains("no call_id")));
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
