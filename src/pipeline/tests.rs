//! What a turn costs the store, driven end to end against the fake model.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;

use super::{Pipeline, PipelineSettings};
use crate::catalog::ModeCatalog;
use crate::contract::{AgentExecuteResponse, RequestLimits, parse_request};
use crate::fake_llm::{FakeLlm, FakeOptions, Reply};
use crate::llm::LlmClient;
use crate::store::{MemoryStore, SessionStore};

async fn pipeline_over(store: Arc<MemoryStore>) -> (FakeLlm, Pipeline) {
    let fake = FakeLlm::start("127.0.0.1:0".parse().unwrap(), FakeOptions::default(), None)
        .await
        .unwrap();
    let llm = LlmClient::new(
        &fake.base_url(),
        None,
        Duration::from_secs(2),
        Duration::from_secs(10),
        0,
    )
    .unwrap();
    let dyn_store: Arc<dyn SessionStore> = store;
    let pipeline = Pipeline::new(
        dyn_store,
        Arc::new(ModeCatalog::builtin()),
        llm,
        PipelineSettings::new("gpt-test"),
    )
    .unwrap();
    (fake, pipeline)
}

/// Runs turn `turn` of session `s`: its answer, and how many turn writes the store took for it.
async fn run_turn(
    store: &MemoryStore,
    pipeline: &Pipeline,
    turn: &str,
) -> (AgentExecuteResponse, u64) {
    let body = json!({"sessionId": "s", "turnId": turn, "instruction": "go"}).to_string();
    let request = parse_request(body.as_bytes(), &RequestLimits::default())
        .unwrap()
        .request;
    let before = store.saves();
    let result = pipeline.run(&request).await.unwrap();
    let answer = result.result().cloned().expect("a successful turn");
    (answer, store.saves() - before)
}

/// An answer without tool calls settles the turn in the write that follows it: the turn is
/// written when it starts running and when it settles, with no checkpoint between (a
/// checkpoint there would be the same turn written one round trip earlier). An answer that
/// calls a tool is checkpointed before the tool runs, so a re-run does not run it twice.
#[tokio::test]
async fn only_an_answer_that_calls_tools_is_checkpointed() {
    let store = Arc::new(MemoryStore::new());
    let (fake, pipeline) = pipeline_over(store.clone()).await;
    fake.push([
        Reply::Text("Hello.".into()),
        Reply::Calls(vec![(
            "workspace_read_file".into(),
            json!({"path": "a.md"}),
        )]),
    ]);

    let (answer, writes) = run_turn(&store, &pipeline, "t1").await;
    assert!(
        matches!(answer, AgentExecuteResponse::Final(_)),
        "{answer:?}"
    );
    assert_eq!(
        writes, 2,
        "a final answer: the running turn and the settled turn"
    );

    let (answer, writes) = run_turn(&store, &pipeline, "t2").await;
    assert!(
        matches!(answer, AgentExecuteResponse::ClientToolContinuation(_)),
        "{answer:?}"
    );
    assert_eq!(
        writes, 3,
        "an answer calling a tool: running, the checkpoint, then the turn waiting for the tool"
    );
}

/// A user turn's request, parsed as a job's body is.
fn a_user_turn() -> crate::contract::AgentExecuteRequest {
    let body = json!({"sessionId": "s", "turnId": "t", "instruction": "go"}).to_string();
    parse_request(body.as_bytes(), &RequestLimits::default())
        .unwrap()
        .request
}

/// Each turn in flight holds its run's future while it waits for the model (boxed once, in
/// `execute_as`): at 10,000 turns in flight every KB of it is ~10 MB. A bound that fails when
/// a new state makes it grow past it (it was ~13 KB when written; 9,256 bytes with rustc 1.95
/// with the loop's arguments held twice, 8,368 without; 4,416 since only the model call is
/// awaited in the loop itself, the call is raced against a stop in place, and the result is
/// boxed as it comes; in a test build 9,384 once the model client sent on connections of its
/// own, 5,048 with their opening and the answer's reading boxed, steps a waiting call is not
/// in).
#[tokio::test]
async fn a_turns_run_stays_under_5_kib() {
    let (_fake, pipeline) = pipeline_over(Arc::new(MemoryStore::new())).await;
    let request = a_user_turn();
    let run = pipeline.run_job(&request, super::Origin::default());
    let size = std::mem::size_of_val(&run);
    eprintln!("a turn's run: {size} B");
    assert!(size < 5 * 1024, "a turn's run grew to {size} B");
}

/// While its begin step runs, a turn also holds its opening (boxed apart from its run): with
/// thousands of turns arriving at once, most of them are here when the worker's memory peaks.
/// It must not carry its rare failure's state (13,256 bytes with it, rustc 1.95), nor the
/// begin step's future twice, nor the turn's record by value in each slot it passes through
/// (6,400 bytes before the store handed the record over boxed; 2,824 since), nor a duplicate
/// job's answer held across the lease's release (1,920 since that path is boxed).
#[tokio::test]
async fn a_turns_opening_stays_under_2_kib() {
    let (_fake, pipeline) = pipeline_over(Arc::new(MemoryStore::new())).await;
    let request = a_user_turn();
    let crate::contract::AgentExecuteRequest::UserTurn(turn) = &request else {
        unreachable!("a user turn's body")
    };
    let opening = pipeline.open_user_turn(super::outcome::TurnPrint::of(turn, None), None, None);
    let size = std::mem::size_of_val(&opening);
    eprintln!("a turn's opening: {size} B");
    assert!(size < 2 * 1024, "a turn's opening grew to {size} B");
    // And, boxed inside it while it runs, the begin step beside retrieval: 1,776 bytes with
    // rustc 1.95 (4,768 with the record unboxed in its answer; 7,168 with the begin step's
    // future made before and captured).
    let begin = pipeline.begin_beside_retrieval(turn, None, Some("probe"));
    let size = std::mem::size_of_val(&begin);
    eprintln!("its begin step: {size} B");
    assert!(size < 2 * 1024, "a turn's begin step grew to {size} B");
}

/// The turn's next write joined with its tokens' count holds the write once (the settling
/// write's box was 13,937 bytes for a 6,656-byte step when an `async fn` held it as its
/// argument and again in `tokio::join!`'s tuple).
#[tokio::test]
async fn a_write_counted_beside_its_tokens_is_held_once() {
    let (_fake, pipeline) = pipeline_over(Arc::new(MemoryStore::new())).await;
    let spent = crate::tenants::Spent {
        tenant: "t".into(),
        context: "c".into(),
        usage: Default::default(),
    };
    let step = super::until_cancelled::holding_4_kib();
    let alone = std::mem::size_of_val(&step);
    assert!(alone >= 4096, "the step holds its 4 KiB: {alone} B");
    let counting = pipeline.counting(spent, step);
    let size = std::mem::size_of_val(&counting);
    eprintln!("a {alone}-byte step counted: {size} B");
    assert!(
        size < alone + 1024,
        "the step is held more than once: {size} B"
    );
    assert_eq!(counting.await, 4096);
}
