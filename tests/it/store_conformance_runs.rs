//! The store conformance suite, the runs index (what `GET /v1/turns` and the console's home
//! page read): each tenant's turns newest first, apart from other tenants', paged from a
//! position without losing or repeating an entry of the same millisecond, within a time range;
//! and, in Redis, kept no longer than the turn records they name.

use super::store_conformance::*;
use aptix_worker::store::{
    Admission, ContextIds, IndexedTurn, RunsNote, RunsPage, StoreReader, TurnRecord, now_ms,
};

fn entry(at_ms: i64, tenant: &str, session: &str, turn: &str) -> IndexedTurn {
    IndexedTurn {
        at_ms,
        session: sid(session).within(tenant),
        turn: tid(turn),
    }
}

/// The tenant's ten newest entries.
async fn newest(st: &(impl StoreReader + ?Sized), tenant: &str) -> Vec<IndexedTurn> {
    st.recent_turns(
        tenant,
        &RunsPage {
            max: 10,
            ..RunsPage::default()
        },
    )
    .await
    .unwrap()
}

fn names(entries: &[IndexedTurn]) -> Vec<String> {
    entries
        .iter()
        .map(|e| e.turn.as_str().to_string())
        .collect()
}

async fn the_runs_index_lists_a_tenants_turns_newest_first_and_pages_without_gaps(s: Subject) {
    let st = &s.store;
    let t0 = now_ms() - 60_000;
    // Three of one millisecond, one before, one after; another tenant's in between.
    for e in [
        entry(t0, "acme", "s1", "a"),
        entry(t0 + 10, "acme", "s1", "b"),
        entry(t0 + 10, "acme", "s2", "c"),
        entry(t0 + 10, "acme", "s3", "d"),
        entry(t0 + 20, "acme", "s1", "e"),
        entry(t0 + 15, "other", "s1", "x"),
    ] {
        st.index_turn(e.clone()).await.unwrap();
    }
    // Noted again later (a resubmission): keeps its first time.
    st.index_turn(entry(t0 + 30, "acme", "s1", "a"))
        .await
        .unwrap();
    let all = newest(st.as_ref(), "acme").await;
    // Of one millisecond, by name, last first: "acme:s3 d" > "acme:s2 c" > "acme:s1 b".
    assert_eq!(names(&all), ["e", "d", "c", "b", "a"]);
    assert_eq!(all[0], entry(t0 + 20, "acme", "s1", "e"));
    assert_eq!(all[4].at_ms, t0, "a turn noted again keeps its first time");
    let theirs = newest(st.as_ref(), "other").await;
    assert_eq!(names(&theirs), ["x"], "each tenant's index is its own");
    assert!(newest(st.as_ref(), "nobody").await.is_empty());
    // Pages of two, each from the last one's position, through the tie: every entry once.
    let mut paged = Vec::new();
    let mut after = None;
    loop {
        let page = st
            .recent_turns(
                "acme",
                &RunsPage {
                    after: after.clone(),
                    max: 2,
                    ..RunsPage::default()
                },
            )
            .await
            .unwrap();
        if page.is_empty() {
            break;
        }
        after = page.last().map(IndexedTurn::position);
        paged.extend(page);
    }
    assert_eq!(paged, all);
    // A time range, both ends included.
    let ranged = st
        .recent_turns(
            "acme",
            &RunsPage {
                since_ms: Some(t0 + 10),
                until_ms: Some(t0 + 10),
                max: 10,
                ..RunsPage::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(names(&ranged), ["d", "c", "b"]);
    let none = st
        .recent_turns(
            "acme",
            &RunsPage {
                max: 0,
                ..RunsPage::default()
            },
        )
        .await
        .unwrap();
    assert!(none.is_empty());
}

/// What the front door does with a new turn: admitted and noted, in one step where the store
/// can ([`RunsNote::Noted`]), else by the caller ([`RunsNote::Yours`]); either way the turn is
/// listed once, at its first time, and a refused admission notes nothing.
async fn an_admitted_turn_is_noted_in_the_runs_index_once(s: Subject) {
    let st = &s.store;
    let first = {
        let mut t = turn("s", "t1");
        t.session_id = sid("s").within("acme");
        t
    };
    let noted = entry(now_ms() - 1_000, "acme", "s", "t1");
    // What the caller does with the answer (the front door: beside its enqueue).
    let admit = |record: TurnRecord, run: IndexedTurn, owner: &'static str| async move {
        let (admission, note) = st
            .admit_and_index(G, Some(owner), &ContextIds::default(), &record, run.at_ms)
            .await
            .unwrap();
        if note == RunsNote::Yours && matches!(admission, Admission::Turn(_)) {
            st.index_turn(run.clone()).await.unwrap();
        }
        assert_ne!(
            std::mem::discriminant(&note),
            std::mem::discriminant(&RunsNote::Missed(String::new())),
            "{note:?}"
        );
        admission
    };
    assert_eq!(
        admit(first.clone(), noted.clone(), "acme").await,
        Admission::Turn(None)
    );
    // Sent again a second later: found, and still listed at its first time.
    let again = IndexedTurn {
        at_ms: noted.at_ms + 1_000,
        ..noted.clone()
    };
    assert!(matches!(
        admit(first.clone(), again, "acme").await,
        Admission::Turn(Some(_))
    ));
    // Another tenant's claim on the session is refused and notes nothing.
    let refused = {
        let mut t = turn("s", "t2");
        t.session_id = first.session_id.clone();
        t
    };
    let theirs = entry(now_ms(), "acme", "s", "t2");
    assert_eq!(
        admit(refused, theirs, "intruder").await,
        Admission::OtherOwner
    );
    let listed = newest(st.as_ref(), "acme").await;
    assert_eq!(listed, [noted]);
}

for_each_backend!(
    backends: [
        memory => super::memory(),
        redis => super::redis().await,
        cluster => super::cluster().await,
    ],
    tests: [
        the_runs_index_lists_a_tenants_turns_newest_first_and_pages_without_gaps,
        an_admitted_turn_is_noted_in_the_runs_index_once,
    ],
);

/// A standalone Redis notes the turn in the admission's own script (no request of its own),
/// and an index it cannot write to refuses no turn: the note is reported missed.
#[tokio::test]
async fn redis_notes_a_turn_in_its_admission_and_a_broken_index_refuses_none() {
    use ::redis::AsyncCommands as _;
    use aptix_worker::store::{SessionStore as _, StoreReader as _};
    let g = crate::support::redis_store().await;
    let record = |session: &str| {
        let mut t = turn(session, "t");
        t.session_id = sid(session).within("acme");
        t
    };
    let run = entry(now_ms(), "acme", "s1", "t");
    let before = g.store.round_trips();
    let (admission, note) = g
        .store
        .admit_and_index(
            G,
            Some("acme"),
            &ContextIds::default(),
            &record("s1"),
            run.at_ms,
        )
        .await
        .unwrap();
    assert_eq!((admission, note), (Admission::Turn(None), RunsNote::Noted));
    assert_eq!(
        g.store.round_trips() - before,
        1,
        "one request admits and notes"
    );
    let listed = newest(g.store.as_ref(), "acme").await;
    assert_eq!(listed, [run]);
    // Something else took the index's name: the turn is admitted, the note reported missed.
    let mut conn = crate::support::redis_connection().await;
    let key = format!("{}:runs:{{acme}}", g.store.namespace());
    let _: () = conn.del(&key).await.unwrap();
    let _: () = conn.set(&key, "not an index").await.unwrap();
    let (admission, note) = g
        .store
        .admit_and_index(
            G,
            Some("acme"),
            &ContextIds::default(),
            &record("s2"),
            now_ms(),
        )
        .await
        .unwrap();
    assert_eq!(admission, Admission::Turn(None));
    match note {
        RunsNote::Missed(why) => assert!(why.contains("WRONGTYPE"), "{why}"),
        other => panic!("the note should be reported missed: {other:?}"),
    }
    let stored = g
        .store
        .get_turn(&sid("s2").within("acme"), &tid("t"))
        .await
        .unwrap();
    assert!(stored.is_some(), "the turn is recorded all the same");
}

/// In Redis the index lives as long as the turn records it names: a tenant's set expires a
/// turn retention after its latest trim, and a trim (the first note of a process, then once a
/// minute) drops entries older than the retention, which readers skip anyway.
#[tokio::test]
async fn redis_keeps_the_runs_index_as_long_as_turn_records() {
    use ::redis::AsyncCommands as _;
    use aptix_worker::store::RecordWriter as _;
    let g = crate::support::redis_store().await;
    let retention = aptix_worker::store::Retention::default().turns;
    let old = entry(
        now_ms() - retention.as_millis() as i64 - 5_000,
        "acme",
        "s",
        "old",
    );
    let fresh = entry(now_ms(), "acme", "s", "fresh");
    let key = format!("{}:runs:{{acme}}", g.store.namespace());
    let mut conn = crate::support::redis_connection().await;
    // An entry left from long ago; the first note of this process trims it.
    let _: () = conn.zadd(&key, old.member(), old.at_ms).await.unwrap();
    g.store.index_turn(fresh.clone()).await.unwrap();
    let members: Vec<String> = conn.zrange(&key, 0, -1).await.unwrap();
    assert_eq!(members, [fresh.member()]);
    let ttl: i64 = conn.pttl(&key).await.unwrap();
    assert!(
        ttl > 0 && ttl <= retention.as_millis() as i64,
        "the index expires with the turn retention: {ttl} ms"
    );
    // Within the minute no trim: an old entry stays in the set, but no reader sees it.
    g.store.index_turn(old.clone()).await.unwrap();
    let members: Vec<String> = conn.zrange(&key, 0, -1).await.unwrap();
    assert_eq!(members.len(), 2);
    let seen = newest(g.store.as_ref(), "acme").await;
    assert_eq!(names(&seen), ["fresh"]);
}
