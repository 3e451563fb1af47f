//! The store conformance suite, on every store: the begin step (the lease with the turn and session
//! read, a new session's contexts latched), what a save reads back (a stop request, a watch mark)
//! and how a watch mark lasts.

use super::store_conformance::*;
use aptix_worker::contract::TurnId;
use aptix_worker::store::{
    ContextIds, CounterAdd, CounterAdds, RunWrite, StoreError, ToolOutput, TurnStatus,
};
use std::time::Duration;

pub(super) async fn begin_takes_the_lease_and_reads_the_turn_and_session(s: Subject) {
    let st = &s.store;
    let tid = TurnId::parse("t").unwrap();
    // Nothing stored yet: the lease, and nothing to read.
    let first = st
        .begin_turn(G, &sid("s"), &tid, "w1", LONG, None, None)
        .await
        .unwrap();
    let lease = first.lease.expect("a free session's lease");
    assert!(first.turn.is_none() && first.session.is_none());
    assert_eq!(first.latched, None, "no contexts were given to latch");
    assert_eq!(
        (first.runs, first.stop_requested),
        (1, false),
        "the run counted"
    );
    // Another run of the session finds it busy, and no session is read for it, nor is it
    // counted.
    let busy = st
        .begin_turn(G, &sid("s"), &tid, "w2", LONG, None, None)
        .await
        .unwrap();
    assert!(busy.lease.is_none() && busy.session.is_none());
    assert_eq!(busy.runs, 0);
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
            session: None,
        },
        &lease,
    )
    .await
    .unwrap();
    t.tool_ledger.insert("call_1".into(), "{\"ok\":1}".into());
    // The count of runs begun comes with the turn as read (not as a tool output).
    t.runs_begun = 1;
    // Busy, yet the turn is read: a duplicate job may only need its stored result.
    let busy = st
        .begin_turn(G, &sid("s"), &tid, "w2", LONG, None, None)
        .await
        .unwrap();
    assert!(busy.lease.is_none() && busy.session.is_none());
    assert_eq!(busy.turn.as_deref(), Some(&t));
    t.status = TurnStatus::Completed;
    st.save(G, None, &t, &lease, true).await.unwrap();
    let next = st
        .begin_turn(G, &sid("s"), &tid, "w2", LONG, None, None)
        .await
        .unwrap();
    let taken = next.lease.expect("released by the settling save");
    assert!(taken.token > lease.token, "a new lease fences the old one");
    assert_eq!(
        next.runs, 2,
        "this run counted too (the turn as read shows the one before)"
    );
    assert_eq!(next.turn.as_deref(), Some(&t));
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

/// Two turns of one session begun by one holder: a lease a begin step takes is its turn's run's
/// (Redis numbers it by the turn's runs begun, so both first runs have token 1), so the first
/// turn's run, paused past its lease while the second turn's run took it, writes nothing.
pub(super) async fn a_paused_run_of_another_turn_cannot_write(s: Subject) {
    let st = &s.store;
    let (t1, t2) = (TurnId::parse("t1").unwrap(), TurnId::parse("t2").unwrap());
    let (s_id, short) = (sid("s"), Duration::from_millis(500));
    let begin = |tid| st.begin_turn(G, &s_id, tid, "w1", short, None, None);
    let first = begin(&t1).await.unwrap();
    let lease = first.lease.expect("a free session's lease");
    tokio::time::sleep(Duration::from_millis(700)).await;
    let second = begin(&t2).await.unwrap();
    assert_eq!(
        (first.runs, second.runs),
        (1, 1),
        "each its turn's first run"
    );
    let taken = second.lease.expect("the first run's lease lapsed");
    let stale = st.save(G, None, &turn("s", "t1"), &lease, true).await;
    assert!(matches!(stale, Err(StoreError::Fenced(_))), "{stale:?}");
    st.save(G, None, &turn("s", "t2"), &taken, true)
        .await
        .unwrap();
}

pub(super) async fn begin_counts_the_run_that_readers_then_see_running(s: Subject) {
    let st = &s.store;
    let tid = TurnId::parse("t").unwrap();
    let mut queued = turn("s", "t");
    (queued.status, queued.attempts) = (TurnStatus::Queued, 0);
    assert_eq!(st.create_turn(G, &queued).await.unwrap(), None);
    let first = st
        .begin_turn(G, &sid("s"), &tid, "w1", LONG, None, None)
        .await
        .unwrap();
    assert_eq!(first.runs, 1);
    // The record was not written, yet a reader sees the run: running, in attempt 1.
    let read = st.get_turn(&sid("s"), &tid).await.unwrap().unwrap();
    assert_eq!(
        (read.status, read.attempts, read.runs_begun),
        (TurnStatus::Running, 1, 1)
    );
    // A compare-and-set on the record as read before the run began fails (the front door
    // cannot cancel or take back a turn a worker runs), and so does taking it back.
    assert!(
        !st.replace_turn(G, &queued, &queued.clone().cancelled())
            .await
            .unwrap()
    );
    assert!(!st.discard_turn(G, &queued).await.unwrap());
    assert_eq!(
        st.get_turn(&sid("s"), &tid).await.unwrap().unwrap().status,
        TurnStatus::Running
    );
    // A stop request is read by the next begin; a run that died unwritten is counted.
    st.request_cancel(&sid("s"), &tid).await.unwrap();
    st.release_lease(G, &sid("s"), first.lease.as_ref().unwrap())
        .await
        .unwrap();
    let second = st
        .begin_turn(G, &sid("s"), &tid, "w2", LONG, None, None)
        .await
        .unwrap();
    assert_eq!((second.runs, second.stop_requested), (2, true));
    assert_eq!(
        second.turn.map(|t| t.attempts),
        Some(1),
        "read before this run counted"
    );
    // A settled turn is what its record says, however many runs began.
    let mut done = queued.clone();
    (done.status, done.attempts) = (TurnStatus::Completed, 2);
    st.save(G, None, &done, second.lease.as_ref().unwrap(), true)
        .await
        .unwrap();
    let dup = st
        .begin_turn(G, &sid("s"), &tid, "w3", LONG, None, None)
        .await
        .unwrap();
    assert_eq!(dup.runs, 3);
    let read = st.get_turn(&sid("s"), &tid).await.unwrap().unwrap();
    assert_eq!((read.status, read.attempts), (TurnStatus::Completed, 2));
    // A compare-and-set on the record as read now holds.
    assert!(
        st.replace_turn(G, &read, &read.clone().cancelled())
            .await
            .unwrap()
    );
}

pub(super) async fn begin_latches_a_new_sessions_contexts_and_only_then(s: Subject) {
    let st = &s.store;
    let fast = ContextIds::named_or_default(Some("fast"), None);
    let slow = ContextIds::named_or_default(Some("slow"), None);
    // A new session: the lease, and the given contexts latched in the same step.
    let first = st
        .begin_turn(G, &sid("s"), &tid("t1"), "w1", LONG, Some(&fast), None)
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
        .begin_turn(G, &sid("other"), &tid("t1"), "w1", LONG, None, None)
        .await
        .unwrap();
    assert!(busy.lease.is_some());
    let busy = st
        .begin_turn(G, &sid("other"), &tid("t2"), "w2", LONG, Some(&fast), None)
        .await
        .unwrap();
    assert!(busy.lease.is_none() && busy.latched.is_none());
    assert_eq!(st.latched_contexts(&sid("other")).await.unwrap(), None);
    // Still no session stored, other contexts latched (the front door admitted them): those
    // come back and stay.
    st.release_lease(G, &sid("s"), &lease).await.unwrap();
    let again = st
        .begin_turn(G, &sid("s"), &tid("t1"), "w2", LONG, Some(&slow), None)
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
        .begin_turn(G, &sid("s"), &tid("t2"), "w3", LONG, Some(&slow), None)
        .await
        .unwrap();
    assert!(stored.lease.is_some() && stored.session.is_some());
    assert_eq!(stored.latched, None);
    assert_eq!(st.latched_contexts(&sid("s")).await.unwrap(), Some(fast));
}

pub(super) async fn a_save_reads_whether_the_turn_was_asked_to_stop(s: Subject) {
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
    // With or without the session, the request is read by a write that keeps the lease; one
    // that gives it back ends the run and does not read it.
    let saved = st
        .save(G, Some(&session("s")), &t, &lease, false)
        .await
        .unwrap();
    assert!(saved.stop_requested);
    let saved = st.save(G, None, &t, &lease, false).await.unwrap();
    assert!(saved.stop_requested);
    let saved = st.save(G, None, &t, &lease, true).await.unwrap();
    assert!(!saved.stop_requested);
}

pub(super) async fn a_save_reads_whether_the_session_is_marked_watched(s: Subject) {
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

pub(super) async fn a_held_watch_mark_outlasts_its_ttl_and_lapses_after_it_is_dropped(s: Subject) {
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

/// A begin step asked to probe a key says, with the lease, whether the key exists — on a
/// store that reads it in the step (a standalone Redis, whose scripts reach any key); the
/// others say they cannot, and answer nothing.
pub(super) async fn a_begin_step_probes_a_key_where_the_store_can(s: Subject) {
    let st = &s.store;
    let (t1, t2) = (TurnId::parse("t1").unwrap(), TurnId::parse("t2").unwrap());
    let Some(ns) = s.namespace() else {
        assert!(
            !st.steps_reach_other_keys(),
            "only a standalone Redis probes"
        );
        let begun = st
            .begin_turn(G, &sid("s"), &t1, "w1", LONG, None, Some("any"))
            .await
            .unwrap();
        assert!(begun.lease.is_some());
        assert_eq!(begun.probed, None);
        return;
    };
    assert!(st.steps_reach_other_keys());
    let (present, absent) = (format!("{ns}:probe:{{x}}:here"), format!("{ns}:probe:gone"));
    let mut conn = crate::support::redis_connection().await;
    let _: i64 = ::redis::cmd("HSET")
        .arg(&present)
        .arg("chunks")
        .arg(1)
        .query_async(&mut conn)
        .await
        .unwrap();
    let found = st
        .begin_turn(G, &sid("a"), &t1, "w1", LONG, None, Some(&present))
        .await
        .unwrap();
    assert!(found.lease.is_some());
    assert_eq!(found.probed, Some(true), "a key of another slot is found");
    let missing = st
        .begin_turn(G, &sid("b"), &t1, "w1", LONG, None, Some(&absent))
        .await
        .unwrap();
    assert_eq!(missing.probed, Some(false));
    // Busy: no lease, nothing probed.
    let busy = st
        .begin_turn(G, &sid("a"), &t2, "w2", LONG, None, Some(&present))
        .await
        .unwrap();
    assert!(busy.lease.is_none());
    assert_eq!(busy.probed, None);
    // A plain begin probes nothing.
    let plain = st
        .begin_turn(G, &sid("c"), &t1, "w1", LONG, None, None)
        .await
        .unwrap();
    assert_eq!(plain.probed, None);
}

/// A run's write adds its counters in its own step on a store that can (a standalone Redis):
/// fields of hashes (tallies); one made by the write gets the counters' TTL, one already
/// there keeps its own. A counter key of another type is reported and the write stands; a
/// write fenced out adds nothing. The other stores say they cannot, and report the counters
/// missed (the caller counts them apart). A write that may be a new record's first lists it
/// among the session's turns once; one known stored does not ask.
pub(super) async fn a_runs_write_adds_its_counters_where_the_store_can(s: Subject) {
    let st = &s.store;
    let lease = st
        .acquire_lease(G, &sid("s"), "w1", LONG)
        .await
        .unwrap()
        .unwrap();
    let t = turn("s", "t");
    let ns = s.namespace().unwrap_or("x").to_string();
    let key = |k: &str| format!("{ns}:counters:{k}");
    let add = |k: &str, field: &str, amount| CounterAdd {
        key: key(k),
        field: field.to_string(),
        amount,
    };
    let counts = |adds| CounterAdds {
        keep_ms: 60_000,
        adds,
    };
    let write = |lease, stored, counts| RunWrite {
        session: None,
        turn: &t,
        lease,
        release: false,
        stored,
        unlisted: false,
        counts,
    };
    let first = counts(vec![
        add("count", "n", 7),
        add("tally", "a/calls", 1),
        add("tally", "a/input", 5),
    ]);
    if s.namespace().is_none() {
        assert!(!st.steps_reach_other_keys());
        let saved = st
            .save_run(G, write(&lease, false, Some(&first)))
            .await
            .unwrap();
        assert!(
            saved.counts_missed,
            "not added: the caller counts them apart"
        );
        return;
    }
    assert!(st.steps_reach_other_keys());
    let mut conn = crate::support::redis_connection().await;
    let reader = conn.clone();
    let ttl = async |k: &str| -> i64 {
        ::redis::cmd("PTTL")
            .arg(key(k))
            .query_async(&mut reader.clone())
            .await
            .unwrap()
    };
    let saved = st
        .save_run(G, write(&lease, false, Some(&first)))
        .await
        .unwrap();
    assert!(!saved.counts_missed);
    for k in ["count", "tally"] {
        let ms = ttl(k).await;
        assert!(ms > 50_000 && ms <= 60_000, "{k}: made by the write: {ms}");
        let _: i64 = ::redis::cmd("PEXPIRE")
            .arg(key(k))
            .arg(5_000)
            .query_async(&mut conn)
            .await
            .unwrap();
    }
    let saved = st
        .save_run(G, write(&lease, true, Some(&first)))
        .await
        .unwrap();
    assert!(!saved.counts_missed);
    let count: u64 = ::redis::cmd("HGET")
        .arg(key("count"))
        .arg("n")
        .query_async(&mut conn)
        .await
        .unwrap();
    let tally: Vec<u64> = ::redis::cmd("HMGET")
        .arg(key("tally"))
        .arg("a/calls")
        .arg("a/input")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!((count, tally), (14, vec![2, 10]));
    for k in ["count", "tally"] {
        let ms = ttl(k).await;
        assert!(
            ms > 0 && ms <= 5_000,
            "{k}: a later addition keeps the expiry: {ms}"
        );
    }
    assert_eq!(
        st.list_turns(&sid("s")).await.unwrap(),
        vec![TurnId::parse("t").unwrap()]
    );
    // A key of another type: reported, the others added, the write made.
    let _: i64 = ::redis::cmd("RPUSH")
        .arg(key("list"))
        .arg("x")
        .query_async(&mut conn)
        .await
        .unwrap();
    let odd = counts(vec![add("list", "n", 1), add("count", "n", 1)]);
    let mut moved = t.clone();
    moved.status = TurnStatus::Completed;
    let saved = st
        .save_run(
            G,
            RunWrite {
                turn: &moved,
                ..write(&lease, true, Some(&odd))
            },
        )
        .await
        .unwrap();
    assert!(saved.counts_missed);
    assert_eq!(
        st.get_turn(&sid("s"), &TurnId::parse("t").unwrap())
            .await
            .unwrap()
            .unwrap()
            .status,
        TurnStatus::Completed
    );
    let count: u64 = ::redis::cmd("HGET")
        .arg(key("count"))
        .arg("n")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 15);
    // Fenced out: nothing added.
    let stale = aptix_worker::store::Lease {
        token: lease.token + 100,
        holder: "stale".into(),
    };
    let fenced = st.save_run(G, write(&stale, true, Some(&first))).await;
    assert!(matches!(fenced, Err(StoreError::Fenced(_))), "{fenced:?}");
    let count: u64 = ::redis::cmd("HGET")
        .arg(key("count"))
        .arg("n")
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(count, 15);
}

for_each_backend!(
    backends: [
        memory => super::memory(),
        redis => super::redis().await,
        cluster => super::cluster().await,
    ],
    tests: [
        begin_takes_the_lease_and_reads_the_turn_and_session,
        begin_counts_the_run_that_readers_then_see_running,
        a_paused_run_of_another_turn_cannot_write,
        begin_latches_a_new_sessions_contexts_and_only_then,
        a_save_reads_whether_the_turn_was_asked_to_stop,
        a_save_reads_whether_the_session_is_marked_watched,
        a_held_watch_mark_outlasts_its_ttl_and_lapses_after_it_is_dropped,
        a_begin_step_probes_a_key_where_the_store_can,
        a_runs_write_adds_its_counters_where_the_store_can,
    ],
);
