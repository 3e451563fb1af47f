//! Composition (AGN-027 layer B): the only code that assembles model input.
//!
//! Builds `CreateResponse` bodies as the real Responses API wants them (DESIGN.md §3):
//! `input_text` / `input_image` parts, flat function tools sent on every call, the AGN-014 §6
//! catalog block as `instructions` on every call, and either `previous_response_id` or the
//! replayed conversation. Must not: call the model, run tools, loop or retry.

use std::borrow::Cow;
use std::sync::Arc;

use serde_json::value::RawValue;
use serde_json::{Value, json};

use crate::catalog::{CHANGE_MODE_TOOL, LIST_MODES_TOOL, ModeCatalog};
use crate::contexts::HostedTool;
use crate::contract::UserTurn;
use crate::contract::request::Encoding;
use crate::mcp::McpTool;
pub use crate::rag::ContextChunk;

mod body;
pub use body::{Request, request};

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

/// Every mode's [`mode_block`], written once for a catalog: the block is the same on every
/// call in a mode, and writing it took six `format!`s a call.
#[derive(Debug)]
pub struct ModeBlocks {
    /// Each mode's key and block, in the catalog's order.
    blocks: Vec<(String, Instructions)>,
    /// The default mode's block, for a key the catalog does not know.
    default: Instructions,
}

impl ModeBlocks {
    /// The blocks of `catalog`'s modes.
    pub fn of(catalog: &ModeCatalog) -> Self {
        Self {
            blocks: (catalog.modes().iter())
                .map(|m| {
                    (
                        m.key.clone(),
                        Instructions::new(mode_block(catalog, &m.key)),
                    )
                })
                .collect(),
            default: Instructions::new(mode_block(catalog, &catalog.default_mode().key)),
        }
    }

    /// [`mode_block`] for `current_key`.
    pub fn get(&self, current_key: &str) -> &Instructions {
        (self.blocks.iter())
            .find(|(key, _)| key == current_key)
            .map_or(&self.default, |(_, block)| block)
    }
}

/// A call's `instructions`: the text (what its prompt is made of) and the same text as a JSON
/// string, escaped once rather than on every call that sends it.
#[derive(Debug)]
pub struct Instructions {
    text: String,
    json: Box<RawValue>,
}

impl Instructions {
    /// `text` as instructions.
    pub fn new(text: String) -> Self {
        // Infallible: a string written to memory.
        let json = serde_json::value::to_raw_value(&text).expect("a string always serialises");
        Self { text, json }
    }

    /// The text.
    pub fn text(&self) -> &str {
        &self.text
    }

    /// The text as a JSON string.
    pub fn json(&self) -> &RawValue {
        &self.json
    }
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
    pub instructions: &'a Instructions,
    /// The turn's tools (chosen before the loop) as the `tools` array
    /// ([`crate::catalog::ModeCatalog::wire_tools`]); `None` for none.
    pub tools: Option<&'a RawValue>,
    /// A tool the model must call, if the mode forces one.
    pub tool_choice: Option<&'a str>,
    /// How the call continues the conversation.
    pub continuation: Continuation<'a>,
    /// The new input items of this call.
    pub input: &'a [Value],
    /// The boot prompt, on a session's first call: its system message opens the input (the
    /// turn carries the prompt's text, not the message, until the call is answered).
    pub boot: Option<&'a str>,
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

/// The mode whose tools a turn offers: the one it started in (a mode change inside a turn takes
/// effect on tools from the next turn). Lent by the catalog: a turn waiting on its model holds
/// no copy of it.
pub(super) fn tools_mode<'a>(
    catalog: &'a ModeCatalog,
    progress: &crate::store::TurnProgress,
) -> &'a crate::catalog::Mode {
    catalog
        .by_key(&progress.tools_mode_key)
        .unwrap_or_else(|| catalog.default_mode())
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

    /// The blocks written once are the ones written per call, an unknown key's included.
    #[test]
    fn the_mode_blocks_are_the_mode_block_of_each_key() {
        let c = ModeCatalog::builtin();
        let blocks = ModeBlocks::of(&c);
        for key in c.keys().into_iter().chain(["unknown", ""]) {
            let block = blocks.get(key);
            assert_eq!(block.text(), mode_block(&c, key), "{key}");
            let sent: String = serde_json::from_str(block.json().get()).expect("a JSON string");
            assert_eq!(sent, block.text(), "{key}");
        }
        assert!(
            blocks
                .get("ddr_authoring")
                .text()
                .starts_with("Current Mode: ddr_authoring\n")
        );
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
