//! Server tools (AGN-027 layer D): the registry and the built-in tools `agent_change_mode`
//! (TUL-007) and `agent_list_modes` (TUL-010).
//!
//! Owns: running one server tool call and saying how it went. Must not: call the model, loop,
//! or write session state: `agent_change_mode` *returns* the change ([`ToolRun::ChangeMode`]);
//! the reasoner applies it. A tool that rejects its arguments answers the model (so it can
//! correct itself); a tool that cannot run fails the turn retryably.

use std::collections::HashMap;
use std::sync::Arc;

use serde_json::{Value, json};

use crate::catalog::{CHANGE_MODE_TOOL, LIST_MODES_TOOL, ModeCatalog};
use crate::contract::{SessionId, TurnId};
use crate::store::{ModeChange, now_rfc3339};

/// What a server tool call is about.
#[derive(Debug, Clone)]
pub struct ToolContext {
    /// The session whose turn called the tool.
    pub session_id: SessionId,
    /// The turn.
    pub turn_id: TurnId,
    /// The session's mode key when the tool runs.
    pub current_mode_key: String,
}

/// A change of the session's mode that a tool asks for.
#[derive(Debug, Clone, PartialEq)]
pub struct ModeEffect {
    /// The catalog id of the new mode.
    pub mode_id: String,
    /// The history entry.
    pub change: ModeChange,
}

/// How one server tool call went.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolRun {
    /// It ran; this is its result JSON.
    Ok(Value),
    /// It ran and asks for a mode change; `output` is its result once the change is applied.
    ChangeMode {
        /// The result JSON for the model.
        output: Value,
        /// The change to apply.
        effect: ModeEffect,
    },
    /// It refused the arguments; the message goes back to the model.
    Rejected(String),
    /// It could not run (a dependency is down); the turn fails and is retried later.
    Unavailable(String),
}

/// A tool implemented by this server.
#[async_trait::async_trait]
pub trait ServerTool: Send + Sync {
    /// The function name.
    fn name(&self) -> &'static str;
    /// Runs one call with the model's arguments (JSON text).
    async fn run(&self, ctx: &ToolContext, arguments: &str) -> ToolRun;
}

/// The server tools by name.
#[derive(Clone, Default)]
pub struct ToolRegistry {
    tools: HashMap<&'static str, Arc<dyn ServerTool>>,
}

impl ToolRegistry {
    /// The built-in tools over a catalog.
    pub fn builtin(catalog: Arc<ModeCatalog>) -> Self {
        let mut r = Self::default();
        r.register(Arc::new(ModeChangeTool {
            catalog: catalog.clone(),
        }));
        r.register(Arc::new(ListModesTool { catalog }));
        r
    }

    /// Adds a tool (replacing one of the same name).
    pub fn register(&mut self, tool: Arc<dyn ServerTool>) {
        self.tools.insert(tool.name(), tool);
    }

    /// A tool by name.
    pub fn get(&self, name: &str) -> Option<&Arc<dyn ServerTool>> {
        self.tools.get(name)
    }

    /// Checks that every tool the catalog declares as a server tool is implemented here.
    pub fn check_catalog(&self, catalog: &ModeCatalog) -> Result<(), UnimplementedTool> {
        for t in catalog.tools() {
            if t.location == crate::catalog::ToolLocation::Server && self.get(&t.name).is_none() {
                return Err(UnimplementedTool(t.name.clone()));
            }
        }
        Ok(())
    }
}

/// A server tool the mode catalog declares and this server does not implement.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("the catalog declares server tool {0:?}, which this server does not implement")]
pub struct UnimplementedTool(pub String);

/// `agent_change_mode` (TUL-007): checks the requested mode and says which change to make (the
/// reasoner applies it and records why).
pub struct ModeChangeTool {
    catalog: Arc<ModeCatalog>,
}

#[async_trait::async_trait]
impl ServerTool for ModeChangeTool {
    fn name(&self) -> &'static str {
        CHANGE_MODE_TOOL
    }

    async fn run(&self, ctx: &ToolContext, arguments: &str) -> ToolRun {
        const EMPTY: &str = "ModeChangeTool requires a non-empty arguments object.";
        if arguments.trim().is_empty() {
            return ToolRun::Rejected(EMPTY.into());
        }
        let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else {
            return ToolRun::Rejected(EMPTY.into());
        };
        let mode = args
            .get("mode")
            .and_then(Value::as_str)
            .map(str::trim)
            .filter(|m| !m.is_empty());
        let Some(mode) = mode else {
            return ToolRun::Rejected("ModeChangeTool requires a non-empty 'mode' string.".into());
        };
        let Some(branch) = args.get("branch").and_then(Value::as_bool) else {
            return ToolRun::Rejected("ModeChangeTool requires a 'branch' boolean flag.".into());
        };
        let reason = args
            .get("reason")
            .and_then(Value::as_str)
            .filter(|r| !r.trim().is_empty());
        let Some(reason) = reason else {
            return ToolRun::Rejected(
                "ModeChangeTool requires a non-empty 'reason' string explaining why the mode change is needed."
                    .into(),
            );
        };
        let Some(target) = self.catalog.by_key(mode) else {
            return ToolRun::Rejected(format!(
                "ModeChangeTool cannot change to unknown mode '{mode}'. Valid modes: {}.",
                self.catalog.keys().join(", ")
            ));
        };
        let change = ModeChange {
            previous_mode: ctx.current_mode_key.clone(),
            new_mode: target.key.clone(),
            timestamp: now_rfc3339(),
            reason: reason.to_string(),
            turn_id: ctx.turn_id.clone(),
        };
        ToolRun::ChangeMode {
            output: json!({
                "success": true, "mode": target.key, "branch": branch, "reason": reason
            }),
            effect: ModeEffect {
                mode_id: target.id.clone(),
                change,
            },
        }
    }
}

/// `agent_list_modes` (TUL-010): the catalog's modes, read-only.
pub struct ListModesTool {
    catalog: Arc<ModeCatalog>,
}

#[async_trait::async_trait]
impl ServerTool for ListModesTool {
    fn name(&self) -> &'static str {
        LIST_MODES_TOOL
    }

    async fn run(&self, _ctx: &ToolContext, arguments: &str) -> ToolRun {
        let args = if arguments.trim().is_empty() {
            Value::Object(Default::default())
        } else {
            match serde_json::from_str::<Value>(arguments) {
                Ok(v @ Value::Object(_)) => v,
                _ => {
                    return ToolRun::Rejected(
                        "agent_list_modes expects a JSON object of arguments.".into(),
                    );
                }
            }
        };
        let include_examples = match args.get("includeExamples") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(b)) => *b,
            Some(_) => {
                return ToolRun::Rejected(
                    "agent_list_modes: 'includeExamples' must be a boolean.".into(),
                );
            }
        };
        let modes: Vec<Value> = self
            .catalog
            .modes()
            .iter()
            .map(|m| {
                json!({
                    "id": m.id,
                    "key": m.key,
                    "displayName": m.display_name,
                    "description": if m.description.is_empty() { &m.when_to_use } else { &m.description },
                    "systemPromptSummary": m.when_to_use,
                    "isDefault": m.is_default,
                    "humanRoleHints": m.human_role_hints,
                    "exampleUtterances": if include_examples { m.example_utterances.clone() } else { Vec::new() },
                })
            })
            .collect();
        ToolRun::Ok(json!({ "modes": modes }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{
        MemoryStore, SessionState, SessionStore as _, StoreReader as _, TurnRecord, TurnStatus,
    };

    async fn setup() -> (Arc<MemoryStore>, ToolRegistry, ToolContext) {
        let store = Arc::new(MemoryStore::new());
        let catalog = Arc::new(ModeCatalog::builtin());
        let sid = SessionId::parse("s").unwrap();
        let tid = TurnId::parse("t").unwrap();
        let session = SessionState {
            session_id: sid.clone(),
            mode_id: catalog.default_mode().id.clone(),
            mode_key: "general".into(),
            mode_history: vec![],
            previous_response_id: None,
            conversation: vec![],
            replay: false,
            previous_call: None,
            solution_context: None,
            contexts: Default::default(),
            owner: None,
            created_at: now_rfc3339(),
            updated_at: now_rfc3339(),
        };
        let turn = TurnRecord {
            session_id: sid.clone(),
            turn_id: tid.clone(),
            fingerprint: String::new(),
            status: TurnStatus::Running,
            mode_key: "general".into(),
            pending: None,
            tool_ledger: Default::default(),
            requests: vec![],
            attempts: 1,
            submitted_at: now_rfc3339(),
            completed_at: None,
            result: None,
            answered: vec![],
            checkpoint: None,
            continuation: None,
            reply_to: None,
            streaming: false,
            webhook: None,
            batch: None,
            model_call: None,
            calls: Vec::new(),
            service_tier: None,
            history: Vec::new(),
            tools: Vec::new(),
            input: None,
            bodies_withheld: false,
            runs_begun: 0,
        };
        let lease = store
            .acquire_lease(
                &crate::store::Grant::for_tests(),
                &sid,
                "test",
                std::time::Duration::from_secs(60),
            )
            .await
            .unwrap()
            .unwrap();
        store
            .save(
                &crate::store::Grant::for_tests(),
                Some(&session),
                &turn,
                &lease,
                false,
            )
            .await
            .unwrap();
        let registry = ToolRegistry::builtin(catalog);
        let ctx = ToolContext {
            session_id: sid,
            turn_id: tid,
            current_mode_key: "general".into(),
        };
        (store, registry, ctx)
    }

    async fn mode_of(store: &MemoryStore) -> (String, usize) {
        let s = store
            .get_session(&SessionId::parse("s").unwrap())
            .await
            .unwrap()
            .unwrap();
        (s.mode_key, s.mode_history.len())
    }

    #[tokio::test]
    async fn change_mode_returns_the_change_and_writes_nothing_itself() {
        let (store, reg, ctx) = setup().await;
        let run = reg
            .get(CHANGE_MODE_TOOL)
            .unwrap()
            .run(
                &ctx,
                r#"{"mode":"ddr_authoring","branch":true,"reason":"DDR work"}"#,
            )
            .await;
        let ToolRun::ChangeMode { output, effect } = run else {
            panic!("{run:?}")
        };
        assert_eq!(
            output,
            json!({"success": true, "mode": "ddr_authoring", "branch": true, "reason": "DDR work"})
        );
        let catalog = ModeCatalog::builtin();
        assert_eq!(effect.mode_id, catalog.by_key("ddr_authoring").unwrap().id);
        assert_eq!(
            (
                effect.change.previous_mode.as_str(),
                effect.change.new_mode.as_str(),
                effect.change.reason.as_str(),
                effect.change.turn_id.as_str()
            ),
            ("general", "ddr_authoring", "DDR work", "t")
        );
        assert_eq!(
            mode_of(&store).await,
            ("general".to_string(), 0),
            "the reasoner applies the change, not the tool"
        );
    }

    #[tokio::test]
    async fn change_mode_validation_messages_and_no_side_effect() {
        let (store, reg, ctx) = setup().await;
        let tool = reg.get(CHANGE_MODE_TOOL).unwrap();
        let cases = [
            ("", "ModeChangeTool requires a non-empty arguments object."),
            (
                "   ",
                "ModeChangeTool requires a non-empty arguments object.",
            ),
            (
                "[1]",
                "ModeChangeTool requires a non-empty arguments object.",
            ),
            (
                r#"{"branch":false,"reason":"r"}"#,
                "ModeChangeTool requires a non-empty 'mode' string.",
            ),
            (
                r#"{"mode":"","branch":false,"reason":"r"}"#,
                "ModeChangeTool requires a non-empty 'mode' string.",
            ),
            (
                r#"{"mode":"general","reason":"r"}"#,
                "ModeChangeTool requires a 'branch' boolean flag.",
            ),
            (
                r#"{"mode":"general","branch":false}"#,
                "ModeChangeTool requires a non-empty 'reason' string explaining why the mode change is needed.",
            ),
            (
                r#"{"mode":"general","branch":false,"reason":" "}"#,
                "ModeChangeTool requires a non-empty 'reason' string explaining why the mode change is needed.",
            ),
            (
                r#"{"mode":"poetry","branch":false,"reason":"r"}"#,
                "ModeChangeTool cannot change to unknown mode 'poetry'. Valid modes: general, ddr_authoring, workflow_authoring.",
            ),
        ];
        for (args, msg) in cases {
            assert_eq!(
                tool.run(&ctx, args).await,
                ToolRun::Rejected(msg.into()),
                "{args}"
            );
        }
        assert_eq!(
            mode_of(&store).await,
            ("general".to_string(), 0),
            "no rejected call changed the mode"
        );
    }

    #[tokio::test]
    async fn list_modes_returns_the_catalog() {
        let (store, reg, ctx) = setup().await;
        let tool = reg.get(LIST_MODES_TOOL).unwrap();
        let ToolRun::Ok(v) = tool.run(&ctx, "{}").await else {
            panic!()
        };
        let modes = v["modes"].as_array().unwrap();
        assert_eq!(modes.len(), 3);
        assert_eq!(modes[0]["id"], "3F8E4F377F7A4C189C7F6A8B9F945C11");
        assert_eq!(modes[0]["isDefault"], true);
        assert_eq!(modes[0]["exampleUtterances"], json!([]));
        let ToolRun::Ok(v) = tool.run(&ctx, r#"{"includeExamples":true}"#).await else {
            panic!()
        };
        assert_eq!(
            v["modes"][0]["exampleUtterances"][0],
            "What does this function do?"
        );
        assert!(matches!(
            tool.run(&ctx, r#"{"includeExamples":"yes"}"#).await,
            ToolRun::Rejected(_)
        ));
        assert_eq!(
            mode_of(&store).await,
            ("general".to_string(), 0),
            "read-only"
        );
    }

    #[test]
    fn every_builtin_server_tool_is_implemented() {
        let catalog = Arc::new(ModeCatalog::builtin());
        assert!(
            ToolRegistry::builtin(catalog.clone())
                .check_catalog(&catalog)
                .is_ok()
        );
        let mut v = catalog.to_json();
        v["tools"][2]["location"] = json!("server");
        let c = ModeCatalog::from_json(&v.to_string()).unwrap();
        let e = ToolRegistry::builtin(catalog)
            .check_catalog(&c)
            .unwrap_err();
        assert_eq!(e, UnimplementedTool("workspace_read_file".into()));
    }
}
