//! `aptix-bench store`: Redis round trips and time per turn on the store's hot path (begin and
//! commit of a turn, as layer F does them) against a bare `SET`+`GET` baseline measured in
//! the same run. Commands are counted with Redis's own `total_commands_processed`.

use std::time::{Duration, Instant};

use redis::AsyncCommands as _;

use super::GRANT;
use crate::contract::{SessionId, TurnId};
use crate::store::{
    ContextIds, RedisStore, Retention, SessionState, SessionStore, StoreError, TurnRecord,
    TurnStatus,
};

async fn commands_processed(
    conn: &mut redis::aio::MultiplexedConnection,
) -> Result<u64, StoreError> {
    let info: String = redis::cmd("INFO")
        .arg("stats")
        .query_async(conn)
        .await
        .map_err(StoreError::Redis)?;
    info.lines()
        .find_map(|l| l.strip_prefix("total_commands_processed:"))
        .and_then(|v| v.trim().parse().ok())
        .ok_or_else(|| StoreError::Corrupt("INFO stats has no total_commands_processed".into()))
}

fn session(id: &SessionId) -> SessionState {
    SessionState {
        session_id: id.clone(),
        mode_id: "3F8E4F377F7A4C189C7F6A8B9F945C11".into(),
        mode_key: "general".into(),
        mode_history: Vec::new(),
        previous_response_id: Some("resp_0123456789abcdef".into()),
        conversation: Vec::new(),
        replay: false,
        previous_call: None,
        solution_context: None,
        contexts: Default::default(),
        owner: None,
        created_at: crate::store::now_rfc3339(),
        updated_at: crate::store::now_rfc3339(),
    }
}

fn record(sid: &SessionId, tid: &TurnId) -> TurnRecord {
    TurnRecord::queued(sid.clone(), tid.clone(), "0".repeat(64), "general".into())
}

/// Runs the benchmark and prints a small report.
pub async fn run(url: &str, turns: usize) -> Result<(), StoreError> {
    let ns = format!("aptix-bench-{}", uuid::Uuid::new_v4().simple());
    let store = RedisStore::connect(url, &ns, Retention::default()).await?;
    let client = redis::Client::open(url).map_err(StoreError::Redis)?;
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .map_err(StoreError::Redis)?;
    let unavailable = StoreError::Redis;
    let payload = serde_json::to_string(&record(&SessionId::generate(), &TurnId::generate()))
        .unwrap_or_default();

    // Baseline: one SET and one GET of a turn-sized value per "turn".
    let before = commands_processed(&mut conn).await?;
    let started = Instant::now();
    for i in 0..turns {
        let key = format!("{ns}:baseline:{i}");
        let _: () = conn.set(&key, &payload).await.map_err(unavailable)?;
        let _: Option<String> = conn.get(&key).await.map_err(unavailable)?;
    }
    let baseline = started.elapsed();
    let baseline_cmds = commands_processed(&mut conn).await? - before - 1;

    // Hot path: what the pipeline does to begin and to commit a turn.
    let before = commands_processed(&mut conn).await?;
    let trips_before = store.round_trips();
    let contexts = ContextIds::default();
    let started = Instant::now();
    for i in 0..turns {
        let sid = SessionId::parse(format!("bench-{}", i % 64))
            .map_err(|e| StoreError::Corrupt(e.to_string()))?;
        let tid = TurnId::parse(format!("t{i}")).map_err(|e| StoreError::Corrupt(e.to_string()))?;
        // begin: the lease with the turn and the session read under it (and a new session's
        // contexts latched, the run counted; one script)
        let begun = store
            .begin_turn(
                &GRANT,
                &sid,
                &tid,
                "bench",
                Duration::from_secs(30),
                Some(&contexts),
                None,
            )
            .await?;
        let lease = begun
            .lease
            .ok_or_else(|| StoreError::Corrupt("bench session unexpectedly busy".into()))?;
        let state = begun.session.unwrap_or_else(|| session(&sid));
        let mut rec = record(&sid, &tid);
        // (the begin step counted the run: nothing is written until it settles)
        // commit: result, status, session and lease release in one step
        rec.status = TurnStatus::Completed;
        store.save(&GRANT, Some(&state), &rec, &lease, true).await?;
    }
    let hot = started.elapsed();
    let hot_cmds = commands_processed(&mut conn).await? - before - 1;
    let hot_trips = store.round_trips() - trips_before;
    store.delete_namespace().await?;

    let per = |d: Duration| d.as_secs_f64() * 1e6 / turns as f64;
    println!("store benchmark: {turns} turns against {}", redact(url));
    println!(
        "  {:<22} {:>10} {:>12} {:>16}",
        "", "us/turn", "round trips", "Redis commands"
    );
    println!(
        "  {:<22} {:>10.1} {:>12.2} {:>16.2}",
        "baseline SET+GET",
        per(baseline),
        2.0,
        baseline_cmds as f64 / turns as f64
    );
    println!(
        "  {:<22} {:>10.1} {:>12.2} {:>16.2}",
        "begin+commit (fenced)",
        per(hot),
        hot_trips as f64 / turns as f64,
        hot_cmds as f64 / turns as f64
    );
    println!(
        "  {:<22} {:>9.2}x {:>11.2}x {:>15.2}x",
        "ratio",
        hot.as_secs_f64() / baseline.as_secs_f64().max(f64::EPSILON),
        hot_trips as f64 / (2 * turns) as f64,
        hot_cmds as f64 / baseline_cmds.max(1) as f64
    );
    println!("  (Redis commands include those run inside the Lua scripts)");
    Ok(())
}

/// A Redis URL without its password, for printing.
fn redact(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***{}", &url[..scheme], &url[at..])
        }
        _ => url.to_string(),
    }
}
