//! The contexts file (`APTIX_CONTEXTS_FILE`): its shape, its checks, and the contexts it
//! describes together with the built-in `default`s.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use super::{DEFAULT_CONTEXT, KnownContexts};
use crate::secret::Secret;

/// A model backend: where calls go, with which key and model, and how many may run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentContext {
    /// The id requests name in `agentContextId`.
    pub id: String,
    /// The Responses API base URL (`…/v1`); `None` for the built-in default when no URL is
    /// configured (the embedded fake model is started in its place).
    pub base_url: Option<String>,
    /// The environment variable the key was read from (shown by `aptix contexts`).
    pub api_key_env: Option<String>,
    /// The key itself.
    pub api_key: Option<Secret>,
    /// The model sent when the conversation context names none.
    pub model: String,
    /// At most this many calls of this context at once, across all workers.
    pub max_concurrent_calls: Option<u32>,
    /// At most this many calls in any rate window (a minute unless configured otherwise).
    pub requests_per_minute: Option<u32>,
    /// How long one call may take (else `APTIX_LLM_TIMEOUT_SECS`).
    pub timeout: Option<Duration>,
    /// Replay the conversation instead of `previous_response_id` (else `APTIX_LLM_REPLAY`).
    pub replay: Option<bool>,
    /// Send each session's `prompt_cache_key` (unless `false`).
    pub prompt_caching: Option<bool>,
    /// Background mode, service tier and prices.
    pub calls: super::CallSettings,
}

impl AgentContext {
    /// Whether calls of this context are limited at all.
    pub fn is_limited(&self) -> bool {
        self.max_concurrent_calls.is_some() || self.requests_per_minute.is_some()
    }
}

/// A kind of conversation: its boot prompt and, optionally, its model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConversationContext {
    /// The id requests name in `conversationContextId`.
    pub id: String,
    /// The system message of the session's first model call.
    pub boot_prompt: String,
    /// Overrides the agent context's model.
    pub model: Option<String>,
}

/// Every context of the deployment, `default` of each kind included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Contexts {
    agents: BTreeMap<String, AgentContext>,
    conversations: BTreeMap<String, ConversationContext>,
}

/// A contexts file that cannot be used; the message names the file and the entry.
#[derive(Debug, thiserror::Error)]
pub enum ContextsError {
    /// The file cannot be read.
    #[error("cannot read the contexts file {}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// The file is not the expected JSON (unknown fields included).
    #[error("the contexts file is not valid: {0}")]
    Malformed(String),
    /// One entry breaks a rule.
    #[error("{entry}: {problem}")]
    Entry {
        /// `agentContexts[1] ("vllm")`.
        entry: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct FileShape {
    #[serde(default)]
    agent_contexts: Vec<AgentEntry>,
    #[serde(default)]
    conversation_contexts: Vec<ConversationEntry>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct AgentEntry {
    id: String,
    base_url: String,
    api_key_env: String,
    model: String,
    max_concurrent_calls: Option<u32>,
    requests_per_minute: Option<u32>,
    timeout_secs: Option<u64>,
    replay: Option<bool>,
    prompt_caching: Option<bool>,
    #[serde(default)]
    background: bool,
    service_tier: Option<String>,
    flex_fallback_after_secs: Option<super::calls::FallbackEntry>,
    prices: Option<super::calls::PricesEntry>,
    #[serde(default)]
    hosted_tools: Vec<serde_json::Value>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct ConversationEntry {
    id: String,
    boot_prompt: String,
    model: Option<String>,
}

impl Contexts {
    /// No contexts (a deployment without a contexts file, before the defaults are added).
    pub fn empty() -> Self {
        Self {
            agents: BTreeMap::new(),
            conversations: BTreeMap::new(),
        }
    }

    /// Adds the built-in `default` agent and conversation contexts unless defined already
    /// (a file may define its own).
    pub fn with_defaults(mut self, agent: AgentContext, boot_prompt: &str) -> Self {
        self.agents
            .entry(DEFAULT_CONTEXT.to_string())
            .or_insert_with(|| AgentContext {
                id: DEFAULT_CONTEXT.to_string(),
                ..agent
            });
        self.conversations
            .entry(DEFAULT_CONTEXT.to_string())
            .or_insert_with(|| ConversationContext {
                id: DEFAULT_CONTEXT.to_string(),
                boot_prompt: boot_prompt.to_string(),
                model: None,
            });
        self
    }

    /// Reads a contexts file; keys come from the variables the file names, looked up
    /// through `env`.
    pub fn load(path: &Path, env: impl Fn(&str) -> Option<String>) -> Result<Self, ContextsError> {
        let text = std::fs::read_to_string(path).map_err(|source| ContextsError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, env)
    }

    /// [`Contexts::load`] from the file's text.
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self, ContextsError> {
        let shape: FileShape =
            serde_json::from_str(text).map_err(|e| ContextsError::Malformed(e.to_string()))?;
        let mut out = Self::empty();
        let mut seen = BTreeSet::new();
        for (i, entry) in shape.agent_contexts.into_iter().enumerate() {
            let name = format!("agentContexts[{i}] ({:?})", entry.id);
            let bad = |problem: String| ContextsError::Entry {
                entry: name.clone(),
                problem,
            };
            check_id(&entry.id).map_err(&bad)?;
            if !seen.insert(entry.id.clone()) {
                return Err(bad("the id is used by an earlier agent context".into()));
            }
            check_base_url(&entry.base_url).map_err(&bad)?;
            if entry.model.trim().is_empty() {
                return Err(bad("model must not be empty".into()));
            }
            let key = env(&entry.api_key_env)
                .filter(|k| !k.trim().is_empty())
                .ok_or_else(|| {
                    bad(format!(
                        "apiKeyEnv names {:?}, which is not set (the key must be in that environment variable)",
                        entry.api_key_env
                    ))
                })?;
            for (field, value) in [
                (
                    "maxConcurrentCalls",
                    entry.max_concurrent_calls.map(u64::from),
                ),
                (
                    "requestsPerMinute",
                    entry.requests_per_minute.map(u64::from),
                ),
                ("timeoutSecs", entry.timeout_secs),
            ] {
                if value == Some(0) {
                    return Err(bad(format!("{field} must be at least 1")));
                }
            }
            let service_tier = match entry.service_tier.as_deref() {
                None => None,
                Some(t) => Some(super::ServiceTier::parse(t).ok_or_else(|| {
                    bad(format!(
                        "serviceTier must be auto, default, flex or priority, not {t:?}"
                    ))
                })?),
            };
            let flex_fallback = match &entry.flex_fallback_after_secs {
                None => Some(super::FLEX_FALLBACK_AFTER),
                Some(f) => f.check().map_err(&bad)?,
            };
            let prices = match &entry.prices {
                None => None,
                Some(p) => Some(p.check().map_err(&bad)?),
            };
            let calls = super::CallSettings {
                background: entry.background,
                service_tier,
                flex_fallback,
                prices,
                hosted_tools: super::hosted::read(entry.hosted_tools, &env).map_err(&bad)?,
            };
            out.agents.insert(
                entry.id.clone(),
                AgentContext {
                    id: entry.id,
                    base_url: Some(entry.base_url.trim_end_matches('/').to_string()),
                    api_key_env: Some(entry.api_key_env),
                    api_key: Some(Secret::new(key.trim())),
                    model: entry.model,
                    max_concurrent_calls: entry.max_concurrent_calls,
                    requests_per_minute: entry.requests_per_minute,
                    timeout: entry.timeout_secs.map(Duration::from_secs),
                    replay: entry.replay,
                    prompt_caching: entry.prompt_caching,
                    calls,
                },
            );
        }
        let mut seen = BTreeSet::new();
        for (i, entry) in shape.conversation_contexts.into_iter().enumerate() {
            let name = format!("conversationContexts[{i}] ({:?})", entry.id);
            let bad = |problem: String| ContextsError::Entry {
                entry: name.clone(),
                problem,
            };
            check_id(&entry.id).map_err(&bad)?;
            if !seen.insert(entry.id.clone()) {
                return Err(bad(
                    "the id is used by an earlier conversation context".into()
                ));
            }
            if entry.boot_prompt.trim().is_empty() {
                return Err(bad("bootPrompt must not be empty".into()));
            }
            if entry.model.as_deref().is_some_and(|m| m.trim().is_empty()) {
                return Err(bad("model, when given, must not be empty".into()));
            }
            out.conversations.insert(
                entry.id.clone(),
                ConversationContext {
                    id: entry.id,
                    boot_prompt: entry.boot_prompt,
                    model: entry.model,
                },
            );
        }
        Ok(out)
    }

    /// The agent context `id`.
    pub fn agent(&self, id: &str) -> Option<&AgentContext> {
        self.agents.get(id)
    }

    /// The conversation context `id`.
    pub fn conversation(&self, id: &str) -> Option<&ConversationContext> {
        self.conversations.get(id)
    }

    /// Every agent context, by id.
    pub fn agents(&self) -> impl Iterator<Item = &AgentContext> {
        self.agents.values()
    }

    /// Every conversation context, by id.
    pub fn conversations(&self) -> impl Iterator<Item = &ConversationContext> {
        self.conversations.values()
    }

    /// The ids, for the front door.
    pub fn known(&self) -> KnownContexts {
        KnownContexts::new(
            self.agents.keys().cloned(),
            self.conversations.keys().cloned(),
        )
    }

    /// What `aptix contexts` prints: every context, keys masked.
    pub fn describe(&self) -> serde_json::Value {
        let agents: Vec<_> = self
            .agents()
            .map(|a| {
                serde_json::json!({
                    "id": a.id,
                    "baseUrl": a.base_url.as_deref().unwrap_or("(the embedded fake model)"),
                    "apiKeyEnv": a.api_key_env,
                    "apiKey": a.api_key.as_ref().map(|k| mask(k.expose())),
                    "model": a.model,
                    "maxConcurrentCalls": a.max_concurrent_calls,
                    "requestsPerMinute": a.requests_per_minute,
                    "timeoutSecs": a.timeout.map(|t| t.as_secs()),
                    "replay": a.replay,
                    "promptCaching": a.prompt_caching,
                    "background": a.calls.background,
                    "serviceTier": a.calls.service_tier.map(super::ServiceTier::as_str),
                    "flexFallbackAfterSecs": match a.calls.flex_fallback {
                        Some(d) => serde_json::json!(d.as_secs()),
                        None => serde_json::json!("never"),
                    },
                    "prices": a.calls.prices.map(|p| serde_json::json!({
                        "inputPerMillion": p.input_micros as f64 / 1e6,
                        "cachedInputPerMillion": p.cached_input_micros as f64 / 1e6,
                        "outputPerMillion": p.output_micros as f64 / 1e6,
                    })),
                    "hostedTools": a.calls.hosted_tools.iter().map(super::HostedTool::describe).collect::<Vec<_>>(),
                })
            })
            .collect();
        let conversations: Vec<_> = self
            .conversations()
            .map(|c| {
                serde_json::json!({
                    "id": c.id,
                    "model": c.model,
                    "bootPrompt": c.boot_prompt,
                })
            })
            .collect();
        serde_json::json!({"agentContexts": agents, "conversationContexts": conversations})
    }
}

/// A key as `sk-…1234`: enough to tell keys apart, not enough to use one.
fn mask(key: &str) -> String {
    let chars: Vec<char> = key.chars().collect();
    if chars.len() <= 8 {
        return "***".to_string();
    }
    let head: String = chars[..3].iter().collect();
    let tail: String = chars[chars.len() - 4..].iter().collect();
    format!("{head}…{tail}")
}

fn check_id(id: &str) -> Result<(), String> {
    if id.is_empty() || id.len() > 128 {
        return Err("id must be 1 to 128 characters".into());
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'))
    {
        return Err("id may hold only letters, digits, '-', '_' and '.'".into());
    }
    Ok(())
}

fn check_base_url(url: &str) -> Result<(), String> {
    super::model_base_url(url)
        .map(|_| ())
        .map_err(|why| format!("baseUrl {url:?} is not an http(s) URL with a host: {why}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(key: &str) -> Option<String> {
        match key {
            "OPENAI_KEY" => Some("sk-openai-0123456789".into()),
            "VLLM_KEY" => Some("local".into()),
            _ => None,
        }
    }

    const GOOD: &str = r#"{
        "agentContexts": [
            {"id": "openai", "baseUrl": "https://api.openai.com/v1/", "apiKeyEnv": "OPENAI_KEY",
             "model": "gpt-4.1", "maxConcurrentCalls": 4, "requestsPerMinute": 500},
            {"id": "vllm", "baseUrl": "http://10.0.0.7:8000/v1", "apiKeyEnv": "VLLM_KEY",
             "model": "qwen", "timeoutSecs": 300, "replay": true}
        ],
        "conversationContexts": [
            {"id": "ddr-review", "bootPrompt": "Review the DDR.", "model": "gpt-4.1-mini"}
        ]
    }"#;

    fn problem(text: &str) -> String {
        Contexts::parse(text, env).unwrap_err().to_string()
    }

    fn agent_entry(extra: &str) -> String {
        format!(
            r#"{{"agentContexts": [{{"id": "a", "baseUrl": "https://x.example/v1", "apiKeyEnv": "OPENAI_KEY", "model": "m"{extra}}}]}}"#
        )
    }

    /// The environment's default agent context, as the composition root builds it.
    fn env_default(base_url: Option<&str>) -> AgentContext {
        AgentContext {
            id: "ignored".into(),
            base_url: base_url.map(str::to_string),
            api_key_env: None,
            api_key: None,
            model: "env-model".into(),
            max_concurrent_calls: None,
            requests_per_minute: None,
            timeout: None,
            replay: None,
            prompt_caching: None,
            calls: Default::default(),
        }
    }

    #[test]
    fn call_settings_are_read_and_checked_per_context() {
        let text = agent_entry(
            r#", "background": true, "serviceTier": "flex", "flexFallbackAfterSecs": "never",
               "prices": {"inputPerMillion": 2, "outputPerMillion": 8}"#,
        );
        let c = Contexts::parse(&text, env).unwrap();
        let calls = &c.agent("a").unwrap().calls;
        assert!(calls.background);
        assert_eq!(calls.service_tier, Some(super::super::ServiceTier::Flex));
        assert_eq!(calls.flex_fallback, None);
        let prices = calls.prices.unwrap();
        assert_eq!(
            (
                prices.input_micros,
                prices.cached_input_micros,
                prices.output_micros
            ),
            (2_000_000, 2_000_000, 8_000_000)
        );
        let plain = Contexts::parse(&agent_entry(""), env).unwrap();
        assert_eq!(
            plain.agent("a").unwrap().calls,
            super::super::CallSettings::default()
        );
        let e = problem(&agent_entry(r#", "serviceTier": "cheap""#));
        assert!(
            e.contains("agentContexts[0]") && e.contains("serviceTier"),
            "{e}"
        );
        let e = problem(&agent_entry(r#", "flexFallbackAfterSecs": "soon""#));
        assert!(e.contains("flexFallbackAfterSecs"), "{e}");
        let e = problem(&agent_entry(
            r#", "prices": {"inputPerMillion": -1, "outputPerMillion": 1}"#,
        ));
        assert!(e.contains("prices.inputPerMillion"), "{e}");
    }

    #[test]
    fn a_good_file_reads_every_field_and_keeps_the_default_pair() {
        let default = env_default(Some("http://env/v1"));
        let c = Contexts::parse(GOOD, env)
            .unwrap()
            .with_defaults(default, "boot");
        let openai = c.agent("openai").unwrap();
        assert_eq!(
            openai.base_url.as_deref(),
            Some("https://api.openai.com/v1")
        );
        assert_eq!(
            openai.api_key.as_ref().unwrap().expose(),
            "sk-openai-0123456789"
        );
        assert_eq!(
            (openai.max_concurrent_calls, openai.requests_per_minute),
            (Some(4), Some(500))
        );
        assert!(openai.is_limited());
        let vllm = c.agent("vllm").unwrap();
        assert_eq!(vllm.timeout, Some(Duration::from_secs(300)));
        assert_eq!(vllm.replay, Some(true));
        assert!(!vllm.is_limited());
        assert_eq!(
            c.conversation("ddr-review").unwrap().model.as_deref(),
            Some("gpt-4.1-mini")
        );
        let d = c.agent(DEFAULT_CONTEXT).unwrap();
        assert_eq!((d.id.as_str(), d.model.as_str()), ("default", "env-model"));
        assert_eq!(c.conversation(DEFAULT_CONTEXT).unwrap().boot_prompt, "boot");
        let known = c.known();
        assert_eq!(
            known.agent_ids().collect::<Vec<_>>(),
            ["default", "openai", "vllm"]
        );
        assert_eq!(
            known.conversation_ids().collect::<Vec<_>>(),
            ["ddr-review", "default"]
        );
    }

    #[test]
    fn a_file_may_define_its_own_default() {
        let text = r#"{"agentContexts": [{"id": "default", "baseUrl": "http://h/v1",
            "apiKeyEnv": "VLLM_KEY", "model": "file-model"}]}"#;
        let c = Contexts::parse(text, env)
            .unwrap()
            .with_defaults(env_default(None), "boot");
        assert_eq!(c.agent("default").unwrap().model, "file-model");
    }

    #[test]
    fn every_bad_entry_is_named() {
        let e = problem(&agent_entry(r#", "apiKeyEnv2": "x""#));
        assert!(
            e.contains("apiKeyEnv2") && e.contains("unknown field"),
            "{e}"
        );
        let e = problem(
            r#"{"agentContexts": [
                {"id": "a", "baseUrl": "https://x/v1", "apiKeyEnv": "OPENAI_KEY", "model": "m"},
                {"id": "a", "baseUrl": "https://y/v1", "apiKeyEnv": "OPENAI_KEY", "model": "m"}]}"#,
        );
        assert!(
            e.starts_with(r#"agentContexts[1] ("a")"#) && e.contains("earlier"),
            "{e}"
        );
        let e = problem(
            r#"{"agentContexts": [{"id": "a", "baseUrl": "https://x/v1", "apiKeyEnv": "NOT_SET", "model": "m"}]}"#,
        );
        assert!(
            e.contains("agentContexts[0]") && e.contains("NOT_SET"),
            "{e}"
        );
        for url in ["ftp://x/v1", "file:///etc/passwd", "not a url"] {
            let e = problem(&format!(
                r#"{{"agentContexts": [{{"id": "a", "baseUrl": "{url}", "apiKeyEnv": "OPENAI_KEY", "model": "m"}}]}}"#
            ));
            assert!(
                e.contains("agentContexts[0]")
                    && e.contains(&format!(
                        "baseUrl {url:?} is not an http(s) URL with a host"
                    )),
                "{url}: {e}"
            );
        }
        let e = problem(&agent_entry(r#", "maxConcurrentCalls": 0"#));
        assert!(e.contains("maxConcurrentCalls must be at least 1"), "{e}");
        let e = problem(
            r#"{"conversationContexts": [{"id": "c", "bootPrompt": "x"}, {"id": "c", "bootPrompt": "y"}]}"#,
        );
        assert!(e.starts_with(r#"conversationContexts[1] ("c")"#), "{e}");
        let e = problem(r#"{"conversationContexts": [{"id": "c", "bootPrompt": "  "}]}"#);
        assert!(e.contains("bootPrompt"), "{e}");
        let e = problem(r#"{"conversationContexts": [{"id": "bad id", "bootPrompt": "x"}]}"#);
        assert!(
            e.contains("conversationContexts[0]") && e.contains("id may hold"),
            "{e}"
        );
        let e = problem(r#"{"agents": []}"#);
        assert!(e.contains("unknown field"), "{e}");
    }

    #[test]
    fn keys_are_masked_when_described() {
        let c = Contexts::parse(GOOD, env).unwrap();
        let text = c.describe().to_string();
        assert!(!text.contains("sk-openai-0123456789"), "{text}");
        assert!(text.contains("sk-…6789"), "{text}");
        assert!(
            !text.contains("\"local\""),
            "a short key is not shown at all: {text}"
        );
    }
}
