//! The tools file (`APTIX_TOOLS_FILE`, JSON like the contexts and tenants files): the MCP
//! servers a worker plugs in as server tools, each a *source*.
//!
//! ```json
//! {"sources": [
//!   {"name": "tickets", "url": "https://mcp.internal.example/mcp",
//!    "headers": {"Authorization": {"env": "TICKETS_TOKEN", "prefix": "Bearer "}},
//!    "tools": ["search_*", "file_ticket"], "prefix": "tickets_",
//!    "modes": ["agent"], "tenants": ["tenant-a"],
//!    "repeat": {"file_ticket": "never"}, "approval": ["file_ticket"]},
//!   {"name": "local", "command": "python3", "args": ["tools.py"]}
//! ]}
//! ```
//!
//! Secrets never sit in the file: a header's value comes from the environment variable it
//! names (read at start-up; a variable that is not set stops start-up), and is never logged.
//!
//! Owns: the file's shape and its rules. Must not: connect to anything.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Deserialize;

use crate::secret::Secret;

/// The longest tool name the Responses API takes (`^[a-zA-Z0-9_-]{1,64}$`).
pub const MAX_TOOL_NAME: usize = 64;

/// How a source is reached.
#[derive(Debug, Clone, PartialEq)]
pub enum Transport {
    /// Streamable HTTP at this URL, with these headers (values from the environment).
    Http {
        /// The MCP endpoint.
        url: String,
        /// Header name → value.
        headers: Vec<(String, Secret)>,
    },
    /// A command each worker starts and keeps (stdio), restarted when it dies.
    Stdio {
        /// The program.
        command: String,
        /// Its arguments.
        args: Vec<String>,
        /// Extra environment for it (values from the worker's environment).
        env: Vec<(String, Secret)>,
    },
}

/// Whether a call whose outcome a crash left unknown may be made again.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Repeat {
    /// Safe to repeat (read-only or idempotent), whatever the annotations say.
    Safe,
    /// Never repeated, whatever the annotations say.
    Never,
}

/// What a run does with a call it finds sent but not answered, for a tool that may not repeat.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Unknown {
    /// The model gets a tool output saying the earlier attempt's outcome is unknown.
    #[default]
    Tell,
    /// The turn fails with `TOOL_OUTCOME_UNKNOWN`.
    Fail,
}

/// Which of a source's tools need a person's approval before a call runs.
#[derive(Debug, Clone, PartialEq, Eq, Default, Deserialize)]
#[serde(untagged)]
pub enum Approval {
    /// `"annotated"` (the default), `"always"` or `"never"`.
    Rule(ApprovalRule),
    /// These tools (names at the server, or `*` globs).
    Tools(Vec<String>),
    /// Absent: [`ApprovalRule::Annotated`].
    #[default]
    #[serde(skip)]
    Default,
}

/// An approval rule for every tool of a source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum ApprovalRule {
    /// The tools that say `destructiveHint: true` and are not read-only (saying nothing is
    /// not enough: most servers annotate nothing, and a batch could then use none of them).
    Annotated,
    /// Every call.
    Always,
    /// No call.
    Never,
}

/// One MCP server.
#[derive(Debug, Clone, PartialEq)]
pub struct Source {
    /// Its name (in logs, metrics, `aptix tools`, `/readyz`).
    pub name: String,
    /// How it is reached.
    pub transport: Transport,
    /// The longest a connection (and its `initialize`) may take.
    pub connect_timeout: Duration,
    /// The longest one tool call may take.
    pub call_timeout: Duration,
    /// The most calls in flight to it from one worker.
    pub max_in_flight: usize,
    /// Its tools offered (names or `*` globs); empty: all.
    pub allow: Vec<String>,
    /// Put before each tool's name for the model (against collisions).
    pub prefix: String,
    /// The mode keys that offer its tools; empty: every mode.
    pub modes: BTreeSet<String>,
    /// The tenants that may use its tools; empty: every tenant.
    pub tenants: BTreeSet<String>,
    /// Per tool (its name at the server): an override of its annotations' repeat safety.
    pub repeat: BTreeMap<String, Repeat>,
    /// What to do with a call left unknown by a crash.
    pub unknown_outcome: Unknown,
    /// Which tools need a person's approval.
    pub approval: Approval,
    /// The largest tool output passed to the model, in bytes; longer ones are cut, saying so.
    pub max_output_bytes: usize,
}

impl Source {
    /// Whether the tool `remote` (its name at the server) is offered.
    pub fn allows(&self, remote: &str) -> bool {
        self.allow.is_empty() || self.allow.iter().any(|g| glob_matches(g, remote))
    }

    /// Whether a call of tool `remote` (its name at the server), which says `destructive` of
    /// itself explicitly (`None`: it says nothing) and may be `read_only`, needs a person's
    /// approval.
    pub fn needs_approval(&self, remote: &str, destructive: Option<bool>, read_only: bool) -> bool {
        match &self.approval {
            Approval::Rule(ApprovalRule::Always) => true,
            Approval::Rule(ApprovalRule::Never) => false,
            Approval::Tools(globs) => globs.iter().any(|g| glob_matches(g, remote)),
            Approval::Rule(ApprovalRule::Annotated) | Approval::Default => {
                destructive == Some(true) && !read_only
            }
        }
    }

    /// Whether mode `key` offers this source's tools.
    pub fn in_mode(&self, key: &str) -> bool {
        self.modes.is_empty() || self.modes.contains(key)
    }

    /// Whether `tenant` may use this source's tools.
    pub fn for_tenant(&self, tenant: &str) -> bool {
        self.tenants.is_empty() || self.tenants.contains(tenant)
    }
}

/// Every source of the tools file.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolSources {
    /// In the file's order (a tool name two sources give is the first's).
    pub sources: Vec<Source>,
}

/// A tools file that cannot be used; start-up stops with it.
#[derive(Debug, thiserror::Error)]
pub enum SourcesError {
    /// The file cannot be read.
    #[error("cannot read the tools file {}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// Not the expected JSON (unknown fields included).
    #[error("the tools file is not valid: {0}")]
    Malformed(String),
    /// One source breaks a rule.
    #[error("sources[{index}] ({name:?}): {problem}")]
    Entry {
        /// Its position.
        index: usize,
        /// Its name.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FileShape {
    sources: Vec<SourceShape>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct SourceShape {
    name: String,
    url: Option<String>,
    #[serde(default)]
    headers: BTreeMap<String, FromEnv>,
    command: Option<String>,
    #[serde(default)]
    args: Vec<String>,
    #[serde(default)]
    env: BTreeMap<String, FromEnv>,
    connect_timeout_ms: Option<u64>,
    call_timeout_ms: Option<u64>,
    max_in_flight: Option<usize>,
    #[serde(default)]
    tools: Vec<String>,
    #[serde(default)]
    prefix: String,
    #[serde(default)]
    modes: BTreeSet<String>,
    #[serde(default)]
    tenants: BTreeSet<String>,
    #[serde(default)]
    repeat: BTreeMap<String, Repeat>,
    #[serde(default)]
    unknown_outcome: Unknown,
    #[serde(default)]
    approval: Approval,
    max_output_bytes: Option<usize>,
}

/// A value read from the environment: `{"env": "VAR", "prefix": "Bearer "}`.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct FromEnv {
    env: String,
    #[serde(default)]
    prefix: String,
}

impl ToolSources {
    /// Reads a tools file; header and environment values come from the variables it names,
    /// looked up through `env`.
    pub fn load(path: &Path, env: impl Fn(&str) -> Option<String>) -> Result<Self, SourcesError> {
        let text = std::fs::read_to_string(path).map_err(|source| SourcesError::Unreadable {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(&text, env)
    }

    /// [`ToolSources::load`] from the file's text.
    pub fn parse(text: &str, env: impl Fn(&str) -> Option<String>) -> Result<Self, SourcesError> {
        let shape: FileShape =
            serde_json::from_str(text).map_err(|e| SourcesError::Malformed(e.to_string()))?;
        let mut names = BTreeSet::new();
        let mut sources = Vec::with_capacity(shape.sources.len());
        for (index, s) in shape.sources.into_iter().enumerate() {
            let bad = |problem: String| SourcesError::Entry {
                index,
                name: s.name.clone(),
                problem,
            };
            if !valid_name(&s.name, 32) {
                return Err(bad(
                    "the name must be 1 to 32 letters, digits, '_' or '-'".into()
                ));
            }
            if !names.insert(s.name.clone()) {
                return Err(bad("an earlier source has the same name".into()));
            }
            if !s.prefix.is_empty() && !valid_name(&s.prefix, 24) {
                return Err(bad(
                    "the prefix must be up to 24 letters, digits, '_' or '-'".into(),
                ));
            }
            let resolve = |what: &str, vars: &BTreeMap<String, FromEnv>| {
                vars.iter()
                    .map(|(k, v)| {
                        let value = env(&v.env).filter(|x| !x.is_empty()).ok_or_else(|| {
                            format!("{what} {k:?} names {:?}, which is not set", v.env)
                        })?;
                        Ok((k.clone(), Secret::new(format!("{}{value}", v.prefix))))
                    })
                    .collect::<Result<Vec<_>, String>>()
            };
            let transport = match (s.url.as_deref(), s.command.as_deref()) {
                (Some(url), None) => {
                    if !s.args.is_empty() || !s.env.is_empty() {
                        return Err(bad("args and env are for a command, not a url".into()));
                    }
                    Transport::Http {
                        url: url.to_string(),
                        headers: resolve("header", &s.headers).map_err(&bad)?,
                    }
                }
                (None, Some(command)) if !command.trim().is_empty() => {
                    if !s.headers.is_empty() {
                        return Err(bad("headers are for a url, not a command".into()));
                    }
                    Transport::Stdio {
                        command: command.to_string(),
                        args: s.args.clone(),
                        env: resolve("env", &s.env).map_err(&bad)?,
                    }
                }
                _ => return Err(bad("give either a url or a command".into())),
            };
            let millis = |v: Option<u64>, default: u64, what: &str| match v {
                Some(0) => Err(bad(format!("{what} must be more than 0"))),
                v => Ok(Duration::from_millis(v.unwrap_or(default))),
            };
            let max_in_flight = s.max_in_flight.unwrap_or(16);
            if max_in_flight == 0 {
                return Err(bad("maxInFlight must be more than 0".into()));
            }
            for pattern in s.repeat.keys() {
                if pattern.contains('*') {
                    return Err(bad(format!(
                        "repeat names tools exactly; {pattern:?} is a glob"
                    )));
                }
            }
            sources.push(Source {
                transport,
                connect_timeout: millis(s.connect_timeout_ms, 10_000, "connectTimeoutMs")?,
                call_timeout: millis(s.call_timeout_ms, 30_000, "callTimeoutMs")?,
                max_in_flight,
                allow: s.tools,
                prefix: s.prefix,
                modes: s.modes,
                tenants: s.tenants,
                repeat: s.repeat,
                unknown_outcome: s.unknown_outcome,
                approval: s.approval,
                max_output_bytes: s.max_output_bytes.unwrap_or(16 * 1024).max(256),
                name: s.name,
            });
        }
        Ok(Self { sources })
    }
}

/// 1 to `max` ASCII letters, digits, `_` or `-`.
pub fn valid_name(name: &str, max: usize) -> bool {
    !name.is_empty()
        && name.len() <= max
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

/// Whether `name` matches `glob`, where `*` stands for any run of characters.
pub fn glob_matches(glob: &str, name: &str) -> bool {
    let mut parts = glob.split('*');
    let first = parts.next().unwrap_or_default();
    let Some(mut rest) = name.strip_prefix(first) else {
        return false;
    };
    let pieces: Vec<&str> = parts.collect();
    let Some((last, middle)) = pieces.split_last() else {
        return rest.is_empty(); // no `*`: an exact name
    };
    for piece in middle {
        match rest.find(piece) {
            Some(at) => rest = &rest[at + piece.len()..],
            None => return false,
        }
    }
    rest.ends_with(last)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(k: &str) -> Option<String> {
        (k == "TOKEN").then(|| "s3cret".to_string())
    }

    #[test]
    fn globs_match_as_written() {
        assert!(glob_matches("search_*", "search_docs"));
        assert!(glob_matches("*", "anything"));
        assert!(glob_matches("get", "get"));
        assert!(!glob_matches("get", "get_page"));
        assert!(glob_matches("a*b*c", "aXbYc"));
        assert!(!glob_matches("a*b*c", "aXcYb"));
        assert!(glob_matches("*_page", "get_page"));
        assert!(!glob_matches("search_*", "research_x"));
    }

    #[test]
    fn a_source_reads_with_its_defaults_and_secrets_from_the_environment() {
        let file = r#"{"sources": [
            {"name": "t", "url": "http://127.0.0.1:9/mcp",
             "headers": {"Authorization": {"env": "TOKEN", "prefix": "Bearer "}},
             "tools": ["get_*"], "prefix": "t_", "modes": ["agent"]},
            {"name": "s", "command": "python3", "args": ["x.py"], "unknownOutcome": "fail",
             "repeat": {"add": "safe"}, "callTimeoutMs": 500}
        ]}"#;
        let s = ToolSources::parse(file, env).unwrap();
        let Transport::Http { headers, .. } = &s.sources[0].transport else {
            panic!("http")
        };
        assert_eq!(headers[0].1.expose(), "Bearer s3cret");
        assert!(
            !format!("{:?}", s.sources[0]).contains("s3cret"),
            "never logged"
        );
        assert!(s.sources[0].allows("get_page") && !s.sources[0].allows("put_page"));
        assert!(s.sources[0].in_mode("agent") && !s.sources[0].in_mode("plan"));
        assert!(s.sources[1].in_mode("plan") && s.sources[1].for_tenant("anyone"));
        assert_eq!(s.sources[1].call_timeout, Duration::from_millis(500));
        assert_eq!(s.sources[1].unknown_outcome, Unknown::Fail);
        assert_eq!(s.sources[1].repeat["add"], Repeat::Safe);
        assert_eq!(s.sources[0].max_in_flight, 16);
    }

    #[test]
    fn approval_is_asked_as_the_source_says() {
        let source = |approval: &str| {
            let file = format!(r#"{{"sources": [{{"name": "a", "url": "http://x"{approval}}}]}}"#);
            ToolSources::parse(&file, env).unwrap().sources.remove(0)
        };
        let default = source("");
        assert!(default.needs_approval("t", Some(true), false));
        assert!(
            !default.needs_approval("t", None, false),
            "saying nothing is not enough"
        );
        assert!(!default.needs_approval("t", Some(true), true), "read-only");
        assert!(source(r#", "approval": "always""#).needs_approval("t", None, true));
        assert!(!source(r#", "approval": "never""#).needs_approval("t", Some(true), false));
        let listed = source(r#", "approval": ["file_*"]"#);
        assert!(listed.needs_approval("file_ticket", None, true));
        assert!(!listed.needs_approval("search", Some(true), false));
        let bad = r#"{"sources": [{"name": "a", "url": "http://x", "approval": "sometimes"}]}"#;
        assert!(ToolSources::parse(bad, env).is_err());
    }

    #[test]
    fn bad_sources_are_refused_by_name() {
        let cases = [
            (
                r#"{"sources": [{"name": "a"}]}"#,
                "either a url or a command",
            ),
            (
                r#"{"sources": [{"name": "a", "url": "http://x", "command": "y"}]}"#,
                "either a url or a command",
            ),
            (
                r#"{"sources": [{"name": "a", "url": "http://x", "headers": {"A": {"env": "NOPE"}}}]}"#,
                "\"NOPE\", which is not set",
            ),
            (
                r#"{"sources": [{"name": "a", "url": "http://x"}, {"name": "a", "url": "http://y"}]}"#,
                "same name",
            ),
            (
                r#"{"sources": [{"name": "a b", "url": "http://x"}]}"#,
                "the name must be",
            ),
            (
                r#"{"sources": [{"name": "a", "url": "http://x", "maxInFlight": 0}]}"#,
                "maxInFlight",
            ),
            (
                r#"{"sources": [{"name": "a", "url": "http://x", "repeat": {"x*": "safe"}}]}"#,
                "is a glob",
            ),
            (
                r#"{"sources": [{"name": "a", "url": "http://x", "surprise": 1}]}"#,
                "unknown field",
            ),
        ];
        for (file, says) in cases {
            let e = ToolSources::parse(file, env).unwrap_err().to_string();
            assert!(e.contains(says), "{file}: {e}");
        }
    }
}
