//! Composition (AGN-027 layer B): the only code that assembles model input.
//!
//! Builds `CreateResponse` bodies as the real Responses API wants them (DESIGN.md §3):
//! `input_text` / `input_image` parts, flat function tools sent on every call, the AGN-014 §6
//! catalog block as `instructions` on every call, and either `previous_response_id` or the
//! replayed conversation. Must not: call the model, run tools, loop or retry.

use std::borrow::Cow;
use std::sync::Arc;

use serde::{Serialize, Serializer};
use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::catalog::{CHANGE_MODE_TOOL, LIST_MODES_TOOL, ModeCatalog};
use crate::contexts::HostedTool;
use crate::contract::UserTurn;
use crate::contract::request::Encoding;
use crate::mcp::McpTool;
pub use crate::rag::ContextChunk;
use crate::state::{Prompt, Prompts, SentRequest};

/// The boot prompt used when a turn names no conversation context.
pub const DEFAULT_BOOT_PROMPT: &str = "You are the Aptix Reasoner, an assistant for software teams working with Aptix design records (DDRs), workflows and code. Answer in Markdown. Use only the material in [CONTEXT] as authoritative source content, cite chunks by Id or number, and say so when something you need is missing. Put machine-readable payloads in fenced code blocks with a language tag.";

/// The AGN-014 §6 catalog block (sent as `instructions` on every call), naming the current
/// mode (the catalog's default when the key is unknown).
pub fn mode_block(catalog: &ModeCatalog, current_key: &str) -> String {
    let current = catalog
        .by_key(current_key)
        .unwrap_or_else(|| catalog.default_mode());
    let mut out = format!("Current Mode: {}\n\nAvailable Modes:\n", current.key);
    for m in catalog.modes() {
        out.push_str(&format!("- {}: {}\n", m.key, m.when_to_use));
    }
    out.push_str("\nMode Switching:\n");
    out.push_str("- If the user’s request clearly matches another mode’s \"when to use\" description, you may recommend switching.\n");
    out.push_str(&format!(
        "- If the user expresses interest in switching, follow the instructions in the {CHANGE_MODE_TOOL} tool.\n"
    ));
    out.push_str(&format!(
        "- If you need more detail about modes, call the {LIST_MODES_TOOL} tool."
    ));
    out
}

/// How the call continues the conversation.
#[derive(Debug, Clone, Copy)]
pub enum Continuation<'a> {
    /// The first call of a session.
    Fresh,
    /// Continue from a stored response.
    Previous(&'a str),
    /// Resend these earlier items (servers that do not store responses).
    Replay(&'a [Value]),
}

/// Everything one model call needs.
#[derive(Debug, Clone)]
pub struct CallSpec<'a> {
    /// Model name.
    pub model: &'a str,
    /// The AGN-014 §6 block for the mode current at this call.
    pub instructions: &'a str,
    /// The turn's tools (chosen before the loop) as the `tools` array
    /// ([`crate::catalog::ModeCatalog::wire_tools`]); `None` for none.
    pub tools: Option<&'a RawValue>,
    /// A tool the model must call, if the mode forces one.
    pub tool_choice: Option<&'a str>,
    /// How the call continues the conversation.
    pub continuation: Continuation<'a>,
    /// The new input items of this call.
    pub input: &'a [Value],
    /// The session's prompt cache key ([`prompt_cache_key`]), when the context sends one.
    pub prompt_cache_key: Option<&'a str>,
    /// Made in background mode (`background` and `store` set): the call outlives the
    /// connection, and a worker that dies during it is followed by one that re-attaches.
    pub background: bool,
    /// The service tier asked for (`auto`, `default`, `flex`, `priority`), when one is.
    pub service_tier: Option<&'a str>,
}

/// The `prompt_cache_key` of a session's calls: the model server routes requests with the
/// same key to the same prompt cache, so a session's calls find their shared prefix (its
/// instructions, tools and conversation) cached whichever worker makes them. Keyed by the
/// session, not the conversation context: a session's calls share their whole prefix, while a
/// context's sessions share only the boot prompt, and one key for a busy context would pile
/// its traffic on one cache (the API advises keeping each key's rate modest). The session id
/// is hashed: the key reaches the model provider.
pub fn prompt_cache_key(session: &crate::contract::SessionId) -> String {
    use sha2::{Digest as _, Sha256};
    let digest = Sha256::digest(session.as_str().as_bytes());
    format!("aptix-{}", &crate::hex::lower(&digest)[..32])
}

/// The `CreateResponse` body for one call, serialised once: the text sent.
pub fn request_body(spec: &CallSpec<'_>) -> SentRequest {
    request(spec, &Prompts::default()).sent
}

/// One call's request: the body sent, and the body the turn's transcript keeps — the same
/// without the call's prompt (instructions and tools, the same for every call of a mode and
/// tool set), which it names instead and the store keeps once.
#[derive(Debug, Clone)]
pub struct Request {
    /// The body sent.
    pub sent: SentRequest,
    /// The body kept, naming its prompt.
    pub kept: SentRequest,
    /// The call's prompt.
    pub prompt: Prompt,
}

/// [`request_body`], with the body the transcript keeps: the input is serialised once for
/// both, and the prompt made once per distinct prompt (`prompts` remembers them).
pub fn request(spec: &CallSpec<'_>, prompts: &Prompts) -> Request {
    let replayed = match spec.continuation {
        Continuation::Replay(items) => items,
        Continuation::Fresh | Continuation::Previous(_) => &[],
    };
    // A session's first item, the system message with its boot prompt, is the same for every
    // session of a conversation context: it goes with the prompt too.
    let first = replayed.first().or(spec.input.first());
    let boot = first.filter(|item| item.get("role").and_then(Value::as_str) == Some("system"));
    let rest = raw(&Input(replayed, spec.input, usize::from(boot.is_some())));
    let boot = boot.map(raw);
    let input = match &boot {
        None => rest.clone(),
        Some(boot) => {
            let inner = &rest.get()[1..rest.get().len() - 1];
            let comma = if inner.is_empty() { "" } else { "," };
            RawValue::from_string(format!("[{}{comma}{inner}]", boot.get()))
                .expect("an array of JSON values is JSON")
        }
    };
    let prompt = prompts.of(spec.instructions, spec.tools, boot.as_deref());
    let body = |kept: bool| Body {
        model: spec.model,
        instructions: (!kept).then_some(spec.instructions),
        prompt: kept.then_some(prompt.id.as_str()),
        previous_response_id: match spec.continuation {
            Continuation::Previous(id) => Some(id),
            Continuation::Fresh | Continuation::Replay(_) => None,
        },
        input: if kept { &rest } else { &input },
        tools: spec.tools.filter(|_| !kept),
        tool_choice: spec.tool_choice.map(|name| FunctionChoice {
            kind: "function",
            name,
        }),
        prompt_cache_key: spec.prompt_cache_key,
        background: spec.background.then_some(true),
        store: spec.background.then_some(true),
        service_tier: spec.service_tier,
    };
    Request {
        sent: SentRequest::new(raw(&body(false))),
        kept: SentRequest::new(raw(&body(true))),
        prompt,
    }
}

/// The wire shape of a `CreateResponse` body, borrowing what it sends (and, as the transcript
/// keeps it, naming its prompt instead of carrying it).
#[derive(Serialize)]
struct Body<'a> {
    model: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    instructions: Option<&'a str>,
    #[serde(rename = "aptixPrompt", skip_serializing_if = "Option::is_none")]
    prompt: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    previous_response_id: Option<&'a str>,
    input: &'a RawValue,
    #[serde(skip_serializing_if = "Option::is_none")]
    tools: Option<&'a RawValue>,
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

/// The system message carrying the boot prompt (first call of a session only).
pub fn system_message(boot_prompt: &str) -> Value {
    json!({"role": "system", "content": [{"type": "input_text", "text": boot_prompt}]})
}

/// The user message of a turn: `[MODE]`+`[INSTRUCTION]`, then the `[CONTEXT]` block, then the
/// latched solution context, then clipboard images (AGN-003 §3, AGN-002).
pub fn user_message(
    mode_key: &str,
    turn: &UserTurn,
    solution_context: Option<&str>,
    chunks: &[ContextChunk],
) -> Value {
    let mut parts = vec![json!({
        "type": "input_text",
        "text": format!("[MODE: {mode_key}]\n\n[INSTRUCTION]\n{}", turn.instruction().unwrap_or("")),
    })];
    if let Some(block) = context_block(chunks) {
        parts.push(json!({"type": "input_text", "text": block}));
    }
    if let Some(ctx) = solution_context.filter(|c| !c.trim().is_empty()) {
        parts.push(json!({"type": "input_text", "text": format!("[SOLUTION CONTEXT]\n{ctx}")}));
    }
    for image in turn.clipboard_images() {
        parts.push(json!({"type": "input_image", "image_url": image.data_url(), "detail": "auto"}));
    }
    json!({"role": "user", "content": parts})
}

/// The turn's `tools` array: the mode's tools (`base`, as the catalog wrote them) followed by
/// the MCP tools the turn is offered, each as written when its source listed it, and the
/// agent context's hosted tools. No JSON tree is built: the arrays are joined as text.
pub fn with_tools<'a>(
    base: Option<Cow<'a, RawValue>>,
    mcp: &[Arc<McpTool>],
    hosted: &[HostedTool],
) -> Option<Cow<'a, RawValue>> {
    if mcp.is_empty() && hosted.is_empty() {
        return base;
    }
    let mut joined = String::from("[");
    if let Some(base) = &base {
        let text = base.get().trim();
        let inner = text
            .strip_prefix('[')
            .and_then(|t| t.strip_suffix(']'))
            .unwrap_or_default()
            .trim();
        if !inner.is_empty() {
            joined.push_str(inner);
            joined.push(',');
        }
    }
    let added = mcp
        .iter()
        .map(|t| t.wire.get())
        .chain(hosted.iter().map(HostedTool::wire));
    for (i, wire) in added.enumerate() {
        if i > 0 {
            joined.push(',');
        }
        joined.push_str(wire);
    }
    joined.push(']');
    // Joined from valid JSON values: it parses; should it not, the mode's tools alone go.
    match RawValue::from_string(joined) {
        Ok(raw) => Some(Cow::Owned(raw)),
        Err(_) => base,
    }
}

/// A `function_call_output` input item.
pub fn tool_output(call_id: &str, output: &str) -> Value {
    json!({"type": "function_call_output", "call_id": call_id, "output": output})
}

/// The AGN-002 `[CONTEXT]` block, or `None` when there is nothing to show.
pub fn context_block(chunks: &[ContextChunk]) -> Option<String> {
    if chunks.is_empty() {
        return None;
    }
    let mut out = String::from("[CONTEXT]\n\n");
    for (i, c) in chunks.iter().enumerate() {
        let body = c.content.strip_suffix('\n').unwrap_or(&c.content);
        // A fence longer than any backtick run inside the content keeps the block well-formed.
        let fence = "`".repeat(longest_backtick_run(body).max(2) + 1);
        out.push_str(&format!(
            "=== CHUNK {} ===\nId: {}\nPath: {}\nLines: {}-{}\nLanguage: {}\n{fence}{}\n{body}\n{fence}\n\n",
            i + 1,
            c.id,
            c.path,
            c.line_start,
            c.line_end,
            c.language,
            c.language
        ));
    }
    Some(out)
}

fn longest_backtick_run(s: &str) -> usize {
    let (mut best, mut run) = (0, 0);
    for ch in s.chars() {
        if ch == '`' {
            run += 1;
            best = best.max(run);
        } else {
            run = 0;
        }
    }
    best
}

/// Whole-file chunks for a turn's input artifacts (`Lines: 1-<line count>`).
pub fn artifact_chunks(turn: &UserTurn) -> Vec<ContextChunk> {
    turn.input_artifacts()
        .iter()
        .enumerate()
        .map(|(i, a)| {
            let content = match a.encoding() {
                Encoding::Utf8 => a.contents().to_string(),
                Encoding::Base64 => {
                    let bytes = a.decoded();
                    String::from_utf8(bytes).unwrap_or_else(|e| {
                        format!("(binary content, {} bytes, not shown)", e.as_bytes().len())
                    })
                }
            };
            let lines = content.lines().count().max(1);
            ContextChunk {
                id: format!("artifact_{}", i + 1),
                path: a.relative_path().as_str().to_string(),
                line_start: 1,
                line_end: lines,
                language: a
                    .language()
                    .map(str::to_string)
                    .unwrap_or_else(|| language_of(a.relative_path().as_str()).to_string()),
                content,
            }
        })
        .collect()
}

/// A fence language from a file extension.
pub fn language_of(path: &str) -> &'static str {
    let ext = path.rsplit_once('.').map(|(_, e)| e.to_ascii_lowercase());
    match ext.as_deref() {
        Some("rs") => "rust",
        Some("cs") => "csharp",
        Some("ts" | "tsx") => "typescript",
        Some("js" | "jsx" | "mjs") => "javascript",
        Some("py") => "python",
        Some("md" | "markdown") => "markdown",
        Some("json") => "json",
        Some("xml" | "csproj") => "xml",
        Some("scss") => "scss",
        Some("css") => "css",
        Some("html" | "htm") => "html",
        Some("yml" | "yaml") => "yaml",
        Some("toml") => "toml",
        Some("sh") => "bash",
        Some("go") => "go",
        Some("java") => "java",
        Some("sql") => "sql",
        _ => "text",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_mode_block_names_the_current_mode() {
        let c = ModeCatalog::builtin();
        let p = mode_block(&c, "ddr_authoring");
        assert!(p.starts_with("Current Mode: ddr_authoring\n\nAvailable Modes:\n- general: Use this mode for everyday Q&A"));
        assert!(p.contains("\n\nMode Switching:\n- If the user"));
        assert!(p.ends_with("call the agent_list_modes tool."));
        assert!(mode_block(&c, "unknown").starts_with("Current Mode: general\n"));
    }

    #[test]
    fn context_block_has_the_agn002_layout() {
        let chunks = vec![
            ContextChunk {
                id: "ctx_1".into(),
                path: "Billing/InvoiceManager.cs".into(),
                line_start: 40,
                line_end: 42,
                language: "csharp".into(),
                content: "public class InvoiceManager\n{\n}\n".into(),
            },
            ContextChunk {
                id: "ctx_2".into(),
                path: "docs/a.md".into(),
                line_start: 1,
                line_end: 1,
                language: "markdown".into(),
                content: "# A".into(),
            },
        ];
        let expected = "[CONTEXT]\n\n=== CHUNK 1 ===\nId: ctx_1\nPath: Billing/InvoiceManager.cs\nLines: 40-42\nLanguage: csharp\n```csharp\npublic class InvoiceManager\n{\n}\n```\n\n=== CHUNK 2 ===\nId: ctx_2\nPath: docs/a.md\nLines: 1-1\nLanguage: markdown\n```markdown\n# A\n```\n\n";
        assert_eq!(context_block(&chunks).unwrap(), expected);
        assert_eq!(context_block(&[]), None);
    }

    #[test]
    fn fences_grow_past_backticks_in_content() {
        let c = ContextChunk {
            id: "x".into(),
            path: "a.md".into(),
            line_start: 1,
            line_end: 3,
            language: "markdown".into(),
            content: "```rust\nfn a(){}\n```".into(),
        };
        let block = context_block(&[c]).unwrap();
        assert!(
            block.contains("````markdown\n```rust\nfn a(){}\n```\n````\n"),
            "{block}"
        );
    }
}

#[cfg(test)]
mod body_tests {
    use super::*;
    use crate::catalog::ModeCatalog;

    #[test]
    fn a_forced_tool_becomes_tool_choice_function() {
        let catalog = ModeCatalog::builtin();
        let wire = catalog.wire_tools(catalog.default_mode());
        let tools = wire.as_deref();
        let input = [json!({"role": "user", "content": "x"})];
        let body = request_body(&CallSpec {
            model: "m",
            instructions: "i",
            tools,
            tool_choice: Some("workspace_read_file"),
            continuation: Continuation::Previous("resp_1"),
            input: &input,
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
                instructions: "i",
                tools,
                tool_choice: None,
                continuation: Continuation::Fresh,
                input: &input,
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

    #[test]
    fn a_replayed_body_sends_history_then_input_and_flat_tools_in_order() {
        let catalog = ModeCatalog::builtin();
        let tools = catalog.tools_for(catalog.default_mode());
        let wire = catalog.wire_tools(catalog.default_mode());
        let history = [json!({"role": "assistant", "content": "earlier"})];
        let input = [json!({"role": "user", "content": "now \"quoted\""})];
        let body = request_body(&CallSpec {
            model: "m",
            instructions: "i",
            tools: wire.as_deref(),
            tool_choice: None,
            continuation: Continuation::Replay(&history),
            input: &input,
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
        assert_eq!(keys, ["model", "instructions", "input", "tools"]);
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
            instructions: "i",
            tools: None,
            tool_choice: None,
            continuation: Continuation::Fresh,
            input: &input,
            prompt_cache_key: None,
            background: false,
            service_tier: None,
        });
        assert_eq!(
            bare.json(),
            r#"{"model":"m","instructions":"i","input":[{"role":"user","content":"now \"quoted\""}]}"#
        );
    }
}

/// The mode whose tools a turn offers: the one it started in (a mode change inside a turn takes
/// effect on tools from the next turn).
pub(super) fn tools_mode(
    catalog: &ModeCatalog,
    progress: &crate::store::TurnProgress,
) -> crate::catalog::Mode {
    catalog
        .by_key(&progress.tools_mode_key)
        .unwrap_or_else(|| catalog.default_mode())
        .clone()
}
