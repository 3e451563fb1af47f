//! One conformance suite for every session store: each test runs against the in-memory store,
//! against the real local Redis (under a fresh namespace that is deleted afterwards) and against
//! a three-master Redis Cluster the tests start (`redis_cluster.rs`).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use aptix_worker::contract::{SessionId, TurnId};
use aptix_worker::store::{
    Admission, ContextIds, MemoryStore, ModeChange, SessionState, SessionStore, StoreError,
    ToolOutput, TurnRecord, TurnStatus, now_rfc3339,
};

use crate::support::{RedisGuard, redis_store};

/// The right to write turn state directly, as these tests of the store do.
const G: &aptix_worker::store::Grant = &aptix_worker::store::Grant::for_tests();

/// A store under test and whatever keeps its backing data alive (and cleans it up).
pub struct Subject {
    pub store: Arc<dyn SessionStore>,
    _guard: Option<RedisGuard>,
}

pub fn memory() -> Subject {
    Subject {
        store: Arc::new(MemoryStore::new()),
        _guard: None,
    }
}

pub async fn redis() -> Subject {
    let g = redis_store().await;
    Subject {
        store: g.store.clone(),
        _guard: Some(g),
    }
}

pub async fn cluster() -> Subject {
    Subject {
        store: Arc::new(crate::redis_cluster::cluster_store().await),
        _guard: None,
    }
}

fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

fn tid(s: &str) -> TurnId {
    TurnId::parse(s).unwrap()
}

fn session(id: &str) -> SessionState {
    SessionState {
        session_id: sid(id),
        mode_id: "3F8E4F377F7A4C189C7F6A8B9F945C11".into(),
        mode_key: "general".into(),
        mode_history: vec![],
        previous_response_id: None,
        conversation: vec![],
        replay: false,
        previous_call: None,
        solution_context: None,
        contexts: Default::default(),
        owner: Some("tenant-a".into()),
        created_at: now_rfc3339(),
        updated_at: now_rfc3339(),
    }
}

fn turn(session: &str, id: &str) -> TurnRecord {
    TurnRecord {
        session_id: sid(session),
        turn_id: TurnId::parse(id).unwrap(),
        fingerprint: "fp".into(),
        status: TurnStatus::Running,
        mode_key: "general".into(),
        pending: None,
        answered: vec![],
        tool_ledger: Default::default(),
        requests: vec![],
        attempts: 1,
        submitted_at: now_rfc3339(),
        completed_at: None,
        result: None,
        checkpoint: None,
        continuation: None,
        reply_to: Some("a-front-door".into()),
        streaming: true,
        webhook: Some("https://hooks.example.com/aptix".into()),
        batch: Some("batch-1".into()),
        model_call: Some(aptix_worker::state::ModelCallMark {
            response_id: "resp_1".into(),
            request: "abc".into(),
        }),
        calls: vec![aptix_worker::state::CallNote {
            response_id: "resp_1".into(),
            model: "m".into(),
            agent_context: "default".into(),
            latency_ms: 12,
            usage: Default::default(),
            service_tier: Some("flex".into()),
            background: true,
            reattached: false,
            attempt: 1,
            text: Some("hello".into()),
        }],
        service_tier: Some("flex".into()),
        history: vec![aptix_worker::state::TurnEvent {
            at: "2026-11-26T10:00:00Z".into(),
            event: "run_started".into(),
            attempt: 1,
            detail: None,
        }],
        tools: vec![aptix_worker::state::ToolNote {
            tool_call_id: "call_1".into(),
            name: "agent_list_modes".into(),
            arguments: "{}".into(),
            replayed: false,
            execution_ms: 3,
            attempt: 1,
        }],
        bodies_withheld: true,
    }
}

const LONG: Duration = Duration::from_secs(30);

async fn saves_and_reads_back_sessions_and_turns(s: Subject) {
    let st = &s.store;
    assert!(st.get_session(&sid("a")).await.unwrap().is_none());
    let lease = st
        .acquire_lease(G, &sid("a"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    let mut state = session("a");
    state.conversation = vec![serde_json::json!({"role": "user", "content": "hi"})];
    st.save(G, Some(&state), &turn("a", "t1"), &lease, false)
        .await
        .unwrap();
    st.save(G, None, &turn("a", "t2"), &lease, false)
        .await
        .unwrap();
    let mut t1 = turn("a", "t1");
    t1.status = TurnStatus::Completed;
    st.save(G, None, &t1, &lease, true).await.unwrap();
    // The conversation is kept apart from the session: read back on its own, and a session
    // read back carries no pending items.
    assert_eq!(
        st.conversation(&sid("a")).await.unwrap(),
        std::mem::take(&mut state.conversation)
    );
    assert_eq!(st.get_session(&sid("a")).await.unwrap(), Some(state));
    assert_eq!(
        st.get_turn(&sid("a"), &TurnId::parse("t1").unwrap())
            .await
            .unwrap(),
        Some(t1)
    );
    assert!(
        st.get_turn(&sid("b"), &TurnId::parse("t1").unwrap())
            .await
            .unwrap()
            .is_none(),
        "turns live in their session"
    );
    let ids: Vec<String> = st
        .list_turns(&sid("a"))
        .await
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(ids, ["t1", "t2"], "listed once each, oldest first");
}

async fn a_lease_is_exclusive_until_released_or_expired(s: Subject) {
    let st = &s.store;
    let a = st
        .acquire_lease(G, &sid("s"), "w1", Duration::from_millis(600))
        .await
        .unwrap()
        .expect("free");
    assert!(
        st.acquire_lease(G, &sid("s"), "w2", LONG)
            .await
            .unwrap()
            .is_none(),
        "busy"
    );
    assert!(
        st.acquire_lease(G, &sid("other"), "w2", LONG)
            .await
            .unwrap()
            .is_some(),
        "per session"
    );
    st.release_lease(G, &sid("s"), &a).await.unwrap();
    let b = st
        .acquire_lease(G, &sid("s"), "w2", Duration::from_millis(600))
        .await
        .unwrap()
        .expect("released");
    assert!(b.token > a.token, "tokens grow");
    // A non-holder's release does nothing.
    st.release_lease(G, &sid("s"), &a).await.unwrap();
    assert!(
        st.acquire_lease(G, &sid("s"), "w3", LONG)
            .await
            .unwrap()
            .is_none()
    );
    tokio::time::sleep(Duration::from_millis(800)).await;
    let c = st
        .acquire_lease(G, &sid("s"), "w3", LONG)
        .await
        .unwrap()
        .expect("expired");
    assert!(c.token > b.token);
}

async fn renewal_keeps_a_lease_and_fails_once_lost(s: Subject) {
    let st = &s.store;
    // Generous margins: the suite runs in parallel on a 2-core machine.
    let ttl = Duration::from_millis(700);
    let a = st
        .acquire_lease(G, &sid("s"), "w1", ttl)
        .await
        .unwrap()
        .unwrap();
    for _ in 0..5 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(st.renew_lease(G, &sid("s"), &a, ttl).await.unwrap());
        assert!(
            st.acquire_lease(G, &sid("s"), "w2", ttl)
                .await
                .unwrap()
                .is_none()
        );
    }
    tokio::time::sleep(Duration::from_millis(900)).await;
    let _b = st
        .acquire_lease(G, &sid("s"), "w2", LONG)
        .await
        .unwrap()
        .expect("expired");
    assert!(
        !st.renew_lease(G, &sid("s"), &a, ttl).await.unwrap(),
        "a lost lease cannot be renewed"
    );
}

async fn a_stale_holder_cannot_write(s: Subject) {
    let st = &s.store;
    let a = st
        .acquire_lease(G, &sid("s"), "w1", Duration::from_millis(500))
        .await
        .unwrap()
        .unwrap();
    st.save(G, Some(&session("s")), &turn("s", "t"), &a, false)
        .await
        .unwrap();
    // w1 pauses past its lease; w2 takes over and writes.
    tokio::time::sleep(Duration::from_millis(700)).await;
    let b = st
        .acquire_lease(G, &sid("s"), "w2", LONG)
        .await
        .unwrap()
        .unwrap();
    let mut newer = turn("s", "t");
    newer.attempts = 2;
    st.save(G, None, &newer, &b, false).await.unwrap();
    let before = st.fenced_rejections();
    let mut stale = turn("s", "t");
    stale.status = TurnStatus::Completed;
    let tid = TurnId::parse("t").unwrap();
    assert!(matches!(
        st.save(G, Some(&session("s")), &stale, &a, true).await,
        Err(StoreError::Fenced(_))
    ));
    assert!(matches!(
        st.record_tool_output(
            G,
            &sid("s"),
            &tid,
            ToolOutput {
                call_id: "call_1",
                output: "{}",
                mode_change: None
            },
            &a
        )
        .await,
        Err(StoreError::Fenced(_))
    ));
    let change = ModeChange {
        previous_mode: "general".into(),
        new_mode: "ddr_authoring".into(),
        timestamp: now_rfc3339(),
        reason: "r".into(),
        turn_id: tid.clone(),
    };
    assert!(matches!(
        st.record_tool_output(
            G,
            &sid("s"),
            &tid,
            ToolOutput {
                call_id: "call_2",
                output: "{}",
                mode_change: Some(("A9E1F9C15A0C4F8D9AF51F3E8B2A6D22", &change))
            },
            &a
        )
        .await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(
        st.fenced_rejections() - before,
        3,
        "every rejected write is counted"
    );
    let stored = st.get_turn(&sid("s"), &tid).await.unwrap().unwrap();
    assert_eq!(
        (stored.attempts, stored.status),
        (2, TurnStatus::Running),
        "the newer holder's state stands"
    );
    assert!(stored.tool_ledger.is_empty());
    assert_eq!(
        st.get_session(&sid("s")).await.unwrap().unwrap().mode_key,
        "general"
    );
    // and the stale release did not free w2's lease
    assert!(
        st.acquire_lease(G, &sid("s"), "w3", LONG)
            .await
            .unwrap()
            .is_none()
    );
}

async fn the_ledger_is_never_lost_by_a_later_save(s: Subject) {
    let st = &s.store;
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    let t = turn("s", "t");
    st.save(G, Some(&session("s")), &t, &lease, false)
        .await
        .unwrap();
    let tid = TurnId::parse("t").unwrap();
    st.record_tool_output(
        G,
        &sid("s"),
        &tid,
        ToolOutput {
            call_id: "call_1",
            output: "{\"ok\":1}",
            mode_change: None,
        },
        &lease,
    )
    .await
    .unwrap();
    st.save(G, None, &t, &lease, false).await.unwrap(); // an older copy without the entry
    let stored = st.get_turn(&sid("s"), &tid).await.unwrap().unwrap();
    assert_eq!(
        stored.tool_ledger.get("call_1").map(String::as_str),
        Some("{\"ok\":1}")
    );
}

async fn begin_takes_the_lease_and_reads_the_turn_and_session(s: Subject) {
    let st = &s.store;
    let tid = TurnId::parse("t").unwrap();
    // Nothing stored yet: the lease, and nothing to read.
    let first = st
        .begin_turn(G, &sid("s"), &tid, "w1", LONG, None)
        .await
        .unwrap();
    let lease = first.lease.expect("a free session's lease");
    assert!(first.turn.is_none() && first.session.is_none());
    assert_eq!(first.latched, None, "no contexts were given to latch");
    // Another run of the session finds it busy, and no session is read for it.
    let busy = st
        .begin_turn(G, &sid("s"), &tid, "w2", LONG, None)
        .await
        .unwrap();
    assert!(busy.lease.is_none() && busy.session.is_none());
    // What the first run stores (the ledger included) is what the next begin reads.
    let mut state = session("s");
    state.conversation = vec![serde_json::json!({"role": "user", "content": "hi"})];
    let mut t = turn("s", "t");
    st.save(G, Some(&state), &t, &lease, false).await.unwrap();
    st.record_tool_output(
        G,
        &sid("s"),
        &tid,
        ToolOutput {
            call_id: "call_1",
            output: "{\"ok\":1}",
            mode_change: None,
        },
        &lease,
    )
    .await
    .unwrap();
    t.tool_ledger.insert("call_1".into(), "{\"ok\":1}".into());
    // Busy, yet the turn is read: a duplicate job may only need its stored result.
    let busy = st
        .begin_turn(G, &sid("s"), &tid, "w2", LONG, None)
        .await
        .unwrap();
    assert!(busy.lease.is_none() && busy.session.is_none());
    assert_eq!(busy.turn.as_ref(), Some(&t));
    t.status = TurnStatus::Completed;
    st.save(G, None, &t, &lease, true).await.unwrap();
    let next = st
        .begin_turn(G, &sid("s"), &tid, "w2", LONG, None)
        .await
        .unwrap();
    let taken = next.lease.expect("released by the settling save");
    assert!(taken.token > lease.token, "a new lease fences the old one");
    assert_eq!(next.turn, Some(t.clone()));
    state.conversation.clear(); // stored apart from the session
    assert_eq!(next.session, Some(state));
    // The lease begin took is a lease like any other: it fences the old holder's writes.
    assert!(matches!(
        st.save(G, None, &t, &lease, false).await,
        Err(StoreError::Fenced(_))
    ));
    st.save(G, None, &t, &taken, true).await.unwrap();
    assert!(
        st.acquire_lease(G, &sid("s"), "w3", LONG)
            .await
            .unwrap()
            .is_some(),
        "released"
    );
}

async fn begin_latches_a_new_sessions_contexts_and_only_then(s: Subject) {
    let st = &s.store;
    let fast = ContextIds::named_or_default(Some("fast"), None);
    let slow = ContextIds::named_or_default(Some("slow"), None);
    // A new session: the lease, and the given contexts latched in the same step.
    let first = st
        .begin_turn(G, &sid("s"), &tid("t1"), "w1", LONG, Some(&fast))
        .await
        .unwrap();
    let lease = first.lease.expect("a free session's lease");
    assert_eq!(first.latched, Some(fast.clone()));
    assert_eq!(
        st.latched_contexts(&sid("s")).await.unwrap(),
        Some(fast.clone())
    );
    // Busy: nothing latched and nothing read back.
    let busy = st
        .begin_turn(G, &sid("other"), &tid("t1"), "w1", LONG, None)
        .await
        .unwrap();
    assert!(busy.lease.is_some());
    let busy = st
        .begin_turn(G, &sid("other"), &tid("t2"), "w2", LONG, Some(&fast))
        .await
        .unwrap();
    assert!(busy.lease.is_none() && busy.latched.is_none());
    assert_eq!(st.latched_contexts(&sid("other")).await.unwrap(), None);
    // Still no session stored, other contexts latched (the front door admitted them): those
    // come back and stay.
    st.release_lease(G, &sid("s"), &lease).await.unwrap();
    let again = st
        .begin_turn(G, &sid("s"), &tid("t1"), "w2", LONG, Some(&slow))
        .await
        .unwrap();
    let lease = again.lease.expect("released");
    assert_eq!(again.latched, Some(fast.clone()));
    assert_eq!(
        st.latched_contexts(&sid("s")).await.unwrap(),
        Some(fast.clone())
    );
    // Once the session is stored, its own contexts are the run's: nothing is latched or read.
    st.save(G, Some(&session("s")), &turn("s", "t1"), &lease, true)
        .await
        .unwrap();
    let stored = st
        .begin_turn(G, &sid("s"), &tid("t2"), "w3", LONG, Some(&slow))
        .await
        .unwrap();
    assert!(stored.lease.is_some() && stored.session.is_some());
    assert_eq!(stored.latched, None);
    assert_eq!(st.latched_contexts(&sid("s")).await.unwrap(), Some(fast));
}

async fn a_save_reads_whether_the_turn_was_asked_to_stop(s: Subject) {
    let st = &s.store;
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    let t = turn("s", "t");
    let saved = st
        .save(G, Some(&session("s")), &t, &lease, false)
        .await
        .unwrap();
    assert!(!saved.stop_requested);
    // Another turn's request is not this one's.
    st.request_cancel(&sid("s"), &tid("other")).await.unwrap();
    let saved = st.save(G, None, &t, &lease, false).await.unwrap();
    assert!(!saved.stop_requested);
    st.request_cancel(&sid("s"), &tid("t")).await.unwrap();
    // With or without the session, keeping or releasing the lease, the request is read.
    let saved = st
        .save(G, Some(&session("s")), &t, &lease, false)
        .await
        .unwrap();
    assert!(saved.stop_requested);
    let saved = st.save(G, None, &t, &lease, true).await.unwrap();
    assert!(saved.stop_requested);
}

async fn a_save_reads_whether_the_session_is_marked_watched(s: Subject) {
    let st = &s.store;
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    let t = turn("s", "t");
    let saved = st.save(G, None, &t, &lease, false).await.unwrap();
    assert!(!saved.watched, "no one marked the session");
    // Another session's mark is not this one's.
    st.mark_watched(&sid("other"), LONG).await.unwrap();
    assert!(!st.save(G, None, &t, &lease, false).await.unwrap().watched);
    st.mark_watched(&sid("s"), LONG).await.unwrap();
    // With or without the session, keeping or releasing the lease, the mark is read.
    let saved = st
        .save(G, Some(&session("s")), &t, &lease, false)
        .await
        .unwrap();
    assert!(saved.watched);
    // A shorter mark does not shorten a longer one.
    st.mark_watched(&sid("s"), Duration::from_millis(50))
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(st.save(G, None, &t, &lease, true).await.unwrap().watched);
    // A mark lapses.
    let lease = st
        .acquire_lease(G, &sid("u"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    st.mark_watched(&sid("u"), Duration::from_millis(600))
        .await
        .unwrap();
    let u = turn("u", "t");
    assert!(st.save(G, None, &u, &lease, false).await.unwrap().watched);
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert!(!st.save(G, None, &u, &lease, false).await.unwrap().watched);
}

async fn a_held_watch_mark_outlasts_its_ttl_and_lapses_after_it_is_dropped(s: Subject) {
    use aptix_worker::delivery::WatchMark;
    let st = &s.store;
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    let t = turn("s", "t");
    // Renewed every 250 ms, each mark lasting 750 ms: a quarter of a second of slack either
    // way for a loaded machine.
    let linger = Duration::from_millis(500);
    let mark = WatchMark::hold(st.clone(), sid("s"), linger).await.unwrap();
    // Held for several times the mark's own lifetime: renewed meanwhile.
    for _ in 0..4 {
        tokio::time::sleep(linger).await;
        assert!(st.save(G, None, &t, &lease, false).await.unwrap().watched);
    }
    drop(mark);
    // It lasts at least `linger` after the holder has gone, then lapses.
    tokio::time::sleep(linger / 2).await;
    assert!(st.save(G, None, &t, &lease, false).await.unwrap().watched);
    tokio::time::sleep(linger * 2).await;
    assert!(!st.save(G, None, &t, &lease, false).await.unwrap().watched);
}

async fn the_conversation_grows_by_appends_and_only_under_the_lease(s: Subject) {
    let st = &s.store;
    let item = |n: u32| serde_json::json!({"role": "user", "content": format!("item {n}")});
    assert!(st.conversation(&sid("s")).await.unwrap().is_empty());
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    let mut state = session("s");
    state.conversation = vec![item(1), item(2)];
    st.save(G, Some(&state), &turn("s", "t1"), &lease, false)
        .await
        .unwrap();
    // The next save carries only what is new; a save without the session appends nothing.
    state.conversation = vec![item(3)];
    st.save(G, Some(&state), &turn("s", "t2"), &lease, false)
        .await
        .unwrap();
    st.save(G, None, &turn("s", "t2"), &lease, false)
        .await
        .unwrap();
    assert_eq!(
        st.conversation(&sid("s")).await.unwrap(),
        [item(1), item(2), item(3)]
    );
    // A mode change keeps it, and hands back a session with nothing pending.
    let change = ModeChange {
        previous_mode: "general".into(),
        new_mode: "ddr_authoring".into(),
        timestamp: now_rfc3339(),
        reason: "r".into(),
        turn_id: TurnId::parse("t2").unwrap(),
    };
    let changed = st
        .record_tool_output(
            G,
            &sid("s"),
            &TurnId::parse("t2").unwrap(),
            ToolOutput {
                call_id: "call_m",
                output: "{}",
                mode_change: Some(("X", &change)),
            },
            &lease,
        )
        .await
        .unwrap()
        .expect("the mode changed");
    assert!(changed.conversation.is_empty());
    // A stale holder's save appends nothing.
    st.release_lease(G, &sid("s"), &lease).await.unwrap();
    let _other = st
        .acquire_lease(G, &sid("s"), "w2", LONG)
        .await
        .unwrap()
        .unwrap();
    state.conversation = vec![item(4)];
    assert!(matches!(
        st.save(G, Some(&state), &turn("s", "t3"), &lease, false)
            .await,
        Err(StoreError::Fenced(_))
    ));
    assert_eq!(
        st.conversation(&sid("s")).await.unwrap(),
        [item(1), item(2), item(3)]
    );
    assert!(
        st.conversation(&sid("other")).await.unwrap().is_empty(),
        "per session"
    );
}

async fn change_mode_appends_history(s: Subject) {
    let st = &s.store;
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    st.save(G, Some(&session("s")), &turn("s", "t"), &lease, false)
        .await
        .unwrap();
    let tid = TurnId::parse("t").unwrap();
    let change = ModeChange {
        previous_mode: "general".into(),
        new_mode: "ddr_authoring".into(),
        timestamp: now_rfc3339(),
        reason: "DDR".into(),
        turn_id: tid.clone(),
    };
    let state = st
        .record_tool_output(
            G,
            &sid("s"),
            &tid,
            ToolOutput {
                call_id: "call_mode",
                output: "{\"success\":true}",
                mode_change: Some(("A9E1F9C15A0C4F8D9AF51F3E8B2A6D22", &change)),
            },
            &lease,
        )
        .await
        .unwrap()
        .expect("the mode changed");
    // The ledger entry was written in the same step.
    let recorded = st.get_turn(&sid("s"), &tid).await.unwrap().unwrap();
    assert_eq!(
        recorded.tool_ledger.get("call_mode").map(String::as_str),
        Some("{\"success\":true}")
    );
    assert_eq!(
        (state.mode_key.as_str(), state.mode_id.as_str()),
        ("ddr_authoring", "A9E1F9C15A0C4F8D9AF51F3E8B2A6D22")
    );
    let stored = st.get_session(&sid("s")).await.unwrap().unwrap();
    assert_eq!(stored.mode_history, vec![change.clone()]);
    let missing = st
        .acquire_lease(G, &sid("nobody"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    assert!(matches!(
        st.record_tool_output(
            G,
            &sid("nobody"),
            &tid,
            ToolOutput {
                call_id: "call_x",
                output: "{}",
                mode_change: Some(("X", &change))
            },
            &missing
        )
        .await,
        Err(StoreError::Corrupt(_))
    ));
}

async fn racing_holders_take_turns_and_none_is_lost(s: Subject) {
    let inside = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..16 {
        let (st, inside, done) = (s.store.clone(), inside.clone(), done.clone());
        tasks.spawn(async move {
            let lease = loop {
                if let Some(l) = st
                    .acquire_lease(G, &sid("hot"), &format!("w{i}"), LONG)
                    .await
                    .unwrap()
                {
                    break l;
                }
                tokio::time::sleep(Duration::from_millis(2)).await;
            };
            assert_eq!(
                inside.fetch_add(1, Ordering::SeqCst),
                0,
                "two holders at once"
            );
            tokio::time::sleep(Duration::from_millis(3)).await;
            inside.fetch_sub(1, Ordering::SeqCst);
            let mut t = turn("hot", &format!("t{i}"));
            t.status = TurnStatus::Completed;
            st.save(G, None, &t, &lease, true).await.unwrap();
            done.fetch_add(1, Ordering::SeqCst);
        });
    }
    while let Some(r) = tasks.join_next().await {
        r.expect("task");
    }
    assert_eq!(done.load(Ordering::SeqCst), 16);
    assert_eq!(s.store.list_turns(&sid("hot")).await.unwrap().len(), 16);
}

/// A streaming turn's live events are kept for reconnecting clients: the newest
/// `LIVE_EVENTS_PER_TURN` of each turn, oldest first, apart from other turns.
/// A batch's completion: each line counted once however often it settles, complete only
/// once the line count is known (whichever comes last), and not again once marked done.
async fn a_batch_completes_once_every_line_settled_and_the_count_is_known(s: Subject) {
    let st = &s.store;
    let (a, b) = (TurnId::parse("a").unwrap(), TurnId::parse("b").unwrap());
    let session = SessionId::parse("batched").unwrap();
    let line = |t| Some((&session, t));
    // Settled before the front door recorded how many lines there are: not complete yet.
    assert!(!st.note_batch("b1", line(&a), None).await.unwrap());
    assert!(
        !st.note_batch("b1", line(&a), None).await.unwrap(),
        "counted once"
    );
    assert!(!st.note_batch("b1", None, Some(2)).await.unwrap());
    assert!(
        st.note_batch("b1", line(&b), None).await.unwrap(),
        "the last line completes it"
    );
    // Noted again before it is marked done (a retry of the worker that found it complete).
    assert!(st.note_batch("b1", line(&b), None).await.unwrap());
    st.batch_done("b1").await.unwrap();
    assert!(
        !st.note_batch("b1", line(&b), None).await.unwrap(),
        "told of once"
    );
    // Every line settled before the count came: the count completes it.
    assert!(!st.note_batch("b2", line(&a), None).await.unwrap());
    assert!(st.note_batch("b2", None, Some(1)).await.unwrap());
}

/// A batch line's events: the line is out once each URL it was expected at is finished,
/// whatever the order; a line nobody expected events of is out at once; two lines (two
/// tenants' sessions of one id included) are apart.
async fn a_lines_events_are_out_once_each_expected_one_finished(s: Subject) {
    let st = &s.store;
    let t = TurnId::parse("t").unwrap();
    let mine = SessionId::parse("x").unwrap().within("tenant-a");
    let theirs = SessionId::parse("x").unwrap().within("tenant-b");
    st.expect_line_events("b1", (&mine, &t), &["https://a/", "https://b/"])
        .await
        .unwrap();
    st.expect_line_events("b1", (&theirs, &t), &["https://a/"])
        .await
        .unwrap();
    assert!(
        !st.line_event_finished("b1", (&mine, &t), "https://b/")
            .await
            .unwrap()
    );
    // Expected again (the status delivered twice): still the same two.
    st.expect_line_events("b1", (&mine, &t), &["https://a/"])
        .await
        .unwrap();
    assert!(
        st.line_event_finished("b1", (&mine, &t), "https://a/")
            .await
            .unwrap()
    );
    assert!(
        st.line_event_finished("b1", (&theirs, &t), "https://a/")
            .await
            .unwrap()
    );
    // Finished again (a duplicate delivery), or never expected: out.
    assert!(
        st.line_event_finished("b1", (&mine, &t), "https://a/")
            .await
            .unwrap()
    );
    assert!(
        st.line_event_finished("b2", (&mine, &t), "https://a/")
            .await
            .unwrap()
    );
}

async fn the_newest_live_events_of_a_turn_are_kept_in_order(s: Subject) {
    use aptix_worker::store::LIVE_EVENTS_PER_TURN;
    let (a, b) = (tid("a"), tid("b"));
    let total = LIVE_EVENTS_PER_TURN + 20;
    for i in 0..total {
        s.store
            .keep_live(&sid("s"), &a, format!("{i}").as_bytes())
            .await
            .unwrap();
    }
    s.store.keep_live(&sid("s"), &b, b"other").await.unwrap();
    let kept: Vec<String> = s
        .store
        .kept_live(&sid("s"), &a)
        .await
        .unwrap()
        .into_iter()
        .map(|e| String::from_utf8(e).unwrap())
        .collect();
    let expected: Vec<String> = (total - LIVE_EVENTS_PER_TURN..total)
        .map(|i| i.to_string())
        .collect();
    assert_eq!(kept, expected);
    assert_eq!(
        s.store.kept_live(&sid("s"), &b).await.unwrap(),
        vec![b"other".to_vec()]
    );
    assert!(s.store.kept_live(&sid("t"), &a).await.unwrap().is_empty());
}

async fn the_first_tenant_owns_a_session(s: Subject) {
    let st = &s.store;
    assert_eq!(st.owner(&sid("s")).await.unwrap(), None);
    assert_eq!(
        st.claim_owner(&sid("s"), "tenant-a").await.unwrap(),
        "tenant-a"
    );
    assert_eq!(
        st.claim_owner(&sid("s"), "tenant-b").await.unwrap(),
        "tenant-a",
        "first claim wins"
    );
    assert_eq!(
        st.owner(&sid("s")).await.unwrap().as_deref(),
        Some("tenant-a")
    );
    assert_eq!(st.owner(&sid("other")).await.unwrap(), None);
}

async fn create_turn_creates_once(s: Subject) {
    let st = &s.store;
    assert_eq!(st.create_turn(G, &turn("s", "t")).await.unwrap(), None);
    let mut second = turn("s", "t");
    second.fingerprint = "other".into();
    let existing = st
        .create_turn(G, &second)
        .await
        .unwrap()
        .expect("already there");
    assert_eq!(existing.fingerprint, "fp");
    assert_eq!(st.list_turns(&sid("s")).await.unwrap().len(), 1);
}

async fn admit_claims_latches_and_creates_or_stops_at_the_first_refusal(s: Subject) {
    let st = &s.store;
    let fast = ContextIds::named_or_default(Some("fast"), None);
    // A new session: claimed, latched and recorded in one step.
    assert_eq!(
        st.admit_turn(G, Some("tenant-a"), &fast, &turn("s", "t1"))
            .await
            .unwrap(),
        Admission::Turn(None)
    );
    assert_eq!(
        st.owner(&sid("s")).await.unwrap().as_deref(),
        Some("tenant-a")
    );
    assert_eq!(
        st.latched_contexts(&sid("s")).await.unwrap(),
        Some(fast.clone())
    );
    assert_eq!(st.list_turns(&sid("s")).await.unwrap().len(), 1);
    // The same turn again: the record that is there, nothing written.
    let mut again = turn("s", "t1");
    again.fingerprint = "other".into();
    match st
        .admit_turn(G, Some("tenant-a"), &fast, &again)
        .await
        .unwrap()
    {
        Admission::Turn(Some(existing)) => assert_eq!(existing.fingerprint, "fp"),
        other => panic!("expected the existing record, got {other:?}"),
    }
    // Another tenant: refused before anything is latched or recorded.
    assert_eq!(
        st.admit_turn(
            G,
            Some("tenant-b"),
            &ContextIds::default(),
            &turn("s", "t2")
        )
        .await
        .unwrap(),
        Admission::OtherOwner
    );
    // Other contexts: the latched ones come back, and the turn is not recorded.
    assert_eq!(
        st.admit_turn(
            G,
            Some("tenant-a"),
            &ContextIds::default(),
            &turn("s", "t2")
        )
        .await
        .unwrap(),
        Admission::OtherContexts(fast.clone())
    );
    assert_eq!(st.get_turn(&sid("s"), &tid("t2")).await.unwrap(), None);
    assert_eq!(st.list_turns(&sid("s")).await.unwrap().len(), 1);
    assert_eq!(st.latched_contexts(&sid("s")).await.unwrap(), Some(fast));
    // Without an owner to claim (an embedded front door), a new session has none.
    assert_eq!(
        st.admit_turn(G, None, &ContextIds::default(), &turn("free", "t"))
            .await
            .unwrap(),
        Admission::Turn(None)
    );
    assert_eq!(st.owner(&sid("free")).await.unwrap(), None);
}

async fn stop_requests_are_read_for_many_turns_at_once(s: Subject) {
    let st = &s.store;
    let turns: Vec<(SessionId, TurnId)> = (0..700)
        .map(|i| (sid(&format!("s{}", i % 7)), tid(&format!("t{i}"))))
        .collect();
    for (session, turn) in turns.iter().step_by(3) {
        st.request_cancel(session, turn).await.unwrap();
    }
    let asked = st.cancels_requested(&turns).await.unwrap();
    let expected: Vec<bool> = (0..700).map(|i| i % 3 == 0).collect();
    assert_eq!(
        asked, expected,
        "in the order asked, across sessions and chunks"
    );
    assert!(st.cancels_requested(&[]).await.unwrap().is_empty());
}

async fn discard_takes_back_only_an_untouched_turn(s: Subject) {
    let st = &s.store;
    let created = turn("s", "t");
    st.create_turn(G, &created).await.unwrap();
    st.create_turn(G, &turn("s", "keep")).await.unwrap();
    assert!(st.discard_turn(G, &created).await.unwrap());
    assert!(
        st.get_turn(&sid("s"), &created.turn_id)
            .await
            .unwrap()
            .is_none()
    );
    let left: Vec<String> = st
        .list_turns(&sid("s"))
        .await
        .unwrap()
        .iter()
        .map(|t| t.to_string())
        .collect();
    assert_eq!(left, vec!["keep"]);
    assert!(!st.discard_turn(G, &created).await.unwrap(), "already gone");
    // A turn a worker already moved on is not taken back.
    st.create_turn(G, &created).await.unwrap();
    let lease = st
        .acquire_lease(G, &sid("s"), "w", Duration::from_secs(5))
        .await
        .unwrap()
        .unwrap();
    let mut moved_on = created.clone();
    moved_on.status = TurnStatus::Completed;
    moved_on.attempts += 1;
    st.save(G, None, &moved_on, &lease, true).await.unwrap();
    assert!(!st.discard_turn(G, &created).await.unwrap());
    assert_eq!(
        st.get_turn(&sid("s"), &created.turn_id)
            .await
            .unwrap()
            .unwrap()
            .status,
        TurnStatus::Completed
    );
}

/// Taking back a session's only turn (its job was never accepted) lets go of the contexts its
/// admission latched: the session's next first turn may name others. The owner it claimed
/// stays. With another turn, or state from a run, the contexts stay too.
async fn taking_back_a_first_turn_lets_go_of_what_its_admission_latched(s: Subject) {
    let st = &s.store;
    let fast = ContextIds::named_or_default(Some("fast"), None);
    let first = turn("new", "t1");
    let admitted = st
        .admit_turn(G, Some("tenant-a"), &fast, &first)
        .await
        .unwrap();
    assert_eq!(admitted, Admission::Turn(None));
    assert!(st.discard_turn(G, &first).await.unwrap());
    assert_eq!(st.latched_contexts(&sid("new")).await.unwrap(), None);
    assert_eq!(
        st.owner(&sid("new")).await.unwrap().as_deref(),
        Some("tenant-a")
    );
    // Other contexts may now be latched by the session's first turn.
    let slow = ContextIds::named_or_default(Some("slow"), None);
    assert_eq!(
        st.admit_turn(G, Some("tenant-a"), &slow, &first)
            .await
            .unwrap(),
        Admission::Turn(None)
    );
    // With another turn left, what was latched stays.
    st.admit_turn(G, Some("tenant-a"), &slow, &turn("new", "t2"))
        .await
        .unwrap();
    assert!(st.discard_turn(G, &first).await.unwrap());
    assert_eq!(st.latched_contexts(&sid("new")).await.unwrap(), Some(slow));
}

async fn replace_is_a_compare_and_set(s: Subject) {
    let st = &s.store;
    let mut waiting = turn("s", "t");
    waiting.status = TurnStatus::AwaitingClientTools;
    assert!(
        !st.replace_turn(G, &waiting, &waiting).await.unwrap(),
        "a missing turn is not created"
    );
    assert!(
        st.get_turn(&sid("s"), &waiting.turn_id)
            .await
            .unwrap()
            .is_none()
    );
    st.create_turn(G, &waiting).await.unwrap();
    let mut first = waiting.clone();
    first.status = TurnStatus::Queued;
    first.continuation = Some("one".into());
    let mut second = first.clone();
    second.continuation = Some("two".into());
    // Both writers read `waiting`; only the first to write wins.
    assert!(st.replace_turn(G, &waiting, &first).await.unwrap());
    assert!(!st.replace_turn(G, &waiting, &second).await.unwrap());
    let stored = st.get_turn(&sid("s"), &waiting.turn_id).await.unwrap();
    assert_eq!(stored.as_ref(), Some(&first));
    // Undo works from the record as written.
    assert!(st.replace_turn(G, &first, &waiting).await.unwrap());
    assert_eq!(
        st.get_turn(&sid("s"), &waiting.turn_id).await.unwrap(),
        Some(waiting.clone())
    );
    // Many concurrent writers from the same read: exactly one succeeds.
    let attempts = (0..8).map(|i| {
        let mut next = waiting.clone();
        next.status = TurnStatus::Queued;
        next.continuation = Some(format!("c{i}"));
        let (st, waiting) = (st.clone(), waiting.clone());
        tokio::spawn(async move { st.replace_turn(G, &waiting, &next).await.unwrap() })
    });
    let mut won = 0;
    for a in attempts {
        won += usize::from(a.await.unwrap());
    }
    assert_eq!(won, 1);
}

for_each_backend!(
    backends: [
        memory => super::memory(),
        redis => super::redis().await,
        cluster => super::cluster().await,
    ],
    tests: [
        a_batch_completes_once_every_line_settled_and_the_count_is_known,
        a_lines_events_are_out_once_each_expected_one_finished,
        the_newest_live_events_of_a_turn_are_kept_in_order,
        saves_and_reads_back_sessions_and_turns,
        a_lease_is_exclusive_until_released_or_expired,
        renewal_keeps_a_lease_and_fails_once_lost,
        a_stale_holder_cannot_write,
        the_ledger_is_never_lost_by_a_later_save,
        begin_takes_the_lease_and_reads_the_turn_and_session,
        begin_latches_a_new_sessions_contexts_and_only_then,
        a_save_reads_whether_the_turn_was_asked_to_stop,
        a_save_reads_whether_the_session_is_marked_watched,
        a_held_watch_mark_outlasts_its_ttl_and_lapses_after_it_is_dropped,
        the_conversation_grows_by_appends_and_only_under_the_lease,
        change_mode_appends_history,
        racing_holders_take_turns_and_none_is_lost,
        the_first_tenant_owns_a_session,
        create_turn_creates_once,
        stop_requests_are_read_for_many_turns_at_once,
        admit_claims_latches_and_creates_or_stops_at_the_first_refusal,
        discard_takes_back_only_an_untouched_turn,
        taking_back_a_first_turn_lets_go_of_what_its_admission_latched,
        replace_is_a_compare_and_set,
    ],
);
