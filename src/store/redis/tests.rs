//! The Redis store's own tests: errors that keep their causes, and data written by earlier
//! versions. Everything both stores must do is in the conformance suite (`tests/it`).

use std::time::Duration;

use super::{RedisOptions, RedisStore};
use crate::store::{Retention, StoreError};

/// A store on the local Redis under a namespace of its own (the test deletes it).
async fn fresh_store() -> RedisStore {
    let url = std::env::var("APTIX_TEST_REDIS_URL")
        .unwrap_or_else(|_| "redis://127.0.0.1:6379/".to_string());
    let ns = format!("aptix-unit-{}", uuid::Uuid::new_v4().simple());
    RedisStore::connect(&url, &ns, Retention::default())
        .await
        .expect("Redis must be running for this test")
}

/// A store error from Redis keeps the client's error: callers can tell a refused connection
/// from a timeout, not only read a flattened message, and the message says it once.
#[tokio::test]
async fn a_redis_failure_keeps_its_cause() {
    let options = RedisOptions {
        timeout: Duration::from_millis(500),
        ..RedisOptions::default()
    };
    let Err(e) =
        RedisStore::connect_with("redis://127.0.0.1:1/", "ns", Retention::default(), &options)
            .await
    else {
        panic!("nothing listens on port 1");
    };
    let StoreError::Redis(redis) = &e else {
        panic!("not the client's error: {e:?}");
    };
    assert_eq!(e.to_string(), format!("session store unavailable: {redis}"));
    assert!(
        redis.is_io_error() || redis.is_connection_refusal(),
        "{redis:?}"
    );
}

/// A stored value that does not decode names its key and keeps the decoder's error, so an
/// operator can find the value and see what is wrong with it.
#[tokio::test]
async fn an_undecodable_value_names_its_key_and_keeps_its_cause() {
    let store = fresh_store().await;
    let sid = crate::contract::SessionId::parse("s1").expect("valid id");
    let key = store.key("session", &sid);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg("{not json")
        .query_async(&mut store.conn())
        .await
        .expect("SET");
    let e = crate::store::StoreReader::get_session(&store, &sid).await;
    store.delete_namespace().await.expect("clean up");
    let Err(e) = e else {
        panic!("a corrupt session must not read as one: {e:?}");
    };
    let StoreError::Decode { key: k, error } = &e else {
        panic!("not a decoding error: {e:?}");
    };
    assert_eq!(*k, key);
    assert!(error.is_syntax(), "{error:?}");
    assert!(e.to_string().contains(&key), "{e}");
    assert!(e.to_string().ends_with(&error.to_string()), "{e}");
}

/// A session stored by an earlier version holds its conversation inline: it reads back as
/// pending items, and its next save moves them to the conversation list, in order, before
/// the new ones — nothing is lost and nothing is doubled.
#[tokio::test]
async fn an_inline_conversation_moves_out_with_the_next_save() {
    use crate::store::{SessionState, TurnRecord};
    let store = fresh_store().await;
    let sid = crate::contract::SessionId::parse("legacy").expect("valid id");
    let old = serde_json::json!({
        "sessionId": "legacy", "modeId": "M", "modeKey": "general", "modeHistory": [],
        "previousResponseId": "resp_1", "replay": true, "solutionContext": null,
        "owner": null, "createdAt": "2026-11-01T00:00:00Z", "updatedAt": "2026-11-01T00:00:00Z",
        "conversation": [{"role": "user", "content": "one"}, {"role": "assistant", "content": "two"}]
    });
    let key = store.key("session", &sid);
    let _: () = redis::cmd("SET")
        .arg(&key)
        .arg(old.to_string())
        .query_async(&mut store.conn())
        .await
        .expect("SET");
    let mut session: SessionState = crate::store::StoreReader::get_session(&store, &sid)
        .await
        .expect("read")
        .expect("stored");
    assert_eq!(session.conversation.len(), 2, "read back as pending");
    session
        .conversation
        .push(serde_json::json!({"role": "user", "content": "three"}));
    let lease = crate::store::SessionStore::acquire_lease(
        &store,
        &crate::store::Grant::for_tests(),
        &sid,
        "w",
        Duration::from_secs(30),
    )
    .await
    .expect("lease")
    .expect("free");
    let tid = crate::contract::TurnId::parse("t").expect("valid id");
    let turn = TurnRecord::queued(sid.clone(), tid, String::new(), "general".into());
    crate::store::SessionStore::save(
        &store,
        &crate::store::Grant::for_tests(),
        Some(&session),
        &turn,
        &lease,
        true,
    )
    .await
    .expect("save");
    let moved = crate::store::StoreReader::conversation(&store, &sid).await;
    let raw: String = redis::cmd("GET")
        .arg(&key)
        .query_async(&mut store.conn())
        .await
        .expect("GET");
    store.delete_namespace().await.expect("clean up");
    let contents: Vec<String> = moved
        .expect("conversation")
        .iter()
        .map(|v| v["content"].as_str().unwrap_or_default().to_string())
        .collect();
    assert_eq!(contents, ["one", "two", "three"]);
    assert!(!raw.contains("\"conversation\""), "no longer inline: {raw}");
}

/// The last write of a run whose session has no list (`RunWrite::unlisted`) keeps the items
/// with the session: no list key is made, so none is kept as long as the session (two
/// commands fewer for a session of one turn). Without that mark the same write lists them, and
/// so does a write whose items are large (the next begin would read them only to list them).
#[tokio::test]
async fn a_sessions_items_stay_with_it_until_it_has_a_list() {
    use crate::store::{Grant, RunWrite, SessionStore, TurnRecord};
    let store = fresh_store().await;
    let mut made = Vec::new();
    let large = "x".repeat(20 * 1024);
    for (name, unlisted, said) in [
        ("one-turn", true, "hi"),
        ("listed", false, "hi"),
        ("large", true, large.as_str()),
    ] {
        let sid = crate::contract::SessionId::parse(name).expect("valid id");
        let lease = store
            .acquire_lease(&Grant::for_tests(), &sid, "w", Duration::from_secs(30))
            .await
            .expect("lease")
            .expect("free");
        let tid = crate::contract::TurnId::parse("t").expect("valid id");
        let turn = TurnRecord::queued(sid.clone(), tid, String::new(), "general".into());
        let mut session: crate::store::SessionState = serde_json::from_value(serde_json::json!({
            "sessionId": name, "modeId": "M", "modeKey": "general", "modeHistory": [],
            "previousResponseId": null, "replay": false, "solutionContext": null,
            "owner": null, "createdAt": "2026-12-05T00:00:00Z",
            "updatedAt": "2026-12-05T00:00:00Z"
        }))
        .expect("a session");
        session.conversation = vec![serde_json::json!({"role": "user", "content": said})];
        let write = RunWrite {
            session: Some(&session),
            turn: &turn,
            lease: &lease,
            release: true,
            stored: false,
            unlisted,
            counts: None,
        };
        store
            .save_run(&Grant::for_tests(), write)
            .await
            .expect("save");
        let list: i64 = redis::cmd("EXISTS")
            .arg(store.key("conversation", &sid))
            .query_async(&mut store.conn())
            .await
            .expect("EXISTS");
        let read = crate::store::StoreReader::get_session(&store, &sid)
            .await
            .expect("read")
            .expect("stored");
        made.push((name, list, read.conversation.len()));
    }
    store.delete_namespace().await.expect("clean up");
    assert_eq!(
        made,
        [("one-turn", 0, 1), ("listed", 1, 0), ("large", 1, 0)]
    );
}

/// A begin whose reads fail (a turn that does not decode) gives its lease back: the session
/// is not left busy until the lease expires.
#[tokio::test]
async fn a_begin_that_cannot_read_the_turn_gives_the_lease_back() {
    use crate::store::SessionStore as _;
    let store = fresh_store().await;
    let sid = crate::contract::SessionId::parse("s1").expect("valid id");
    let tid = crate::contract::TurnId::parse("t1").expect("valid id");
    let _: () = redis::cmd("SET")
        .arg(store.turn_key("turn", &sid, &tid))
        .arg("{not json")
        .query_async(&mut store.conn())
        .await
        .expect("SET");
    let begun = store
        .begin_turn(
            &crate::store::Grant::for_tests(),
            &sid,
            &tid,
            "w1",
            Duration::from_secs(30),
            None,
            None,
        )
        .await;
    let again = store
        .acquire_lease(
            &crate::store::Grant::for_tests(),
            &sid,
            "w2",
            Duration::from_secs(30),
        )
        .await;
    store.delete_namespace().await.expect("clean up");
    assert!(matches!(begun, Err(StoreError::Decode { .. })), "{begun:?}");
    assert!(
        again.expect("lease").is_some(),
        "the failed begin kept the lease"
    );
}

/// A prompt outlives every record that names it: it is kept twice the turn retention, and a
/// store that wrote it writes it again only once half the retention has passed.
#[tokio::test]
async fn a_prompt_outlives_the_records_that_name_it() {
    let store = fresh_store().await;
    let prompt = crate::state::Prompt::of("be brief", None, None);
    crate::store::RecordWriter::keep_prompt(&store, &prompt)
        .await
        .expect("kept");
    let key = format!("{}:prompt:{}", store.namespace(), prompt.id);
    let ttl: i64 = redis::cmd("PTTL")
        .arg(&key)
        .query_async(&mut store.conn())
        .await
        .expect("PTTL");
    // Gone, and kept again by this store: it does not know, and will not write it before
    // half the retention has passed (what the TTL covers).
    let _: () = redis::cmd("DEL")
        .arg(&key)
        .query_async(&mut store.conn())
        .await
        .expect("DEL");
    crate::store::RecordWriter::keep_prompt(&store, &prompt)
        .await
        .expect("kept");
    let again: bool = redis::cmd("EXISTS")
        .arg(&key)
        .query_async(&mut store.conn())
        .await
        .expect("EXISTS");
    store.delete_namespace().await.expect("clean up");
    let turns = Retention::default().turns;
    assert!(
        ttl as u128 > turns.as_millis() * 2 - 5_000,
        "kept {ttl} ms for a turn retention of {turns:?}"
    );
    assert!(!again, "written once per half retention, not on every call");
}

/// A script call reaches a server that does not hold its script yet (a script of its own,
/// never loaded): the `NOSCRIPT` answer loads it and the same call is sent again. Keys and
/// arguments arrive in their order, a joined argument and a JSON one whole; a call given
/// fewer keys than it declared is refused before anything is sent.
#[tokio::test]
async fn a_script_call_loads_its_script_where_the_server_lacks_it() {
    let store = fresh_store().await;
    let script = redis::Script::new(&format!(
        "-- {}\nreturn {{KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3]}}",
        uuid::Uuid::new_v4()
    ));
    let held = |conn| async {
        let mut conn = conn;
        let held: Vec<bool> = redis::cmd("SCRIPT")
            .arg("EXISTS")
            .arg(script.get_hash())
            .query_async(&mut conn)
            .await
            .unwrap();
        held == [true]
    };
    assert!(!held(store.conn()).await);
    let mut call = super::call::ScriptCall::new(&script, 2);
    call.key("k1")
        .key_joined(&["k", "2"])
        .arg(7)
        .arg_joined(&["a", " ", "b"])
        .arg_json(&serde_json::json!({"x": "y\""}))
        .unwrap();
    let got: Vec<String> = call.invoke(&mut store.conn()).await.unwrap();
    assert_eq!(got, ["k1", "k2", "7", "a b", r#"{"x":"y\""}"#]);
    assert!(held(store.conn()).await);
    let again: Vec<String> = call.invoke(&mut store.conn()).await.unwrap();
    assert_eq!(again, got);

    // A call whose keys do not match its count is refused before anything is sent: a key
    // missing, a key too many (it would reach the script as ARGV[1]), or an argument given
    // before the last key (it would reach the script as a key).
    let mut short = super::call::ScriptCall::new(&script, 3);
    short.key("k1").key("k2");
    let mut long = super::call::ScriptCall::new(&script, 1);
    long.key("k1").key("k2").arg("a");
    let mut early = super::call::ScriptCall::new(&script, 2);
    early.key("k1").arg("a").key("k2");
    for (call, why) in [
        (short, "declared 3, given 2"),
        (long, "declared 1, given 2"),
        (early, "an argument before the last key"),
    ] {
        let refused = call.invoke::<Vec<String>>(&mut store.conn()).await;
        let Err(e) = refused else {
            panic!("sent although {why}: {refused:?}");
        };
        assert_eq!(e.kind(), redis::ErrorKind::Client, "{e}");
        assert!(e.to_string().contains(why), "{why}: {e}");
    }
}

/// A tenant's runs index is trimmed of entries older than the turn retention by the first note
/// this process makes, then at most once a minute by the note's own time, and again at once
/// after the clock went back.
#[tokio::test]
async fn a_runs_index_is_trimmed_by_the_first_note_then_once_a_minute() {
    use crate::contract::{SessionId, TurnId};
    use crate::state::TurnRecord;
    use crate::store::now_ms;
    let store = fresh_store().await;
    let key = store.runs_key("acme");
    let too_old = store.oldest_run_kept() - 10_000;
    let plant = |member: &'static str| {
        let (key, mut conn) = (key.clone(), store.conn());
        async move {
            let _: i64 = redis::cmd("ZADD")
                .arg(&key)
                .arg(too_old)
                .arg(member)
                .query_async(&mut conn)
                .await
                .unwrap();
        }
    };
    let members = || {
        let (key, mut conn) = (key.clone(), store.conn());
        async move {
            let names: Vec<String> = redis::cmd("ZRANGE")
                .arg(&key)
                .arg(0)
                .arg(-1)
                .query_async(&mut conn)
                .await
                .unwrap();
            names
        }
    };
    let admit = |turn: &'static str, at_ms: i64| {
        let record = TurnRecord::queued(
            SessionId::parse("s").unwrap().within("acme"),
            TurnId::parse(turn).unwrap(),
            "fp".into(),
            String::new(),
        );
        let store = &store;
        async move {
            let (_, missed) = store
                .admit(Some("acme"), None, &record, Some(at_ms))
                .await
                .unwrap();
            assert_eq!(missed, None);
        }
    };
    let t0 = now_ms();
    plant("old-1").await;
    admit("t1", t0).await;
    assert_eq!(members().await, ["acme/s t1"], "the first note trims");
    plant("old-2").await;
    admit("t2", t0 + 59_000).await;
    assert_eq!(
        members().await,
        ["old-2", "acme/s t1", "acme/s t2"],
        "within the minute, no trim"
    );
    admit("t3", t0 + 60_000).await;
    assert_eq!(members().await, ["acme/s t1", "acme/s t2", "acme/s t3"]);
    plant("old-3").await;
    admit("t4", t0 - 5_000).await;
    assert!(
        !members().await.contains(&"old-3".to_string()),
        "a clock set back trims at once"
    );
    assert!(
        !store.trim_due("acme", t0 - 4_000),
        "then once a minute again"
    );
}

/// Notes made at once are written together, each tenant's with its own answer: every note
/// of a tenant whose index is sound lands, and those of a tenant whose index key holds
/// something else fail without taking the others with them.
#[tokio::test]
async fn notes_made_at_once_land_each_with_its_own_tenants_answer() {
    use crate::contract::{SessionId, TurnId};
    use crate::store::{IndexedTurn, RecordWriter as _, now_ms};
    let store = fresh_store().await;
    let _: () = redis::cmd("SET")
        .arg(store.runs_key("broken"))
        .arg("not a sorted set")
        .query_async(&mut store.conn())
        .await
        .unwrap();
    let t0 = now_ms();
    let notes = (0..300).map(|i| {
        let tenant = ["acme", "globex", "broken"][i % 3];
        let entry = IndexedTurn::of(
            t0 + i as i64,
            &SessionId::parse(format!("s{i}")).unwrap().within(tenant),
            &TurnId::parse("t").unwrap(),
        );
        let store = store.clone();
        tokio::spawn(async move { (tenant, store.index_turn(entry).await) })
    });
    let mut answers = std::collections::BTreeMap::<(&str, bool), usize>::new();
    for note in futures_util::future::join_all(notes).await {
        let (tenant, answer) = note.unwrap();
        *answers.entry((tenant, answer.is_ok())).or_default() += 1;
    }
    assert_eq!(
        answers,
        [
            (("acme", true), 100),
            (("broken", false), 100),
            (("globex", true), 100)
        ]
        .into(),
    );
    for tenant in ["acme", "globex"] {
        let count: usize = redis::cmd("ZCARD")
            .arg(store.runs_key(tenant))
            .query_async(&mut store.conn())
            .await
            .unwrap();
        assert_eq!(count, 100, "{tenant}");
    }
    assert!(!store.runs_notes.busy(), "every note was answered");
}
