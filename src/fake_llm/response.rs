//! The fake's `Response` object, field for field as the live API answers (the recorded answers
//! in `tests/fixtures/openai/examples`): the request's settings echoed, usage estimated.
//!
//! Owns: the object's fields. Must not: decide what the answer says (the reply is the caller's).

use serde_json::{Value, json};

/// What the answer to one request is, before it becomes a `Response` object.
pub(super) struct Answered<'a> {
    /// `resp_…`.
    pub id: String,
    /// `completed`, `incomplete` or `failed`.
    pub status: &'a str,
    /// The error of a failed response, else null.
    pub error: Value,
    /// Why the response is incomplete, if it is.
    pub incomplete: Option<&'a str>,
    /// The output items.
    pub output: Vec<Value>,
    /// Whether the fake stores responses (`store` in the object).
    pub stored: bool,
    /// The input tokens: the request body's estimate ([`input_tokens`]) and the conversation
    /// a `previous_response_id` carries.
    pub input_tokens: u64,
    /// Input tokens found in the prompt cache ([`cached_tokens`]).
    pub cached_tokens: u64,
    /// Whether the model reasons ([`reasons`]): its output tokens include reasoning ones.
    pub reasoning: bool,
}

/// Reasoning tokens a reasoning model spends on each answer.
pub(super) const REASONING_TOKENS: u64 = 64;

/// The input token estimate of a request body: about four bytes of JSON per token.
pub(super) fn input_tokens(body_len: usize) -> u64 {
    (body_len / 4) as u64
}

/// The input tokens a request finds in the prompt cache, as the live API counts them: none
/// below 1,024 input tokens, else the prefix it shares with the previous request of the same
/// `prompt_cache_key` (modelled as the shorter of the two), in whole blocks of 128 tokens.
pub(super) fn cached_tokens(previous: Option<u64>, input_tokens: u64) -> u64 {
    match previous {
        Some(previous) if input_tokens >= 1024 => previous.min(input_tokens) / 128 * 128,
        _ => 0,
    }
}

/// Whether `model` is a reasoning model (o-series, gpt-5).
pub(super) fn reasons(model: &str) -> bool {
    model.starts_with('o') || model.starts_with("gpt-5")
}

impl Answered<'_> {
    /// The `Response` object. The request's settings that the object echoes (instructions,
    /// model, tools, …) are moved out of `req`, not copied.
    ///
    /// Built as a map of values rather than with `json!`: the macro turns each value it is
    /// given into a `Value` again by serialising it, which copied the echoed tools deeply for
    /// every answer.
    pub(super) fn into_object(self, req: &mut Value) -> Value {
        let input_tokens = self.input_tokens;
        let reasoning_tokens = if self.reasoning { REASONING_TOKENS } else { 0 };
        let output_tokens =
            serde_json::to_vec(&self.output).map_or(0, |b| b.len() / 4) as u64 + reasoning_tokens;
        let cached_tokens = self.cached_tokens.min(input_tokens);
        // The tier the request was served at: `auto` (or none) is the project's, `default`.
        let tier = match req.get("service_tier").and_then(Value::as_str) {
            None | Some("auto") => "default".to_string(),
            Some(t) => t.to_string(),
        };
        let mut echo = |field: &str, absent: Value| match req.get_mut(field) {
            Some(v) => v.take(),
            None => absent,
        };
        let fields: [(&str, Value); 25] = [
            ("id", self.id.into()),
            ("object", "response".into()),
            (
                "created_at",
                time::OffsetDateTime::now_utc().unix_timestamp().into(),
            ),
            ("status", self.status.into()),
            ("error", self.error),
            (
                "incomplete_details",
                self.incomplete
                    .map_or(Value::Null, |r| json!({"reason": r})),
            ),
            ("instructions", echo("instructions", Value::Null)),
            ("max_output_tokens", echo("max_output_tokens", Value::Null)),
            ("model", echo("model", Value::Null)),
            ("output", Value::Array(self.output)),
            ("parallel_tool_calls", true.into()),
            (
                "previous_response_id",
                echo("previous_response_id", Value::Null),
            ),
            ("reasoning", json!({"effort": null, "summary": null})),
            ("store", self.stored.into()),
            ("temperature", 1.0.into()),
            ("text", json!({"format": {"type": "text"}})),
            ("tool_choice", echo("tool_choice", "auto".into())),
            ("tools", echo("tools", Value::Array(Vec::new()))),
            ("top_p", 1.0.into()),
            ("truncation", "disabled".into()),
            (
                "usage",
                json!({
                    "input_tokens": input_tokens,
                    "input_tokens_details": {"cached_tokens": cached_tokens, "cache_write_tokens": 0},
                    "output_tokens": output_tokens,
                    "output_tokens_details": {"reasoning_tokens": reasoning_tokens},
                    "total_tokens": input_tokens + output_tokens
                }),
            ),
            ("user", Value::Null),
            ("background", echo("background", false.into())),
            ("service_tier", tier.into()),
            ("metadata", json!({})),
        ];
        Value::Object(
            fields
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect(),
        )
    }
}
