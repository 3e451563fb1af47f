//! The Redis store's expiries where a script leaves one to another step, on the real local
//! Redis: no key is ever left without one.

use super::store_conformance::*;
use aptix_worker::contract::TurnId;
use aptix_worker::store::{RecordWriter, RunWrite, SessionStore};

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

/// The session's turns index gets its expiry from what adds a turn to it: the admission, or
/// the settling write of a turn whose admission was lost (never a list left to live forever);
/// a write of a turn already listed leaves the expiry as it was.
#[tokio::test]
async fn the_turns_index_expires_from_the_turn_that_was_added_last() {
    let s = redis().await;
    let (st, ns) = (&s.store, s.namespace().unwrap().to_string());
    let mut conn = crate::support::redis_connection().await;
    let turns = format!("{ns}:turns:{{s}}");
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .expect("the session is free");
    let t = turn("s", "t");
    let write = async |stored: bool| {
        let write = RunWrite {
            session: None,
            turn: &t,
            lease: &lease,
            release: false,
            stored,
            unlisted: false,
            counts: None,
        };
        st.save_run(G, write).await.unwrap()
    };
    // No admission recorded it: the write lists it and gives the list the session's retention.
    write(false).await;
    assert_eq!(
        st.list_turns(&sid("s")).await.unwrap(),
        vec![TurnId::parse("t").unwrap()]
    );
    let kept = pttl(&mut conn, &turns).await;
    assert!(
        kept > 3_600_000,
        "the session's retention (days): {kept} ms"
    );
    // Listed already: a later write of it leaves the list's expiry alone.
    let _: i64 = redis::cmd("PEXPIRE")
        .arg(&turns)
        .arg(5_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    write(true).await;
    write(false).await;
    let kept = pttl(&mut conn, &turns).await;
    assert!(kept > 0 && kept <= 5_000, "left as it was: {kept} ms");
    assert_eq!(
        st.list_turns(&sid("s")).await.unwrap().len(),
        1,
        "listed once"
    );
}

/// Sessions kept for less time than turns: the turns index still lasts as long as the turns
/// it lists, whichever step added them (the admission, the console's admission that also
/// notes the run, the settling write of a turn whose admission was lost), so a turn still
/// queued or running when the session's retention runs out is not dropped from its session;
/// and so do the session's latches (its contexts, a bare id's owner, the fencing counter), so
/// the turn runs under the contexts it was admitted with.
#[tokio::test]
async fn a_short_session_retention_never_unlists_a_turn_before_its_record() {
    let retention = aptix_worker::store::Retention {
        turns: std::time::Duration::from_secs(3_600),
        sessions: std::time::Duration::from_secs(2),
    };
    let guard = crate::support::redis_store_with(retention).await;
    let st = &guard.store;
    let ns = st.namespace().to_string();
    let mut conn = crate::support::redis_connection().await;
    let contexts = aptix_worker::store::ContextIds::default();
    let longer_than_the_session = |kept: i64, how: &str| {
        assert!(
            kept > 60_000 && kept <= 3_600_000,
            "{how}: the turns' retention (an hour), not the session's (2 s): {kept} ms"
        );
    };

    st.admit_turn(G, None, &contexts, &turn("a", "t"))
        .await
        .unwrap();
    longer_than_the_session(
        pttl(&mut conn, &format!("{ns}:turns:{{a}}")).await,
        "admitted",
    );
    longer_than_the_session(
        pttl(&mut conn, &format!("{ns}:contexts:{{a}}")).await,
        "the contexts latched by the admission",
    );

    st.admit_and_index(G, Some("tenant-b"), &contexts, &turn("b", "t"), 1)
        .await
        .unwrap();
    longer_than_the_session(
        pttl(&mut conn, &format!("{ns}:turns:{{b}}")).await,
        "admitted and noted in the runs index",
    );
    longer_than_the_session(
        pttl(&mut conn, &format!("{ns}:owner:{{b}}")).await,
        "a bare id's owner",
    );
    assert_eq!(
        st.latch_contexts(&sid("d"), &contexts).await.unwrap(),
        contexts
    );
    longer_than_the_session(
        pttl(&mut conn, &format!("{ns}:contexts:{{d}}")).await,
        "the contexts latched before a busy session's check",
    );
    st.begin_turn(G, &sid("e"), &tid("t"), "w1", LONG, Some(&contexts), None)
        .await
        .unwrap();
    longer_than_the_session(
        pttl(&mut conn, &format!("{ns}:contexts:{{e}}")).await,
        "the contexts latched by a run's begin",
    );

    let lease = st
        .acquire_lease(G, &sid("c"), "w1", LONG)
        .await
        .unwrap()
        .expect("the session is free");
    longer_than_the_session(
        pttl(&mut conn, &format!("{ns}:fence:{{c}}")).await,
        "the fencing counter",
    );
    let t = turn("c", "t");
    let write = RunWrite {
        session: None,
        turn: &t,
        lease: &lease,
        release: true,
        stored: false,
        unlisted: false,
        counts: None,
    };
    st.save_run(G, write).await.unwrap();
    longer_than_the_session(
        pttl(&mut conn, &format!("{ns}:turns:{{c}}")).await,
        "listed by the settling write",
    );
}
