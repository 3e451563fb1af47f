//! A settled status as a waiter hears it: read from the store, or published by the worker
//! that settled the turn. A published one is kept as the JSON the worker sent and read only
//! as far as a waiter decides by — whose turn it is, its status, where its result lies — so
//! the synchronous endpoint answers with the result's bytes as they came, and a whole view is
//! read from them only for a caller that asks for one.
//!
//! Owns: reading a published status's head, and the settled status a wait ends with. Must
//! not: judge a result (the worker that wrote it did).

use std::borrow::Cow;
use std::ops::Range;

use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use crate::contract::TurnId;
use crate::state::{TurnStatus, TurnStatusView};
use crate::store::StoreError;

/// A status the worker published, its JSON whole.
#[derive(Debug, Clone)]
pub struct PublishedStatus {
    body: Bytes,
    status: TurnStatus,
    /// Where the result's JSON lies in `body`, when there is one.
    result: Option<Range<usize>>,
}

/// What a waiter reads of a published status (the rest is passed over, not built).
#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct Head<'a> {
    #[serde(borrow)]
    turn_id: Cow<'a, str>,
    status: TurnStatus,
    #[serde(borrow, default)]
    result: Option<&'a RawValue>,
}

impl PublishedStatus {
    /// `body` as a status of `turn`; `None` when it is not a status or is another turn's.
    pub fn of_turn(body: Vec<u8>, turn: &TurnId) -> Option<Self> {
        let found = match result_last(&body, turn) {
            Some(found) => found,
            None => read_whole(&body, turn)?,
        };
        let (status, result) = found?;
        Some(Self {
            body: Bytes::from(body),
            status,
            result,
        })
    }

    /// The status published.
    pub fn status(&self) -> TurnStatus {
        self.status
    }

    /// The result's JSON (an `InvokeResult`) as the worker wrote it, when there is one.
    pub fn result_json(&self) -> Option<Bytes> {
        self.result.clone().map(|at| self.body.slice(at))
    }

    /// The whole view, read now.
    pub fn view(&self) -> Result<TurnStatusView, StoreError> {
        serde_json::from_slice(&self.body).map_err(|e| {
            StoreError::Corrupt(format!("a published status that cannot be read: {e}"))
        })
    }
}

/// What a status said, if it is the turn's (`None`: another turn's): its status, and where its
/// result lies.
type Found = Option<(TurnStatus, Option<Range<usize>>)>;

/// How a status's result starts when it follows another field: a comma, then a quote that is
/// not escaped (inside a JSON string every quote is), can only start a key.
const RESULT_KEY: &[u8] = b",\"result\":";

/// A status written as [`TurnStatusView`] writes it — its result last, after fields that hold
/// no object — read without reading the result: the first result key is the status's own
/// (no field before it holds one), the result runs from it to the status's closing brace, and
/// only the fields before it are read. `None` for any other shape (a status without a result,
/// one written by a version that put a field after the result): [`read_whole`] reads those.
fn result_last(body: &[u8], turn: &TurnId) -> Option<Found> {
    let at = memchr::memmem::find(body, RESULT_KEY)?;
    let start = at + RESULT_KEY.len();
    // The result is an object, and the status's own closing brace follows it at once.
    if body.get(start) != Some(&b'{') || !body.ends_with(b"}}") {
        return None;
    }
    let mut fields = Vec::with_capacity(at + 1);
    fields.extend_from_slice(&body[..at]);
    fields.push(b'}');
    // The fields before the key, closed, must be an object of their own: then the key is the
    // status's, not one nested in a field before it.
    let head: Head<'_> = serde_json::from_slice(&fields).ok()?;
    Some((head.turn_id == turn.as_str()).then_some((head.status, Some(start..body.len() - 1))))
}

/// A status read whole (its result skipped over, not built).
fn read_whole(body: &[u8], turn: &TurnId) -> Option<Found> {
    let head: Head<'_> = serde_json::from_slice(body).ok()?;
    if head.turn_id != turn.as_str() {
        return Some(None);
    }
    let result = match head.result {
        Some(raw) => Some(within(body, raw.get().as_bytes())?),
        None => None,
    };
    Some(Some((head.status, result)))
}

/// Where `part`, a slice of `whole`, lies in it (`None` if it is not one).
fn within(whole: &[u8], part: &[u8]) -> Option<Range<usize>> {
    let start = (part.as_ptr() as usize).checked_sub(whole.as_ptr() as usize)?;
    let end = start.checked_add(part.len())?;
    (end <= whole.len()).then_some(start..end)
}

/// The settled status a wait ended with.
#[derive(Debug, Clone)]
pub enum Settled {
    /// Read from the store.
    Read(Box<TurnStatusView>),
    /// Published by the worker that settled the turn.
    Published(PublishedStatus),
}

impl Settled {
    /// The status.
    pub fn status(&self) -> TurnStatus {
        match self {
            Self::Read(view) => view.status,
            Self::Published(p) => p.status(),
        }
    }

    /// The whole view (a published one is read now).
    pub fn into_view(self) -> Result<TurnStatusView, StoreError> {
        match self {
            Self::Read(view) => Ok(*view),
            Self::Published(p) => p.view(),
        }
    }
}

impl From<TurnStatusView> for Settled {
    fn from(view: TurnStatusView) -> Self {
        Self::Read(Box::new(view))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contract::{AgentExecuteResponse, InvokeResult, SessionId};
    use crate::state::TurnRecord;

    fn completed(turn: &str) -> TurnStatusView {
        let (sid, tid) = (
            SessionId::parse("s-1").unwrap(),
            TurnId::parse(turn).unwrap(),
        );
        let mut record = TurnRecord::queued(sid, tid, "fp".into(), String::new());
        record.status = TurnStatus::Completed;
        let mut view = TurnStatusView::from(&record);
        view.result = Some(
            serde_json::from_value::<InvokeResult<AgentExecuteResponse>>(serde_json::json!({
                "successful": true,
                "result": {"kind": "final", "sessionId": "s-1", "turnId": turn,
                           "modeDisplayName": "Agent", "primaryOutputText": "done \"quoted\""},
                "errors": [], "warnings": [], "resultId": "R1"
            }))
            .unwrap(),
        );
        view
    }

    #[test]
    fn a_published_status_answers_its_result_as_the_worker_wrote_it() {
        let view = completed("t-1");
        let body = serde_json::to_vec(&view).unwrap();
        let heard = PublishedStatus::of_turn(body, &TurnId::parse("t-1").unwrap()).unwrap();
        assert_eq!(heard.status(), TurnStatus::Completed);
        let result = heard.result_json().unwrap();
        assert_eq!(result, serde_json::to_vec(&view.result).unwrap());
        // The bytes are the result a typed read gives back.
        let typed: InvokeResult<AgentExecuteResponse> = serde_json::from_slice(&result).unwrap();
        assert_eq!(Some(typed), view.result);
        assert_eq!(heard.view().unwrap(), view);
    }

    /// [`TurnStatusView`]'s fields in the order versions before this one wrote them.
    #[derive(serde::Serialize)]
    #[serde(rename_all = "camelCase")]
    struct Earlier<'a> {
        session_id: &'a SessionId,
        turn_id: &'a TurnId,
        status: TurnStatus,
        attempts: u32,
        submitted_at: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        completed_at: &'a Option<String>,
        #[serde(skip_serializing_if = "Option::is_none")]
        result: &'a Option<InvokeResult<AgentExecuteResponse>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        service_tier: &'a Option<String>,
    }

    /// A status as a worker writes it is read without its result, whatever the result and
    /// the fields before it hold; one whose fields come in another order (a version that wrote
    /// a field after the result) is read whole, to the same answer.
    #[test]
    fn the_result_is_found_without_reading_it_and_any_other_order_is_read_whole() {
        let tid = TurnId::parse("t-1").unwrap();
        let tricky = [
            "plain",
            r#"ends like a status ,"result":{"x":1}}"#,
            r#"quote \" and ,\"result\": escaped"#,
            "}}",
        ];
        for text in tricky {
            for tier in [None, Some(r#"flex,"result":{}"#)] {
                let mut view = completed("t-1");
                view.service_tier = tier.map(str::to_string);
                if let Some(result) = view.result.as_mut() {
                    let mut v = serde_json::to_value(&*result).unwrap();
                    v["result"]["primaryOutputText"] = serde_json::json!(text);
                    *result = serde_json::from_value(v).unwrap();
                }
                let expected = serde_json::to_vec(&view.result).unwrap();
                let written = serde_json::to_vec(&view).unwrap();
                assert!(
                    matches!(result_last(&written, &tid), Some(Some(_))),
                    "read without its result: {text:?} {tier:?}"
                );
                // As versions before this one wrote it: the service tier after the result.
                let earlier = serde_json::to_vec(&Earlier {
                    session_id: &view.session_id,
                    turn_id: &view.turn_id,
                    status: view.status,
                    attempts: view.attempts,
                    submitted_at: &view.submitted_at,
                    completed_at: &view.completed_at,
                    result: &view.result,
                    service_tier: &view.service_tier,
                })
                .unwrap();
                assert_eq!(
                    result_last(&earlier, &tid).is_some(),
                    tier.is_none(),
                    "a field after the result is seen: {text:?} {tier:?}"
                );
                for body in [written, earlier] {
                    let heard = PublishedStatus::of_turn(body, &tid).unwrap();
                    assert_eq!(heard.status(), TurnStatus::Completed);
                    assert_eq!(heard.result_json().unwrap(), expected, "{text:?} {tier:?}");
                }
            }
        }
    }

    #[test]
    fn another_turns_status_or_a_body_that_is_none_is_passed_over() {
        let body = serde_json::to_vec(&completed("t-2")).unwrap();
        let t1 = TurnId::parse("t-1").unwrap();
        assert!(PublishedStatus::of_turn(body, &t1).is_none());
        assert!(PublishedStatus::of_turn(b"{\"kind\":\"delta\"}".to_vec(), &t1).is_none());
        assert!(PublishedStatus::of_turn(b"not json".to_vec(), &t1).is_none());
    }

    #[test]
    fn a_status_without_a_result_has_none_and_a_broken_one_is_a_clear_error() {
        let mut view = completed("t-1");
        view.status = TurnStatus::Running;
        view.result = None;
        let tid = TurnId::parse("t-1").unwrap();
        let heard = PublishedStatus::of_turn(serde_json::to_vec(&view).unwrap(), &tid).unwrap();
        assert_eq!(heard.status(), TurnStatus::Running);
        assert!(heard.result_json().is_none());
        // A head that reads but a result that does not: the whole view is refused, named.
        let broken = br#"{"sessionId":"s-1","turnId":"t-1","status":"completed","attempts":1,"submittedAt":"x","result":{"successful":true}}"#;
        let heard = PublishedStatus::of_turn(broken.to_vec(), &tid).unwrap();
        let Err(StoreError::Corrupt(why)) = heard.view() else {
            panic!("a broken result read as a view");
        };
        assert!(why.contains("published status"), "{why}");
    }
}
