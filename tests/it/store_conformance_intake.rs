//! The store conformance suite, its second half: batch completion and line events, kept live
//! events, session owners, and the front door's admission, discard and compare-and-set of turn
//! records, on every store.

use super::store_conformance::*;
use aptix_worker::contract::{SessionId, TurnId};
use aptix_worker::store::{Admission, ContextIds, TurnStatus};
use std::time::Duration;

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
        the_first_tenant_owns_a_session,
        create_turn_creates_once,
        stop_requests_are_read_for_many_turns_at_once,
        admit_claims_latches_and_creates_or_stops_at_the_first_refusal,
        discard_takes_back_only_an_untouched_turn,
        taking_back_a_first_turn_lets_go_of_what_its_admission_latched,
        replace_is_a_compare_and_set,
    ],
);
