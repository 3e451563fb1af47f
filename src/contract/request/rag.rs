//! A request's retrieval scope (`ragScope`, AGN-034 §4.4): conditions on chunk metadata, ANDed.

use serde::{Deserialize, Serialize};

/// A RAG scope condition operator (AGN-034 §4.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RagOperator {
    /// The key's value equals one of the values.
    #[serde(rename = "==")]
    Equals,
    /// The key's value equals none of the values.
    #[serde(rename = "!=")]
    NotEquals,
    /// The key's value contains one of the values.
    #[serde(rename = "contains")]
    Contains,
    /// The key's value contains none of the values.
    #[serde(rename = "does_not_contain")]
    DoesNotContain,
}

impl RagOperator {
    pub(super) fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "==" => Self::Equals,
            "!=" => Self::NotEquals,
            "contains" => Self::Contains,
            "does_not_contain" => Self::DoesNotContain,
            _ => return None,
        })
    }
}

/// The chunk metadata keys a `ragScope` condition can name (DESIGN.md §7).
pub const RAG_KEYS: &[&str] = &["path", "language", "repo", "tags", "docId"];

/// One scope condition; all conditions of a scope are ANDed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RagCondition {
    /// The metadata key (non-empty).
    pub key: String,
    /// The operator.
    pub operator: RagOperator,
    /// The values (at least one).
    pub values: Vec<String>,
}

/// Retrieval scope hints.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RagScope {
    /// The ANDed conditions.
    pub conditions: Vec<RagCondition>,
}
