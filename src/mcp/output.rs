//! An MCP tool result as a Responses API `function_call_output`: what the model can take.
//!
//! The content items are joined (text as it is); a result that carries only
//! `structuredContent` gives it as its JSON (a server that sends both sends the same data as
//! text too, as the protocol asks, so the text is what the model reads). An image,
//! audio or a binary resource becomes a short description (the model cannot take the bytes as
//! a tool output); an embedded text resource gives its text. An output longer than the
//! source's cap is cut at a character boundary and says so. A result with `isError: true` is
//! the tool's own answer: `{"error": "<its text>"}`, for the model to read and act on.
//!
//! It reads the result as JSON (as it came over the wire), not the SDK's types: what the
//! model gets is defined here, by the protocol's field names.
//!
//! Owns: that normalisation. Must not: call anything.

use serde_json::{Value, json};

/// What a tool result comes to for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ModelOutput {
    /// The `function_call_output` text.
    pub text: String,
    /// Whether the tool answered with an error (`isError: true`).
    pub is_error: bool,
    /// Whether the text was cut to the cap.
    pub cut: bool,
}

/// The output for the model of the tool result `result` (a `CallToolResult` as JSON), at most
/// `max_bytes` long (plus the note that says it was cut).
pub fn model_output(result: &Value, max_bytes: usize) -> ModelOutput {
    let is_error = result.get("isError").and_then(Value::as_bool) == Some(true);
    let content = result
        .get("content")
        .and_then(Value::as_array)
        .filter(|items| !items.is_empty());
    let body = match (content, result.get("structuredContent")) {
        (Some(items), _) => items
            .iter()
            .map(describe)
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("\n"),
        (None, Some(v)) if !v.is_null() => v.to_string(),
        (None, _) => String::new(),
    };
    let (body, cut) = cut_to(body, max_bytes);
    let text = if is_error {
        json!({ "error": body }).to_string()
    } else {
        body
    };
    ModelOutput {
        text,
        is_error,
        cut,
    }
}

/// One content item as text.
fn describe(item: &Value) -> String {
    let field = |k: &str| item.get(k).and_then(Value::as_str).unwrap_or_default();
    match field("type") {
        "text" => field("text").to_string(),
        "image" | "audio" => {
            let size = field("data").len() / 4 * 3;
            format!(
                "[{} ({}, about {size} bytes) not shown]",
                field("type"),
                or_unknown(field("mimeType"))
            )
        }
        "resource" => {
            let r = item.get("resource").cloned().unwrap_or(Value::Null);
            let f = |k: &str| r.get(k).and_then(Value::as_str).unwrap_or_default();
            match r.get("text").and_then(Value::as_str) {
                Some(text) => format!("[resource {}]\n{text}", f("uri")),
                None => format!(
                    "[resource {} ({}) not shown]",
                    f("uri"),
                    or_unknown(f("mimeType"))
                ),
            }
        }
        "resource_link" => {
            let name = field("name");
            format!("[resource link {}{}]", field("uri"), named(name))
        }
        other => format!("[{} content not shown]", or_unknown(other)),
    }
}

fn or_unknown(s: &str) -> &str {
    if s.is_empty() { "unknown type" } else { s }
}

fn named(name: &str) -> String {
    if name.is_empty() {
        String::new()
    } else {
        format!(" ({name})")
    }
}

/// `text` cut to `max` bytes at a character boundary, with a note saying how much was shown.
fn cut_to(mut text: String, max: usize) -> (String, bool) {
    if text.len() <= max {
        return (text, false);
    }
    let total = text.len();
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    text.truncate(end);
    text.push_str(&format!(
        "\n[output cut: the first {end} of {total} bytes are shown]"
    ));
    (text, true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_items_are_joined_and_structured_content_stands_in_for_none() {
        let r = json!({"content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]});
        assert_eq!(model_output(&r, 100).text, "a\nb");
        let r = json!({"content": [{"type": "text", "text": "ok"}], "structuredContent": {"result": "ok"}});
        assert_eq!(
            model_output(&r, 100).text,
            "ok",
            "the text, when there is some"
        );
        let r = json!({"content": [], "structuredContent": {"n": 1}});
        assert_eq!(model_output(&r, 100).text, r#"{"n":1}"#);
    }

    #[test]
    fn an_error_is_the_tools_answer() {
        let r = json!({"content": [{"type": "text", "text": "no such ticket"}], "isError": true});
        let out = model_output(&r, 100);
        assert!(out.is_error);
        assert_eq!(out.text, r#"{"error":"no such ticket"}"#);
    }

    #[test]
    fn bytes_become_descriptions() {
        let r = json!({"content": [
            {"type": "image", "data": "AAAABBBB", "mimeType": "image/png"},
            {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "hello"}},
            {"type": "resource", "resource": {"uri": "file:///b.bin", "blob": "AAAA", "mimeType": "application/zip"}},
            {"type": "resource_link", "uri": "https://x/y", "name": "y"}
        ]});
        let text = model_output(&r, 1000).text;
        assert!(
            text.contains("[image (image/png, about 6 bytes) not shown]"),
            "{text}"
        );
        assert!(text.contains("[resource file:///a.txt]\nhello"), "{text}");
        assert!(
            text.contains("[resource file:///b.bin (application/zip) not shown]"),
            "{text}"
        );
        assert!(text.contains("[resource link https://x/y (y)]"), "{text}");
        assert!(!text.contains("AAAA"), "never the bytes: {text}");
    }

    #[test]
    fn a_long_output_is_cut_at_a_character_and_says_so() {
        let r = json!({"content": [{"type": "text", "text": "é".repeat(100)}]});
        let out = model_output(&r, 11);
        assert!(out.cut);
        assert!(
            out.text
                .starts_with("ééééé\n[output cut: the first 10 of 200 bytes"),
            "{}",
            out.text
        );
    }
}
