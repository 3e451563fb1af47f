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
    /// An item type this client does not know; ignored with a warning.
    Unknown {
        /// The item's type.
        item_type: String,
    },
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
}
