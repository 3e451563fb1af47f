//! The mode catalog (AGN-013/AGN-014) and the tool declarations it refers to.
//!
//! Owns: which modes exist, which tools each mode offers (with their JSON schemas and whether
//! they run on the server or the client), the built-in seed modes (`builtin.rs`) and start-up
//! validation of every AGN-014 invariant. Must not: persist anything, call the model, or write
//! prompt text (the catalog block sent to the model is composed in `pipeline::compose`).

use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use serde_json::{Value, json};

mod builtin;

/// Name of the mode change tool (TUL-007); every mode offers it.
pub const CHANGE_MODE_TOOL: &str = "agent_change_mode";
/// Name of the mode listing tool (TUL-010).
pub const LIST_MODES_TOOL: &str = "agent_list_modes";
/// Name of the built-in client tool that reads a workspace file on the client.
pub const READ_FILE_TOOL: &str = "workspace_read_file";

/// Where a tool runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ToolLocation {
    /// Implemented by this server (a registered server tool).
    Server,
    /// Run by the client; a call ends the turn as `client_tool_continuation`.
    Client,
}

/// A tool as declared in the catalog.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ToolDef {
    /// The function name the model calls.
    pub name: String,
    /// What it does, for the model.
    pub description: String,
    /// JSON schema of its arguments.
    pub parameters: Value,
    /// Whether the model must follow the schema exactly (all properties required, no extras).
    #[serde(default = "default_true")]
    pub strict: bool,
    /// Server or client.
    pub location: ToolLocation,
}

fn default_true() -> bool {
    true
}

/// A mode's lifecycle status.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ModeStatus {
    /// In normal use.
    Active,
    /// Available, may change.
    Experimental,
    /// Kept for old sessions; avoid.
    Deprecated,
}

/// One mode (AGN-014 §3), immutable at runtime.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Mode {
    /// 32 uppercase hex characters (a GUID without hyphens); stored in sessions.
    pub id: String,
    /// snake_case key used in prompts and tools.
    pub key: String,
    /// UI label (`modeDisplayName`).
    pub display_name: String,
    /// What the mode covers.
    pub description: String,
    /// One sentence: when to choose this mode.
    pub when_to_use: String,
    /// Whether new sessions start here (exactly one mode).
    #[serde(default)]
    pub is_default: bool,
    /// Lifecycle status; must be a known value when present.
    #[serde(default = "default_status")]
    pub status: ModeStatus,
    /// Names of the tools this mode offers.
    #[serde(default)]
    pub tools: Vec<String>,
    /// A tool the model must call on every call in this mode (`tool_choice`), if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_choice: Option<String>,
    /// Shown once when a session switches into this mode.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub welcome_message: Option<String>,
    /// Roles of the humans who typically use this mode.
    #[serde(default)]
    pub human_role_hints: Vec<String>,
    /// Requests that clearly belong to this mode.
    #[serde(default)]
    pub example_utterances: Vec<String>,
}

fn default_status() -> ModeStatus {
    ModeStatus::Active
}

/// A catalog entry that breaks an invariant; start-up stops with this message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid mode catalog: {0}")]
pub struct CatalogError(pub String);

/// The catalog file format: `{"modes": [...], "tools": [...]}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct CatalogFile {
    modes: Vec<Mode>,
    tools: Vec<ToolDef>,
}

/// The validated catalog.
#[derive(Debug, Clone)]
pub struct ModeCatalog {
    modes: Vec<Mode>,
    tools: Vec<ToolDef>,
    default_index: usize,
    /// Each mode's tools as the model request's `tools` array (aligned with `modes`; `None`
    /// for a mode without tools): written once here instead of on every model call.
    wire_tools: Vec<Option<Box<RawValue>>>,
}

/// A function tool as a `CreateResponse` body declares it.
#[derive(Serialize)]
struct FunctionTool<'a> {
    #[serde(rename = "type")]
    kind: &'static str,
    name: &'a str,
    description: &'a str,
    parameters: &'a Value,
    strict: bool,
}

impl<'a> FunctionTool<'a> {
    fn of(t: &'a ToolDef) -> Self {
        Self {
            kind: "function",
            name: &t.name,
            description: &t.description,
            parameters: &t.parameters,
            strict: t.strict,
        }
    }
}

/// `tool` as one function tool of a request body's `tools` array (JSON text).
pub fn function_tool(tool: &ToolDef) -> Result<Box<RawValue>, serde_json::Error> {
    serde_json::value::to_raw_value(&FunctionTool::of(tool))
}

/// `tools` as a request body's `tools` array of function tools; `None` when there are none.
fn wire_tools(tools: &[&ToolDef]) -> Result<Option<Box<RawValue>>, CatalogError> {
    if tools.is_empty() {
        return Ok(None);
    }
    let functions: Vec<FunctionTool<'_>> = tools.iter().map(|t| FunctionTool::of(t)).collect();
    serde_json::value::to_raw_value(&functions)
        .map(Some)
        .map_err(|e| CatalogError(format!("the tools cannot be written as JSON: {e}")))
}

impl ModeCatalog {
    /// Validates modes and tools against every AGN-014 invariant.
    pub fn new(modes: Vec<Mode>, tools: Vec<ToolDef>) -> Result<Self, CatalogError> {
        let err = |m: String| Err(CatalogError(m));
        if modes.is_empty() {
            return err("the catalog defines no modes".into());
        }
        for (i, mode) in modes.iter().enumerate() {
            let at = format!("modes[{i}] (key {:?})", mode.key);
            let id_ok = mode.id.len() == 32
                && mode
                    .id
                    .chars()
                    .all(|c| c.is_ascii_digit() || ('A'..='F').contains(&c));
            if !id_ok {
                return err(format!(
                    "{at}: id {:?} must be 32 uppercase hexadecimal characters (a GUID without hyphens)",
                    mode.id
                ));
            }
            let key_ok = !mode.key.is_empty()
                && mode
                    .key
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_');
            if !key_ok {
                return err(format!("{at}: key must be snake_case ([a-z0-9_]+)"));
            }
            if modes[..i].iter().any(|m| m.id == mode.id) {
                return err(format!("{at}: id {} is used by another mode", mode.id));
            }
            if modes[..i].iter().any(|m| m.key == mode.key) {
                return err(format!("{at}: key is used by another mode"));
            }
            if mode.when_to_use.trim().is_empty() {
                return err(format!("{at}: whenToUse must not be empty"));
            }
            if mode.when_to_use.contains('\n') {
                return err(format!("{at}: whenToUse must be a single line"));
            }
            if mode.display_name.trim().is_empty() {
                return err(format!("{at}: displayName must not be empty"));
            }
            if !mode.tools.iter().any(|t| t == CHANGE_MODE_TOOL) {
                return err(format!(
                    "{at}: every mode must offer {CHANGE_MODE_TOOL} (TUL-007 §3.1)"
                ));
            }
            for tool in &mode.tools {
                if !tools.iter().any(|t| &t.name == tool) {
                    return err(format!("{at}: tool {tool:?} is not declared in tools"));
                }
            }
            if let Some(choice) = &mode.tool_choice
                && !mode.tools.contains(choice)
            {
                return err(format!(
                    "{at}: toolChoice {choice:?} is not one of the mode's tools"
                ));
            }
        }
        let defaults: Vec<&Mode> = modes.iter().filter(|m| m.is_default).collect();
        if defaults.len() != 1 {
            return err(format!(
                "exactly one mode must be the default; found {} ({})",
                defaults.len(),
                defaults
                    .iter()
                    .map(|m| m.key.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ));
        }
        for (i, tool) in tools.iter().enumerate() {
            let at = format!("tools[{i}] (name {:?})", tool.name);
            let name_ok = !tool.name.is_empty()
                && tool.name.len() <= 64
                && tool
                    .name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
            if !name_ok {
                return err(format!("{at}: name must be 1-64 of [A-Za-z0-9_-]"));
            }
            if tools[..i].iter().any(|t| t.name == tool.name) {
                return err(format!("{at}: declared twice"));
            }
            if tool.parameters.get("type").and_then(Value::as_str) != Some("object") {
                return err(format!(
                    "{at}: parameters must be a JSON schema of type object"
                ));
            }
            if tool.strict {
                check_strict_schema(&tool.parameters)
                    .map_err(|m| CatalogError(format!("{at}: {m}")))?;
            }
        }
        let default_index = modes.iter().position(|m| m.is_default).unwrap_or(0);
        let wire_tools = modes
            .iter()
            .map(|m| {
                let offered: Vec<&ToolDef> = m
                    .tools
                    .iter()
                    .filter_map(|n| tools.iter().find(|t| &t.name == n))
                    .collect();
                wire_tools(&offered)
            })
            .collect::<Result<_, _>>()?;
        Ok(Self {
            modes,
            tools,
            default_index,
            wire_tools,
        })
    }

    /// Parses and validates a catalog file's JSON.
    pub fn from_json(text: &str) -> Result<Self, CatalogError> {
        let file: CatalogFile = serde_json::from_str(text)
            .map_err(|e| CatalogError(format!("the file is not a valid catalog: {e}")))?;
        Self::new(file.modes, file.tools)
    }

    /// Loads the catalog named by `APTIX_MODES_FILE`, or the built-in one.
    pub fn load(path: Option<&str>) -> Result<Self, CatalogError> {
        match path {
            None => Ok(Self::builtin()),
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .map_err(|e| CatalogError(format!("cannot read {p}: {e}")))?;
                Self::from_json(&text)
            }
        }
    }

    /// Serialises the catalog in the file format (for `aptix modes`, and as a template).
    pub fn to_json(&self) -> Value {
        json!({"modes": self.modes, "tools": self.tools})
    }

    /// All modes, in catalog order.
    pub fn modes(&self) -> &[Mode] {
        &self.modes
    }

    /// The default mode for new sessions.
    pub fn default_mode(&self) -> &Mode {
        &self.modes[self.default_index]
    }

    /// A mode by key.
    pub fn by_key(&self, key: &str) -> Option<&Mode> {
        self.modes.iter().find(|m| m.key == key)
    }

    /// A mode by id, falling back to the default mode (AGN-014 §6.3).
    pub fn by_id_or_default(&self, id: &str) -> &Mode {
        self.modes
            .iter()
            .find(|m| m.id == id)
            .unwrap_or_else(|| self.default_mode())
    }

    /// The valid keys, for error messages.
    pub fn keys(&self) -> Vec<&str> {
        self.modes.iter().map(|m| m.key.as_str()).collect()
    }

    /// A tool declaration by name.
    pub fn tool(&self, name: &str) -> Option<&ToolDef> {
        self.tools.iter().find(|t| t.name == name)
    }

    /// All declared tools.
    pub fn tools(&self) -> &[ToolDef] {
        &self.tools
    }

    /// The tools a mode offers, in the mode's order.
    pub fn tools_for(&self, mode: &Mode) -> Vec<&ToolDef> {
        mode.tools.iter().filter_map(|n| self.tool(n)).collect()
    }

    /// [`ModeCatalog::tools_for`] as a model request's `tools` array (JSON written when the
    /// catalog was built); `None` when the mode offers none. A mode that is not this
    /// catalog's (by key) gets its tools written now.
    pub fn wire_tools(&self, mode: &Mode) -> Option<std::borrow::Cow<'_, RawValue>> {
        match self.modes.iter().position(|m| m.key == mode.key) {
            Some(i) => self.wire_tools[i]
                .as_deref()
                .map(std::borrow::Cow::Borrowed),
            None => wire_tools(&self.tools_for(mode))
                .ok()
                .flatten()
                .map(std::borrow::Cow::Owned),
        }
    }
}

/// Checks the rules the Responses API applies to `strict: true` function schemas: every object
/// lists all its properties in `required` and sets `additionalProperties: false`.
pub fn check_strict_schema(schema: &Value) -> Result<(), String> {
    if let Some(props) = schema.get("properties").and_then(Value::as_object) {
        let required: Vec<&str> = schema
            .get("required")
            .and_then(Value::as_array)
            .map(|r| r.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        for name in props.keys() {
            if !required.contains(&name.as_str()) {
                return Err(format!(
                    "strict schemas must list every property in required (missing {name:?}); make optional ones nullable"
                ));
            }
        }
        if schema.get("additionalProperties") != Some(&Value::Bool(false)) {
            return Err("strict schemas must set additionalProperties: false".into());
        }
        for sub in props.values() {
            check_strict_schema(sub)?;
        }
    }
    if let Some(items) = schema.get("items") {
        check_strict_schema(items)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file_with(edit: impl FnOnce(&mut Value)) -> Result<ModeCatalog, CatalogError> {
        let mut v = ModeCatalog::builtin().to_json();
        edit(&mut v);
        ModeCatalog::from_json(&v.to_string())
    }

    #[test]
    fn builtin_catalog_has_the_seed_modes() {
        let c = ModeCatalog::builtin();
        assert_eq!(c.keys(), ["general", "ddr_authoring", "workflow_authoring"]);
        assert_eq!(c.default_mode().key, "general");
        assert_eq!(
            c.by_key("general").unwrap().id,
            "3F8E4F377F7A4C189C7F6A8B9F945C11"
        );
        assert_eq!(
            c.by_key("ddr_authoring").unwrap().id,
            "A9E1F9C15A0C4F8D9AF51F3E8B2A6D22"
        );
        assert_eq!(
            c.by_key("workflow_authoring").unwrap().id,
            "0FB81E6A8337444BA00A0CE28E3A1F78"
        );
        for m in c.modes() {
            assert!(m.tools.contains(&CHANGE_MODE_TOOL.to_string()));
            assert!(m.tools.contains(&LIST_MODES_TOOL.to_string()));
        }
        let general: Vec<&str> = c
            .tools_for(c.default_mode())
            .iter()
            .map(|t| t.name.as_str())
            .collect();
        assert!(general.contains(&READ_FILE_TOOL));
        assert_eq!(
            c.tool(READ_FILE_TOOL).unwrap().location,
            ToolLocation::Client
        );
        // round-trips through the file format
        assert!(ModeCatalog::from_json(&c.to_json().to_string()).is_ok());
    }

    /// The `tools` array each mode sends, written when the catalog is built, is the mode's
    /// tools in order as function tools — the same as writing them on every call would give.
    #[test]
    fn each_modes_tools_are_written_once_as_the_call_sends_them() {
        let c = ModeCatalog::builtin();
        for m in c.modes() {
            let wire = c.wire_tools(m).expect("every mode offers tools");
            assert!(matches!(wire, std::borrow::Cow::Borrowed(_)), "{}", m.key);
            let sent: Value = serde_json::from_str(wire.get()).unwrap();
            let expected: Vec<Value> = c
                .tools_for(m)
                .iter()
                .map(|t| {
                    json!({"type": "function", "name": t.name, "description": t.description,
                           "parameters": t.parameters, "strict": t.strict})
                })
                .collect();
            assert_eq!(sent, Value::Array(expected), "{}", m.key);
        }
        // A mode the catalog does not hold is written when asked; one without tools has none.
        let mut other = c.default_mode().clone();
        other.key = "elsewhere".into();
        let wire = c.wire_tools(&other).expect("its tools");
        assert!(matches!(wire, std::borrow::Cow::Owned(_)));
        other.tools.clear();
        assert!(c.wire_tools(&other).is_none());
    }

    #[test]
    fn every_invariant_fails_fast_naming_the_entry() {
        type Edit = Box<dyn FnOnce(&mut Value)>;
        let cases: Vec<(Edit, &str)> = vec![
            (
                Box::new(|v| v["modes"][1]["id"] = json!("a9e1f9c15a0c4f8d9af51f3e8b2a6d22")),
                "modes[1] (key \"ddr_authoring\"): id",
            ),
            (
                Box::new(|v| v["modes"][1]["id"] = json!("A9E1F9C1")),
                "modes[1] (key \"ddr_authoring\"): id",
            ),
            (
                Box::new(|v| v["modes"][1]["id"] = v["modes"][0]["id"].clone()),
                "is used by another mode",
            ),
            (
                Box::new(|v| v["modes"][2]["key"] = json!("Workflow Authoring")),
                "modes[2] (key \"Workflow Authoring\"): key must be snake_case",
            ),
            (
                Box::new(|v| v["modes"][2]["key"] = json!("")),
                "key must be snake_case",
            ),
            (
                Box::new(|v| v["modes"][2]["key"] = json!("general")),
                "modes[2] (key \"general\"): key is used by another mode",
            ),
            (
                Box::new(|v| v["modes"][1]["isDefault"] = json!(true)),
                "exactly one mode must be the default; found 2",
            ),
            (
                Box::new(|v| v["modes"][0]["isDefault"] = json!(false)),
                "exactly one mode must be the default; found 0",
            ),
            (
                Box::new(|v| v["modes"][0]["whenToUse"] = json!(" ")),
                "modes[0] (key \"general\"): whenToUse must not be empty",
            ),
            (
                Box::new(|v| v["modes"][0]["status"] = json!("retired")),
                "not a valid catalog",
            ),
            (
                Box::new(|v| v["modes"][0]["tools"] = json!(["agent_list_modes"])),
                "every mode must offer agent_change_mode",
            ),
            (
                Box::new(|v| v["modes"][0]["tools"] = json!(["agent_change_mode", "nope"])),
                "tool \"nope\" is not declared",
            ),
            (
                Box::new(|v| v["tools"][2]["parameters"]["required"] = json!([])),
                "tools[2] (name \"workspace_read_file\"): strict schemas must list every property",
            ),
        ];
        for (edit, expected) in cases {
            let e = file_with(edit).unwrap_err();
            assert!(
                e.0.contains(expected),
                "{:?} should contain {expected:?}",
                e.0
            );
        }
        // each status value is accepted
        for s in ["active", "experimental", "deprecated"] {
            assert!(file_with(|v| v["modes"][0]["status"] = json!(s)).is_ok());
        }
    }
}

#[cfg(test)]
mod file_tests {
    use super::*;

    #[test]
    fn loads_a_catalog_file_and_fails_fast_on_a_bad_one() {
        let dir = std::env::temp_dir().join(format!("aptix-modes-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let good = dir.join("modes.json");
        let mut v = ModeCatalog::builtin().to_json();
        v["modes"][1]["toolChoice"] = json!("agent_list_modes");
        std::fs::write(&good, v.to_string()).unwrap();
        let c = ModeCatalog::load(good.to_str()).unwrap();
        assert_eq!(
            c.by_key("ddr_authoring").unwrap().tool_choice.as_deref(),
            Some("agent_list_modes")
        );
        let bad = dir.join("bad.json");
        v["modes"][1]["toolChoice"] = json!("workspace_read_file");
        std::fs::write(&bad, v.to_string()).unwrap();
        let e = ModeCatalog::load(bad.to_str()).unwrap_err();
        assert!(
            e.0.contains("modes[1] (key \"ddr_authoring\"): toolChoice"),
            "{e}"
        );
        assert!(
            ModeCatalog::load(dir.join("missing.json").to_str())
                .unwrap_err()
                .0
                .contains("cannot read")
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
