//! What a turn costs Redis, counted from outside: `redis-cli monitor` watches the local Redis
//! while turns of new sessions run through the synchronous endpoint (front door, RabbitMQ,
//! worker, Redis: the whole product), and every command naming the test's namespace is
//! counted — those inside the Lua scripts too, which MONITOR shows one by one (what comes
//! with time rather than turns is left out: the workers' heartbeats, and the poller that asks
//! every so often whether the turns waiting on the model were asked to stop — one `EXISTS` for
//! all of them, sent only when a turn's call lasts past its period). The ceilings are
//! today's figures: a change that adds a command or a round trip to a turn fails here and
//! says which commands a turn makes.

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use serde_json::json;

use crate::app::{AppOptions, Backend, spawn};

/// Commands a client sends (a script call is one; a pipeline's commands count one each, though
/// they share a round trip) and commands in all, per turn. 2026-11-28: 14 and 54 at first;
/// 12 and 48 once the latches were `SET NX GET` and a tenant without an index stopped reading
/// one hash per word; 5 and 38 once the begin step counted the run (no write to start it),
/// the usage tallies were one script and the scripts lost a few commands. The five: the
/// admission, the begin step with the retrieval read beside it, the settling write with the
/// usage tally beside it (three round trips one after another). 6 and 39 with the runs index
/// (the console's turns list) while the front door sent its `ZADD` beside the enqueue; 5 and
/// 39 since the admission's script notes it (the trim, once a minute per tenant and process,
/// falls outside the count); 5 and 34 once the begin step read the turn, the session and the
/// stop request in one `MGET` and tried the lease with `SET NX` (no `EXISTS` first), and the
/// settling write read the lease and the marks in one `MGET`; 35 once that write asked
/// `EXISTS` again rather than copy the previous record out with `SET … GET`. 2026-11-29: 31
/// once that `EXISTS` was asked only by a run that did not find the record stored, the begin
/// step read the contexts the admission latched instead of latching them again, and a day's
/// usage keys got their expiry from the write that made them, not from every turn; 4 and 30
/// once the begin step looked whether the tenant has an index (`EXISTS`, inside its script)
/// instead of a read of the index's size sent beside it; 3 and 29 once the settling write
/// added the usage counts in its own script (three round trips, each one script); 28 once
/// that write stopped renewing the turns index's expiry (what adds a turn to it sets it); 27
/// once a scoped session (this test's tenant's) was no longer claimed for its tenant (its
/// keys name it; a bare id, the local tenant's, still is). 2026-12-05: 24 once the begin step
/// numbered its lease by the turn's runs begun (no fencing counter to `INCR` and `PEXPIRE`),
/// read the lease in its `MGET` (a plain `SET` takes it) and read the ledger only for a run
/// that is not the turn's first; 23 once the usage tally stopped keeping a total of its own
/// per context (a call's total is its input and output: one `HINCRBY` fewer for each call
/// counted); 22 once a day's tokens and cost were read from that tally (the quotas sum it) and
/// no longer counted again in keys of their own (one `INCRBY` fewer on every counted call, two
/// for a priced one); 20 once a session's first run kept its conversation items with the
/// session rather than start a list (`RunWrite::unlisted`: no `RPUSH` + `PEXPIRE` for a session
/// of one turn; its next turn lists them). Fewer commands is not always less work for Redis: see
/// docs/benchmarks-journal.md ("Two cuts not made") for the two cuts measured and not made.
const MOST_SENT_PER_TURN: f64 = 3.0;
const MOST_COMMANDS_PER_TURN: f64 = 20.0;

/// The turn record a settled turn leaves, in bytes (the last one written of each turn; its
/// answer's text included, twice: the call's and the result's). 2026-11-28: 3.9 KB for a
/// one-line answer while each request kept its prompt (instructions, tools, the boot
/// prompt's system message); 1.5 KB once requests named their prompt instead. Since the
/// console's timeline the record also keeps the client's instruction as asked (here
/// `"input":{"instruction":"summarise the design"}`, 46 bytes) and when each call started
/// (`"startMs":…`, about 12 bytes a call): 1,530 bytes, held to 1,500 plus those.
const MOST_RECORD_BYTES: usize = 1500 + 46 + 12;

/// A MONITOR line's arguments, unquoted (MONITOR writes each as a quoted string with `\"`,
/// `\\` and `\xNN` escapes).
fn arguments(line: &str) -> Vec<Vec<u8>> {
    let mut out = Vec::new();
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '"' {
            continue;
        }
        let mut arg = Vec::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('x') => {
                        let hex: String = chars.by_ref().take(2).collect();
                        arg.push(u8::from_str_radix(&hex, 16).unwrap_or(b'?'));
                    }
                    Some('n') => arg.push(b'\n'),
                    Some(other) => arg.extend(other.to_string().bytes()),
                    None => break,
                },
                c => arg.extend(c.to_string().bytes()),
            }
        }
        out.push(arg);
    }
    out
}

/// One MONITOR line: whether it ran inside a script, and the command's name.
fn read(line: &str) -> Option<(bool, String)> {
    // `1732780000.123456 [0 127.0.0.1:5555] "SET" "key" ...` or `[0 lua] "GET" ...`
    let (from, rest) = line.split_once(']')?;
    let in_script = from.ends_with("lua");
    let name = rest.trim().split('"').nth(1)?.to_ascii_uppercase();
    Some((in_script, name))
}

/// `redis-cli monitor` on the local Redis, keeping the lines that name namespace `ns` and come
/// with turns: the workers' heartbeats and the stop poller's reads come with time (the
/// settling write reads a stop request inside its script: that one is kept).
struct Monitor {
    child: std::process::Child,
    reader: std::thread::JoinHandle<()>,
    seen: Arc<Mutex<Vec<String>>>,
}

impl Monitor {
    fn start(ns: &str) -> Self {
        let mut child = Command::new("redis-cli")
            .args(["-h", "127.0.0.1", "-p", "6379", "monitor"])
            .stdout(Stdio::piped())
            .spawn()
            .expect("redis-cli runs (the Redis tools are installed with Redis)");
        let out = child.stdout.take().expect("its output");
        let seen: Arc<Mutex<Vec<String>>> = Arc::default();
        let (ready_tx, ready_rx) = std::sync::mpsc::channel();
        let reader = {
            let (seen, ns) = (seen.clone(), ns.to_string());
            let heartbeats = format!("{ns}:workers\"");
            let stop_poll = format!("\"EXISTS\" \"{ns}:cancel:");
            std::thread::spawn(move || {
                for line in BufReader::new(out).lines().map_while(Result::ok) {
                    if line.trim() == "OK" {
                        let _ = ready_tx.send(());
                    } else if line.contains(&ns) && !line.contains(&heartbeats) {
                        let polled = line.contains(&stop_poll) && !line.contains(" lua]");
                        if !polled {
                            seen.lock().unwrap().push(line);
                        }
                    }
                }
            })
        };
        ready_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("MONITOR answers OK");
        Self {
            child,
            reader,
            seen,
        }
    }

    /// Stops watching; the lines seen.
    fn stop(mut self) -> Vec<String> {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = self.reader.join();
        self.seen.lock().unwrap().clone()
    }
}

/// The whole product on the services, defaults.
async fn services() -> crate::app::App {
    spawn(AppOptions {
        backend: Backend::Services,
        ..AppOptions::default()
    })
    .await
}

/// A user turn `turn` of session `session`.
fn turn_of(session: &str, turn: &str) -> String {
    json!({"sessionId": session, "turnId": turn, "instruction": "summarise the design"}).to_string()
}

/// A user turn of a new session `session`.
fn turn(session: String) -> String {
    turn_of(&session, "t")
}

/// What `turns` synchronous turns cost Redis, counted under MONITOR (after a first turn that
/// warms what is made once: scripts loaded, queues declared): commands sent and in all per
/// turn, the largest turn record written, and a report of them.
struct Counted {
    sent_per: f64,
    all_per: f64,
    largest: usize,
    records: usize,
    report: String,
}

async fn count_turns(app: &crate::app::App, turns: &[String]) -> Counted {
    let ns = app.topology.namespace.clone();
    let (status, _) = app
        .post_to(Some("tok-a"), "/api/ai/agent/execute", turn("warm".into()))
        .await;
    assert_eq!(status, 200);
    let monitor = Monitor::start(&ns);
    for body in turns {
        let (status, body) = app
            .post_to(Some("tok-a"), "/api/ai/agent/execute", body.clone())
            .await;
        assert_eq!(status, 200, "{body}");
        assert_eq!(body["result"]["kind"], "final", "{body}");
    }
    // The last turn's reply reached the client after its settle; what follows it (the
    // worker's ack bookkeeping) is given a moment to show — an absence cannot be waited for.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let lines = monitor.stop();
    let mut sent = BTreeMap::<String, usize>::new();
    let mut inside = BTreeMap::<String, usize>::new();
    for (in_script, name) in lines.iter().filter_map(|l| read(l)) {
        *if in_script { &mut inside } else { &mut sent }
            .entry(name)
            .or_default() += 1;
    }
    // The last record written of each turn: what a settled turn keeps.
    let turn_keys = format!("{ns}:turn:{{");
    let mut records = BTreeMap::<String, usize>::new();
    for args in lines.iter().map(|l| arguments(l)) {
        if args.len() >= 3
            && args[0].eq_ignore_ascii_case(b"SET")
            && args[1].starts_with(turn_keys.as_bytes())
        {
            records.insert(
                String::from_utf8_lossy(&args[1]).into_owned(),
                args[2].len(),
            );
        }
    }
    let largest = records.values().copied().max().unwrap_or(0);
    let per = |m: &BTreeMap<String, usize>| m.values().sum::<usize>() as f64 / turns.len() as f64;
    let (sent_per, all_per) = (per(&sent), per(&sent) + per(&inside));
    let report = format!(
        "per turn: {sent_per:.2} sent, {all_per:.2} commands in all; turn records up to {largest} bytes ({} turns)\n  sent: {sent:?}\n  inside scripts: {inside:?}",
        records.len()
    );
    println!("{report}");
    assert!(
        sent_per > 0.0,
        "no command of the namespace was seen: {report}"
    );
    Counted {
        sent_per,
        all_per,
        largest,
        records: records.len(),
        report,
    }
}

#[tokio::test]
async fn a_turn_costs_redis_a_counted_number_of_commands() {
    let app = services().await;
    const TURNS: usize = 20;
    let turns: Vec<String> = (0..TURNS).map(|i| turn(format!("s{i}"))).collect();
    let c = count_turns(&app, &turns).await;
    let report = &c.report;
    assert!(at_most(c.sent_per, MOST_SENT_PER_TURN), "{report}");
    assert!(at_most(c.all_per, MOST_COMMANDS_PER_TURN), "{report}");
    assert_eq!(
        c.records, TURNS,
        "every turn's record was seen written: {report}"
    );
    assert!(c.largest <= MOST_RECORD_BYTES, "{report}");
}

/// A session's later turns (its second to eleventh), first counted 2026-12-05: 24.2 in all a
/// turn; 23.2 once a latch holding the value asked for was written again with its expiry
/// (`SET … GET PX`) instead of read and then kept (`SET NX GET` + `PEXPIRE`). Beside a new
/// session's 20: the contexts it latched kept as long as its turns, its conversation listed (`RPUSH` + `PEXPIRE`: the first turn's
/// items moved by the second turn's save, each later turn's appended and the list kept as long
/// as the session), the day's tally of cached input (a continued call reads its earlier input
/// from the cache) and, once, the prompt of a continued call kept (`PSETEX`).
const MOST_COMMANDS_PER_LATER_TURN: f64 = 23.2;
const MOST_SENT_PER_LATER_TURN: f64 = 3.1;

/// `per_turn` is within `ceiling` (a count over ten turns is a tenth: compared to a hundredth).
fn at_most(per_turn: f64, ceiling: f64) -> bool {
    per_turn <= ceiling + 0.005
}

#[tokio::test]
async fn a_sessions_later_turns_cost_redis_a_counted_number_of_commands() {
    let app = services().await;
    let (status, _) = app
        .post_to(
            Some("tok-a"),
            "/api/ai/agent/execute",
            turn_of("long", "t0"),
        )
        .await;
    assert_eq!(status, 200);
    let turns: Vec<String> = (1..=10)
        .map(|i| turn_of("long", &format!("t{i}")))
        .collect();
    let c = count_turns(&app, &turns).await;
    let report = &c.report;
    assert!(at_most(c.sent_per, MOST_SENT_PER_LATER_TURN), "{report}");
    assert!(at_most(c.all_per, MOST_COMMANDS_PER_LATER_TURN), "{report}");
    assert_eq!(c.records, turns.len(), "{report}");
}

#[test]
fn a_monitor_line_is_read() {
    assert_eq!(
        read(r#"1732780000.123456 [0 127.0.0.1:5555] "evalsha" "abc" "2" "k1""#),
        Some((false, "EVALSHA".into()))
    );
    assert_eq!(
        read(r#"1732780000.123456 [0 lua] "PEXPIRE" "ns:session:s" "1000""#),
        Some((true, "PEXPIRE".into()))
    );
    assert_eq!(
        arguments(r#"1.0 [0 lua] "SET" "k" "{\"a\":\"\\u00e9\"}\xc3\xa9""#),
        [&b"SET"[..], b"k", "{\"a\":\"\\u00e9\"}\u{e9}".as_bytes()]
    );
}

/// Turns admitted at once by one front door: their runs index notes are written together
/// (one `ZADD` for the notes that came while the previous one was in flight, rather than one
/// inside each admission's script), each turn's accept answer waits for its note, and every
/// turn is listed.
#[tokio::test]
async fn turns_admitted_at_once_are_noted_together_and_every_one_listed() {
    let app = services().await;
    let ns = app.topology.namespace.clone();
    let (status, _) = app.post(Some("tok-a"), turn("warm".into())).await;
    assert_eq!(status, 202);
    let monitor = Monitor::start(&ns);
    const TURNS: usize = 60;
    let tag = uuid::Uuid::new_v4().simple().to_string()[..8].to_string();
    let sessions: Vec<String> = (0..TURNS).map(|i| format!("at-once-{tag}-{i}")).collect();
    let posts = sessions
        .iter()
        .map(|s| app.post(Some("tok-a"), turn(s.clone())));
    for (status, body) in futures_util::future::join_all(posts).await {
        assert_eq!(status, 202, "{body}");
    }
    let lines = monitor.stop();
    let runs_key = format!("\"{ns}:runs:{{");
    let zadds = lines
        .iter()
        .filter(|l| l.contains("\"ZADD\"") || l.contains("\"zadd\""))
        .filter(|l| l.contains(&runs_key))
        .count();
    let noted: usize = lines
        .iter()
        .filter(|l| l.contains(&runs_key))
        .map(|l| arguments(l))
        .filter(|a| a.first().is_some_and(|c| c.eq_ignore_ascii_case(b"ZADD")))
        .map(|a| (a.len() - 3) / 2)
        .sum();
    println!("{TURNS} turns at once: {zadds} ZADDs of the runs index, {noted} entries");
    assert_eq!(noted, TURNS, "each turn noted once");
    assert!(
        zadds > 0 && zadds < TURNS,
        "notes with company are written together: {zadds} ZADDs for {TURNS} turns"
    );
    let (status, body) = app.get(Some("tok-a"), "/v1/turns?limit=200").await;
    assert_eq!(status, 200, "{body}");
    let listed: std::collections::BTreeSet<&str> = body["result"]["turns"]
        .as_array()
        .expect("a page of turns")
        .iter()
        .filter_map(|l| l["sessionId"].as_str())
        .collect();
    for s in &sessions {
        assert!(listed.contains(s.as_str()), "{s} is listed: {body}");
    }
}
