//! Reading the output items of OpenAI's hosted tools — `web_search_call`, `file_search_call`,
//! `mcp_call`, `mcp_list_tools` and `mcp_approval_request` — into what the pipeline records and
//! answers. Each is also kept whole for replay: a conversation replayed without
//! `previous_response_id` must carry them (an approval request above all, which the next
//! request answers).
//!
//! Owns: these items' reading. Must not: decide what a turn does with them.

use serde_json::Value;
use serde_json::value::RawValue;

use super::OutputItem;
use crate::state::HostedCall;

/// Whether `kind` is a hosted tool's item.
pub(super) fn is_hosted(kind: &str) -> bool {
    matches!(
        kind,
        "web_search_call"
            | "file_search_call"
            | "mcp_call"
            | "mcp_list_tools"
            | "mcp_approval_request"
    )
}

/// The item `raw` of type `kind` (one [`is_hosted`] accepts), and its replay form; `Err` says
/// which field is missing.
pub(super) fn read(kind: &str, raw: &RawValue) -> Result<(OutputItem, Value), String> {
    let v: Value = serde_json::from_str(raw.get()).map_err(|e| e.to_string())?;
    let text = |field: &str| v.get(field).and_then(Value::as_str).map(str::to_string);
    let need = |field: &str| text(field).ok_or_else(|| format!("a {kind} item has no {field}"));
    let id = need("id")?;
    let item = if kind == "mcp_approval_request" {
        OutputItem::ApprovalRequest {
            id,
            server_label: need("server_label")?,
            name: need("name")?,
            arguments: need("arguments")?,
        }
    } else {
        let error = match v.get("error") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(other) => Some(
                other
                    .get("message")
                    .and_then(Value::as_str)
                    .map_or_else(|| other.to_string(), str::to_string),
            ),
        };
        let (name, detail) = match kind {
            "web_search_call" => {
                let action = v.get("action");
                let field = |k: &str| action.and_then(|a| a.get(k)).and_then(Value::as_str);
                let detail = field("query").or(field("url")).or(field("pattern"));
                ("web_search".to_string(), detail.unwrap_or("").to_string())
            }
            "file_search_call" => {
                let queries: Vec<&str> = v
                    .get("queries")
                    .and_then(Value::as_array)
                    .map(|q| q.iter().filter_map(Value::as_str).collect())
                    .unwrap_or_default();
                ("file_search".to_string(), queries.join(" | "))
            }
            "mcp_list_tools" => {
                let n = v.get("tools").and_then(Value::as_array).map_or(0, Vec::len);
                ("tools/list".to_string(), format!("{n} tool(s)"))
            }
            _ => (need("name")?, text("arguments").unwrap_or_default()),
        };
        OutputItem::Hosted(HostedCall {
            item_type: kind.to_string(),
            id,
            status: text("status").unwrap_or_else(|| "completed".into()),
            server_label: text("server_label"),
            name,
            detail,
            error,
        })
    };
    Ok((item, v))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn read_value(v: Value) -> Result<OutputItem, String> {
        let raw = RawValue::from_string(v.to_string()).unwrap();
        let kind = v["type"].as_str().unwrap().to_string();
        read(&kind, &raw).map(|(item, _)| item)
    }

    #[test]
    fn each_hosted_item_is_read_for_the_record() {
        let ws = read_value(
            json!({"type": "web_search_call", "id": "ws_1", "status": "completed",
            "action": {"type": "search", "query": "rust mcp"}}),
        )
        .unwrap();
        let OutputItem::Hosted(ws) = ws else {
            panic!("{ws:?}")
        };
        assert_eq!(
            (ws.name.as_str(), ws.detail.as_str()),
            ("web_search", "rust mcp")
        );
        assert!(!ws.failed());

        let fs = read_value(
            json!({"type": "file_search_call", "id": "fs_1", "status": "failed",
            "queries": ["a", "b"], "results": null}),
        )
        .unwrap();
        let OutputItem::Hosted(fs) = fs else {
            panic!("{fs:?}")
        };
        assert_eq!(fs.detail, "a | b");
        assert!(fs.failed());

        let call = read_value(
            json!({"type": "mcp_call", "id": "mcp_1", "server_label": "docs",
            "name": "search", "arguments": "{\"q\":1}", "output": null,
            "error": {"type": "http_error", "code": 500, "message": "boom"}, "status": "failed"}),
        )
        .unwrap();
        let OutputItem::Hosted(call) = call else {
            panic!("{call:?}")
        };
        assert_eq!(call.server_label.as_deref(), Some("docs"));
        assert_eq!(call.error.as_deref(), Some("boom"));

        let listed = read_value(json!({"type": "mcp_list_tools", "id": "mcpl_1",
            "server_label": "docs", "tools": [{"name": "a", "input_schema": {}}]}))
        .unwrap();
        let OutputItem::Hosted(listed) = listed else {
            panic!("{listed:?}")
        };
        assert_eq!(
            (listed.status.as_str(), listed.detail.as_str()),
            ("completed", "1 tool(s)")
        );

        assert_eq!(
            read_value(
                json!({"type": "mcp_approval_request", "id": "mcpr_1", "server_label": "docs",
                "name": "delete", "arguments": "{}"})
            )
            .unwrap(),
            OutputItem::ApprovalRequest {
                id: "mcpr_1".into(),
                server_label: "docs".into(),
                name: "delete".into(),
                arguments: "{}".into()
            }
        );
        let missing = read_value(
            json!({"type": "mcp_approval_request", "id": "mcpr_1", "name": "x", "arguments": "{}"}),
        );
        assert_eq!(
            missing.unwrap_err(),
            "a mcp_approval_request item has no server_label"
        );
    }
}
