//! The turn's persistent shapes: session state, the turn record with its status, progress,
//! pending client tools and checkpoint (with the model-answer data a checkpoint holds), leases
//! and batch records. The floor the store, the pipeline, the worker and the front door stand on.
//!
//! Owns: these types and their small invariants (a mode change applied to a session, a record's
//! first shape). Must not: import anything of this crate but [`crate::contract`]: no store, no
//! model client, no HTTP.

use serde::{Deserialize, Serialize};

/// A session lease: while held, only its holder may write the session's state. A write carrying
/// a lease that is no longer the session's (a holder that paused past it) is rejected. The
/// token grows with every taking of the kind: a lease taken on its own counts the session's
/// takings, a turn's run counts the turn's runs (its count of runs begun); the holder's
/// unique part makes each lease's value one no other taking has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The fencing token (see above).
    pub token: u64,
    /// Who holds it (worker id and turn), for logs and debugging.
    pub holder: String,
}

mod batch;
mod model;
mod prompt;
mod request;
mod session;
mod turn;
mod views;

pub use batch::*;
pub use model::*;
pub use prompt::*;
pub use request::*;
pub use session::*;
pub use turn::*;
pub use views::*;

/// Now, as RFC 3339 UTC.
pub fn now_rfc3339() -> String {
    time::OffsetDateTime::now_utc()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

#[cfg(test)]
mod tests {
    use super::SentRequest;

    fn sent(text: &str) -> SentRequest {
        SentRequest::new(serde_json::value::RawValue::from_string(text.to_owned()).unwrap())
    }

    #[test]
    fn a_sent_request_is_stored_and_read_back_as_the_exact_text() {
        let text = r#"{"model":"m",  "input":[{"b":1,"a":2}]}"#;
        let stored = serde_json::to_string(&vec![sent(text)]).unwrap();
        assert_eq!(stored, format!("[{text}]"));
        let read: Vec<SentRequest> = serde_json::from_str(&stored).unwrap();
        assert_eq!(read[0].json(), text);
    }

    #[test]
    fn a_record_keeps_the_start_of_an_instruction_and_names_the_first_files() {
        use super::{ARTIFACTS_NAMED, INSTRUCTION_KEPT, TurnInput};
        let long = "é".repeat(INSTRUCTION_KEPT + 5);
        let paths: Vec<String> = (0..ARTIFACTS_NAMED + 3)
            .map(|i| format!("d/{i}.md"))
            .collect();
        let kept = TurnInput::of(Some(&long), paths.iter().map(String::as_str));
        let text = kept.instruction.unwrap();
        assert_eq!(
            text.chars().count(),
            INSTRUCTION_KEPT + 1,
            "cut on a character, then …"
        );
        assert!(text.ends_with('…'));
        assert_eq!(kept.artifacts, paths[..ARTIFACTS_NAMED]);
        assert_eq!(kept.artifact_count, ARTIFACTS_NAMED + 3);
        let short = TurnInput::of(Some("hi"), std::iter::empty());
        assert_eq!(short.instruction.as_deref(), Some("hi"));
        assert!(short.artifacts.is_empty());
    }

    /// A record's status is the same whether the record is lent or given up: ids, times,
    /// result, and the tier of the latest call that reports one.
    #[test]
    fn a_status_moved_out_of_a_record_is_the_one_copied_from_it() {
        use super::{TurnRecord, TurnStatusView};
        let call = |tier: Option<&str>| {
            serde_json::json!({"responseId": "r", "model": "m", "agentContext": "default",
                "latencyMs": 1, "serviceTier": tier,
                "usage": {"promptTokens": 1, "completionTokens": 1, "totalTokens": 2}})
        };
        let record: TurnRecord = serde_json::from_value(serde_json::json!({
            "sessionId": "s", "turnId": "t", "fingerprint": "f", "status": "completed",
            "modeKey": "general", "pending": null, "toolLedger": {}, "requests": [],
            "attempts": 2, "submittedAt": "2026-11-30T00:00:00Z",
            "completedAt": "2026-11-30T00:00:01Z",
            "result": {"successful": true, "errors": [], "warnings": [],
                "result": {"kind": "final", "sessionId": "s", "turnId": "t",
                    "modeDisplayName": "General", "primaryOutputText": "done"}},
            "calls": [call(Some("flex")), call(Some("default")), call(None)]
        }))
        .unwrap();
        let lent = TurnStatusView::from(&record);
        let moved = TurnStatusView::from(record);
        assert_eq!(moved, lent);
        assert_eq!(moved.service_tier.as_deref(), Some("default"));
        assert_eq!(moved.attempts, 2);
        assert!(moved.result.is_some_and(|r| r.is_successful()));
    }

    /// Every turn waiting on its model holds its record (boxed, from the begin step to the
    /// settle): its result, pending client tools and checkpoint are there only at the end of
    /// a run or between runs, and are boxed so a waiting turn does not carry their room
    /// (1,504 bytes inline, rustc 1.95; 552 boxed).
    #[test]
    fn a_record_keeps_its_rare_parts_out_of_line() {
        let size = std::mem::size_of::<super::TurnRecord>();
        eprintln!("a turn's record: {size} B");
        assert!(size <= 640, "a turn's record grew to {size} B");
    }

    #[test]
    fn shortened_counts_characters_not_bytes() {
        use super::shortened;
        assert_eq!(shortened("abc", 3), "abc");
        assert_eq!(shortened("abcd", 3), "abc…");
        // Six bytes, three characters: kept whole at three, cut at two.
        assert_eq!(shortened("ééé", 3), "ééé");
        assert_eq!(shortened("ééé", 2), "éé…");
        assert_eq!(shortened("", 0), "");
    }
}
