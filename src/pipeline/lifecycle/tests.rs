//! Layer F's transitions over the embedded store.
use crate::store::StoreReader as _;
use std::sync::Arc;
use std::time::Duration;

use super::{GRANT, Run};
use crate::catalog::ModeCatalog;
use crate::contract::{ErrorCode, SessionId, TurnId};
use crate::llm::LlmClient;
use crate::pipeline::{Pipeline, PipelineSettings};
use crate::store::{MemoryStore, ModeChange, SessionStore, TurnRecord, TurnStatus, now_rfc3339};
use crate::tools::ModeEffect;

/// A pipeline over a memory store (its model server address answers nothing).
fn pipeline() -> (Arc<MemoryStore>, Pipeline) {
    let store = Arc::new(MemoryStore::new());
    let catalog = Arc::new(ModeCatalog::builtin());
    let llm = LlmClient::new(
        "http://127.0.0.1:9/v1",
        None,
        Duration::from_secs(1),
        Duration::from_secs(1),
        0,
    )
    .unwrap();
    let dyn_store: Arc<dyn SessionStore> = store.clone();
    let pipeline = Pipeline::new(dyn_store, catalog, llm, PipelineSettings::new("m")).unwrap();
    (store, pipeline)
}

/// A pipeline over a memory store, and a started run of turn `t` of session `s`.
async fn running() -> (Arc<MemoryStore>, Pipeline, Run) {
    let (store, pipeline) = pipeline();
    let (sid, tid) = (SessionId::parse("s").unwrap(), TurnId::parse("t").unwrap());
    let held = pipeline.life.lease(&sid, &tid).await.unwrap();
    let record = TurnRecord::queued(sid.clone(), tid, String::new(), "general".into());
    let session = pipeline.life.new_session(&sid);
    let run = pipeline
        .life
        .start_user_turn(held, Box::new(record), session, start(), None)
        .await
        .unwrap();
    (store, pipeline, run)
}

/// How a run of a turn whose record is not stored starts (it writes the record).
fn start() -> super::Start {
    super::Start {
        changed: true,
        new_session: true,
        stored: false,
        runs: 1,
        stop_requested: false,
    }
}

fn to_ddr(catalog: &ModeCatalog) -> ModeEffect {
    ModeEffect {
        mode_id: catalog.by_key("ddr_authoring").unwrap().id.clone(),
        change: ModeChange {
            previous_mode: "general".into(),
            new_mode: "ddr_authoring".into(),
            timestamp: now_rfc3339(),
            reason: "DDR work".into(),
            turn_id: TurnId::parse("t").unwrap(),
        },
    }
}

#[tokio::test]
async fn a_mode_change_persists_with_its_history_and_its_ledger_entry() {
    let (store, pipeline, mut run) = running().await;
    let changed = pipeline
        .life
        .record_tool_output(
            &mut run,
            "call_1",
            "{}",
            Some(to_ddr(&ModeCatalog::builtin())),
        )
        .await
        .unwrap();
    assert!(changed);
    assert_eq!(run.session().mode_key, "ddr_authoring");
    let sid = SessionId::parse("s").unwrap();
    let stored = store.get_session(&sid).await.unwrap().unwrap();
    assert_eq!(
        (stored.mode_key.as_str(), stored.mode_history.len()),
        ("ddr_authoring", 1)
    );
    assert_eq!(stored.mode_history[0].reason, "DDR work");
    let turn = store
        .get_turn(&sid, &TurnId::parse("t").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        turn.tool_ledger.get("call_1").map(String::as_str),
        Some("{}")
    );
}

#[tokio::test]
async fn a_mode_change_that_cannot_persist_is_a_retryable_tool_failure_and_writes_nothing() {
    let (store, pipeline, mut run) = running().await;
    // Another holder took over the session: the step is fenced.
    let sid = SessionId::parse("s").unwrap();
    store
        .release_lease(&GRANT, &sid, run.lease())
        .await
        .unwrap();
    store
        .acquire_lease(&GRANT, &sid, "other", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    let failure = pipeline
        .life
        .record_tool_output(
            &mut run,
            "call_1",
            "{}",
            Some(to_ddr(&ModeCatalog::builtin())),
        )
        .await
        .unwrap_err();
    assert_eq!(failure.error.error_code, ErrorCode::ToolUnavailable);
    assert_eq!(
        failure.error.message,
        "agent_change_mode: ModeChangeTool failed to change the session mode."
    );
    let stored = store.get_session(&sid).await.unwrap().unwrap();
    assert_eq!(stored.mode_key, "general", "nothing was written");
    let turn = store
        .get_turn(&sid, &TurnId::parse("t").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert!(turn.tool_ledger.is_empty(), "nor the ledger entry");
}

#[tokio::test]
async fn after_a_failed_write_a_run_writes_nothing_more_of_the_turn() {
    let (store, pipeline, mut run) = running().await;
    let sid = SessionId::parse("s").unwrap();
    let tid = TurnId::parse("t").unwrap();
    // The lease moves on (the run's writes are fenced) and comes back free: a write that
    // followed the failed one would now land.
    store
        .release_lease(&GRANT, &sid, run.lease())
        .await
        .unwrap();
    let other = store
        .acquire_lease(&GRANT, &sid, "other", Duration::from_secs(60))
        .await
        .unwrap()
        .unwrap();
    assert!(
        pipeline
            .life
            .record_tool_output(&mut run, "call_1", "{}", None)
            .await
            .is_err()
    );
    store.release_lease(&GRANT, &sid, &other).await.unwrap();
    let before = store.get_turn(&sid, &tid).await.unwrap().unwrap();
    let failure = crate::pipeline::RetryableFailure {
        error: crate::contract::ErrorMessage::new(ErrorCode::LlmUnavailable, "later"),
        kind: crate::pipeline::RetryKind::Failure,
    };
    pipeline.life.hand_back(run, failure).await;
    let after = store.get_turn(&sid, &tid).await.unwrap().unwrap();
    assert_eq!(
        serde_json::to_value(&before).unwrap(),
        serde_json::to_value(&after).unwrap(),
        "the hand-back wrote nothing"
    );
}

#[tokio::test]
async fn a_run_of_a_stored_turn_writes_nothing_until_it_has_something_to_keep() {
    let (store, pipeline) = pipeline();
    let (sid, tid) = (SessionId::parse("s").unwrap(), TurnId::parse("t").unwrap());
    let queued = TurnRecord::queued(sid.clone(), tid.clone(), String::new(), String::new());
    store.create_turn(&GRANT, &queued).await.unwrap();
    let begun = pipeline.life.begin(&sid, &tid, None, None).await.unwrap();
    assert_eq!((begun.runs, begun.stop_requested), (1, false));
    let start = super::Start {
        changed: true,
        new_session: true,
        stored: true,
        runs: begun.runs,
        stop_requested: begun.stop_requested,
    };
    let held = begun.held.unwrap();
    let session = pipeline.life.new_session(&sid);
    let mut run = pipeline
        .life
        .start_user_turn(held, begun.turn.unwrap(), session, start, None)
        .await
        .unwrap();
    assert_eq!(store.saves(), 0, "the begin step was the run's only write");
    // A reader sees the turn running in its first attempt all the same.
    let read = store.get_turn(&sid, &tid).await.unwrap().unwrap();
    assert_eq!((read.status, read.attempts), (TurnStatus::Running, 1));
    assert!(store.get_session(&sid).await.unwrap().is_none());
    // The run's next write carries the new session with the record.
    pipeline
        .life
        .note_model_call(
            &mut run,
            crate::state::ModelCallMark {
                response_id: "resp_1".into(),
                request: "r".into(),
            },
        )
        .await
        .unwrap();
    assert_eq!(store.saves(), 1);
    assert!(store.get_session(&sid).await.unwrap().is_some());
    let read = store.get_turn(&sid, &tid).await.unwrap().unwrap();
    assert_eq!(
        read.history.first().map(|e| e.event.as_str()),
        Some("run_started")
    );
    // A run that ends without another write (its worker died; here it gives the lease back)
    // is followed by one counted as the second, though neither wrote its attempt.
    run.held.release().await;
    let again = pipeline.life.begin(&sid, &tid, None, None).await.unwrap();
    assert_eq!(again.runs, 2);
    let read = store.get_turn(&sid, &tid).await.unwrap().unwrap();
    assert_eq!((read.status, read.attempts), (TurnStatus::Running, 2));
}
