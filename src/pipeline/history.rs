//! Whether a call that continued from a response (`previous_response_id`) was answered with
//! the conversation it continued. OpenAI's servers keep it; a gateway bridging the Responses
//! API onto a chat-only model (LiteLLM for Anthropic, Bedrock, a chat-only vLLM, any custom
//! provider) rebuilds it from its own logs, and without them answers from the new input alone,
//! without an error. The answer's `input_tokens` tells: a server that read the conversation
//! counts it again, so the input is at least the previous response's input and visible output
//! (when the instructions and tools are the same) plus something for the new items.
//!
//! Owns: that arithmetic. Must not: call the model or decide what happens next (the model call
//! replays the conversation and makes the call again).

use serde_json::Value;

use crate::contract::Usage;
use crate::state::{CallTokens, SessionState, TurnProgress};

/// The prompt's fixed part a call is made with: the session's mode (its instructions) and the
/// mode whose tools the turn offers.
pub(super) fn shape(mode_key: &str, tools_mode_key: &str) -> String {
    format!("{mode_key}|{tools_mode_key}")
}

/// What response `response_id`, answered with `usage` for a call of `shape`, carries into the
/// next call.
pub(super) fn carried(response_id: &str, usage: &Usage, shape: String) -> CallTokens {
    CallTokens {
        response_id: response_id.to_string(),
        carried: (usage.prompt_tokens + usage.completion_tokens)
            .saturating_sub(usage.reasoning_tokens),
        shape,
    }
}

/// What the response `previous` names carries, when the turn or the session knows it.
pub(super) fn prior<'a>(
    previous: Option<&str>,
    progress: &'a TurnProgress,
    session: &'a SessionState,
) -> Option<&'a CallTokens> {
    let previous = previous?;
    [progress.last_call.as_ref(), session.previous_call.as_ref()]
        .into_iter()
        .flatten()
        .find(|c| c.response_id == previous)
}

/// Whether an answer with `usage` to a call of `shape` that sent `input` after `prior` was made
/// without `prior`'s conversation. Conservative: the new items are counted at one token per
/// sixteen characters of their text (real text takes about four), a small tolerance covers
/// outputs counted again as input, and an answer without usage tells nothing.
pub(super) fn lost(prior: &CallTokens, shape: &str, usage: &Usage, input: &[Value]) -> bool {
    if prior.shape != shape || usage.prompt_tokens == 0 {
        return false;
    }
    let own = text_chars(input) / 16;
    let tolerance = 8 + prior.carried / 64;
    usage.prompt_tokens + tolerance < prior.carried + own
}

/// The characters of the text inside `items`: message text, tool outputs, call arguments (not
/// the framing: types, roles, ids).
fn text_chars(items: &[Value]) -> u64 {
    fn walk(v: &Value, text: bool) -> u64 {
        match v {
            Value::String(s) if text => s.chars().count() as u64,
            Value::Array(a) => a.iter().map(|v| walk(v, text)).sum(),
            Value::Object(o) => o
                .iter()
                .map(|(k, v)| walk(v, TEXT_KEYS.contains(&k.as_str())))
                .sum(),
            _ => 0,
        }
    }
    items.iter().map(|i| walk(i, false)).sum()
}

/// The fields of input items that hold text the model reads.
const TEXT_KEYS: &[&str] = &["content", "text", "output", "arguments"];

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn usage(prompt: u64, completion: u64, reasoning: u64) -> Usage {
        Usage {
            prompt_tokens: prompt,
            completion_tokens: completion,
            total_tokens: prompt + completion,
            reasoning_tokens: reasoning,
            ..Usage::default()
        }
    }

    #[test]
    fn a_response_carries_its_input_and_visible_output() {
        let c = carried("resp_1", &usage(100, 80, 30), shape("general", "general"));
        assert_eq!(c.carried, 150);
        assert_eq!(c.shape, "general|general");
    }

    #[test]
    fn an_answer_that_counted_less_than_the_conversation_did_not_see_it() {
        let prior = carried("resp_1", &usage(38, 56, 0), shape("a", "a"));
        let input = [json!({"role": "user", "content": "again"})];
        // Through a bridge that dropped the history: only the new message was counted.
        assert!(lost(&prior, "a|a", &usage(27, 50, 0), &input));
        // A server that kept it counts the 94 carried tokens again, and more.
        assert!(!lost(&prior, "a|a", &usage(127, 50, 0), &input));
        // Another prompt (a mode change between the calls): nothing can be told.
        assert!(!lost(&prior, "b|a", &usage(27, 50, 0), &input));
        // No usage reported: nothing can be told.
        assert!(!lost(&prior, "a|a", &usage(0, 0, 0), &input));
    }

    #[test]
    fn long_new_items_raise_what_the_answer_must_count() {
        let prior = carried("resp_1", &usage(1000, 200, 0), shape("a", "a"));
        let long = "x".repeat(16_000);
        let input = [json!({"type": "function_call_output", "call_id": "c", "output": long})];
        // 1,200 carried and 1,000 for the output (at a sixteenth): 1,300 is too few.
        assert!(lost(&prior, "a|a", &usage(1300, 10, 0), &input));
        assert!(!lost(&prior, "a|a", &usage(4300, 10, 0), &input));
    }

    #[test]
    fn only_the_text_of_new_items_counts_not_their_framing() {
        let items = [
            json!({"role": "user", "content": [{"type": "input_text", "text": "abcd"}]}),
            json!({"type": "function_call_output", "call_id": "call_123456", "output": "xy"}),
        ];
        assert_eq!(text_chars(&items), 6);
    }

    #[test]
    fn the_prior_is_the_one_the_call_continues_from() {
        let mut progress = TurnProgress::default();
        let session: SessionState = serde_json::from_value(json!({
            "sessionId": "s", "modeId": "m", "modeKey": "general", "modeHistory": [],
            "previousResponseId": "resp_s", "replay": false, "createdAt": "", "updatedAt": "",
            "previousCall": {"responseId": "resp_s", "carried": 5, "shape": "x"}
        }))
        .unwrap_or_else(|e| panic!("a session: {e}"));
        assert_eq!(
            prior(Some("resp_s"), &progress, &session).map(|c| c.carried),
            Some(5)
        );
        progress.last_call = Some(carried("resp_t", &usage(1, 1, 0), "x".into()));
        assert_eq!(
            prior(Some("resp_t"), &progress, &session).map(|c| c.carried),
            Some(2)
        );
        assert!(prior(Some("resp_other"), &progress, &session).is_none());
        assert!(prior(None, &progress, &session).is_none());
    }
}
