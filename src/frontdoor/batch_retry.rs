//! Sending a batch's failed lines again (`POST /v1/batches/{batchId}/retry`).
//!
//! Nothing keeps a line's request once its turn ran, so the client sends the file the batch was
//! made from again. Only the lines that failed are read from it — their turn failed, or the
//! line was rejected at submission — matched to the batch by line number and `customId`; a file
//! that does not match is refused whole. Each becomes a new turn whose id is derived from the
//! line's first try, in the session that try ran in (a rejected line: the session it names, or
//! one derived from it), so the same retry sent twice at once still starts each turn once. The
//! new batch keeps the lines' numbers, names the batch it retries, and that batch names it: a
//! batch is retried once, after its lines have settled (a line waiting for its client's tools
//! is not sent again); what fails again is retried from the retry.

use std::collections::{BTreeMap, HashMap};

use sha2::{Digest, Sha256};

use super::FrontDoor;
use super::batch::{BatchAccepted, BatchError, LineIds, NewBatch, PreparedLine, read_lines};
use crate::config::BatchLimits;
use crate::contract::ErrorCode;
use crate::state::TurnStatus;
use crate::store::{BatchItem, BatchRecord};

/// 32 hex digits that only these parts give (each part's length is hashed with it, so
/// `["ab", "c"]` and `["a", "bc"]` differ).
fn derived(parts: &[&str]) -> String {
    let mut hash = Sha256::new();
    for part in parts {
        hash.update((part.len() as u64).to_le_bytes());
        hash.update(part.as_bytes());
    }
    crate::hex::lower(&hash.finalize()[..16])
}

/// The id of the batch that retries `original`: one per batch, so a second retry finds it.
fn retry_batch_id(original: &str) -> String {
    format!("batch-{}", derived(&["retry", original]))
}

/// A line of a batch that is sent again.
#[derive(Debug, Clone, PartialEq)]
enum Retried {
    /// Its turn failed.
    Failed(BatchItem),
    /// It was rejected at submission (its customId, when it could be read).
    Rejected(Option<String>),
}

impl Retried {
    /// The customId the file's line must have.
    fn custom_id(&self) -> Option<&str> {
        match self {
            Self::Failed(item) => Some(&item.custom_id),
            Self::Rejected(id) => id.as_deref(),
        }
    }

    /// The ids its new turn takes, derived from its first try in batch `batch`.
    fn ids(&self, batch: &str, line: usize) -> LineIds {
        let line = line.to_string();
        match self {
            Self::Failed(item) => LineIds {
                session: Some(item.session_id.client_id().to_string()),
                default_session: String::new(),
                turn: derived(&["turn", batch, &line, item.turn_id.as_str()]),
            },
            Self::Rejected(_) => LineIds {
                session: None,
                default_session: derived(&["session", batch, &line]),
                turn: derived(&["turn", batch, &line]),
            },
        }
    }
}

impl FrontDoor {
    /// Sends again, as a new batch, the lines of `original` that failed, read from `body`
    /// (the file `original` was made from). The webhook is `original`'s unless one is asked.
    pub async fn retry_batch(
        &self,
        original: &BatchRecord,
        body: &[u8],
        limits: BatchLimits,
        (webhook, tier): (Option<&str>, Option<crate::contexts::ServiceTier>),
    ) -> Result<BatchAccepted, BatchError> {
        let retry_id = retry_batch_id(&original.batch_id);
        let retried = match &original.retried_as {
            Some(retry) => Some(retry.clone()),
            None => self.store.get_batch(&retry_id).await?.map(|b| b.batch_id),
        };
        if let Some(retry) = retried {
            return Err(BatchError::AlreadyRetried(format!(
                "batch {:?}'s failed lines were sent again as batch {retry:?}; retry that batch's failed lines instead",
                original.batch_id
            )));
        }
        let failed = self.failed_lines(original).await?;
        if failed.is_empty() {
            return Err(BatchError::NothingToRetry(format!(
                "batch {:?} has no failed or rejected lines to send again",
                original.batch_id
            )));
        }
        let lines = read_lines(body, limits)?;
        let by_number: HashMap<usize, &str> = lines.iter().copied().collect();
        let mut chosen = Vec::with_capacity(failed.len());
        for (&line, retried) in &failed {
            let Some(&raw) = by_number.get(&line) else {
                return Err(mismatch(
                    &original.batch_id,
                    line,
                    retried.custom_id(),
                    Found::NoLine,
                ));
            };
            chosen.push((line, raw));
        }
        let prepared = self.prepare_lines(&chosen, |line| {
            failed
                .get(&line)
                .map(|retried| retried.ids(&original.batch_id, line))
        });
        for p in &prepared {
            let (line, found) = read_custom_id(p);
            let expected = failed.get(&line).and_then(Retried::custom_id);
            if expected.is_some() && expected != found {
                return Err(mismatch(
                    &original.batch_id,
                    line,
                    expected,
                    Found::Line(found),
                ));
            }
        }
        let webhook = webhook.or(original.webhook.as_deref());
        let accepted = self
            .accept_batch(
                &original.tenant,
                prepared,
                NewBatch {
                    id: retry_id,
                    total: failed.len(),
                    retry_of: Some(&original.batch_id),
                },
                (webhook, tier),
            )
            .await?;
        let mut marked = original.clone();
        marked.retried_as = Some(accepted.batch_id.clone());
        if let Err(e) = self.store.put_batch(&marked).await {
            // A second retry is still refused (the retry's id is taken); only the batch's
            // page does not link to its retry.
            tracing::warn!(batch_id = %original.batch_id, retry = %accepted.batch_id, error = %e, "could not note a batch's retry on it");
        }
        Ok(accepted)
    }

    /// The lines of `batch` to send again, by line number: those whose turn failed, and those
    /// rejected at submission (except a repeated customId: sent alone it would run a line the
    /// client sent twice). Refused while a line is queued or running: a line that fails after
    /// the retry could not be retried (a batch is retried once).
    async fn failed_lines(
        &self,
        batch: &BatchRecord,
    ) -> Result<BTreeMap<usize, Retried>, BatchError> {
        let mut out = BTreeMap::new();
        let mut open = 0usize;
        for chunk in batch.items.chunks(crate::store::BATCH_READ_CHUNK) {
            let ids: Vec<_> = chunk
                .iter()
                .map(|i| (i.session_id.clone(), i.turn_id.clone()))
                .collect();
            let records = self.store.get_turns(&ids).await?;
            for (item, record) in chunk.iter().zip(records) {
                match record.map(|r| r.status) {
                    Some(TurnStatus::Failed) => {
                        out.insert(item.line, Retried::Failed(item.clone()));
                    }
                    Some(TurnStatus::Queued | TurnStatus::Running) => open += 1,
                    _ => {}
                }
            }
        }
        if open > 0 {
            return Err(BatchError::NotSettled(format!(
                "batch {:?} has {open} line(s) still queued or running; retry its failed lines once they have settled",
                batch.batch_id
            )));
        }
        for rejected in &batch.rejected {
            let repeated = rejected
                .errors
                .iter()
                .any(|e| e.error_code == ErrorCode::DuplicateCustomId);
            if !repeated {
                out.insert(rejected.line, Retried::Rejected(rejected.custom_id.clone()));
            }
        }
        Ok(out)
    }
}

/// A prepared line's number and the customId it carries, when it could be read.
fn read_custom_id(line: &PreparedLine) -> (usize, Option<&str>) {
    match line {
        Ok((number, custom_id, _)) => (*number, Some(custom_id.as_str())),
        Err(e) => (e.line, e.custom_id.as_deref()),
    }
}

/// What a file has where a failed line of the batch was.
enum Found<'a> {
    /// No line (the file is shorter, or the line is blank).
    NoLine,
    /// A line, with the customId it carries when it could be read.
    Line(Option<&'a str>),
}

/// The file's line `line` is not the batch's.
fn mismatch(batch: &str, line: usize, expected: Option<&str>, found: Found<'_>) -> BatchError {
    let which = expected.map_or(String::new(), |id| format!(" (customId {id:?})"));
    let what = match found {
        Found::NoLine => "no line".to_string(),
        Found::Line(None) => "a line without a readable customId".to_string(),
        Found::Line(Some(id)) => format!("customId {id:?}"),
    };
    BatchError::Mismatch(format!(
        "line {line}: batch {batch:?}'s line {line}{which} failed and is to be sent again, but this file has {what} there; send the file the batch was made from"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{SessionId, TurnId};
    use serde_json::{Map, Value};

    fn ids_for_test(
        batch: &str,
        line: usize,
        item: Option<&BatchItem>,
    ) -> (Option<String>, String) {
        let retried = item.map_or(Retried::Rejected(None), |i| Retried::Failed(i.clone()));
        let ids = retried.ids(batch, line);
        (ids.session, ids.turn)
    }

    fn item(line: usize, turn: &str) -> BatchItem {
        BatchItem {
            line,
            custom_id: format!("doc-{line}"),
            session_id: SessionId::parse("s-1")
                .unwrap_or_else(|e| panic!("{e}"))
                .within("acme"),
            turn_id: TurnId::parse(turn).unwrap_or_else(|e| panic!("{e}")),
        }
    }

    #[test]
    fn a_failed_lines_retry_runs_in_its_session_as_a_new_turn_of_a_derived_id() {
        let first = item(3, "t-1");
        let (session, turn) = ids_for_test("batch-a", 3, Some(&first));
        // The client's id of the session, not the scoped one (the request is scoped later).
        assert_eq!(session.as_deref(), Some("s-1"));
        assert_ne!(turn, "t-1");
        assert!(crate::contract::ids::check_id(&turn).is_ok(), "{turn}");
        // The same line of the same batch gives the same id, any other a different one.
        assert_eq!(ids_for_test("batch-a", 3, Some(&first)).1, turn);
        assert_ne!(ids_for_test("batch-b", 3, Some(&first)).1, turn);
        assert_ne!(ids_for_test("batch-a", 4, Some(&first)).1, turn);
        assert_ne!(ids_for_test("batch-a", 3, Some(&item(3, "t-2"))).1, turn);
        assert_ne!(ids_for_test("batch-a", 3, None).1, turn);
    }

    #[test]
    fn the_ids_are_written_over_what_the_line_names_except_a_rejected_lines_session() {
        let mut named: Map<String, Value> =
            serde_json::from_str(r#"{"SessionId": "mine", "TurnId": "t-9", "instruction": "x"}"#)
                .unwrap_or_default();
        Retried::Failed(item(2, "t-1"))
            .ids("batch-a", 2)
            .apply(&mut named);
        assert_eq!(named.get("sessionId"), Some(&Value::from("s-1")));
        assert!(!named.contains_key("SessionId") && !named.contains_key("TurnId"));
        assert_ne!(named.get("turnId"), Some(&Value::from("t-9")));

        let mut own: Map<String, Value> =
            serde_json::from_str(r#"{"sessionId": "mine"}"#).unwrap_or_default();
        Retried::Rejected(None).ids("batch-a", 2).apply(&mut own);
        assert_eq!(own.get("sessionId"), Some(&Value::from("mine")));
        let mut none = Map::new();
        Retried::Rejected(None).ids("batch-a", 2).apply(&mut none);
        let derived_session = none.get("sessionId").cloned();
        let mut again = Map::new();
        Retried::Rejected(None).ids("batch-a", 2).apply(&mut again);
        assert_eq!(again.get("sessionId"), derived_session.as_ref());
        assert!(derived_session.is_some());
    }

    #[test]
    fn a_batch_has_one_retry_id_and_it_is_a_batch_id() {
        let id = retry_batch_id("batch-0123");
        assert_eq!(id, retry_batch_id("batch-0123"));
        assert_ne!(id, retry_batch_id("batch-0124"));
        assert!(id.starts_with("batch-") && id.len() == 38, "{id}");
        assert!(crate::contract::ids::check_id(&id).is_ok());
    }

    #[test]
    fn a_mismatch_names_the_line_and_both_custom_ids() {
        let e = mismatch("batch-a", 4, Some("doc-4"), Found::Line(Some("doc-9"))).to_string();
        assert!(e.starts_with("line 4: "), "{e}");
        assert!(e.contains("\"doc-4\"") && e.contains("\"doc-9\""), "{e}");
        let unread = mismatch("batch-a", 7, Some("doc-7"), Found::Line(None)).to_string();
        assert!(unread.contains("without a readable customId"), "{unread}");
        let gone = mismatch("b", 7, None, Found::NoLine).to_string();
        assert!(gone.contains("has no line there"), "{gone}");
    }
}
