//! OpenAI's hosted tools in the fake: the tool objects a request may carry (`web_search`,
//! `file_search`, `mcp`), their items a conversation may replay, and the answers the live API
//! gives when the model uses them — a `web_search_call` with the message citing a source, a
//! `file_search_call`, and for a hosted MCP server `mcp_list_tools` then either the `mcp_call`
//! or, when the tool's `require_approval` asks for it (the API's default), an
//! `mcp_approval_request` that the next request answers with an `mcp_approval_response`.
//!
//! A user message line `#fake:hosted web_search <query>`, `#fake:hosted file_search <query>` or
//! `#fake:hosted mcp <server_label> <tool> <json arguments>` makes the model use one.
//!
//! Owns: those shapes and checks. Must not: reach any server (the MCP output is made up).

use serde_json::{Value, json};

use super::Inner;

/// Why the API refuses a request: its message and the parameter it names.
pub(super) type Refusal = (String, String);

fn refuse(message: impl Into<String>, param: &str) -> Refusal {
    (message.into(), param.to_string())
}

/// What the model does with a hosted tool.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum HostedUse {
    /// Searches the web for this query.
    WebSearch(String),
    /// Searches the request's vector stores for this query.
    FileSearch(String),
    /// Calls `tool` on the hosted MCP server `label` with `arguments` (JSON text).
    Mcp {
        /// The tool object's `server_label`.
        label: String,
        /// The tool on that server.
        tool: String,
        /// Its arguments.
        arguments: String,
    },
    /// Goes on after a person answered the approval request `request_id`.
    Answered {
        /// The `approval_request_id` answered.
        request_id: String,
        /// Whether the call was approved.
        approve: bool,
    },
}

/// The hosted tool types a request's `tools` may carry.
pub(super) fn is_hosted_tool(kind: &str) -> bool {
    kind.starts_with("web_search") || matches!(kind, "file_search" | "mcp")
}

/// The hosted use a user message line asks for.
pub(super) fn asked(line: &str) -> Option<HostedUse> {
    let rest = line.trim().strip_prefix("#fake:hosted ")?;
    let (kind, rest) = rest.split_once(' ').unwrap_or((rest, ""));
    match kind {
        "web_search" => Some(HostedUse::WebSearch(rest.trim().to_string())),
        "file_search" => Some(HostedUse::FileSearch(rest.trim().to_string())),
        "mcp" => {
            let mut parts = rest.trim().splitn(3, ' ');
            let label = parts.next()?.to_string();
            let tool = parts.next()?.to_string();
            let arguments = parts.next().unwrap_or("{}").trim().to_string();
            Some(HostedUse::Mcp {
                label,
                tool,
                arguments,
            })
        }
        _ => None,
    }
}

/// The answer to an approval request among the items sent after the last user message.
pub(super) fn answered(items: &[Value]) -> Option<HostedUse> {
    let item = items
        .iter()
        .rev()
        .find(|i| i.get("type").and_then(Value::as_str) == Some("mcp_approval_response"))?;
    Some(HostedUse::Answered {
        request_id: item.get("approval_request_id")?.as_str()?.to_string(),
        approve: item.get("approve").and_then(Value::as_bool) == Some(true),
    })
}

/// Checks a hosted tool object the way the API does (the schema check covers the rest).
pub(super) fn check_tool(t: &Value, at: &str) -> Result<(), Refusal> {
    match t.get("type").and_then(Value::as_str).unwrap_or("") {
        "file_search"
            if t.get("vector_store_ids")
                .and_then(Value::as_array)
                .is_none() =>
        {
            Err(refuse(
                "Missing required parameter: 'tools[].vector_store_ids'.",
                at,
            ))
        }
        "mcp" if t.get("server_label").and_then(Value::as_str).is_none() => Err(refuse(
            "Missing required parameter: 'tools[].server_label'.",
            at,
        )),
        _ => Ok(()),
    }
}

/// Checks a replayed hosted item or an approval answer in the input; the ids of the approval
/// requests it carries go to `requests`, the ids answered to `answers`.
pub(super) fn check_item(
    item: &Value,
    kind: &str,
    at: &str,
    (requests, answers): (&mut Vec<String>, &mut Vec<String>),
) -> Result<bool, Refusal> {
    let need = |k: &str| {
        item.get(k)
            .and_then(Value::as_str)
            .map(str::to_string)
            .ok_or_else(|| refuse(format!("Missing required parameter: '{at}.{k}'."), at))
    };
    match kind {
        "web_search_call" | "file_search_call" | "mcp_call" | "mcp_list_tools" => {
            need("id")?;
        }
        "mcp_approval_request" => requests.push(need("id")?),
        "mcp_approval_response" => {
            if item.get("approve").and_then(Value::as_bool).is_none() {
                return Err(refuse(
                    format!("Missing required parameter: '{at}.approve'."),
                    at,
                ));
            }
            answers.push(need("approval_request_id")?);
        }
        _ => return Ok(false),
    }
    Ok(true)
}

/// The approval requests among `output` items, kept with a stored response.
pub(super) fn requests_in(output: &[Value]) -> Vec<Value> {
    output
        .iter()
        .filter(|o| o["type"] == "mcp_approval_request")
        .cloned()
        .collect()
}

/// The output items of `used` before the answer's message, and that message's text (`None`:
/// the response ends without one, waiting for an approval).
pub(super) fn output(
    inner: &Inner,
    req: &Value,
    used: &HostedUse,
    next_id: impl Fn(&str) -> String,
) -> (Vec<Value>, Option<String>) {
    let tools: &[Value] = req
        .get("tools")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice);
    let offered = |kind: &str| {
        tools.iter().find(|t| {
            t.get("type")
                .and_then(Value::as_str)
                .is_some_and(|k| k.starts_with(kind))
        })
    };
    let not_offered = |what: &str| {
        (
            Vec::new(),
            Some(format!("(fake: {what} is not among the request's tools)")),
        )
    };
    match used {
        HostedUse::WebSearch(query) => {
            if offered("web_search").is_none() {
                return not_offered("web_search");
            }
            let url = "https://example.org/search-result";
            let call = json!({"type": "web_search_call", "id": next_id("ws"), "status": "completed",
                "action": {"type": "search", "query": query, "sources": [{"type": "url", "url": url}]}});
            (
                vec![call],
                Some(format!("Searched the web for {query:?}: see {url}.")),
            )
        }
        HostedUse::FileSearch(query) => {
            let Some(tool) = offered("file_search") else {
                return not_offered("file_search");
            };
            let stores = tool["vector_store_ids"].as_array().map_or(0, Vec::len);
            let call = json!({"type": "file_search_call", "id": next_id("fs"), "status": "completed",
                "queries": [query], "results": null});
            (
                vec![call],
                Some(format!("Searched {stores} vector store(s) for {query:?}.")),
            )
        }
        HostedUse::Mcp {
            label,
            tool,
            arguments,
        } => {
            let Some(server) = tools
                .iter()
                .find(|t| t["type"] == "mcp" && t["server_label"] == label.as_str())
            else {
                return not_offered(&format!("an mcp tool labelled {label:?}"));
            };
            if !allowed(server, tool) {
                return (
                    Vec::new(),
                    Some(format!(
                        "(fake: {tool} is not among {label}'s allowed_tools)"
                    )),
                );
            }
            let listed = json!({"type": "mcp_list_tools", "id": next_id("mcpl"), "server_label": label,
                "tools": [{"name": tool, "input_schema": {"type": "object"}, "description": null, "annotations": null}]});
            if needs_approval(server, tool) {
                let request = json!({"type": "mcp_approval_request", "id": next_id("mcpr"),
                    "server_label": label, "name": tool, "arguments": arguments});
                return (vec![listed, request], None);
            }
            let call = mcp_call(next_id("mcp"), (label, tool, arguments), None);
            (
                vec![listed, call],
                Some(format!("{label}.{tool} answered: fake output of {tool}.")),
            )
        }
        HostedUse::Answered {
            request_id,
            approve,
        } => {
            let Some(request) = approval_request(inner, req, request_id) else {
                return (
                    Vec::new(),
                    Some(format!("(fake: no approval request {request_id})")),
                );
            };
            let text = |k: &str| request[k].as_str().unwrap_or("").to_string();
            let (label, tool, arguments) = (text("server_label"), text("name"), text("arguments"));
            if !approve {
                return (
                    Vec::new(),
                    Some(format!(
                        "The call to {label}.{tool} was denied; it did not run."
                    )),
                );
            }
            let call = mcp_call(
                next_id("mcp"),
                (&label, &tool, &arguments),
                Some(request_id),
            );
            (
                vec![call],
                Some(format!(
                    "{label}.{tool} answered after approval: fake output of {tool}."
                )),
            )
        }
    }
}

fn mcp_call(
    id: String,
    (label, tool, arguments): (&str, &str, &str),
    approval: Option<&str>,
) -> Value {
    json!({"type": "mcp_call", "id": id, "server_label": label, "name": tool, "arguments": arguments,
        "output": format!("fake output of {tool}"), "error": null, "status": "completed",
        "approval_request_id": approval})
}

/// Whether `allowed_tools` (a list of names, or `{"tool_names": [...]}`) lets `tool` through.
fn allowed(server: &Value, tool: &str) -> bool {
    let names = match server.get("allowed_tools") {
        None | Some(Value::Null) => return true,
        Some(Value::Array(names)) => names,
        Some(filter) => match filter.get("tool_names").and_then(Value::as_array) {
            Some(names) => names,
            None => return true,
        },
    };
    names.iter().any(|n| n.as_str() == Some(tool))
}

/// `require_approval`: absent or `"always"` asks, `"never"` does not, and a filter object
/// asks unless the tool is among its `never` tool names.
fn needs_approval(server: &Value, tool: &str) -> bool {
    match server.get("require_approval") {
        Some(Value::String(s)) => s != "never",
        Some(Value::Object(filter)) => !filter
            .get("never")
            .and_then(|n| n.get("tool_names"))
            .and_then(Value::as_array)
            .is_some_and(|names| names.iter().any(|n| n.as_str() == Some(tool))),
        _ => true,
    }
}

/// The approval request `id`: replayed in the input, or kept with the previous response.
fn approval_request(inner: &Inner, req: &Value, id: &str) -> Option<Value> {
    let is_it = |v: &&Value| v["type"] == "mcp_approval_request" && v["id"] == id;
    if let Some(found) = req
        .get("input")
        .and_then(Value::as_array)
        .and_then(|items| items.iter().find(is_it))
    {
        return Some(found.clone());
    }
    let prev = req.get("previous_response_id")?.as_str()?;
    let stored = inner.stored.lock().ok()?;
    stored.get(prev)?.approvals.iter().find(is_it).cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_line_asks_for_a_hosted_tool() {
        assert_eq!(
            asked("#fake:hosted web_search rust mcp"),
            Some(HostedUse::WebSearch("rust mcp".into()))
        );
        assert_eq!(
            asked("#fake:hosted mcp docs delete {\"page\": 7}"),
            Some(HostedUse::Mcp {
                label: "docs".into(),
                tool: "delete".into(),
                arguments: "{\"page\": 7}".into()
            })
        );
        assert_eq!(asked("#fake:hosted mcp docs"), None);
        assert_eq!(asked("#fake:call f {}"), None);
    }

    #[test]
    fn approval_follows_require_approval() {
        let server = |v: Value| json!({"type": "mcp", "server_label": "d", "require_approval": v});
        assert!(needs_approval(&json!({"type": "mcp"}), "t"));
        assert!(needs_approval(&server(json!("always")), "t"));
        assert!(!needs_approval(&server(json!("never")), "t"));
        let filter = server(json!({"never": {"tool_names": ["read"]}}));
        assert!(!needs_approval(&filter, "read"));
        assert!(needs_approval(&filter, "write"));
        assert!(allowed(&json!({"allowed_tools": ["a"]}), "a"));
        assert!(!allowed(
            &json!({"allowed_tools": {"tool_names": ["a"]}}),
            "b"
        ));
    }
}
