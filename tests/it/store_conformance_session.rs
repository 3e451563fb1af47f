//! The store conformance suite, on every store: the stored conversation, mode changes and their
//! history, racing holders that take turns and lose nothing.

use super::store_conformance::*;
use aptix_worker::contract::TurnId;
use aptix_worker::store::{
    ModeChange, Prompt, RunWrite, StoreError, ToolOutput, TurnStatus, now_rfc3339,
};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

pub(super) async fn the_conversation_grows_by_appends_and_only_under_the_lease(s: Subject) {
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
    // A mode change keeps it, and appends what the changed session carries.
    let change = ModeChange {
        previous_mode: "general".into(),
        new_mode: "ddr_authoring".into(),
        timestamp: now_rfc3339(),
        reason: "r".into(),
        turn_id: TurnId::parse("t2").unwrap(),
    };
    let mut changed = session("s");
    changed.apply_mode_change("X", change);
    st.record_tool_output(
        G,
        &sid("s"),
        &TurnId::parse("t2").unwrap(),
        ToolOutput {
            call_id: "call_m",
            output: "{}",
            session: Some(&changed),
        },
        &lease,
    )
    .await
    .unwrap();
    let stored = st.get_session(&sid("s")).await.unwrap().unwrap();
    assert_eq!(
        (stored.mode_id.as_str(), stored.conversation.len()),
        ("X", 0)
    );
    assert_eq!(
        st.conversation(&sid("s")).await.unwrap(),
        [item(1), item(2), item(3)]
    );
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

/// A session's first run writes it last with the lease given back and no list behind it
/// (`RunWrite::unlisted`): a store may keep the run's items with the session. On every store
/// the whole conversation reads back as the list followed by the session's items, and the
/// next run's save lists them ahead of its own, none lost and none doubled.
pub(super) async fn a_first_runs_items_read_back_whole_and_the_next_save_lists_them(s: Subject) {
    let st = &s.store;
    let item = |n: u32| serde_json::json!({"role": "user", "content": format!("item {n}")});
    let whole = async |st: &Arc<dyn aptix_worker::store::SessionStore>| {
        let session = st.get_session(&sid("s")).await.unwrap().expect("stored");
        let mut items = st.conversation(&sid("s")).await.unwrap();
        items.extend(session.conversation);
        items
    };
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    let mut state = session("s");
    state.conversation = vec![item(1), item(2)];
    let last = RunWrite {
        session: Some(&state),
        turn: &turn("s", "t1"),
        lease: &lease,
        release: true,
        stored: false,
        unlisted: true,
        counts: None,
    };
    st.save_run(G, last).await.unwrap();
    assert_eq!(whole(st).await, [item(1), item(2)]);
    // The next run: the session as read back, its items still to list, then its own.
    let lease = st
        .acquire_lease(G, &sid("s"), "w2", LONG)
        .await
        .unwrap()
        .unwrap();
    let mut next = st.get_session(&sid("s")).await.unwrap().expect("stored");
    next.conversation.push(item(3));
    st.save(G, Some(&next), &turn("s", "t2"), &lease, true)
        .await
        .unwrap();
    assert_eq!(
        st.conversation(&sid("s")).await.unwrap(),
        [item(1), item(2), item(3)],
        "listed in order, once each"
    );
    let read = st.get_session(&sid("s")).await.unwrap().expect("stored");
    assert!(read.conversation.is_empty(), "{:?}", read.conversation);
}

pub(super) async fn change_mode_appends_history(s: Subject) {
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
    let mut changed = session("s");
    changed.apply_mode_change("A9E1F9C15A0C4F8D9AF51F3E8B2A6D22", change.clone());
    st.record_tool_output(
        G,
        &sid("s"),
        &tid,
        ToolOutput {
            call_id: "call_mode",
            output: "{\"success\":true}",
            session: Some(&changed),
        },
        &lease,
    )
    .await
    .unwrap();
    // The ledger entry was written in the same step.
    let recorded = st.get_turn(&sid("s"), &tid).await.unwrap().unwrap();
    assert_eq!(
        recorded.tool_ledger.get("call_mode").map(String::as_str),
        Some("{\"success\":true}")
    );
    let stored = st.get_session(&sid("s")).await.unwrap().unwrap();
    assert_eq!(
        (stored.mode_key.as_str(), stored.mode_id.as_str()),
        ("ddr_authoring", "A9E1F9C15A0C4F8D9AF51F3E8B2A6D22")
    );
    assert_eq!(stored.mode_history, vec![change.clone()]);

    // A new session's run changes the mode before the session was ever written: the step
    // stores it whole (the run's session is the truth under its lease).
    let fresh = st
        .acquire_lease(G, &sid("fresh"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    st.save(G, None, &turn("fresh", "t"), &fresh, false)
        .await
        .unwrap();
    assert!(st.get_session(&sid("fresh")).await.unwrap().is_none());
    let mut first = session("fresh");
    first.apply_mode_change("A9E1F9C15A0C4F8D9AF51F3E8B2A6D22", change.clone());
    st.record_tool_output(
        G,
        &sid("fresh"),
        &tid,
        ToolOutput {
            call_id: "call_x",
            output: "{}",
            session: Some(&first),
        },
        &fresh,
    )
    .await
    .unwrap();
    let stored = st.get_session(&sid("fresh")).await.unwrap().unwrap();
    assert_eq!(
        (stored.mode_key.as_str(), stored.mode_history.len()),
        ("ddr_authoring", 1)
    );
}

pub(super) async fn racing_holders_take_turns_and_none_is_lost(s: Subject) {
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

pub(super) async fn a_prompt_is_kept_once_and_read_back_by_id(s: Subject) {
    let st = &s.store;
    let tools =
        serde_json::value::RawValue::from_string(r#"[{"type":"function"}]"#.into()).unwrap();
    let prompt = Prompt::of("be brief", Some(&tools), None);
    let other = Prompt::of("be long", None, None);
    let ids = [prompt.id.clone(), other.id.clone()];
    assert!(
        st.prompts(&ids).await.unwrap().is_empty(),
        "nothing kept yet"
    );
    st.keep_prompt(&prompt).await.unwrap();
    // Kept again (every call does): no harm, the same text.
    st.keep_prompt(&prompt).await.unwrap();
    let kept = st.prompts(&ids).await.unwrap();
    assert_eq!(
        kept,
        std::collections::BTreeMap::from([(prompt.id.clone(), prompt.json.to_string())]),
        "the kept one, by id; the other absent"
    );
}

for_each_backend!(
    backends: [
        memory => super::memory(),
        redis => super::redis().await,
        cluster => super::cluster().await,
    ],
    tests: [
        the_conversation_grows_by_appends_and_only_under_the_lease,
        a_first_runs_items_read_back_whole_and_the_next_save_lists_them,
        change_mode_appends_history,
        racing_holders_take_turns_and_none_is_lost,
        a_prompt_is_kept_once_and_read_back_by_id,
    ],
);
