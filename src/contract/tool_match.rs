//! AGN-033 §3.3: submitted tool results must match the tool calls a turn waits for exactly —
//! same count, same ids, same order. Anything else is a hard fault.

use super::codes::ErrorCode;
use super::ids::ToolCallId;
use super::invoke::ErrorMessage;
use super::request::ToolResult;

/// How a submission differed from what the turn waits for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ToolResultsMismatch {
    /// A different number of results than calls.
    #[error("expected {expected} tool result(s), got {got}")]
    Count {
        /// Calls the turn waits for.
        expected: usize,
        /// Results submitted.
        got: usize,
    },
    /// The same ids, in a different order.
    #[error(
        "tool results are out of order: expected [{}], got [{}]",
        join(expected),
        join(got)
    )]
    Order {
        /// The expected order.
        expected: Vec<ToolCallId>,
        /// The submitted order.
        got: Vec<ToolCallId>,
    },
    /// A result answers a call the turn does not wait for (or one is answered twice).
    #[error("toolResults[{index}]: expected toolCallId {expected:?}, got {got:?}")]
    Id {
        /// Position of the first differing result.
        index: usize,
        /// The id expected there.
        expected: ToolCallId,
        /// The id submitted there.
        got: ToolCallId,
    },
}

fn join(ids: &[ToolCallId]) -> String {
    ids.iter()
        .map(ToolCallId::as_str)
        .collect::<Vec<_>>()
        .join(", ")
}

impl ToolResultsMismatch {
    /// The client-facing error.
    pub fn to_error(&self) -> ErrorMessage {
        ErrorMessage::new(ErrorCode::ToolResultsMismatch, self.to_string())
    }
}

/// Accepts `submitted` only if it answers `expected` exactly (count, ids, order).
pub fn check_tool_results(
    expected: &[ToolCallId],
    submitted: &[ToolResult],
) -> Result<(), ToolResultsMismatch> {
    if expected.len() != submitted.len() {
        return Err(ToolResultsMismatch::Count {
            expected: expected.len(),
            got: submitted.len(),
        });
    }
    let got: Vec<ToolCallId> = submitted.iter().map(|r| r.tool_call_id.clone()).collect();
    let Some(index) = expected.iter().zip(&got).position(|(e, g)| e != g) else {
        return Ok(());
    };
    let mut sorted_expected = expected.to_vec();
    let mut sorted_got = got.clone();
    sorted_expected.sort();
    sorted_got.sort();
    if sorted_expected == sorted_got {
        return Err(ToolResultsMismatch::Order {
            expected: expected.to_vec(),
            got,
        });
    }
    Err(ToolResultsMismatch::Id {
        index,
        expected: expected[index].clone(),
        got: got[index].clone(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::request::{JsonText, ToolOutcome};

    fn id(s: &str) -> ToolCallId {
        ToolCallId::parse(s).unwrap()
    }
    fn res(s: &str) -> ToolResult {
        ToolResult {
            tool_call_id: id(s),
            execution_ms: 1,
            outcome: ToolOutcome::Result(JsonText::parse("{}").unwrap()),
        }
    }

    #[test]
    fn exact_match_is_accepted() {
        assert_eq!(
            check_tool_results(&[id("a"), id("b")], &[res("a"), res("b")]),
            Ok(())
        );
    }

    #[test]
    fn each_kind_of_mismatch_is_named() {
        let cases: Vec<(Vec<ToolCallId>, Vec<ToolResult>, &str)> = vec![
            (
                vec![id("a"), id("b")],
                vec![res("a")],
                "expected 2 tool result(s), got 1",
            ),
            (
                vec![id("a")],
                vec![res("a"), res("b")],
                "expected 1 tool result(s), got 2",
            ),
            (
                vec![id("a"), id("b")],
                vec![res("b"), res("a")],
                "tool results are out of order: expected [a, b], got [b, a]",
            ),
            (
                vec![id("a"), id("b")],
                vec![res("a"), res("c")],
                "toolResults[1]: expected toolCallId ToolCallId(\"b\"), got ToolCallId(\"c\")",
            ),
            (
                vec![id("a"), id("b")],
                vec![res("a"), res("a")],
                "toolResults[1]: expected toolCallId ToolCallId(\"b\"), got ToolCallId(\"a\")",
            ),
        ];
        for (expected, submitted, msg) in cases {
            let err = check_tool_results(&expected, &submitted).unwrap_err();
            assert_eq!(err.to_string(), msg);
            assert_eq!(err.to_error().error_code, ErrorCode::ToolResultsMismatch);
        }
    }
}
