//! The Redis store's arithmetic and expiries inside its scripts, on the real local Redis: the
//! fencing counter the begin step reads and writes back (no `INCR`), the tally fields a run's
//! write adds to with one read and one write per hash (no `HINCRBY` per field), and the turns
//! index's expiry, set by what adds to it. Each must do what the one-command-per-number
//! versions did: exact sums, a field named twice counted twice, a value that is no number
//! refused without writing, no key left without an expiry.

use super::store_conformance::*;
use aptix_worker::contract::TurnId;
use aptix_worker::store::{CounterAdd, CounterAdds, RunWrite};

async fn pttl(conn: &mut redis::aio::MultiplexedConnection, key: &str) -> i64 {
    redis::cmd("PTTL").arg(key).query_async(conn).await.unwrap()
}

/// Sends one command as a test sets the stage with (`SET`, `HSET`, `PEXPIRE`), its answer
/// dropped.
async fn stage(conn: &mut redis::aio::MultiplexedConnection, command: &[&str]) {
    let (name, args) = command.split_first().expect("a command");
    let _: redis::Value = redis::cmd(name).arg(args).query_async(conn).await.unwrap();
}

/// A run's write of `turn` that keeps the lease and writes no session.
fn run_write<'a>(
    turn: &'a aptix_worker::store::TurnRecord,
    lease: &'a aptix_worker::store::Lease,
    stored: bool,
    counts: Option<&'a CounterAdds>,
) -> RunWrite<'a> {
    RunWrite {
        session: None,
        turn,
        lease,
        release: false,
        stored,
        counts,
    }
}

/// The session "s"'s lease, taken by `holder`.
async fn leased(
    st: &dyn aptix_worker::store::SessionStore,
    holder: &str,
) -> aptix_worker::store::Lease {
    st.acquire_lease(G, &sid("s"), holder, LONG)
        .await
        .unwrap()
        .expect("the session is free")
}

/// The begin step draws the session's next token from the stored counter and writes it back
/// with the session's retention; a try that finds the session busy spends no number; a
/// counter that holds something else fails the step (and a lease taken alone), as `INCR`
/// did, and takes no lease.
#[tokio::test]
async fn the_fencing_counter_counts_each_taking_and_only_takings() {
    let s = redis().await;
    let (st, ns) = (&s.store, s.namespace().unwrap().to_string());
    let mut conn = crate::support::redis_connection().await;
    let fence = format!("{ns}:fence:{{s}}");
    let (id, t) = (sid("s"), TurnId::parse("t").unwrap());
    let begin = |holder: &'static str| st.begin_turn(G, &id, &t, holder, LONG, None, None);

    let first = begin("w1").await.unwrap().lease.expect("taken");
    assert_eq!(first.token, 1, "a new session's first token");
    let stored: String = redis::cmd("GET")
        .arg(&fence)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(stored, "1");
    let kept = pttl(&mut conn, &fence).await;
    assert!(
        kept > 3_600_000,
        "kept as long as the session (its retention is hours): {kept} ms"
    );

    let busy = begin("w2").await.unwrap();
    assert!(busy.lease.is_none());
    st.release_lease(G, &id, &first).await.unwrap();
    let second = begin("w2").await.unwrap().lease.expect("free again");
    assert_eq!(
        second.token, 2,
        "the busy try spent nothing; the next taking is one more"
    );
    st.release_lease(G, &id, &second).await.unwrap();

    // A counter far past 32 bits is read and written back exactly.
    stage(&mut conn, &["SET", &fence, "9007199254740000"]).await;
    let third = begin("w3").await.unwrap().lease.expect("free");
    assert_eq!(third.token, 9_007_199_254_740_001);
    st.release_lease(G, &id, &third).await.unwrap();

    stage(&mut conn, &["SET", &fence, "not a number"]).await;
    let refused = begin("w4").await;
    let err = refused
        .expect_err("a broken counter fails the step")
        .to_string();
    assert!(err.contains("fencing counter"), "{err}");
    let acquired = st.acquire_lease(G, &id, "w5", LONG).await;
    let err = acquired
        .expect_err("the same for a lease alone")
        .to_string();
    assert!(err.contains("fencing counter"), "{err}");
    let lease: Option<String> = redis::cmd("GET")
        .arg(format!("{ns}:lease:{{s}}"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(lease, None, "no lease was taken by the failed step");
}

/// A run's write adds a hash's fields in one read and one write: exact above 32 bits, a field
/// named twice gets both amounts, a new field (re)sets the hash's expiry while additions to
/// fields already there keep it, and a field holding no number refuses the whole hash (the
/// write stands, the counters are reported missed, the plain count beside it is added).
#[tokio::test]
async fn a_writes_tally_fields_add_up_like_hincrby() {
    let s = redis().await;
    let (st, ns) = (&s.store, s.namespace().unwrap().to_string());
    let mut conn = crate::support::redis_connection().await;
    let lease = leased(st.as_ref(), "w1").await;
    let t = turn("s", "t");
    let key = |k: &str| format!("{ns}:counters:{k}");
    let add = |k: &str, field: Option<&str>, amount| CounterAdd {
        key: key(k),
        field: field.map(str::to_string),
        amount,
    };
    let tally = key("tally");
    let fields = async |conn: &mut redis::aio::MultiplexedConnection| -> Vec<Option<u64>> {
        redis::cmd("HMGET")
            .arg(&tally)
            .arg(&["a/calls", "a/input", "a/output"])
            .query_async(conn)
            .await
            .unwrap()
    };
    let write = async |counts: CounterAdds| {
        st.save_run(G, run_write(&t, &lease, false, Some(&counts)))
            .await
    };
    let counts = |adds| CounterAdds {
        keep_ms: 60_000,
        adds,
    };

    stage(&mut conn, &["HSET", &tally, "a/input", "5000000000"]).await;
    stage(&mut conn, &["PEXPIRE", &tally, "5000"]).await;
    // Only fields already there: the expiry is kept.
    let saved = write(counts(vec![
        add("tally", Some("a/input"), 7),
        add("tally", Some("a/input"), 3),
    ]))
    .await
    .unwrap();
    assert!(!saved.counts_missed);
    assert_eq!(fields(&mut conn).await, [None, Some(5_000_000_010), None]);
    let ttl = pttl(&mut conn, &tally).await;
    assert!(ttl > 0 && ttl <= 5_000, "kept its own expiry: {ttl}");

    // A field it did not have: added, and the hash gets the counters' expiry.
    let saved = write(counts(vec![
        add("count", None, 4),
        add("tally", Some("a/calls"), 1),
        add("tally", Some("a/input"), 1),
    ]))
    .await
    .unwrap();
    assert!(!saved.counts_missed);
    assert_eq!(
        fields(&mut conn).await,
        [Some(1), Some(5_000_000_011), None]
    );
    let ttl = pttl(&mut conn, &tally).await;
    assert!(ttl > 50_000 && ttl <= 60_000, "a new field: {ttl}");

    // A field holding no number: the hash is left as it was, the count beside it is added.
    stage(&mut conn, &["HSET", &tally, "a/output", "many"]).await;
    let saved = write(counts(vec![
        add("count", None, 1),
        add("tally", Some("a/calls"), 1),
        add("tally", Some("a/output"), 9),
    ]))
    .await
    .unwrap();
    assert!(saved.counts_missed, "reported");
    let calls: Option<u64> = redis::cmd("HGET")
        .arg(&tally)
        .arg("a/calls")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(calls, Some(1), "nothing of that hash written");
    let count: u64 = redis::cmd("GET")
        .arg(key("count"))
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 5);
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
    let lease = leased(st.as_ref(), "w1").await;
    let t = turn("s", "t");
    let write = async |stored: bool| {
        st.save_run(G, run_write(&t, &lease, stored, None))
            .await
            .unwrap()
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
    stage(&mut conn, &["PEXPIRE", &turns, "5000"]).await;
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
