//! The store's connection cut at each write of a turn's life, and the job run again: the
//! session's next model request must continue from the last answer its client was given.
//!
//! A proxy between the workers and Redis reads the commands going through (RESP) and counts
//! the turn-state writes — `EVALSHA` of the store's write scripts, told apart by their SHA1 —
//! and at the Nth one drops the connection, either **before** forwarding it (the write never
//! happens) or **after** Redis has run it, holding back its answer (the write happened, the
//! worker cannot know). The turn used has a server tool that changes the mode and a client
//! tool, so every kind of write is cut: begin, start, checkpoint, tool output with the mode
//! change, the wait for client tools, the continuation's lease and start, and the completion.
//! The same on a Redis killed (SIGKILL) at the cut and restarted from its append-only file,
//! and on a Redis Cluster whose nodes announce the proxies as their addresses.
//!
//! Each job is run again until it settles, as the queue redelivers it; the checks: every job
//! settles once with one answer, the mode changed once, and turn t2's model request names the
//! response whose text the client got for t1 as its `previous_response_id`.

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use aptix_worker::catalog::ModeCatalog;
use aptix_worker::contract::{AgentExecuteRequest, AgentExecuteResponse, SessionId};
use aptix_worker::fake_llm::{FakeLlm, FakeOptions};
use aptix_worker::llm::LlmClient;
use aptix_worker::pipeline::{JobOutcome, Pipeline, PipelineSettings};
use aptix_worker::store::redis::{RedisOptions, RedisStore};
use aptix_worker::store::{Retention, SessionStore, StoreReader as _};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;

use crate::support::{request, schema};

/// Where the connection is cut, relative to the counted write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Cut {
    /// The write is not forwarded: it never happens.
    Before,
    /// The write is forwarded and run; its answer is held back and the connection dropped.
    After,
}

/// What a run of the proxies does to the traffic.
#[derive(Default)]
pub(super) struct Plan {
    /// The write scripts' SHA1s, with their names.
    writes: HashMap<Vec<u8>, &'static str>,
    /// Cut at the write with this number (1-based), once.
    cut: Option<(usize, Cut)>,
    /// The writes seen, by name, in order.
    seen: Vec<&'static str>,
    fired: bool,
}

/// What to do (once) when the cut fires, before the connection is dropped: it runs on the
/// relay's task, so it must be quick (spawn what takes long).
pub(super) type OnCut = Arc<Mutex<Option<Box<dyn Fn() + Send>>>>;

/// One or more proxies (one per Redis node) sharing one plan and one count.
pub(super) struct Proxies {
    plan: Arc<Mutex<Plan>>,
    /// Called when the cut fires, before the connection is dropped.
    on_cut: OnCut,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Proxies {
    pub(super) fn new(writes: HashMap<Vec<u8>, &'static str>) -> Self {
        Self {
            plan: Arc::new(Mutex::new(Plan {
                writes,
                ..Plan::default()
            })),
            on_cut: Arc::new(Mutex::new(None)),
            tasks: Vec::new(),
        }
    }

    /// Starts a proxy on `listener` to `target`.
    pub(super) fn serve(&mut self, listener: TcpListener, target: String) {
        let (plan, on_cut) = (self.plan.clone(), self.on_cut.clone());
        self.tasks.push(tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(&target).await else {
                    continue; // the client sees its connection closed
                };
                tokio::spawn(relay(client, server, plan.clone(), on_cut.clone()));
            }
        }));
    }

    /// A new run: count from zero, cut at `cut`.
    pub(super) fn arm(&self, cut: Option<(usize, Cut)>) {
        let mut plan = self.plan.lock().unwrap();
        plan.cut = cut;
        plan.seen.clear();
        plan.fired = false;
    }

    pub(super) fn seen(&self) -> Vec<&'static str> {
        self.plan.lock().unwrap().seen.clone()
    }

    pub(super) fn fired(&self) -> bool {
        self.plan.lock().unwrap().fired
    }
}

impl Drop for Proxies {
    fn drop(&mut self) {
        for t in &self.tasks {
            t.abort();
        }
    }
}

/// The length of the first complete RESP command in `buf`, with its first two arguments.
pub(super) fn command(buf: &[u8]) -> Option<(usize, Vec<Vec<u8>>)> {
    fn line(buf: &[u8], at: usize) -> Option<(i64, usize)> {
        let end = buf[at..].windows(2).position(|w| w == b"\r\n")? + at;
        let n = std::str::from_utf8(&buf[at + 1..end]).ok()?.parse().ok()?;
        Some((n, end + 2))
    }
    if buf.first()? != &b'*' {
        panic!(
            "the proxy only reads RESP arrays; got {:?}",
            &buf[..buf.len().min(20)]
        );
    }
    let (count, mut at) = line(buf, 0)?;
    let mut args = Vec::new();
    for _ in 0..count {
        let (len, start) = line(buf, at)?;
        let end = start + len as usize;
        if buf.len() < end + 2 {
            return None;
        }
        if args.len() < 2 {
            args.push(buf[start..end].to_vec());
        }
        at = end + 2;
    }
    Some((at, args))
}

/// Relays one connection, counting writes client → server and cutting where the plan says.
pub(super) async fn relay(
    client: TcpStream,
    server: TcpStream,
    plan: Arc<Mutex<Plan>>,
    on_cut: OnCut,
) {
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let dropped = CancellationToken::new();
    let hold = Arc::new(AtomicBool::new(false));
    let answers = {
        let (dropped, hold) = (dropped.clone(), hold.clone());
        tokio::spawn(async move {
            let mut buf = vec![0u8; 64 * 1024];
            loop {
                let n = tokio::select! {
                    () = dropped.cancelled() => return,
                    read = sr.read(&mut buf) => match read { Ok(0) | Err(_) => return, Ok(n) => n },
                };
                // Held back: the answer to the cut write never reaches the client.
                while hold.load(Ordering::SeqCst) {
                    tokio::select! {
                        () = dropped.cancelled() => return,
                        () = tokio::time::sleep(Duration::from_millis(5)) => {}
                    }
                }
                if cw.write_all(&buf[..n]).await.is_err() {
                    return;
                }
            }
        })
    };
    let mut pending = Vec::new();
    let mut buf = vec![0u8; 64 * 1024];
    let mut fired_here = false;
    'read: loop {
        let n = match cr.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        pending.extend_from_slice(&buf[..n]);
        while let Some((len, args)) = command(&pending) {
            let cut = {
                let mut plan = plan.lock().unwrap();
                let write = args
                    .first()
                    .is_some_and(|c| c.eq_ignore_ascii_case(b"EVALSHA"))
                    .then(|| args.get(1).and_then(|sha| plan.writes.get(sha).copied()))
                    .flatten();
                match write {
                    Some(name) => {
                        plan.seen.push(name);
                        let number = plan.seen.len();
                        match plan.cut {
                            Some((at, cut)) if at == number && !plan.fired => {
                                plan.fired = true;
                                Some(cut)
                            }
                            _ => None,
                        }
                    }
                    None => None,
                }
            };
            let bytes: Vec<u8> = pending.drain(..len).collect();
            fired_here = cut.is_some();
            match cut {
                None => {
                    if sw.write_all(&bytes).await.is_err() {
                        break 'read;
                    }
                }
                Some(Cut::Before) => break 'read,
                Some(Cut::After) => {
                    hold.store(true, Ordering::SeqCst);
                    let _ = sw.write_all(&bytes).await;
                    // Redis runs a script in microseconds; leave it ample time.
                    tokio::time::sleep(Duration::from_millis(150)).await;
                    break 'read;
                }
            }
        }
    }
    if fired_here && let Some(f) = on_cut.lock().unwrap().take() {
        f();
    }
    dropped.cancel();
    let _ = answers.await;
    drop((cr, sw));
}

/// A Redis server of the test's own, with an append-only file fsynced at every write.
pub(super) struct AofRedis {
    port: u16,
    dir: std::path::PathBuf,
    child: Arc<Mutex<Option<Child>>>,
}

impl AofRedis {
    fn start() -> Self {
        let port = crate::support::free_port();
        let dir = std::env::temp_dir().join(format!("aptix-aof-{}", uuid::Uuid::new_v4().simple()));
        std::fs::create_dir_all(&dir).unwrap();
        let redis = Self {
            port,
            dir,
            child: Arc::new(Mutex::new(None)),
        };
        redis.launch();
        redis
    }

    fn launch(&self) {
        spawn_aof(self.port, &self.dir, &self.child);
    }

    /// SIGKILL now (before the client hears anything), and start again from the append-only
    /// file on a thread of its own (the caller goes on; its retries meet a Redis that is down,
    /// then back).
    fn crash_and_restart(&self) -> impl Fn() + Send + 'static {
        let (port, dir, child) = (self.port, self.dir.clone(), self.child.clone());
        move || {
            if let Some(mut c) = child.lock().unwrap().take() {
                let _ = c.kill();
                let _ = c.wait();
            }
            let (dir, child) = (dir.clone(), child.clone());
            std::thread::spawn(move || spawn_aof(port, &dir, &child));
        }
    }
}

pub(super) fn spawn_aof(port: u16, dir: &std::path::Path, child: &Mutex<Option<Child>>) {
    let c = Command::new("redis-server")
        .args([
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
        ])
        .args(["--appendonly", "yes", "--appendfsync", "always"])
        .arg("--dir")
        .arg(dir)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server (Debian's redis-server package) must be installed");
    *child.lock().unwrap() = Some(c);
    let deadline = Instant::now() + Duration::from_secs(20);
    while redis_ping(port).is_err() {
        assert!(
            Instant::now() < deadline,
            "redis-server on {port} did not start"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

pub(super) fn redis_ping(port: u16) -> redis::RedisResult<String> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut conn = client.get_connection_with_timeout(Duration::from_millis(500))?;
    redis::cmd("PING").query(&mut conn)
}

impl Drop for AofRedis {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.lock().unwrap().take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The write scripts of a store (every script but the renewal, which runs on a timer, and the
/// read-only watch mark), by SHA1.
pub(super) fn write_scripts(store: &RedisStore) -> HashMap<Vec<u8>, &'static str> {
    store
        .script_hashes()
        .into_iter()
        .filter(|(name, _)| !matches!(*name, "renew" | "mark_watched"))
        .map(|(name, sha)| (sha.into_bytes(), name))
        .collect()
}

/// The writes of the turns below without a cut, in order.
pub(super) const WRITES: [&str; 11] = [
    "begin",         // t1: lease taken, turn and session read
    "save",          // t1 running
    "save",          // checkpoint: the answer calling both tools
    "record_output", // agent_change_mode's output with the new mode
    "save",          // settled: waiting for the client tool
    "acquire",       // the continuation's lease
    "save",          // the client's results accepted, running
    "save",          // settled: completed
    "begin",         // t2: lease taken, turn and session read
    "save",          // t2 running
    "save",          // settled: completed
];

/// Runs a job until it settles, as the queue redelivers it; its settled result.
pub(super) async fn settle(worker: &Pipeline, job: &AgentExecuteRequest, what: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        match worker.execute(job, Duration::from_secs(20)).await {
            JobOutcome::Done(settled) => return serde_json::to_value(settled.result()).unwrap(),
            JobOutcome::NotTheTurns(errors) => panic!("{what}: not the turn's job: {errors:?}"),
            JobOutcome::Busy | JobOutcome::NoCapacity(_) | JobOutcome::Retry(_) => {
                assert!(Instant::now() < deadline, "{what} did not settle in 60 s");
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
    }
}

/// A worker over a store reached through the proxies.
pub(super) async fn worker(
    url: &str,
    cluster: bool,
    fake: &FakeLlm,
) -> (Pipeline, Arc<RedisStore>) {
    let ns = format!("aptix-test-{}", uuid::Uuid::new_v4().simple());
    let options = RedisOptions {
        timeout: Duration::from_secs(2),
        cluster,
        ..RedisOptions::default()
    };
    let store = Arc::new(
        RedisStore::connect_with(url, &ns, Retention::default(), &options)
            .await
            .expect("the store connects through the proxy"),
    );
    let llm = LlmClient::new(
        &fake.base_url(),
        None,
        Duration::from_secs(2),
        Duration::from_secs(10),
        0,
    )
    .unwrap();
    let mut settings = PipelineSettings::new("gpt-test");
    // A lease taken by a write whose answer was lost is free again after this long.
    settings.lease_ttl = Duration::from_millis(1500);
    let dyn_store: Arc<dyn SessionStore> = store.clone();
    let pipeline = Pipeline::new(dyn_store, Arc::new(ModeCatalog::builtin()), llm, settings)
        .expect("pipeline");
    (pipeline, store)
}

/// The turn's life with the plan armed: t1 (server tool + client tool), its continuation, t2.
/// Returns the writes the proxies saw.
pub(super) async fn one_life(
    proxies: &Proxies,
    url: &str,
    cluster: bool,
    cut: Option<(usize, Cut)>,
) -> Vec<&'static str> {
    let fake = FakeLlm::start(
        "127.0.0.1:0".parse().unwrap(),
        FakeOptions {
            stamp_answers: true,
            ..FakeOptions::default()
        },
        Some(schema()),
    )
    .await
    .unwrap();
    let (pipeline, store) = worker(url, cluster, &fake).await;
    let label = format!("{cut:?}");
    let sid = format!("faults-{}", uuid::Uuid::new_v4().simple());
    proxies.arm(cut);
    let t1 = request(json!({
        "sessionId": sid, "turnId": "t1",
        "instruction": "Write a DDR.\n#fake:call agent_change_mode {\"mode\":\"ddr_authoring\",\"branch\":false,\"reason\":\"DDR work\"}\n#fake:call workspace_read_file {\"relativePath\":\"docs/a.md\"}"
    }));
    let waiting = settle(&pipeline, &t1, "t1").await;
    assert_eq!(waiting["successful"], true, "{label}: {waiting}");
    let calls = waiting["result"]["toolCalls"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    assert_eq!(calls.len(), 1, "{label}: one client tool call: {waiting}");
    let continuation = request(json!({
        "sessionId": sid, "turnId": "t1",
        "toolResults": [{"toolCallId": calls[0]["toolCallId"], "executionMs": 3, "resultJson": "{\"text\":\"# DDR\"}"}]
    }));
    let done = settle(&pipeline, &continuation, "t1's continuation").await;
    assert_eq!(done["successful"], true, "{label}: {done}");
    assert_eq!(done["result"]["kind"], "final", "{label}: {done}");
    let text = done["result"]["primaryOutputText"]
        .as_str()
        .unwrap_or_default();
    let given = text
        .rsplit_once('[')
        .and_then(|(_, id)| id.strip_suffix(']'))
        .unwrap_or_else(|| panic!("{label}: the answer names its response: {text}"))
        .to_string();
    // The same job, delivered once more after it settled, answers the same.
    let again = settle(&pipeline, &continuation, "a duplicate of the continuation").await;
    assert_eq!(
        again["result"], done["result"],
        "{label}: one answer per turn"
    );

    let t2 = request(json!({"sessionId": sid, "turnId": "t2", "instruction": "And now?"}));
    let next = settle(&pipeline, &t2, "t2").await;
    assert_eq!(next["successful"], true, "{label}: {next}");
    let sent = fake.requests();
    let last = sent.last().expect("t2 called the model");
    assert_eq!(
        last["previous_response_id"].as_str(),
        Some(given.as_str()),
        "{label}: t2 must continue from the answer t1's client was given"
    );
    assert!(
        last["instructions"]
            .as_str()
            .unwrap_or_default()
            .contains("Current Mode: ddr_authoring"),
        "{label}: t2 runs in the mode t1 changed to: {last}"
    );
    let session = store
        .get_session(&SessionId::parse(&sid).unwrap())
        .await
        .unwrap()
        .expect("the session is stored");
    assert_eq!(
        session.mode_history.len(),
        1,
        "{label}: the mode changed once"
    );
    let Some(AgentExecuteResponse::Final(_)) =
        serde_json::from_value::<aptix_worker::contract::InvokeResult<AgentExecuteResponse>>(next)
            .ok()
            .and_then(|r| r.result().cloned())
    else {
        panic!("{label}: t2 ends with a final answer");
    };
    proxies.seen()
}

/// Every cut point, before and after, against the store reached through `url`.
pub(super) async fn every_cut(proxies: &Proxies, url: &str, cluster: bool) {
    let clean = one_life(proxies, url, cluster, None).await;
    assert_eq!(clean, WRITES, "the writes of the turn's life, uncut");
    for at in 1..=WRITES.len() {
        for cut in [Cut::Before, Cut::After] {
            one_life(proxies, url, cluster, Some((at, cut))).await;
            assert!(
                proxies.fired(),
                "the cut at write {at} ({}) fired",
                WRITES[at - 1]
            );
        }
    }
}

pub(super) async fn listener() -> (TcpListener, u16) {
    let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = l.local_addr().unwrap().port();
    (l, port)
}

/// Scripts loaded before each life, so every write is one `EVALSHA` (a `NOSCRIPT` answer
/// would send it twice and shift the count).
pub(super) async fn preload(url: &str) {
    RedisStore::connect(url, "aptix-preload", Retention::default())
        .await
        .expect("Redis answers")
        .load_scripts()
        .await
        .expect("scripts load");
}

#[tokio::test]
pub(super) async fn a_cut_at_any_write_of_a_turn_loses_nothing_on_redis() {
    let target = crate::support::redis_url();
    let target = target
        .trim_start_matches("redis://")
        .trim_end_matches('/')
        .to_string();
    preload(&crate::support::redis_url()).await;
    let probe = RedisStore::connect(&crate::support::redis_url(), "probe", Retention::default())
        .await
        .expect("Redis must be running for this test");
    let mut proxies = Proxies::new(write_scripts(&probe));
    let (l, port) = listener().await;
    proxies.serve(l, target);
    every_cut(&proxies, &format!("redis://127.0.0.1:{port}/"), false).await;
}

#[tokio::test]
pub(super) async fn a_redis_killed_at_any_write_and_restarted_from_its_aof_loses_nothing() {
    let redis = Arc::new(AofRedis::start());
    let direct = format!("redis://127.0.0.1:{}/", redis.port);
    let probe = RedisStore::connect(&direct, "probe", Retention::default())
        .await
        .unwrap();
    let mut proxies = Proxies::new(write_scripts(&probe));
    let (l, port) = listener().await;
    proxies.serve(l, format!("127.0.0.1:{}", redis.port));
    let url = format!("redis://127.0.0.1:{port}/");
    let clean = {
        preload(&direct).await;
        one_life(&proxies, &url, false, None).await
    };
    assert_eq!(clean, WRITES, "the writes of the turn's life, uncut");
    for at in 1..=WRITES.len() {
        for cut in [Cut::Before, Cut::After] {
            preload(&direct).await;
            *proxies.on_cut.lock().unwrap() = Some(Box::new(redis.crash_and_restart()));
            one_life(&proxies, &url, false, Some((at, cut))).await;
            assert!(
                proxies.fired(),
                "the cut at write {at} ({}) fired",
                WRITES[at - 1]
            );
        }
    }
}

/// Three masters announcing the proxies' ports as their addresses, so a cluster client that
/// follows the slot map still goes through them.
pub(super) struct ProxiedCluster {
    pub(super) children: Vec<Child>,
    pub(super) dir: std::path::PathBuf,
    /// The nodes' own ports.
    pub(super) ports: Vec<u16>,
}

impl Drop for ProxiedCluster {
    fn drop(&mut self) {
        for c in &mut self.children {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
