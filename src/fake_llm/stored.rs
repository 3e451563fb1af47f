//! The responses the fake keeps for `previous_response_id`, as the live API keeps them: what a
//! follow-up must answer (the function calls left open) and the conversation a follow-up's
//! model sees again (counted in its input tokens).
//!
//! Owns: that memory, bounded. Must not: decide answers.

use std::collections::{HashMap, VecDeque};

/// A stored response: what a follow-up call must answer, and what it carries.
#[derive(Debug, Clone)]
pub(super) struct Stored {
    /// The `call_id`s of its function calls (a follow-up must answer each).
    pub pending_calls: Vec<String>,
    /// Its `mcp_approval_request` items (a follow-up may answer them).
    pub approvals: Vec<serde_json::Value>,
    /// The tokens of the conversation up to and including this response, as a follow-up's
    /// input counts them: its own input and its output, less the reasoning (which the live
    /// API does not carry into the next call).
    pub context_tokens: u64,
}

/// The responses a follow-up may name, oldest first, up to a limit.
#[derive(Debug, Default)]
pub(super) struct StoredResponses {
    by_id: HashMap<String, Stored>,
    order: VecDeque<String>,
    limit: Option<usize>,
}

impl StoredResponses {
    /// Remembers at most `limit` responses (`None`: every one).
    pub(super) fn bounded(limit: Option<usize>) -> Self {
        Self {
            limit,
            ..Self::default()
        }
    }

    pub(super) fn insert(&mut self, id: String, stored: Stored) {
        if self.by_id.insert(id.clone(), stored).is_none() {
            self.order.push_back(id);
        }
        while self.limit.is_some_and(|l| self.order.len() > l) {
            if let Some(oldest) = self.order.pop_front() {
                self.by_id.remove(&oldest);
            }
        }
    }

    pub(super) fn get(&self, id: &str) -> Option<&Stored> {
        self.by_id.get(id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn stored(tokens: u64) -> Stored {
        Stored {
            pending_calls: Vec::new(),
            approvals: Vec::new(),
            context_tokens: tokens,
        }
    }

    #[test]
    fn the_oldest_response_is_forgotten_past_the_limit() {
        let mut kept = StoredResponses::bounded(Some(2));
        for (i, id) in ["a", "b", "c"].into_iter().enumerate() {
            kept.insert(id.into(), stored(i as u64));
        }
        assert!(kept.get("a").is_none());
        assert_eq!(kept.get("b").map(|s| s.context_tokens), Some(1));
        assert_eq!(kept.get("c").map(|s| s.context_tokens), Some(2));
        // Storing an id again neither duplicates it nor forgets another.
        kept.insert("c".into(), stored(9));
        assert_eq!(kept.get("b").map(|s| s.context_tokens), Some(1));
        assert_eq!(kept.get("c").map(|s| s.context_tokens), Some(9));
    }
}
