//! A call's prompt — its instructions and tools, the same for every call of a mode and tool
//! set — kept once by the store rather than in every turn's transcript, and joined back into a
//! request when a turn is inspected.

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use serde_json::Value;
use serde_json::value::RawValue;

use super::SentRequest;

/// The field of a kept request (see [`Prompt`]) that names its prompt.
pub const PROMPT_FIELD: &str = "aptixPrompt";

/// A call's instructions and tools (and a session's first call's system message) as one JSON
/// object, named by its content: the first 32 hex
/// digits of the SHA-256 of that text. A turn's transcript keeps each request without them,
/// naming the prompt under [`PROMPT_FIELD`]; the store keeps the prompt (see
/// [`crate::store::RecordWriter::keep_prompt`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Prompt {
    /// Its name.
    pub id: String,
    /// `{"instructions": …, "tools": […], "boot": {…}}` (no `tools` without any, no `boot`
    /// but for a session's first call).
    pub json: Arc<str>,
    /// How every body sent with it opens: `{"instructions": …, "tools": […], "input": [` and
    /// the boot message (see [`super::WireRequest`]); the call's own items follow.
    pub opening: bytes::Bytes,
}

/// Prompts made so far, by a fast hash (XXH3, 128 bits) of their parts: a call whose prompt
/// was made before — every call of a mode and tool set but the first — costs one pass of that
/// hash over its parts instead of their serialisation and SHA-256.
#[derive(Debug, Default)]
pub struct Prompts {
    made: Mutex<HashMap<u128, Prompt>>,
}

/// Prompts a [`Prompts`] remembers (a handful per mode, tool set and conversation context);
/// past that it starts again.
const PROMPTS_MADE: usize = 1024;

impl Prompts {
    /// [`Prompt::of`], made once per distinct prompt.
    pub fn of(
        &self,
        instructions: &str,
        tools: Option<&RawValue>,
        boot: Option<&RawValue>,
    ) -> Prompt {
        let mut hasher = xxhash_rust::xxh3::Xxh3::new();
        for part in [
            Some(instructions),
            tools.map(RawValue::get),
            boot.map(RawValue::get),
        ] {
            let part = part.unwrap_or_default();
            hasher.update(&(part.len() as u64).to_le_bytes());
            hasher.update(part.as_bytes());
        }
        let key = hasher.digest128();
        let Ok(mut made) = self.made.lock() else {
            return Prompt::of(instructions, tools, boot);
        };
        if let Some(prompt) = made.get(&key) {
            return prompt.clone();
        }
        let prompt = Prompt::of(instructions, tools, boot);
        if made.len() >= PROMPTS_MADE {
            made.clear();
        }
        made.insert(key, prompt.clone());
        prompt
    }
}

#[derive(Serialize)]
struct Parts<'a> {
    instructions: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    boot: Option<&'a RawValue>,
}

impl Prompt {
    /// The prompt of a call with these instructions and tools, and `boot`, the input's first
    /// item when it is the system message with a session's boot prompt.
    pub fn of(instructions: &str, tools: Option<&RawValue>, boot: Option<&RawValue>) -> Self {
        use sha2::{Digest as _, Sha256};
        // Infallible: a string and raw JSON, written to memory.
        let json = serde_json::to_string(&Parts {
            instructions,
            tools,
            boot,
        })
        .unwrap_or_default();
        let digest = Sha256::digest(json.as_bytes());
        let id = digest[..16].iter().map(|b| format!("{b:02x}")).collect();
        let mut opening = serde_json::to_vec(&Parts {
            instructions,
            tools,
            boot: None,
        })
        .unwrap_or_default();
        // In place of the object's closing brace, the input array opens.
        opening.pop();
        opening.extend_from_slice(b",\"input\":[");
        if let Some(boot) = boot {
            opening.extend_from_slice(boot.get().as_bytes());
        }
        Self {
            id,
            json: json.into(),
            opening: opening.into(),
        }
    }
}

/// The prompt a kept request names, if it names one (a request kept before prompts were kept
/// apart holds its instructions and tools itself).
pub fn prompt_of(request: &Value) -> Option<&str> {
    request.get(PROMPT_FIELD)?.as_str()
}

/// A kept request as it was sent: its prompt's instructions and tools put back from `prompts`
/// (by id). A prompt the store no longer holds leaves the request naming it, as kept.
pub fn joined(request: &SentRequest, prompts: &BTreeMap<String, String>) -> Option<Value> {
    let mut value = request.to_value().ok()?;
    let Some(json) = prompt_of(&value).and_then(|id| prompts.get(id)) else {
        return Some(value);
    };
    let Ok(Value::Object(mut parts)) = serde_json::from_str::<Value>(json) else {
        return Some(value);
    };
    let boot = parts.remove("boot");
    if let Value::Object(map) = &mut value {
        map.remove(PROMPT_FIELD);
        map.extend(parts);
        if let (Some(boot), Some(Value::Array(input))) = (boot, map.get_mut("input")) {
            input.insert(0, boot);
        }
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kept(text: &str) -> SentRequest {
        SentRequest::new(RawValue::from_string(text.to_owned()).unwrap())
    }

    #[test]
    fn a_prompt_is_named_by_its_content() {
        let tools = RawValue::from_string(r#"[{"type":"function","name":"f"}]"#.into()).unwrap();
        let a = Prompt::of("be brief", Some(&tools), None);
        assert_eq!(
            &*a.json,
            r#"{"instructions":"be brief","tools":[{"type":"function","name":"f"}]}"#
        );
        assert_eq!(a.id.len(), 32);
        assert_eq!(
            &a.opening[..],
            br#"{"instructions":"be brief","tools":[{"type":"function","name":"f"}],"input":["#
        );
        assert_eq!(a, Prompt::of("be brief", Some(&tools), None));
        assert_ne!(a.id, Prompt::of("be brief", None, None).id);
        assert_ne!(a.id, Prompt::of("be long", Some(&tools), None).id);
        let boot = RawValue::from_string(r#"{"role":"system"}"#.into()).unwrap();
        assert_ne!(a.id, Prompt::of("be brief", Some(&tools), Some(&boot)).id);
    }

    #[test]
    fn a_prompt_made_before_is_the_same_prompt() {
        let prompts = Prompts::default();
        let tools = RawValue::from_string(r#"[{"type":"function","name":"f"}]"#.into()).unwrap();
        let a = prompts.of("be brief", Some(&tools), None);
        assert_eq!(a, Prompt::of("be brief", Some(&tools), None));
        assert!(Arc::ptr_eq(
            &a.json,
            &prompts.of("be brief", Some(&tools), None).json
        ));
        // Parts that join to the same text are still other prompts.
        let b = prompts.of("be brief[", None, None);
        assert_ne!(a.id, b.id);
        assert_eq!(b, Prompt::of("be brief[", None, None));
    }

    #[test]
    fn a_kept_request_gets_its_prompt_back_or_names_it() {
        let boot = RawValue::from_string(r#"{"role":"system","content":"boot"}"#.into()).unwrap();
        let prompt = Prompt::of("be brief", None, Some(&boot));
        assert_eq!(
            &prompt.opening[..],
            br#"{"instructions":"be brief","input":[{"role":"system","content":"boot"}"#
        );
        let request = kept(&format!(
            r#"{{"model":"m","aptixPrompt":"{}","input":[{{"role":"user"}}]}}"#,
            prompt.id
        ));
        let prompts = BTreeMap::from([(prompt.id.clone(), prompt.json.to_string())]);
        let full = joined(&request, &prompts).unwrap();
        assert_eq!(
            full,
            serde_json::json!({"model": "m", "instructions": "be brief", "input": [
                {"role": "system", "content": "boot"}, {"role": "user"}
            ]})
        );
        // Not kept any more: the request as kept, naming it.
        let named = joined(&request, &BTreeMap::new()).unwrap();
        assert_eq!(prompt_of(&named), Some(prompt.id.as_str()));
        // A request kept whole (before prompts were kept apart) is as it was.
        let whole = kept(r#"{"model":"m","instructions":"x","input":[]}"#);
        assert_eq!(joined(&whole, &prompts), whole.to_value().ok());
    }
}
