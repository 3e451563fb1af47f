//! One conformance suite for every session store: each test runs against the in-memory store,
//! against the real local Redis (under a fresh namespace that is deleted afterwards) and against
//! a three-master Redis Cluster the tests start (`redis_cluster.rs`).

use std::sync::Arc;
use std::time::Duration;

use aptix_worker::contract::{SessionId, TurnId};
use aptix_worker::store::{
    MemoryStore, ModeChange, SessionState, SessionStore, StoreError, ToolOutput, TurnRecord,
    TurnStatus, now_rfc3339,
};

use crate::support::{RedisGuard, redis_store};

/// The right to write turn state directly, as these tests of the store do.
pub(super) const G: &aptix_worker::store::Grant = &aptix_worker::store::Grant::for_tests();

/// A store under test and whatever keeps its backing data alive (and cleans it up).
pub struct Subject {
    pub store: Arc<dyn SessionStore>,
    _guard: Option<RedisGuard>,
}

impl Subject {
    /// The namespace of a standalone Redis store (its keys, removed after the test).
    pub fn namespace(&self) -> Option<&str> {
        self._guard.as_ref().map(|g| g.store.namespace())
    }
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

pub(super) fn sid(s: &str) -> SessionId {
    SessionId::parse(s).unwrap()
}

pub(super) fn tid(s: &str) -> TurnId {
    TurnId::parse(s).unwrap()
}

pub(super) fn session(id: &str) -> SessionState {
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

pub(super) fn turn(session: &str, id: &str) -> TurnRecord {
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
            start_ms: Some(1_000),
            capacity_wait_ms: None,
            error: None,
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
            source: Some("tickets".into()),
            outcome: Some("answered".into()),
            repeated: true,
            start_ms: Some(2_000),
            result: None,
        }],
        input: Some(aptix_worker::state::TurnInput {
            instruction: Some("hello".into()),
            artifacts: vec!["docs/a.md".into()],
            artifact_count: 3,
        }),
        bodies_withheld: true,
        runs_begun: 0,
    }
}

pub(super) const LONG: Duration = Duration::from_secs(30);

pub(super) async fn saves_and_reads_back_sessions_and_turns(s: Subject) {
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

pub(super) async fn a_lease_is_exclusive_until_released_or_expired(s: Subject) {
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

pub(super) async fn renewal_keeps_a_lease_and_fails_once_lost(s: Subject) {
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

pub(super) async fn a_stale_holder_cannot_write(s: Subject) {
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
                session: None
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
    let mut changed = session("s");
    changed.apply_mode_change("A9E1F9C15A0C4F8D9AF51F3E8B2A6D22", change);
    assert!(matches!(
        st.record_tool_output(
            G,
            &sid("s"),
            &tid,
            ToolOutput {
                call_id: "call_2",
                output: "{}",
                session: Some(&changed)
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

pub(super) async fn the_ledger_is_never_lost_by_a_later_save(s: Subject) {
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
            session: None,
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

for_each_backend!(
    backends: [
        memory => super::memory(),
        redis => super::redis().await,
        cluster => super::cluster().await,
    ],
    tests: [
        saves_and_reads_back_sessions_and_turns,
        a_lease_is_exclusive_until_released_or_expired,
        renewal_keeps_a_lease_and_fails_once_lost,
        a_stale_holder_cannot_write,
        the_ledger_is_never_lost_by_a_later_save,
    ],
);
