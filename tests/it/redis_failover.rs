//! Redis with replicas that fails over, run the way a deployment without Redis Cluster runs
//! it: a primary and two replicas, Sentinel deciding the failover, and haproxy in front sending
//! every client to whichever server answers `role:master` (the documented alternative to a
//! Sentinel-aware client). Each replica's link to the primary goes through a proxy the test can
//! stall: the replicas fall behind on purpose (on loopback they never lag otherwise), so a
//! failover loses what the primary had not passed on.
//!
//! Without `APTIX_REDIS_MIN_REPLICAS` a result the client was given can be lost that way; with
//! it, nothing a client was told survives only on the primary: the turn waits until a replica
//! holds it, and after the failover it runs again on the new primary and answers once.

use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{Value, json};

use crate::app::{App, AppOptions, spawn};
use crate::support::StallProxy;

/// A port nothing listens on now.
pub(super) fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

pub(super) fn cli(port: u16, args: &[&str]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(["-h", "127.0.0.1", "-p", &port.to_string()])
        .args(args)
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() && !text.starts_with("ERR") {
        Ok(text)
    } else {
        Err(format!("redis-cli -p {port} {args:?}: {text}"))
    }
}

/// Polls `check` every 100 ms until it holds, for up to `within`.
pub(super) async fn until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A primary, two replicas (each linked through a stallable proxy), one Sentinel and haproxy.
pub(super) struct Replicated {
    dir: std::path::PathBuf,
    primary: Child,
    primary_port: u16,
    replicas: Vec<(Child, u16)>,
    sentinel: Child,
    sentinel_port: u16,
    haproxy: Child,
    /// Where clients connect (haproxy).
    url: String,
    haproxy_port: u16,
    links: Vec<StallProxy>,
}

pub(super) fn redis_server(port: u16, dir: &std::path::Path, extra: &[String]) -> Child {
    std::fs::create_dir_all(dir).unwrap();
    Command::new("redis-server")
        .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
        .args(["--save", "", "--appendonly", "no"])
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("redis-server starts")
}

impl Replicated {
    async fn start() -> Self {
        let dir =
            std::env::temp_dir().join(format!("aptix-failover-{}", uuid::Uuid::new_v4().simple()));
        let primary_port = free_port();
        // Replicas sync at once (not after the default 5 s wait for more of them).
        let primary = redis_server(
            primary_port,
            &dir.join("primary"),
            &["--repl-diskless-sync-delay".into(), "0".into()],
        );
        until(Duration::from_secs(10), "the primary answers", || {
            cli(primary_port, &["ping"]).is_ok()
        })
        .await;
        let mut links = Vec::new();
        let mut replicas = Vec::new();
        for i in 0..2 {
            let link = StallProxy::start(&format!("127.0.0.1:{primary_port}")).await;
            let port = free_port();
            let child = redis_server(
                port,
                &dir.join(format!("replica{i}")),
                &[
                    "--replicaof".into(),
                    "127.0.0.1".into(),
                    link.addr.port().to_string(),
                ],
            );
            links.push(link);
            replicas.push((child, port));
        }
        until(Duration::from_secs(20), "both replicas are in sync", || {
            cli(primary_port, &["info", "replication"]).is_ok_and(|i| {
                i.contains("connected_slaves:2") && i.matches("state=online").count() == 2
            })
        })
        .await;
        let sentinel_port = free_port();
        let conf = dir.join("sentinel.conf");
        std::fs::write(
            &conf,
            format!(
                "port {sentinel_port}\nbind 127.0.0.1\ndir {}\n\
                 sentinel monitor m 127.0.0.1 {primary_port} 1\n\
                 sentinel down-after-milliseconds m 1000\n\
                 sentinel failover-timeout m 10000\n\
                 sentinel parallel-syncs m 1\n",
                dir.display()
            ),
        )
        .unwrap();
        let sentinel = Command::new("redis-server")
            .arg(&conf)
            .arg("--sentinel")
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server --sentinel starts");
        until(
            Duration::from_secs(10),
            "Sentinel knows both replicas",
            || {
                cli(sentinel_port, &["sentinel", "replicas", "m"])
                    .is_ok_and(|r| replicas.iter().all(|(_, p)| r.contains(&p.to_string())))
            },
        )
        .await;
        let haproxy_port = free_port();
        let servers: String = std::iter::once(primary_port)
            .chain(replicas.iter().map(|(_, p)| *p))
            .enumerate()
            .map(|(i, p)| {
                format!(
                    "  server r{i} 127.0.0.1:{p} check inter 200ms fall 2 rise 1 on-marked-down shutdown-sessions\n"
                )
            })
            .collect();
        let hconf = dir.join("haproxy.cfg");
        std::fs::write(
            &hconf,
            format!(
                "defaults\n  mode tcp\n  timeout connect 1s\n  timeout check 2s\n  timeout client 120s\n  timeout server 120s\n\
                 frontend redis\n  bind 127.0.0.1:{haproxy_port}\n  default_backend primary\n\
                 backend primary\n  option tcp-check\n  tcp-check connect\n\
                 \x20 tcp-check send PING\\r\\n\n  tcp-check expect string +PONG\n\
                 \x20 tcp-check send info\\ replication\\r\\n\n  tcp-check expect string role:master\n\
                 \x20 tcp-check send QUIT\\r\\n\n  tcp-check expect string +OK\n{servers}"
            ),
        )
        .unwrap();
        let haproxy = Command::new("haproxy")
            .arg("-db")
            .arg("-f")
            .arg(&hconf)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("haproxy starts (apt-get install haproxy; .ci/run does)");
        let served = Self {
            dir,
            primary,
            primary_port,
            replicas,
            sentinel,
            sentinel_port,
            haproxy,
            url: format!("redis://127.0.0.1:{haproxy_port}/"),
            haproxy_port,
            links,
        };
        until(
            Duration::from_secs(10),
            "haproxy reaches the primary",
            || served.behind_haproxy() == Some(primary_port),
        )
        .await;
        served
    }

    /// The port of the server haproxy sends clients to now, if any.
    fn behind_haproxy(&self) -> Option<u16> {
        let info = cli(self.haproxy_port, &["info", "server"]).ok()?;
        info.lines()
            .find_map(|l| l.strip_prefix("tcp_port:"))?
            .trim()
            .parse()
            .ok()
    }

    /// Waits until both replicas hold everything the primary has now: a write of our own,
    /// then `WAIT` on the same connection (a connection that wrote nothing has nothing to
    /// wait for).
    async fn replicas_caught_up(&self) {
        let client =
            redis::Client::open(format!("redis://127.0.0.1:{}/", self.primary_port)).unwrap();
        let mut conn = client.get_multiplexed_async_connection().await.unwrap();
        let (acked,): (i64,) = redis::pipe()
            .set("caught-up", 1)
            .ignore()
            .cmd("WAIT")
            .arg(2)
            .arg(5000)
            .query_async(&mut conn)
            .await
            .unwrap();
        assert_eq!(acked, 2, "both replicas acknowledged");
    }

    /// Stops passing the primary's writes on to the replicas.
    fn stall_replication(&self) {
        for link in &self.links {
            link.stall(true);
        }
    }

    /// SIGKILLs the primary and waits until Sentinel promoted a replica, the other follows it,
    /// and haproxy sends clients there.
    async fn fail_over(&mut self) -> u16 {
        self.primary.kill().expect("SIGKILL the primary");
        let _ = self.primary.wait();
        let ports: Vec<u16> = self.replicas.iter().map(|(_, p)| *p).collect();
        let mut promoted = 0;
        until(
            Duration::from_secs(30),
            "Sentinel promoted a replica",
            || {
                promoted = cli(
                    self.sentinel_port,
                    &["sentinel", "get-master-addr-by-name", "m"],
                )
                .ok()
                .and_then(|a| a.lines().nth(1).and_then(|p| p.trim().parse().ok()))
                .unwrap_or(0);
                ports.contains(&promoted)
                    && cli(promoted, &["info", "replication"]).is_ok_and(|i| {
                        i.contains("role:master") && i.contains("connected_slaves:1")
                    })
            },
        )
        .await;
        until(
            Duration::from_secs(10),
            "haproxy sends clients to the new primary",
            || self.behind_haproxy() == Some(promoted),
        )
        .await;
        promoted
    }
}

impl Drop for Replicated {
    fn drop(&mut self) {
        for child in [&mut self.primary, &mut self.sentinel, &mut self.haproxy]
            .into_iter()
            .chain(self.replicas.iter_mut().map(|(c, _)| c))
        {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(super) async fn app_on(redis: &Replicated, min_replicas: u32) -> App {
    spawn(AppOptions {
        redis_url: Some(redis.url.clone()),
        extra_env: vec![
            ("APTIX_REDIS_MIN_REPLICAS", min_replicas.to_string()),
            ("APTIX_REDIS_REPLICA_TIMEOUT_MS", "500".into()),
            // The stalled replicas hold turns back for a while; they must not give up.
            ("APTIX_MAX_ATTEMPTS", "1000".into()),
        ],
        ..AppOptions::default()
    })
    .await
}

/// A turn through the synchronous endpoint, as a client sends it: again after a 503-like
/// answer (the store's connection cut under the front door); its answer, or `None` if none came
/// in `within`.
pub(super) async fn execute(
    http: &reqwest::Client,
    base: &str,
    turn: &str,
    within: Duration,
) -> Option<Value> {
    let deadline = Instant::now() + within;
    loop {
        let answer: Value = http
            .post(format!("{base}/api/ai/agent/execute"))
            .bearer_auth("tok-a")
            .timeout(within)
            .body(json!({"sessionId": "s", "turnId": turn, "instruction": "x"}).to_string())
            .send()
            .await
            .ok()?
            .json()
            .await
            .ok()?;
        if answer["errors"][0]["errorCode"] != "SERVICE_UNAVAILABLE" || Instant::now() > deadline {
            return Some(answer);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A GET once the app's Redis connection has found the new primary (503 until then).
pub(super) async fn get_after_failover(app: &App, path: &str) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = app.get(Some("tok-a"), path).await;
        if status != 503 || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

pub(super) fn answer_text(body: &Value) -> &str {
    body["result"]["primaryOutputText"]
        .as_str()
        .unwrap_or_else(|| panic!("not a final answer: {body}"))
}

/// Without `WAIT`, replication is asynchronous: a result the client was given and the failover
/// then loses. This is the loss `APTIX_REDIS_MIN_REPLICAS` exists for.
#[tokio::test]
pub(super) async fn without_min_replicas_a_failover_can_lose_a_result_the_client_was_given() {
    let mut redis = Replicated::start().await;
    let app = app_on(&redis, 0).await;
    let first = execute(&app.http, &app.base, "t0", Duration::from_secs(30))
        .await
        .expect("t0 answered");
    answer_text(&first);
    // Everything so far is on both replicas; from now on nothing more gets there.
    redis.replicas_caught_up().await;
    redis.stall_replication();
    let given = execute(&app.http, &app.base, "t1", Duration::from_secs(30))
        .await
        .expect("t1 answered while the replicas lag");
    answer_text(&given);
    redis.fail_over().await;
    let (status, body) = get_after_failover(&app, "/v1/sessions/s/turns/t1").await;
    assert_eq!(
        status, 404,
        "the failover kept the result after all (the replicas did not lag): {body}"
    );
    let (status, _) = get_after_failover(&app, "/v1/sessions/s/turns/t0").await;
    assert_eq!(status, 200, "what the replicas had survives");
}

/// With `APTIX_REDIS_MIN_REPLICAS=1` a result counts only once a replica holds it: while the
/// replicas lag the client is told nothing (the job waits and tries again); after the failover
/// the turn runs on the new primary, the client gets one answer, and that answer is what the
/// store keeps.
#[tokio::test]
pub(super) async fn with_min_replicas_no_result_the_client_was_given_is_lost_in_a_failover() {
    let mut redis = Replicated::start().await;
    let app = app_on(&redis, 1).await;
    let first = execute(&app.http, &app.base, "t0", Duration::from_secs(30))
        .await
        .expect("t0 answered while the replicas keep up");
    answer_text(&first);
    redis.stall_replication();
    // The waiting client does what a client does with a 503-like answer (the store failing
    // over under its front door): sends the same turn again, until it gets the turn's answer.
    let waiting = {
        let (base, http) = (app.base.clone(), app.http.clone());
        tokio::spawn(async move {
            execute(&http, &base, "t1", Duration::from_secs(90))
                .await
                .expect("t1 answered")
        })
    };
    // While the replicas lag, nothing about t1 is told: the job keeps coming back.
    let deadline = Instant::now() + Duration::from_secs(15);
    loop {
        let metrics = app.metrics_text().await;
        let unreplicated = metrics.lines().any(|l| {
            l.starts_with("aptix_job_retries_total{reason=\"transient\"}") && !l.ends_with(" 0")
        });
        if unreplicated {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "no retry while the replicas lag:\n{metrics}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert!(
        !waiting.is_finished(),
        "t1 was answered while no replica held it"
    );
    redis.fail_over().await;
    let answered = tokio::time::timeout(Duration::from_secs(90), waiting)
        .await
        .expect("t1 answered after the failover")
        .expect("the waiting client");
    let text = answer_text(&answered).to_string();
    let (status, body) = get_after_failover(&app, "/v1/sessions/s/turns/t1").await;
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["result"]["status"], "completed", "{body}");
    assert_eq!(
        body["result"]["result"]["result"]["primaryOutputText"], text,
        "the store keeps the answer the client was given"
    );
}

/// The `turn` events of session `s`'s Server-Sent Events (as tenant A): their data, as they
/// come, on `seen`. Subscribed before it returns.
pub(super) async fn turn_events(app: &App) -> tokio::sync::mpsc::UnboundedReceiver<Value> {
    use futures_util::StreamExt as _;
    let resp = app
        .http
        .get(format!("{}/v1/sessions/s/events", app.base))
        .bearer_auth("tok-a")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let (seen, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut bytes = resp.bytes_stream();
        let mut buffer = String::new();
        while let Some(Ok(chunk)) = bytes.next().await {
            buffer.push_str(&String::from_utf8_lossy(&chunk));
            while let Some(end) = buffer.find("\n\n") {
                let frame: String = buffer.drain(..end + 2).collect();
                if frame.lines().any(|l| l == "event: turn")
                    && let Some(data) = frame.lines().find_map(|l| l.strip_prefix("data: "))
                    && let Ok(data) = serde_json::from_str(data)
                    && seen.send(data).is_err()
                {
                    return;
                }
            }
        }
    });
    rx
}

/// With `APTIX_REDIS_MIN_REPLICAS=1`, a cancel no replica holds yet is answered 503 and told to
/// nobody (a failover could bring the turn back as waiting); the client's cancel sent again once
/// a replica holds it is answered 200 and the session's watchers hear `cancelled` then. (Before,
/// the second cancel found the turn cancelled and told nobody.)
#[tokio::test]
pub(super) async fn with_min_replicas_a_cancel_is_told_once_a_replica_holds_it() {
    let redis = Replicated::start().await;
    let app = app_on(&redis, 1).await;
    let instruction = "#fake:call workspace_read_file {\"path\":\"README.md\"}";
    let body = json!({"sessionId": "s", "turnId": "t", "instruction": instruction});
    // Sent again after a 503, as a client does (the app's first Redis connection can meet
    // haproxy still settling on the primary).
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, answer) = app.post(Some("tok-a"), body.to_string()).await;
        if status == 202 {
            break;
        }
        assert!(
            status == 503 && Instant::now() < deadline,
            "{status} {answer}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let waiting = app.settled("tok-a", "s", "t").await;
    assert_eq!(waiting["status"], "awaiting_client_tools", "{waiting}");
    let mut events = turn_events(&app).await;
    redis.stall_replication();
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/sessions/s/turns/t/cancel", Vec::new())
        .await;
    assert_eq!(status, 503, "no replica holds the cancel: {body}");
    let told = tokio::time::timeout(Duration::from_secs(2), events.recv()).await;
    assert!(told.is_err(), "told before a replica held it: {told:?}");
    for link in &redis.links {
        link.stall(false);
    }
    redis.replicas_caught_up().await;
    let (status, body) = app
        .post_to(Some("tok-a"), "/v1/sessions/s/turns/t/cancel", Vec::new())
        .await;
    assert_eq!(
        (status, &body["result"]["status"]),
        (200, &json!("cancelled")),
        "{body}"
    );
    let told = tokio::time::timeout(Duration::from_secs(10), events.recv())
        .await
        .expect("the watchers hear of the cancel")
        .expect("the stream goes on");
    assert_eq!(
        (&told["turnId"], &told["status"]),
        (&json!("t"), &json!("cancelled")),
        "{told}"
    );
}

/// A Redis Cluster of three masters, each with a replica, for one test.
pub(super) struct ReplicatedCluster {
    pub(super) dir: std::path::PathBuf,
    pub(super) nodes: Vec<(Child, u16)>,
    pub(super) urls: String,
}
