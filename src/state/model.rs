//! A model answer as the pipeline keeps it: output items and the response a checkpoint holds.

use serde_json::Value;

use crate::contract::Usage;

/// One output item of a model answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputItem {
    /// Assistant text (`output_text` parts of a `message`, joined).
    Text(String),
    /// The model declined (`refusal` part).
    Refusal(String),
    /// The model asks for a function call.
    FunctionCall {
        /// The id to answer with (`call_id`).
        call_id: String,
        /// The function name.
        name: String,
        /// The arguments as JSON text (as the model wrote them; not necessarily valid).
        arguments: String,
    },
    /// Reasoning, ignored.
    Reasoning,
    /// A call the model server ran itself (one of OpenAI's hosted tools), as it reported it.
    Hosted(HostedCall),
    /// A hosted `mcp` tool's call that waits for a person's approval (`mcp_approval_request`):
    /// answered in the next request with an `mcp_approval_response`.
    ApprovalRequest {
        /// The request's id (`approval_request_id` of the answer).
        id: String,
        /// The `server_label` of the hosted MCP server.
        server_label: String,
        /// The tool to run.
        name: String,
        /// Its arguments, as JSON text.
        arguments: String,
    },
    /// An item type this client does not know; ignored with a warning.
    Unknown {
        /// The item's type.
        item_type: String,
    },
}

/// A hosted tool's call as the model server reported it: `web_search_call`,
/// `file_search_call`, `mcp_call`, `mcp_list_tools`.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HostedCall {
    /// The item's `type`.
    pub item_type: String,
    /// The item's `id`.
    pub id: String,
    /// Its `status` (`completed` when the item has none, as `mcp_list_tools`).
    pub status: String,
    /// The hosted MCP server's `server_label`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub server_label: Option<String>,
    /// What ran: the MCP tool's name, else the item type without `_call`.
    pub name: String,
    /// What it was asked: the search's query, the file search's queries, the MCP arguments.
    pub detail: String,
    /// The error it reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl HostedCall {
    /// Whether it reported a failure.
    pub fn failed(&self) -> bool {
        self.error.is_some() || matches!(self.status.as_str(), "failed" | "incomplete")
    }
}

/// A normalised model answer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ModelResponse {
    /// The response id (`previous_response_id` for the next call).
    pub id: String,
    /// The parsed output items, in order.
    pub items: Vec<OutputItem>,
    /// The raw output items that can be replayed as input (messages and function calls).
    pub replay_items: Vec<Value>,
    /// Why the answer is incomplete (`max_output_tokens`, `content_filter`), if it is.
    pub incomplete_reason: Option<String>,
    /// Token usage of this call.
    pub usage: Usage,
    /// The service tier the server says it used, when it says.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_tier: Option<String>,
    /// How long the attempt that got this answer waited for its agent context's capacity
    /// (concurrency or rate) before it was sent: not the server's, the client's to say.
    #[serde(skip)]
    pub capacity_waited: std::time::Duration,
}
