//! The built-in mode catalog: the three AGN-014 seed modes with their fixed ids, used when no
//! `APTIX_MODES_FILE` is given.

use serde_json::json;

use super::{
    CHANGE_MODE_TOOL, LIST_MODES_TOOL, Mode, ModeCatalog, ModeStatus, READ_FILE_TOOL, ToolDef,
    ToolLocation,
};

impl ModeCatalog {
    /// The built-in catalog: the three AGN-014 seed modes with their fixed ids.
    pub fn builtin() -> Self {
        let shared = || vec![CHANGE_MODE_TOOL.to_string(), LIST_MODES_TOOL.to_string()];
        let mode = |id: &str, key: &str, name: &str, desc: &str, when: &str, default: bool| Mode {
            id: id.into(),
            key: key.into(),
            display_name: name.into(),
            description: desc.into(),
            when_to_use: when.into(),
            is_default: default,
            status: ModeStatus::Active,
            tools: shared(),
            tool_choice: None,
            welcome_message: None,
            human_role_hints: Vec::new(),
            example_utterances: Vec::new(),
        };
        let mut general = mode(
            "3F8E4F377F7A4C189C7F6A8B9F945C11",
            "general",
            "General",
            "General-purpose help: questions, explanations and light assistance.",
            "Use this mode for everyday Q&A, explanation, and lightweight assistance.",
            true,
        );
        general.tools.push(READ_FILE_TOOL.into());
        general.example_utterances = vec!["What does this function do?".into()];
        let mut ddr = mode(
            "A9E1F9C15A0C4F8D9AF51F3E8B2A6D22",
            "ddr_authoring",
            "DDR Authoring",
            "Writing, refining and checking Aptix DDR specifications (SYS-001).",
            "Use this mode when the user wants to create, refine, or validate Aptix DDR specifications following SYS-001.",
            false,
        );
        ddr.welcome_message = Some("You are now in DDR Authoring mode.".into());
        ddr.example_utterances = vec!["Draft a DDR for the retry policy.".into()];
        let workflow = mode(
            "0FB81E6A8337444BA00A0CE28E3A1F78",
            "workflow_authoring",
            "Workflow Authoring",
            "Creating, refining and checking Aptix agent workflows (TUL-006).",
            "Use this mode when defining, editing, or validating Aptix workflows using TUL-006.",
            false,
        );
        let tools = vec![
            ToolDef {
                name: CHANGE_MODE_TOOL.into(),
                description: "Changes the mode of the current session. Call it only after the user has confirmed the switch; give a short reason, and set branch=true when the user wants the new work to start as a separate session.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "mode": {"type": "string", "description": "Key of the target mode."},
                        "branch": {"type": "boolean", "description": "true to start the new work as a separate session."},
                        "reason": {"type": "string", "description": "Why the new mode fits the request."}
                    },
                    "required": ["mode", "branch", "reason"],
                    "additionalProperties": false
                }),
                strict: true,
                location: ToolLocation::Server,
            },
            ToolDef {
                name: LIST_MODES_TOOL.into(),
                description: "Lists every mode with its purpose. Call it when the user asks which modes exist or needs help choosing one, or before proposing a mode change; not on every message.".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "includeExamples": {"type": ["boolean", "null"], "description": "Include example requests for each mode."}
                    },
                    "required": ["includeExamples"],
                    "additionalProperties": false
                }),
                strict: true,
                location: ToolLocation::Server,
            },
            ToolDef {
                name: READ_FILE_TOOL.into(),
                description: "Reads a file from the user's workspace (runs in the client).".into(),
                parameters: json!({
                    "type": "object",
                    "properties": {
                        "path": {"type": "string", "description": "Path relative to the workspace root."}
                    },
                    "required": ["path"],
                    "additionalProperties": false
                }),
                strict: true,
                location: ToolLocation::Client,
            },
        ];
        // The built-in catalog satisfies its own invariants (checked by a unit test).
        Self::new(vec![general, ddr, workflow], tools)
            .unwrap_or_else(|e| unreachable!("the built-in catalog is invalid: {e}"))
    }
}
