//! Normalising a Responses API `Response` object: output items (text, refusals, function
//! calls, reasoning, hosted tools' items, unknown types), the items kept for replay, usage, and `failed` /
//! `incomplete` statuses.
//!
//! The answer is read into borrowed wire types that name only the fields used: each of its
//! top-level members is found by a skim ([`super::skim`]) and only those used are parsed;
//! everything else (the echoed tools, instructions, metadata…) is passed over without being
//! built, and strings without escapes are not copied until they become part of the result.

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
                Ok(value) => {
                    *slot = value;
                    ControlFlow::Continue(())
                }
                Err(_) => ControlFlow::Break(()),
            }
        }
        let mut wire = Wire::default();
        // Which fields were given (a `null` leaves its slot empty): one given twice goes the
        // full way, which names it.
        let mut seen = [false; 7];
        super::skim::members(bytes, |name, text| {
            let (slot, read) = match name {
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
            read
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
mod tests;
