//! OpenAI's hosted tools an agent context passes through to its model server: `web_search`
//! (and its dated and preview spellings), `file_search`, and the Responses API's own `mcp` tool
//! (a remote MCP server the model server calls itself, with its `require_approval`). Written in
//! the contexts file as the Responses API's tool objects, under `hostedTools`; the model server
//! runs them and the pipeline records what it reports (see `pipeline::hosted`).
//!
//! Secrets stay out of the file as for the context's key: an `mcp` tool's `authorization` comes
//! from the variable its `authorizationEnv` names, and literal `authorization` or `headers` are
//! refused.
//!
//! Owns: the `hostedTools` entries and their checks. Must not: call anything.

use std::fmt;

use serde_json::{Map, Value};

/// The hosted tool types passed through.
const KINDS: &[&str] = &[
    "web_search",
    "web_search_2025_08_26",
    "web_search_preview",
    "web_search_preview_2025_03_11",
    "file_search",
    "mcp",
];

/// One hosted tool of an agent context, as its calls send it.
#[derive(Clone, PartialEq, Eq)]
pub struct HostedTool {
    /// Its `type`.
    pub kind: String,
    /// An `mcp` tool's `server_label`.
    pub label: Option<String>,
    /// The tool object as sent (an `mcp` tool's `authorization` resolved into it).
    wire: String,
    /// The variable an `mcp` tool's `authorization` came from.
    authorization_env: Option<String>,
}

impl HostedTool {
    /// The tool object's JSON text, as the `tools` array of a request carries it.
    pub fn wire(&self) -> &str {
        &self.wire
    }

    /// What `aptix contexts` shows: the object without its authorization, and where that
    /// came from.
    pub fn describe(&self) -> Value {
        let mut v: Value = serde_json::from_str(&self.wire).unwrap_or(Value::Null);
        if let (Some(map), Some(var)) = (v.as_object_mut(), &self.authorization_env) {
            map.remove("authorization");
            map.insert("authorizationEnv".into(), Value::String(var.clone()));
        }
        v
    }
}

impl fmt::Debug for HostedTool {
    // The wire text may hold a token: never printed.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostedTool")
            .field("kind", &self.kind)
            .field("label", &self.label)
            .field("authorization_env", &self.authorization_env)
            .finish_non_exhaustive()
    }
}

/// Reads an agent context's `hostedTools`; `Err` names the entry and what is wrong.
pub(super) fn read(
    entries: Vec<Value>,
    env: &impl Fn(&str) -> Option<String>,
) -> Result<Vec<HostedTool>, String> {
    let mut out: Vec<HostedTool> = Vec::with_capacity(entries.len());
    for (i, entry) in entries.into_iter().enumerate() {
        let tool = one(entry, env).map_err(|why| format!("hostedTools[{i}]: {why}"))?;
        let clash = out.iter().any(|t| match (&t.label, &tool.label) {
            (Some(a), Some(b)) => a == b,
            (None, None) => same_family(&t.kind, &tool.kind),
            _ => false,
        });
        if clash {
            return Err(format!(
                "hostedTools[{i}]: a {} tool{} is listed twice",
                tool.kind,
                tool.label
                    .as_deref()
                    .map(|l| format!(" with server_label {l:?}"))
                    .unwrap_or_default()
            ));
        }
        out.push(tool);
    }
    Ok(out)
}

/// `web_search` and its other spellings are one tool.
fn same_family(a: &str, b: &str) -> bool {
    let family = |k: &str| {
        if k.starts_with("web_search") {
            "web_search"
        } else {
            k
        }
        .to_string()
    };
    family(a) == family(b)
}

fn one(entry: Value, env: &impl Fn(&str) -> Option<String>) -> Result<HostedTool, String> {
    let Value::Object(mut map) = entry else {
        return Err("must be a tool object such as {\"type\": \"web_search\"}".into());
    };
    let kind = match map.get("type") {
        Some(Value::String(k)) if KINDS.contains(&k.as_str()) => k.clone(),
        Some(Value::String(k)) if k == "function" => {
            return Err(
                "function tools come from the mode catalog or the tool sources, not hostedTools"
                    .into(),
            );
        }
        other => {
            return Err(format!(
                "type must be one of {}, not {}",
                KINDS.join(", "),
                other.map_or("missing".to_string(), Value::to_string)
            ));
        }
    };
    let mut label = None;
    let mut authorization_env = None;
    match kind.as_str() {
        "file_search" => {
            let ids = map.get("vector_store_ids").and_then(Value::as_array);
            if !ids.is_some_and(|ids| !ids.is_empty() && ids.iter().all(Value::is_string)) {
                return Err("a file_search tool needs vector_store_ids, a non-empty list of vector store ids".into());
            }
        }
        "mcp" => {
            let l = match map.get("server_label") {
                Some(Value::String(l)) if !l.trim().is_empty() => l.clone(),
                _ => return Err("an mcp tool needs a server_label".into()),
            };
            let targets = ["server_url", "connector_id", "tunnel_id"]
                .iter()
                .filter(|k| map.get(**k).is_some_and(Value::is_string))
                .count();
            if targets != 1 {
                return Err(format!(
                    "the mcp tool {l:?} needs exactly one of server_url, connector_id or tunnel_id"
                ));
            }
            if let Some(Value::String(url)) = map.get("server_url") {
                super::model_base_url(url)
                    .map_err(|why| format!("server_url {url:?} of {l:?} is unusable: {why}"))?;
            }
            for secret in ["authorization", "headers"] {
                if map.contains_key(secret) {
                    return Err(format!(
                        "the mcp tool {l:?} must not hold {secret} in the file: name the variable holding the token in authorizationEnv"
                    ));
                }
            }
            check_approval(&l, map.get("require_approval"))?;
            if let Some(var) = map.remove("authorizationEnv") {
                let Value::String(var) = var else {
                    return Err(format!("authorizationEnv of {l:?} must be a variable name"));
                };
                let token = env(&var).filter(|t| !t.trim().is_empty()).ok_or_else(|| {
                    format!("authorizationEnv of {l:?} names {var:?}, which is not set")
                })?;
                map.insert(
                    "authorization".into(),
                    Value::String(token.trim().to_string()),
                );
                authorization_env = Some(var);
            }
            label = Some(l);
        }
        _ => {}
    }
    Ok(HostedTool {
        kind,
        label,
        wire: Value::Object(Map::from_iter(map)).to_string(),
        authorization_env,
    })
}

/// `require_approval`: `"always"`, `"never"`, or the filter object the API takes.
fn check_approval(label: &str, v: Option<&Value>) -> Result<(), String> {
    match v {
        None | Some(Value::Object(_)) => Ok(()),
        Some(Value::String(s)) if s == "always" || s == "never" => Ok(()),
        Some(other) => Err(format!(
            "require_approval of {label:?} must be \"always\", \"never\" or an approval filter object, not {other}"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn env(key: &str) -> Option<String> {
        (key == "DOCS_TOKEN").then(|| "tok-0123456789".to_string())
    }

    fn problem(entries: Value) -> String {
        let list = entries.as_array().cloned().unwrap_or_default();
        read(list, &env).unwrap_err()
    }

    #[test]
    fn the_three_kinds_pass_through_as_written() {
        let tools = read(
            vec![
                json!({"type": "web_search", "search_context_size": "low"}),
                json!({"type": "file_search", "vector_store_ids": ["vs_1"], "max_num_results": 3}),
                json!({"type": "mcp", "server_label": "docs", "server_url": "https://mcp.example/mcp",
                       "require_approval": "never", "authorizationEnv": "DOCS_TOKEN"}),
            ],
            &env,
        )
        .unwrap();
        let wire: Vec<Value> = tools
            .iter()
            .map(|t| serde_json::from_str(t.wire()).unwrap())
            .collect();
        assert_eq!(
            wire[0],
            json!({"type": "web_search", "search_context_size": "low"})
        );
        assert_eq!(wire[1]["vector_store_ids"], json!(["vs_1"]));
        // The token is resolved into the wire object, and shown nowhere else.
        assert_eq!(wire[2]["authorization"], "tok-0123456789");
        assert!(wire[2].get("authorizationEnv").is_none());
        assert_eq!(tools[2].label.as_deref(), Some("docs"));
        let shown = tools[2].describe();
        assert!(shown.get("authorization").is_none());
        assert_eq!(shown["authorizationEnv"], "DOCS_TOKEN");
        assert!(!format!("{:?}", tools[2]).contains("tok-"));
    }

    #[test]
    fn entries_that_cannot_work_are_refused_by_name() {
        for (entries, expected) in [
            (json!([{"type": "code_interpreter"}]), "type must be one of"),
            (json!([{"type": "function", "name": "f"}]), "mode catalog"),
            (json!(["web_search"]), "tool object"),
            (json!([{"type": "file_search"}]), "vector_store_ids"),
            (
                json!([{"type": "file_search", "vector_store_ids": []}]),
                "vector_store_ids",
            ),
            (
                json!([{"type": "mcp", "server_url": "https://x.example"}]),
                "server_label",
            ),
            (
                json!([{"type": "mcp", "server_label": "a"}]),
                "exactly one of",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "ftp://x"}]),
                "unusable",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "https://x.example", "authorization": "t"}]),
                "must not hold authorization",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "https://x.example", "headers": {"k": "v"}}]),
                "must not hold headers",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "https://x.example", "authorizationEnv": "UNSET"}]),
                "\"UNSET\", which is not set",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "server_url": "https://x.example", "require_approval": "sometimes"}]),
                "require_approval",
            ),
            (
                json!([{"type": "web_search"}, {"type": "web_search_preview"}]),
                "hostedTools[1]: a web_search_preview tool is listed twice",
            ),
            (
                json!([{"type": "mcp", "server_label": "a", "connector_id": "connector_gmail"},
                       {"type": "mcp", "server_label": "a", "server_url": "https://x.example"}]),
                "server_label \"a\"",
            ),
        ] {
            let got = problem(entries.clone());
            assert!(got.contains(expected), "{entries}: {got}");
        }
    }
}
