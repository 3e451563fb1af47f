//! A source's `tools/list` as the tools a turn can offer: each allowed tool named for the
//! model (the source's prefix before its name), its `inputSchema` as a Responses API function
//! tool (strict where the schema already meets the strict rules), its annotations read with
//! the protocol's defaults, and whether a call of it may be repeated after a crash.
//!
//! Annotations are hints, and absent ones mean the cautious thing (MCP's defaults):
//! `readOnlyHint` false, `destructiveHint` true, `idempotentHint` false. A tool may be
//! repeated when it says it is read-only or idempotent, or the source's `repeat` says `safe`;
//! `repeat: never` overrides what it says.
//!
//! Owns: that reading, and checking a call's arguments against the tool's schema. Must not:
//! connect to anything.

use serde::Serialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::sources::{MAX_TOOL_NAME, Repeat, Source, valid_name};
use crate::catalog::{ToolDef, ToolLocation};

/// What a tool says of itself (MCP tool annotations, with the protocol's defaults).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Hints {
    /// Changes nothing.
    pub read_only: bool,
    /// May destroy something (meaningful only when not read-only).
    pub destructive: bool,
    /// Calling it again with the same arguments changes nothing more.
    pub idempotent: bool,
    /// Reaches beyond a closed world.
    pub open_world: bool,
}

impl Hints {
    /// The annotations object of a listed tool (`None`: the tool gave none).
    pub fn read(annotations: Option<&Value>) -> Self {
        let flag = |k: &str, default: bool| {
            annotations
                .and_then(|a| a.get(k))
                .and_then(Value::as_bool)
                .unwrap_or(default)
        };
        Self {
            read_only: flag("readOnlyHint", false),
            destructive: flag("destructiveHint", true),
            idempotent: flag("idempotentHint", false),
            open_world: flag("openWorldHint", true),
        }
    }
}

/// One MCP tool as a turn offers it.
pub struct McpTool {
    /// The source's name.
    pub source: String,
    /// Its name at the source.
    pub remote: String,
    /// Its declaration for the model (named with the source's prefix; a server tool).
    pub def: ToolDef,
    /// `def` as a request's function tool (JSON written once, when listed).
    pub wire: Box<RawValue>,
    /// What it says of itself.
    pub hints: Hints,
    /// Whether a call whose outcome a crash left unknown may be made again.
    pub repeat_safe: bool,
    /// Whether a call needs a person's approval before it runs.
    pub needs_approval: bool,
    /// Its `inputSchema`, compiled (`None`: the schema does not compile; calls are not checked
    /// here and the server checks them).
    validator: Option<jsonschema::Validator>,
}

impl std::fmt::Debug for McpTool {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("McpTool")
            .field("name", &self.def.name)
            .field("source", &self.source)
            .field("hints", &self.hints)
            .finish_non_exhaustive()
    }
}

/// Why a listed tool is not offered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Skipped {
    /// The source's allow-list leaves it out.
    #[error("not in the source's allow-list")]
    NotAllowed,
    /// Its name (with the prefix) is not one the Responses API takes.
    #[error("{0:?} is not a valid function name (1 to 64 letters, digits, '_' or '-')")]
    BadName(String),
    /// Its `inputSchema` is not an object schema.
    #[error("its inputSchema is not a JSON schema of type object")]
    BadSchema,
}

impl McpTool {
    /// A listed tool (`tool`: one entry of `tools/list`'s `tools`, as JSON) of `source`.
    pub fn from_listing(source: &Source, tool: &Value) -> Result<Self, Skipped> {
        let remote = tool
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        if !source.allows(&remote) {
            return Err(Skipped::NotAllowed);
        }
        let name = format!("{}{remote}", source.prefix);
        if !valid_name(&name, MAX_TOOL_NAME) {
            return Err(Skipped::BadName(name));
        }
        let schema = tool.get("inputSchema").cloned().unwrap_or(Value::Null);
        if schema.get("type").and_then(Value::as_str) != Some("object") {
            return Err(Skipped::BadSchema);
        }
        let description = tool
            .get("description")
            .or_else(|| tool.get("title"))
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string();
        let hints = Hints::read(tool.get("annotations"));
        let said_destructive = tool
            .get("annotations")
            .and_then(|a| a.get("destructiveHint"))
            .and_then(Value::as_bool);
        let needs_approval = source.needs_approval(&remote, said_destructive, hints.read_only);
        let repeat_safe = match source.repeat.get(&remote) {
            Some(Repeat::Safe) => true,
            Some(Repeat::Never) => false,
            None => hints.read_only || hints.idempotent,
        };
        let def = ToolDef {
            name,
            description,
            strict: crate::catalog::check_strict_schema(&schema).is_ok(),
            parameters: schema,
            location: ToolLocation::Server,
        };
        let wire = crate::catalog::function_tool(&def).map_err(|_| Skipped::BadSchema)?;
        Ok(Self {
            validator: jsonschema::validator_for(&def.parameters).ok(),
            source: source.name.clone(),
            remote,
            def,
            wire,
            hints,
            repeat_safe,
            needs_approval,
        })
    }

    /// The model's arguments (JSON text) as the call's arguments object, checked against the
    /// tool's schema; the error says what is wrong, for the model.
    pub fn arguments(&self, text: &str) -> Result<Map<String, Value>, String> {
        let value: Value = if text.trim().is_empty() {
            Value::Object(Map::new())
        } else {
            serde_json::from_str(text)
                .map_err(|e| format!("the arguments are not valid JSON: {e}"))?
        };
        let Value::Object(args) = value else {
            return Err("the arguments must be a JSON object".into());
        };
        if let Some(v) = &self.validator {
            let problems: Vec<String> = v
                .iter_errors(&Value::Object(args.clone()))
                .take(5)
                .map(|e| {
                    let at = e.instance_path.to_string();
                    if at.is_empty() {
                        e.to_string()
                    } else {
                        format!("{at}: {e}")
                    }
                })
                .collect();
            if !problems.is_empty() {
                return Err(format!(
                    "the arguments do not match the tool's schema: {}",
                    problems.join("; ")
                ));
            }
        }
        Ok(args)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mcp::sources::ToolSources;
    use serde_json::json;

    fn source(extra: &str) -> Source {
        let file = format!(r#"{{"sources": [{{"name": "s", "url": "http://x/mcp"{extra}}}]}}"#);
        ToolSources::parse(&file, |_| None)
            .unwrap()
            .sources
            .remove(0)
    }

    fn listed(annotations: Value) -> Value {
        json!({"name": "add", "description": "adds", "annotations": annotations,
               "inputSchema": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}})
    }

    #[test]
    fn annotations_default_to_caution_and_decide_repeats() {
        let s = source("");
        let t = McpTool::from_listing(&s, &listed(Value::Null)).unwrap();
        assert_eq!(
            t.hints,
            Hints {
                read_only: false,
                destructive: true,
                idempotent: false,
                open_world: true
            }
        );
        assert!(!t.repeat_safe);
        let t = McpTool::from_listing(&s, &listed(json!({"idempotentHint": true}))).unwrap();
        assert!(t.repeat_safe);
        let t = McpTool::from_listing(&s, &listed(json!({"readOnlyHint": true}))).unwrap();
        assert!(t.repeat_safe);
        let never = source(r#", "repeat": {"add": "never"}"#);
        let t = McpTool::from_listing(&never, &listed(json!({"readOnlyHint": true}))).unwrap();
        assert!(!t.repeat_safe, "the operator's word wins");
    }

    #[test]
    fn a_tool_is_named_with_the_prefix_and_offered_as_a_function() {
        let s = source(r#", "prefix": "calc_", "tools": ["ad*"]"#);
        let t = McpTool::from_listing(&s, &listed(Value::Null)).unwrap();
        assert_eq!(t.def.name, "calc_add");
        assert!(
            !t.def.strict,
            "an object without additionalProperties: false is not strict"
        );
        let wire: Value = serde_json::from_str(t.wire.get()).unwrap();
        assert_eq!(wire["type"], "function");
        assert_eq!(wire["name"], "calc_add");
        assert_eq!(wire["parameters"]["required"], json!(["a"]));
        let other = json!({"name": "sub", "inputSchema": {"type": "object"}});
        assert_eq!(
            McpTool::from_listing(&s, &other).unwrap_err(),
            Skipped::NotAllowed
        );
    }

    #[test]
    fn arguments_are_checked_against_the_schema() {
        let t = McpTool::from_listing(&source(""), &listed(Value::Null)).unwrap();
        assert_eq!(t.arguments(r#"{"a": 2}"#).unwrap()["a"], 2);
        let e = t.arguments(r#"{"a": "two"}"#).unwrap_err();
        assert!(e.contains("/a") && e.contains("integer"), "{e}");
        let e = t.arguments("{}").unwrap_err();
        assert!(e.contains("\"a\" is a required property"), "{e}");
        assert!(t.arguments("[1]").unwrap_err().contains("JSON object"));
        assert!(t.arguments("{").unwrap_err().contains("not valid JSON"));
    }
}
