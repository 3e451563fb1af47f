//! The Redis store's expiries where a script leaves one to another step, on the real local
//! Redis: no key is ever left without one.

use super::store_conformance::*;
use aptix_worker::contract::TurnId;
use aptix_worker::store::RunWrite;

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
