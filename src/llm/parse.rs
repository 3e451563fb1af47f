//! Normalising a Responses API `Response` object: output items (text, refusals, function
//! calls, reasoning, hosted tools' items, unknown types), the items kept for replay, usage, and `failed` /
//! `incomplete` statuses.
//!
//! The answer is read into borrowed wire types that name only the fields used: everything
//! else (the echoed tools, instructions, metadata…) is skipped without being built, and
//! strings without escapes are not copied until they become part of the result.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;
use std::ops::ControlFlow;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};
use serde_json::Value;
use serde_json::value::RawValue;

use super::{AttemptError, LlmError, ModelResponse, OutputItem};
use crate::contract::Usage;

/// Normalises a `Response` object received as bytes (a non-streamed answer).
pub(super) fn parse_bytes(bytes: &[u8]) -> Result<ModelResponse, AttemptError> {
    let wire = Wire::skimmed(bytes).map_or_else(|| serde_json::from_slice(bytes), Ok);
    let wire: Wire<'_> = wire.map_err(|e| {
        bad(if e.is_data() {
            format!("the answer is not a Responses API response ({e})")
        } else {
            format!("the answer is not JSON ({e})")
        })
    })?;
    normalise(wire)
}

/// Normalises a `Response` object already parsed (the terminal event of a stream: one per
/// call, so reading it again from its text costs little).
pub(super) fn parse_response(v: &Value) -> Result<ModelResponse, AttemptError> {
    parse_bytes(v.to_string().as_bytes())
}

fn bad(message: String) -> AttemptError {
    AttemptError {
        retryable: false,
        retry_after: None,
        rate_limited: false,
        flex_unavailable: false,
        error: LlmError::BadResponse(message),
    }
}

/// The fields of a `Response` this client reads.
#[derive(Deserialize, Default)]
struct Wire<'a> {
    #[serde(borrow, default)]
    id: Option<Text<'a>>,
    #[serde(borrow, default)]
    status: Option<Text<'a>>,
    #[serde(borrow, default)]
    incomplete_details: Option<Reason<'a>>,
    #[serde(borrow, default)]
    error: Option<WireError<'a>>,
    /// Each item as its text: only the kinds this client handles are read further, so an item
    /// of a kind it does not know can have any shape.
    #[serde(borrow, default)]
    output: Option<Vec<&'a RawValue>>,
    #[serde(default)]
    usage: Option<WireUsage>,
    #[serde(borrow, default)]
    service_tier: Option<Text<'a>>,
}

impl<'a> Wire<'a> {
    /// The fields read from their members' text alone, the others skimmed over
    /// ([`super::skim`]); `None` when the answer is to be read the full way: a skim could not
    /// walk it, a field did not parse from its text, or a field came twice (the full way
    /// names each of these as serde_json does).
    fn skimmed(bytes: &'a [u8]) -> Option<Self> {
        fn field<'a, T: Deserialize<'a>>(slot: &mut Option<T>, text: &'a [u8]) -> ControlFlow<()> {
            match serde_json::from_slice::<Option<T>>(text) {
                Ok(value) if slot.is_none() => {
                    *slot = value;
                    ControlFlow::Continue(())
                }
                // A null read twice is a field twice too; so is any second one.
                _ => ControlFlow::Break(()),
            }
        }
        let mut wire = Wire::default();
        // Members whose value was `null` leave their slot empty: counted apart, so that a
        // field given twice is still sent the full way.
        let mut seen = [false; 7];
        super::skim::members(bytes, |name, text| {
            let (slot, flow) = match name {
                b"id" => (0, field(&mut wire.id, text)),
                b"status" => (1, field(&mut wire.status, text)),
                b"incomplete_details" => (2, field(&mut wire.incomplete_details, text)),
                b"error" => (3, field(&mut wire.error, text)),
                b"output" => (4, field(&mut wire.output, text)),
                b"usage" => (5, field(&mut wire.usage, text)),
                b"service_tier" => (6, field(&mut wire.service_tier, text)),
                _ => return ControlFlow::Continue(()),
            };
            if std::mem::replace(&mut seen[slot], true) {
                return ControlFlow::Break(());
            }
            flow
        })?;
        Some(wire)
    }
}

#[derive(Deserialize)]
struct Reason<'a> {
    #[serde(borrow, default)]
    reason: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct WireError<'a> {
    #[serde(borrow, default)]
    code: Option<Text<'a>>,
    #[serde(borrow, default)]
    message: Option<Text<'a>>,
}

/// An output item's kind.
#[derive(Deserialize)]
struct Kind<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Text<'a>>,
}

/// The fields of the output items this client handles: a message's parts, a function call's.
#[derive(Deserialize)]
struct Item<'a> {
    #[serde(borrow, default)]
    content: Option<Vec<Part<'a>>>,
    #[serde(borrow, default)]
    call_id: Option<Text<'a>>,
    #[serde(borrow, default)]
    name: Option<Text<'a>>,
    #[serde(borrow, default)]
    arguments: Option<Text<'a>>,
}

/// A part of a message's (or a reasoning item's) content.
#[derive(Deserialize)]
struct Part<'a> {
    #[serde(rename = "type", borrow, default)]
    kind: Option<Text<'a>>,
    #[serde(borrow, default)]
    text: Option<Text<'a>>,
    #[serde(borrow, default)]
    refusal: Option<Text<'a>>,
}

#[derive(Deserialize)]
struct WireUsage {
    #[serde(default)]
    input_tokens: Option<u64>,
    #[serde(default)]
    output_tokens: Option<u64>,
    #[serde(default)]
    total_tokens: Option<u64>,
    #[serde(default)]
    input_tokens_details: Option<InputDetails>,
    #[serde(default)]
    output_tokens_details: Option<OutputDetails>,
}

#[derive(Deserialize)]
struct InputDetails {
    #[serde(default)]
    cached_tokens: Option<u64>,
}

#[derive(Deserialize)]
struct OutputDetails {
    #[serde(default)]
    reasoning_tokens: Option<u64>,
}

/// A string of the answer, borrowed from the answer where it holds no escapes. (`Cow`'s own
/// `Deserialize` always copies, and `#[serde(borrow)]` does not reach into an `Option`.)
struct Text<'a>(Cow<'a, str>);

impl Text<'_> {
    fn as_str(&self) -> &str {
        &self.0
    }
}

fn text<'t>(t: &'t Option<Text<'_>>) -> Option<&'t str> {
    t.as_ref().map(Text::as_str)
}

impl<'de: 'a, 'a> Deserialize<'de> for Text<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Strings<'a>(PhantomData<&'a ()>);
        impl<'de: 'a, 'a> Visitor<'de> for Strings<'a> {
            type Value = Text<'a>;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a string")
            }
            fn visit_borrowed_str<E: de::Error>(self, s: &'de str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Borrowed(s)))
            }
            fn visit_str<E: de::Error>(self, s: &str) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(s.to_owned())))
            }
            fn visit_string<E: de::Error>(self, s: String) -> Result<Text<'a>, E> {
                Ok(Text(Cow::Owned(s)))
            }
        }
        d.deserialize_str(Strings(PhantomData))
    }
}

fn normalise(v: Wire<'_>) -> Result<ModelResponse, AttemptError> {
    let id = text(&v.id)
        .ok_or_else(|| bad("the answer has no response id".into()))?
        .to_string();
    let mut incomplete_reason = None;
    match text(&v.status).unwrap_or("completed") {
        "completed" => {}
        "incomplete" => {
            incomplete_reason = Some(
                v.incomplete_details
                    .as_ref()
                    .and_then(|d| text(&d.reason))
                    .unwrap_or("unknown")
                    .to_string(),
            );
        }
        "failed" => {
            let error = v.error.as_ref();
            let code = error.and_then(|e| text(&e.code)).unwrap_or("unknown");
            let message = error
                .and_then(|e| text(&e.message))
                .unwrap_or("the model reported a failure");
            let retryable = matches!(code, "server_error" | "rate_limit_exceeded");
            return Err(AttemptError {
                retryable,
                retry_after: None,
                rate_limited: false,
                flex_unavailable: false,
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
        "cancelled" => {
            return Err(bad("the response was cancelled on the model server".into()));
        }
        other => return Err(bad(format!("unexpected response status {other:?}"))),
    }
    let output = v
        .output
        .ok_or_else(|| bad("the answer has no output array".into()))?;
    let mut items = Vec::with_capacity(output.len());
    let mut replay_items = Vec::new();
    for raw in output {
        let kind: Kind<'_> = serde_json::from_str(raw.get())
            .map_err(|e| bad(format!("an output item has no readable type ({e})")))?;
        let kind = text(&kind.kind).unwrap_or("");
        let known = || -> Result<Item<'_>, AttemptError> {
            serde_json::from_str(raw.get()).map_err(|e| {
                bad(format!(
                    "a {kind} item does not match the Responses API ({e})"
                ))
            })
        };
        match kind {
            "message" => {
                let item = known()?;
                let parts = item
                    .content
                    .ok_or_else(|| bad("a message item has no content".into()))?;
                let mut joined = String::new();
                for part in parts {
                    match text(&part.kind) {
                        Some("output_text") => joined.push_str(text(&part.text).unwrap_or("")),
                        Some("refusal") => items.push(OutputItem::Refusal(
                            text(&part.refusal).unwrap_or("").to_string(),
                        )),
                        other => items.push(OutputItem::Unknown {
                            item_type: format!("message part {}", other.unwrap_or("(none)")),
                        }),
                    }
                }
                if !joined.is_empty() {
                    replay_items.push(serde_json::json!({"role": "assistant", "content": joined}));
                    items.push(OutputItem::Text(joined));
                }
            }
            "function_call" => {
                let item = known()?;
                let field = |v: Option<Text<'_>>, k: &str| {
                    v.map(|t| t.0.into_owned())
                        .ok_or_else(|| bad(format!("a function_call item has no {k}")))
                };
                let call_id = field(item.call_id, "call_id")?;
                let name = field(item.name, "name")?;
                let arguments = field(item.arguments, "arguments")?;
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
            hosted if super::hosted::is_hosted(hosted) => {
                let (item, replay) = super::hosted::read(hosted, raw).map_err(bad)?;
                replay_items.push(replay);
                items.push(item);
            }
            other => items.push(OutputItem::Unknown {
                item_type: other.to_string(),
            }),
        }
    }
    let usage = v.usage.as_ref();
    let n = |f: fn(&WireUsage) -> Option<u64>| usage.and_then(f).unwrap_or(0);
    Ok(ModelResponse {
        id,
        items,
        replay_items,
        incomplete_reason,
        usage: Usage {
            prompt_tokens: n(|u| u.input_tokens),
            completion_tokens: n(|u| u.output_tokens),
            total_tokens: n(|u| u.total_tokens),
            cached_tokens: n(|u| u.input_tokens_details.as_ref()?.cached_tokens),
            reasoning_tokens: n(|u| u.output_tokens_details.as_ref()?.reasoning_tokens),
            // Priced by the pipeline, which knows the agent context.
            cost_micros: 0,
        },
        service_tier: text(&v.service_tier).map(str::to_string),
        capacity_waited: std::time::Duration::ZERO,
    })
}

#[cfg(test)]
mod tests {
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
        // A field twice (even null first) is the parser's error, not the last one read.
        for twice in [
            &br#"{"id":"a","output":[],"id":"b"}"#[..],
            br#"{"id":null,"output":[],"id":"b"}"#,
        ] {
            assert!(Wire::skimmed(twice).is_none());
            let e = parse_bytes(twice).unwrap_err();
            assert!(
                matches!(&e.error, LlmError::BadResponse(m) if m.contains("duplicate field `id`")),
                "{e:?}"
            );
        }
        // A field of the wrong type: the same message as parsed whole.
        let e = parse_bytes(br#"{"tools":[],"id":7,"output":[]}"#).unwrap_err();
        assert!(
            matches!(&e.error, LlmError::BadResponse(m) if m.starts_with("the answer is not a Responses API response (invalid type: integer `7`")),
            "{e:?}"
        );
        // Brackets that do not match in a member no one reads: still not JSON.
        let e = parse_bytes(br#"{"id":"r","tools":[{"type":"x"]],"output":[]}"#).unwrap_err();
        assert!(
            matches!(&e.error, LlmError::BadResponse(m) if m.starts_with("the answer is not JSON")),
            "{e:?}"
        );
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
        let e = parse_bytes(br#"{"id":"r","output":[{"type":"message","content":"text"}]}"#)
            .unwrap_err();
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
}
