//! The pipeline over the real local Redis: exactly-once turns under races, crashes and
//! redeliveries.

use std::collections::HashSet;
use std::time::Duration;

use aptix_worker::contract::{
    AgentExecuteRequest, AgentExecuteResponse, ErrorCode, SessionId, TurnId,
};
use aptix_worker::fake_llm::{FakeOptions, Reply};
use aptix_worker::pipeline::PipelineSettings;
use aptix_worker::store::{TurnRecord, TurnStatus};
use serde_json::{Value, json};

use crate::support::{Setup, StoreKind, harness, request};

fn redis_setup() -> Setup {
    Setup {
        store: StoreKind::Redis,
        ..Setup::default()
    }
}

fn turn(session: &str, turn: &str, instruction: &str) -> Value {
    json!({"sessionId": session, "turnId": turn, "instruction": instruction})
}

#[tokio::test]
async fn a_mode_change_is_persisted_in_redis_and_seen_by_the_next_turn() {
    let h = harness(redis_setup()).await;
    h.fake.push([
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "ddr_authoring", "branch": false, "reason": "DDR"}),
        )]),
        Reply::Text("switched".into()),
        Reply::Text("next".into()),
    ]);
    h.pipeline
        .run(&request(turn("s", "t1", "switch")))
        .await
        .unwrap();
    let session = h
        .store
        .get_session(&SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(session.mode_key, "ddr_authoring");
    assert_eq!(session.mode_history.len(), 1);
    assert_eq!(session.mode_history[0].turn_id.as_str(), "t1");
    // A different worker (same Redis) runs the next turn in the new mode.
    let other = h.another_worker(PipelineSettings::new("gpt-test"));
    let r = other.run(&request(turn("s", "t2", "go on"))).await.unwrap();
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        panic!("{:?}", r.errors())
    };
    assert_eq!(f.meta.mode_display_name, "DDR Authoring");
    let reqs = h.fake.requests();
    assert!(
        reqs[2]["input"][0]["content"][0]["text"]
            .as_str()
            .unwrap()
            .starts_with("[MODE: ddr_authoring]")
    );
}

#[tokio::test]
async fn racing_turns_on_one_session_run_one_at_a_time_and_all_complete() {
    let h = harness(Setup {
        options: FakeOptions {
            latency: Duration::from_millis(20),
            ..Default::default()
        },
        ..redis_setup()
    })
    .await;
    let workers: Vec<_> = (0..3)
        .map(|_| h.another_worker(PipelineSettings::new("gpt-test")))
        .collect();
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..12 {
        let worker = workers[i % workers.len()].clone();
        tasks.spawn(async move {
            let req = request(turn("hot", &format!("t{i}"), &format!("turn {i}")));
            let mut busy = 0;
            loop {
                match worker.run(&req).await {
                    Ok(r) => return (r, busy),
                    Err(e) if e.error.error_code == ErrorCode::SessionBusy => {
                        busy += 1;
                        tokio::time::sleep(Duration::from_millis(5)).await;
                    }
                    Err(e) => panic!("unexpected failure: {e}"),
                }
            }
        });
    }
    let mut busy_total = 0;
    while let Some(done) = tasks.join_next().await {
        let (r, busy) = done.expect("task");
        assert!(r.is_successful(), "{:?}", r.errors());
        busy_total += busy;
    }
    assert!(
        busy_total > 0,
        "the race was real: some starts found the session busy"
    );
    let sid = SessionId::parse("hot").unwrap();
    assert_eq!(h.store.list_turns(&sid).await.unwrap().len(), 12);
    for i in 0..12 {
        let rec = h
            .store
            .get_turn(&sid, &TurnId::parse(format!("t{i}")).unwrap())
            .await
            .unwrap()
            .unwrap();
        assert_eq!(rec.status, TurnStatus::Completed);
    }
    // Serialised: every call continues from a different response (no two turns interleaved on
    // the same conversation state), and exactly one call started the conversation.
    let reqs = h.fake.requests();
    assert_eq!(reqs.len(), 12, "each turn called the model once");
    let prevs: Vec<Option<&str>> = reqs
        .iter()
        .map(|r| r["previous_response_id"].as_str())
        .collect();
    assert_eq!(prevs.iter().filter(|p| p.is_none()).count(), 1);
    let distinct: HashSet<_> = prevs.iter().flatten().collect();
    assert_eq!(distinct.len(), 11);
}

#[tokio::test]
async fn a_crashed_turn_resumes_without_rerunning_recorded_server_tools() {
    let mut settings = PipelineSettings::new("gpt-test");
    settings.lease_ttl = Duration::from_millis(400);
    let h = harness(Setup {
        settings,
        ..redis_setup()
    })
    .await;
    h.fake.push([
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "ddr_authoring", "branch": false, "reason": "once"}),
        )]),
        // The worker dies while waiting for this answer.
        Reply::Delay(
            Duration::from_secs(30),
            Box::new(Reply::Text("never".into())),
        ),
        Reply::Text("finished after the crash".into()),
    ]);
    let crashing = h.pipeline.clone();
    let task = tokio::spawn(async move { crashing.run(&request(turn("s", "t", "switch"))).await });
    // Wait until the tool ran and the second model call is in flight, then kill the worker.
    for _ in 0..200 {
        if h.fake.requests().len() >= 2 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(h.fake.requests().len(), 2);
    task.abort();
    let _ = task.await;

    let mut settings = PipelineSettings::new("gpt-test");
    settings.lease_ttl = Duration::from_millis(400);
    let survivor = h.another_worker(settings);
    let req = request(turn("s", "t", "switch"));
    let mut busy = 0;
    let r = loop {
        match survivor.run(&req).await {
            Ok(r) => break r,
            Err(e) if e.error.error_code == ErrorCode::SessionBusy => {
                busy += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            Err(e) => panic!("{e}"),
        }
    };
    assert!(busy > 0, "the dead worker's lease had to expire first");
    let Some(AgentExecuteResponse::Final(f)) = r.result() else {
        panic!("{:?}", r.errors())
    };
    assert_eq!(f.primary_output_text, "finished after the crash");
    assert_eq!(
        f.tool_results.len(),
        1,
        "the recorded mode change is reported"
    );
    let session = h
        .store
        .get_session(&SessionId::parse("s").unwrap())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        session.mode_history.len(),
        1,
        "agent_change_mode ran exactly once"
    );
    let reqs = h.fake.requests();
    assert_eq!(
        reqs.len(),
        3,
        "resumed from the checkpoint: the first answer was not asked for again"
    );
    assert_eq!(
        reqs[2]["previous_response_id"],
        reqs[1]["previous_response_id"]
    );
    let rec = h
        .store
        .get_turn(
            &SessionId::parse("s").unwrap(),
            &TurnId::parse("t").unwrap(),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.attempts, 2);
}

#[tokio::test]
async fn a_redelivered_continuation_gets_the_stored_result() {
    let h = harness(redis_setup()).await;
    h.fake.push([
        Reply::Calls(vec![(
            "workspace_read_file".into(),
            json!({"path": "a.md"}),
        )]),
        Reply::Text("read it".into()),
    ]);
    let r = h
        .pipeline
        .run(&request(turn("s", "t", "read")))
        .await
        .unwrap();
    let Some(AgentExecuteResponse::ClientToolContinuation(c)) = r.result() else {
        panic!()
    };
    let id = c.tool_call_ids()[0].to_string();
    let cont = request(
        json!({"sessionId": "s", "turnId": "t", "toolResults": [{"toolCallId": id, "executionMs": 1, "resultJson": "{}"}]}),
    );
    let first = h.pipeline.run(&cont).await.unwrap();
    let again = h.pipeline.run(&cont).await.unwrap();
    assert_eq!(first, again);
    assert!(first.is_successful());
    assert_eq!(
        h.fake.requests().len(),
        2,
        "the duplicate did not call the model"
    );
    // And a redelivered *user turn* returns its stored result too.
    let user_again = h
        .pipeline
        .run(&request(turn("s", "t", "read")))
        .await
        .unwrap();
    assert_eq!(user_again, first);
}

#[tokio::test]
async fn a_turn_longer_than_its_lease_keeps_it_by_renewal() {
    let mut settings = PipelineSettings::new("gpt-test");
    settings.lease_ttl = Duration::from_millis(300);
    let h = harness(Setup {
        settings,
        options: FakeOptions {
            latency: Duration::from_millis(1200),
            ..Default::default()
        },
        ..redis_setup()
    })
    .await;
    let r = h
        .pipeline
        .run(&request(turn("s", "t", "slow")))
        .await
        .expect("not fenced: the lease was renewed");
    assert!(r.is_successful(), "{:?}", r.errors());
    assert_eq!(h.store.fenced_rejections(), 0);
}

/// A session stored by an earlier version holds its conversation inline. A turn on it — one
/// that changes the mode, whose write moves the inline items to the conversation list, and
/// whose model server no longer knows the session's last response, so the call replays —
/// sends every earlier item once, in order, and leaves each of them stored once.
#[tokio::test]
async fn an_inline_conversation_is_replayed_and_kept_once_across_a_mode_change() {
    let h = harness(redis_setup()).await;
    let ns = h._redis.as_ref().unwrap().store.namespace().to_string();
    let sid = SessionId::parse("legacy").unwrap();
    let old = json!({
        "sessionId": "legacy", "modeId": "3F8E4F377F7A4C189C7F6A8B9F945C11", "modeKey": "general",
        "modeHistory": [], "previousResponseId": "resp_forgotten", "replay": false,
        "solutionContext": null, "owner": null,
        "createdAt": "2026-11-01T00:00:00Z", "updatedAt": "2026-11-01T00:00:00Z",
        "conversation": [
            {"role": "user", "content": "earlier question"},
            {"role": "assistant", "content": "earlier answer"}
        ]
    });
    let mut conn = crate::support::redis_connection().await;
    let _: () = redis::cmd("SET")
        .arg(format!("{ns}:session:{{legacy}}"))
        .arg(old.to_string())
        .query_async(&mut conn)
        .await
        .unwrap();
    h.fake.push([
        Reply::Calls(vec![(
            "agent_change_mode".into(),
            json!({"mode": "ddr_authoring", "branch": false, "reason": "DDR"}),
        )]),
        Reply::Text("switched".into()),
    ]);
    let r = h
        .pipeline
        .run(&request(turn("legacy", "t1", "go on")))
        .await
        .unwrap();
    assert!(r.is_successful(), "{:?}", r.errors());
    let earlier = |items: &[Value]| -> Vec<String> {
        items
            .iter()
            .filter_map(|i| i["content"].as_str())
            .filter(|c| c.starts_with("earlier"))
            .map(str::to_string)
            .collect()
    };
    // The call that found its previous response forgotten replayed the earlier items once.
    let replayed: Vec<Value> = h
        .fake
        .requests()
        .into_iter()
        .filter(|r| r.get("previous_response_id").is_none())
        .collect();
    let first_replay = replayed.first().expect("a replayed call");
    assert_eq!(
        earlier(first_replay["input"].as_array().unwrap()),
        ["earlier question", "earlier answer"]
    );
    // Stored once each, first, with the turn's own items after them.
    let stored = h.store.conversation(&sid).await.unwrap();
    assert_eq!(earlier(&stored), ["earlier question", "earlier answer"]);
    assert_eq!(
        earlier(&stored[..2]),
        ["earlier question", "earlier answer"]
    );
    assert!(stored.len() > 2, "the turn's items follow: {stored:?}");
    let session = h.store.get_session(&sid).await.unwrap().unwrap();
    assert_eq!(session.mode_key, "ddr_authoring");
    assert!(session.conversation.is_empty());
}

/// What a turn costs in Redis requests, counted by the store, for an answer without tool calls
/// and a turn the front door stored: two — the begin step (the lease, the run counted, the turn
/// and the session read, a new session's contexts latched) and the write that settles it — for
/// a session's first turn as for its later ones, each a round trip the turn waits for; plus one
/// beside the settling write for a prompt the store has not kept yet (a session's first call
/// has its own, with the boot prompt). A turn whose stored record was lost is written at its
/// start: three.
#[tokio::test]
async fn a_turn_answered_at_once_takes_two_round_trips_new_session_or_not() {
    let h = harness(redis_setup()).await;
    let store = &h._redis.as_ref().expect("a Redis harness").store;
    let grant = &aptix_worker::store::Grant::for_tests();
    // (turn, the front door stored it, a prompt new to the store)
    let turns = [
        ("t1", true, true),
        ("t2", true, true),
        ("t3", true, false),
        ("t4", false, false),
    ];
    for (n, (t, stored, new_prompt)) in turns.into_iter().enumerate() {
        h.fake.push([Reply::Text(format!("answer {n}"))]);
        let job = request(turn("s", t, "go"));
        if stored {
            let AgentExecuteRequest::UserTurn(user) = &job else {
                panic!("a user turn");
            };
            let queued = TurnRecord::queued(
                SessionId::parse("s").unwrap(),
                TurnId::parse(t).unwrap(),
                aptix_worker::pipeline::fingerprint(user),
                String::new(),
            );
            aptix_worker::store::SessionStore::create_turn(&*h.store, grant, &queued)
                .await
                .unwrap();
        }
        let before = store.round_trips();
        let r = h.pipeline.run(&job).await.unwrap();
        assert!(
            matches!(r.result(), Some(AgentExecuteResponse::Final(_))),
            "{:?}",
            r.errors()
        );
        let expected = 2 + u64::from(!stored) + u64::from(new_prompt);
        assert_eq!(store.round_trips() - before, expected, "turn {t}");
    }
    // The first turn latched the session's contexts (the default ones) in its begin step.
    let latched = h
        .store
        .latched_contexts(&SessionId::parse("s").unwrap())
        .await
        .unwrap();
    assert_eq!(latched, Some(Default::default()));
}

/// A turn asked to stop before its run began (the front door recorded the request as a worker
/// took the turn) makes no model call: the write that marks it running reads the request, and
/// the run ends the turn cancelled — in the store, with either backend.
#[tokio::test]
async fn a_turn_asked_to_stop_before_its_run_makes_no_model_call() {
    for kind in [StoreKind::Memory, StoreKind::Redis] {
        let h = harness(Setup {
            store: kind,
            ..Setup::default()
        })
        .await;
        let (sid, tid) = (SessionId::parse("s").unwrap(), TurnId::parse("t1").unwrap());
        h.store.request_cancel(&sid, &tid).await.unwrap();
        h.fake.push([Reply::Text("never asked".into())]);
        let r = h
            .pipeline
            .run(&request(turn("s", "t1", "go")))
            .await
            .unwrap();
        assert_eq!(r.errors()[0].error_code, ErrorCode::TurnCancelled, "{r:?}");
        assert!(h.fake.requests().is_empty(), "the model was called");
        let stored = h.store.get_turn(&sid, &tid).await.unwrap().unwrap();
        assert_eq!(stored.status, TurnStatus::Cancelled);
    }
}

/// With the limits on the store's Redis, a model call's usage is counted by the write that
/// settles its turn, in that write's own script; when that write is fenced out (another holder
/// took the session's lease during the call), nothing of it is written and the usage is
/// counted apart all the same: every call paid for is counted, once.
#[tokio::test]
async fn a_calls_usage_is_counted_once_whether_its_write_is_made_or_fenced_out() {
    use aptix_worker::limiter::RedisLimits;
    use aptix_worker::metrics::Metrics;
    use aptix_worker::store::redis::RedisOptions;
    use aptix_worker::tenants::{Quotas, Tenants};
    use std::sync::Arc;

    let h = harness(Setup {
        options: FakeOptions {
            latency: Duration::from_millis(800),
            ..Default::default()
        },
        ..redis_setup()
    })
    .await;
    let ns = h._redis.as_ref().unwrap().store.namespace().to_string();
    let limits = RedisLimits::connect(&crate::support::redis_url(), &ns, &RedisOptions::default())
        .await
        .unwrap();
    let quotas = Quotas::new(
        Tenants::default(),
        Arc::new(limits),
        Arc::new(Metrics::default()),
        Duration::from_secs(30),
    );
    let pipeline = h
        .pipeline
        .clone()
        .with_quotas(quotas.clone())
        .with_quotas_on_store();
    let used = async || quotas.usage("local", None).await.unwrap().tokens_used;
    let spent = |calls: &[Value]| -> u64 {
        calls
            .iter()
            .map(|u| u["total_tokens"].as_u64().unwrap())
            .sum()
    };

    let done = pipeline.run(&request(turn("s1", "t", "hi"))).await.unwrap();
    assert!(done.is_successful(), "{:?}", done.errors());
    let first = spent(&h.fake.usages());
    assert!(first > 0);
    assert_eq!(used().await, first, "counted by the settling write");

    // Another holder takes the session's lease while the model answers.
    let lease_key = format!("{ns}:lease:{{s2}}");
    let thief = tokio::spawn(async move {
        tokio::time::sleep(Duration::from_millis(400)).await;
        let mut conn = crate::support::redis_connection().await;
        let _: () = ::redis::cmd("SET")
            .arg(&lease_key)
            .arg("1:thief")
            .arg("PX")
            .arg(60_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    });
    let fenced = pipeline.run(&request(turn("s2", "t", "slow"))).await;
    thief.await.unwrap();
    assert!(
        fenced.is_err(),
        "the settling write was fenced out: {fenced:?}"
    );
    assert!(h.store.fenced_rejections() >= 1);
    assert_eq!(
        h.fake.usages().len(),
        2,
        "the model answered the second call"
    );
    assert_eq!(
        used().await,
        spent(&h.fake.usages()),
        "the fenced-out write's usage counted apart"
    );
}
