//! A call's `CreateResponse` body: the text sent, and the text the turn's transcript keeps —
//! the same without the call's prompt, which it names instead (see [`crate::state::Prompt`]).

use serde::{Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

use super::{CallSpec, Continuation};
use crate::state::{Prompt, Prompts, SentRequest, WireRequest};

/// One call's request: the body sent, and the body the turn's transcript keeps — the same
/// without the call's prompt (instructions and tools, the same for every call of a mode and
/// tool set), which it names instead and the store keeps once.
#[derive(Debug, Clone)]
pub struct Request {
    /// The body sent: its prompt's opening (shared), then the call's own bytes.
    pub sent: WireRequest,
    /// The body kept, naming its prompt.
    pub kept: SentRequest,
    /// The call's prompt.
    pub prompt: Prompt,
}

/// The body [`request`] sends (for tests of the body alone).
#[cfg(test)]
fn request_body(spec: &CallSpec<'_>) -> WireRequest {
    request(spec, &Prompts::default()).sent
}

/// The `CreateResponse` body for one call, with the body the transcript keeps: the input is
/// serialised once for both, and the prompt made once per distinct prompt (`prompts`
/// remembers them) — the body sent is that prompt's opening, shared, then the call's own
/// bytes: the rest of the input and the call's other members.
pub fn request(spec: &CallSpec<'_>, prompts: &Prompts) -> Request {
    let replayed = match spec.continuation {
        Continuation::Replay(items) => items,
        Continuation::Fresh | Continuation::Previous(_) => &[],
    };
    // A session's first item, the system message with its boot prompt, is the same for every
    // session of a conversation context: it goes with the prompt too. On the first call it
    // comes as the prompt's text; a replayed conversation opens with it.
    let first = replayed.first().or(spec.input.first());
    let listed = first
        .filter(|item| item.get("role").and_then(Value::as_str) == Some("system"))
        .filter(|_| spec.boot.is_none());
    let rest = raw(&Input(replayed, spec.input, usize::from(listed.is_some())));
    let boot = match spec.boot {
        Some(text) => Some(raw(&SystemMessage::of(text))),
        None => listed.map(raw),
    };
    let prompt = prompts.of(spec.instructions.text(), spec.tools, boot.as_deref());
    Request {
        sent: WireRequest::new(
            prompt.opening.clone(),
            own_piece(&rest, boot.is_some(), &Members::of(spec, None, None)),
        ),
        kept: SentRequest::new(raw(&Members::of(spec, Some(&prompt.id), Some(&rest)))),
        prompt,
    }
}

/// The call's own piece of the body sent, after its prompt's opening (which ends inside the
/// input array, after the boot message when `after_boot`): the input's other items, the
/// array closed, then the call's other members, and the object closed.
fn own_piece(input: &RawValue, after_boot: bool, members: &Members<'_>) -> bytes::Bytes {
    let items = input.get();
    let items = items
        .strip_prefix('[')
        .and_then(|inner| inner.strip_suffix(']'))
        .unwrap_or_default();
    let mut own = Vec::with_capacity(items.len() + 256);
    if after_boot && !items.is_empty() {
        own.push(b',');
    }
    own.extend_from_slice(items.as_bytes());
    own.push(b']');
    let at = own.len();
    // Infallible: strings, bools and JSON values written to memory; `model` is always there,
    // so the object written is never empty and its opening brace becomes a comma.
    if serde_json::to_writer(&mut own, members).is_ok()
        && let Some(brace) = own.get_mut(at)
    {
        *brace = b',';
    }
    own.into()
}

/// The members of a `CreateResponse` body besides its prompt's (instructions and tools):
/// with the input and the prompt's name as the transcript keeps it, alone after the input
/// as sent.
#[derive(Serialize)]
struct Members<'a> {
    model: &'a str,
    #[serde(rename = "aptixPrompt", skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_response_id: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    input: Option<&'a RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    tool_choice: Option<FunctionChoice<'a>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    prompt_cache_key: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    background: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    store: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    service_tier: Option<&'a str>,
}

impl<'a> Members<'a> {
    fn of(spec: &CallSpec<'a>, prompt: Option<&'a str>, input: Option<&'a RawValue>) -> Self {
        Self {
            model: spec.model,
            prompt,
            previous_response_id: match spec.continuation {
                Continuation::Previous(id) => Some(id),
                Continuation::Fresh | Continuation::Replay(_) => None,
            },
            input,
            tool_choice: spec.tool_choice.map(|name| FunctionChoice {
                kind: "function",
                name,
            }),
            prompt_cache_key: spec.prompt_cache_key,
            background: spec.background.then_some(true),
            store: spec.background.then_some(true),
            service_tier: spec.service_tier,
        }
    }
}

/// A session's system message ([`super::system_message`]) written from its text, with no
/// JSON tree made for it.
#[derive(Serialize)]
struct SystemMessage<'a> {
    role: &'static str,
    content: [InputText<'a>; 1],
}

#[derive(Serialize)]
struct InputText<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    text: &'a str,
}

impl<'a> SystemMessage<'a> {
    fn of(text: &'a str) -> Self {
        Self {
            role: "system",
            content: [InputText {
                kind: "input_text",
                text,
            }],
        }
    }
}

/// The replayed items, then the call's new ones, as one array (without the first so many).
struct Input<'a>(&'a [Value], &'a [Value], usize);

impl Serialize for Input<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_seq(self.0.iter().chain(self.1).skip(self.2))
    }
}

/// `value` as raw JSON. Infallible for what a request holds: strings, bools, numbers and JSON
/// values (whose map keys are strings), written to memory.
fn raw<T: Serialize + ?Sized>(value: &T) -> Box<RawValue> {
    serde_json::value::to_raw_value(value).expect("JSON values always serialise")
}

#[derive(Serialize)]
struct FunctionChoice<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
}

#[cfg(test)]
mod body_tests {
    use super::*;
    use crate::catalog::ModeCatalog;
    use crate::pipeline::compose::{Instructions, system_message};
    use serde_json::json;

    #[test]
    fn the_kept_body_with_its_prompt_put_back_is_the_body_sent() {
        let catalog = ModeCatalog::builtin();
        let wire = catalog.wire_tools(catalog.default_mode());
        let boot = system_message("boot prompt");
        let history = [boot, json!({"role": "assistant", "content": "earlier"})];
        let input = [json!({"role": "user", "content": "now"})];
        for (replayed, input) in [
            (&history[..], &input[..]),
            (&[][..], &history[..1]),
            (&[][..], &input[..]),
        ] {
            let made = request(
                &CallSpec {
                    model: "m",
                    instructions: &Instructions::new("i".into()),
                    tools: wire.as_deref(),
                    tool_choice: None,
                    continuation: Continuation::Replay(replayed),
                    input,
                    boot: None,
                    prompt_cache_key: None,
                    background: false,
                    service_tier: None,
                },
                &Prompts::default(),
            );
            let kept = made.kept.to_value().unwrap();
            assert!(kept.get("instructions").is_none() && kept.get("tools").is_none());
            let prompts = std::collections::BTreeMap::from([(
                made.prompt.id.clone(),
                made.prompt.json.to_string(),
            )]);
            assert_eq!(
                crate::state::joined(&made.kept, &prompts),
                made.sent.to_value().ok()
            );
        }
    }

    #[test]
    fn a_forced_tool_becomes_tool_choice_function() {
        let catalog = ModeCatalog::builtin();
        let wire = catalog.wire_tools(catalog.default_mode());
        let tools = wire.as_deref();
        let input = [json!({"role": "user", "content": "x"})];
        let body = request_body(&CallSpec {
            model: "m",
            instructions: &Instructions::new("i".into()),
            tools,
            tool_choice: Some("workspace_read_file"),
            continuation: Continuation::Previous("resp_1"),
            input: &input,
            boot: None,
            prompt_cache_key: Some("aptix-k"),
            background: true,
            service_tier: Some("flex"),
        })
        .to_value()
        .expect("json");
        // Background mode asks the server to keep the response (it is followed by its id).
        assert_eq!(
            (&body["background"], &body["store"], &body["service_tier"]),
            (&json!(true), &json!(true), &json!("flex"))
        );
        assert_eq!(
            body["tool_choice"],
            json!({"type": "function", "name": "workspace_read_file"})
        );
        assert_eq!(body["previous_response_id"], "resp_1");
        assert_eq!(body["prompt_cache_key"], "aptix-k");
        let none = request_body(&CallSpec {
            tool_choice: None,
            ..CallSpec {
                model: "m",
                instructions: &Instructions::new("i".into()),
                tools,
                tool_choice: None,
                continuation: Continuation::Fresh,
                input: &input,
                boot: None,
                prompt_cache_key: None,
                background: false,
                service_tier: None,
            }
        })
        .to_value()
        .expect("json");
        assert!(none.get("tool_choice").is_none(), "omitted means auto");
        assert!(none.get("previous_response_id").is_none());
        for field in ["background", "store", "service_tier"] {
            assert!(none.get(field).is_none(), "{field} is sent only when set");
        }
    }
}

#[cfg(test)]
mod wire_tests {
    use super::*;
    use crate::catalog::ModeCatalog;
    use crate::pipeline::compose::Instructions;
    use serde_json::json;

    #[test]
    fn a_replayed_body_sends_history_then_input_and_flat_tools_in_order() {
        let catalog = ModeCatalog::builtin();
        let tools = catalog.tools_for(catalog.default_mode());
        let wire = catalog.wire_tools(catalog.default_mode());
        let history = [json!({"role": "assistant", "content": "earlier"})];
        let input = [json!({"role": "user", "content": "now \"quoted\""})];
        let block = "Current Mode: \"ddr\"\n\t- one\u{1}";
        let body = request_body(&CallSpec {
            model: "m",
            instructions: &Instructions::new(block.into()),
            tools: wire.as_deref(),
            tool_choice: None,
            continuation: Continuation::Replay(&history),
            input: &input,
            boot: None,
            prompt_cache_key: None,
            background: false,
            service_tier: None,
        });
        let v = body.to_value().expect("the body is JSON");
        let keys: Vec<&str> = v
            .as_object()
            .expect("an object")
            .keys()
            .map(String::as_str)
            .collect();
        assert_eq!(keys, ["instructions", "tools", "input", "model"]);
        // Sent as escaped once, when the block was made.
        assert_eq!(v["instructions"], json!(block));
        assert_eq!(v["input"], json!([history[0], input[0]]));
        let first = &tools[0];
        assert_eq!(
            v["tools"][0],
            json!({"type": "function", "name": first.name, "description": first.description,
                   "parameters": first.parameters, "strict": first.strict})
        );
        assert_eq!(v["tools"].as_array().map(Vec::len), Some(tools.len()));
        let bare = request_body(&CallSpec {
            model: "m",
            instructions: &Instructions::new("i".into()),
            tools: None,
            tool_choice: None,
            continuation: Continuation::Fresh,
            input: &input,
            boot: None,
            prompt_cache_key: None,
            background: false,
            service_tier: None,
        });
        assert_eq!(
            bare.joined(),
            br#"{"instructions":"i","input":[{"role":"user","content":"now \"quoted\""}],"model":"m"}"#
        );
    }

    #[test]
    fn calls_with_one_prompt_share_its_opening_and_hold_only_their_own_bytes() {
        let catalog = ModeCatalog::builtin();
        let wire = catalog.wire_tools(catalog.default_mode());
        let instructions = Instructions::new("a long block of instructions".repeat(20));
        let prompts = Prompts::default();
        let boot = crate::pipeline::compose::system_message("boot prompt");
        let call = |input: &[Value]| {
            request(
                &CallSpec {
                    model: "m",
                    instructions: &instructions,
                    tools: wire.as_deref(),
                    tool_choice: None,
                    continuation: Continuation::Fresh,
                    input,
                    boot: None,
                    prompt_cache_key: None,
                    background: false,
                    service_tier: None,
                },
                &prompts,
            )
            .sent
        };
        let a = call(&[boot.clone(), json!({"role": "user", "content": "one"})]);
        let b = call(&[boot, json!({"role": "user", "content": "two"})]);
        let ([opening_a, own_a], [opening_b, own_b]) = (a.pieces(), b.pieces());
        assert_eq!(
            opening_a.as_ptr(),
            opening_b.as_ptr(),
            "one opening, shared"
        );
        assert!(opening_a.len() > 1000, "the bulk: {}", opening_a.len());
        for own in [own_a, own_b] {
            let own = std::str::from_utf8(own).expect("text");
            assert!(own.len() < 100, "{own}");
            assert!(!own.contains("instructions") && !own.contains("boot prompt"));
        }
        assert_eq!(
            own_a,
            &br#",{"role":"user","content":"one"}],"model":"m"}"#[..]
        );
    }

    /// A first call carries its boot prompt as text (the turn holds no JSON tree of it while
    /// it waits): its body is the one the system message as its first item made, byte for
    /// byte, on the same shared opening; its kept body names the same prompt.
    #[test]
    fn a_boot_prompt_given_as_text_opens_the_body_as_its_system_message_did() {
        let text = "boot \"prompt\"\nwith a line \u{e9}";
        assert_eq!(
            raw(&SystemMessage::of(text)).get(),
            raw(&crate::pipeline::compose::system_message(text)).get()
        );
        let prompts = Prompts::default();
        let user = json!({"role": "user", "content": "now"});
        let listed = [crate::pipeline::compose::system_message(text), user.clone()];
        let call = |input: &[Value], boot| {
            request(
                &CallSpec {
                    model: "m",
                    instructions: &Instructions::new("i".into()),
                    tools: None,
                    tool_choice: None,
                    continuation: Continuation::Fresh,
                    input,
                    boot,
                    prompt_cache_key: None,
                    background: false,
                    service_tier: None,
                },
                &prompts,
            )
        };
        let (as_item, as_text) = (call(&listed, None), call(&listed[1..], Some(text)));
        assert_eq!(as_text.sent.joined(), as_item.sent.joined());
        let [opening_item, _] = as_item.sent.pieces();
        let [opening_text, own] = as_text.sent.pieces();
        assert_eq!(opening_text.as_ptr(), opening_item.as_ptr(), "one opening");
        assert!(!std::str::from_utf8(own).expect("text").contains("boot"));
        assert_eq!(as_text.kept, as_item.kept);
        assert_eq!(as_text.prompt.id, as_item.prompt.id);
        let sent = as_text.sent.to_value().expect("JSON");
        assert_eq!(sent["input"], json!(listed), "the system message first");
    }
}
