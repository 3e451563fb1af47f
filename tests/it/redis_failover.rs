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
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn cli(port: u16, args: &[&str]) -> Result<String, String> {
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
async fn until(within: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + within;
    while !check() {
        assert!(Instant::now() < deadline, "{what}: not within {within:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A primary, two replicas (each linked through a stallable proxy), one Sentinel and haproxy.
struct Replicated {
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

fn redis_server(port: u16, dir: &std::path::Path, extra: &[String]) -> Child {
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

async fn app_on(redis: &Replicated, min_replicas: u32) -> App {
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
async fn execute(
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
async fn get_after_failover(app: &App, path: &str) -> (u16, Value) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let (status, body) = app.get(Some("tok-a"), path).await;
        if status != 503 || Instant::now() > deadline {
            return (status, body);
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

fn answer_text(body: &Value) -> &str {
    body["result"]["primaryOutputText"]
        .as_str()
        .unwrap_or_else(|| panic!("not a final answer: {body}"))
}

/// Without `WAIT`, replication is asynchronous: a result the client was given and the failover
/// then loses. This is the loss `APTIX_REDIS_MIN_REPLICAS` exists for.
#[tokio::test]
async fn without_min_replicas_a_failover_can_lose_a_result_the_client_was_given() {
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
async fn with_min_replicas_no_result_the_client_was_given_is_lost_in_a_failover() {
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
async fn turn_events(app: &App) -> tokio::sync::mpsc::UnboundedReceiver<Value> {
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
async fn with_min_replicas_a_cancel_is_told_once_a_replica_holds_it() {
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
struct ReplicatedCluster {
    dir: std::path::PathBuf,
    nodes: Vec<(Child, u16)>,
    urls: String,
}

/// A port whose cluster bus port (+10000) is free too.
fn free_cluster_port() -> u16 {
    loop {
        let port = free_port();
        if port < 55_000 && std::net::TcpListener::bind(("127.0.0.1", port + 10_000)).is_ok() {
            return port;
        }
    }
}

/// One node of the cluster (started again on the same port and directory, it rejoins with the
/// node id its `nodes.conf` keeps).
fn cluster_node(dir: &std::path::Path, port: u16) -> Child {
    redis_server(
        port,
        &dir.join(port.to_string()),
        &[
            "--cluster-enabled".into(),
            "yes".into(),
            "--cluster-config-file".into(),
            "nodes.conf".into(),
            "--cluster-node-timeout".into(),
            "2000".into(),
            "--repl-diskless-sync-delay".into(),
            "0".into(),
        ],
    )
}

impl ReplicatedCluster {
    async fn start() -> Self {
        let dir = std::env::temp_dir().join(format!(
            "aptix-cluster-failover-{}",
            uuid::Uuid::new_v4().simple()
        ));
        let mut nodes = Vec::new();
        for _ in 0..6 {
            let port = free_cluster_port();
            nodes.push((cluster_node(&dir, port), port));
        }
        for (_, port) in &nodes {
            until(Duration::from_secs(10), "a node answers", || {
                cli(*port, &["ping"]).is_ok()
            })
            .await;
        }
        let mut create = vec!["--cluster".to_string(), "create".to_string()];
        create.extend(nodes.iter().map(|(_, p)| format!("127.0.0.1:{p}")));
        create.extend(["--cluster-replicas", "1", "--cluster-yes"].map(String::from));
        let out = Command::new("redis-cli").args(&create).output().unwrap();
        assert!(
            out.status.success(),
            "redis-cli --cluster create: {}",
            String::from_utf8_lossy(&out.stdout)
        );
        let cluster = Self {
            urls: nodes
                .iter()
                .map(|(_, p)| format!("redis://127.0.0.1:{p}/"))
                .collect::<Vec<_>>()
                .join(","),
            dir,
            nodes,
        };
        until(
            Duration::from_secs(30),
            "every node sees the cluster ok with its replicas in sync",
            || {
                cluster.nodes.iter().all(|(_, p)| {
                    cli(*p, &["cluster", "info"]).is_ok_and(|i| i.contains("cluster_state:ok"))
                }) && cluster.masters().iter().all(|(p, _)| {
                    cli(*p, &["info", "replication"]).is_ok_and(|i| i.contains("state=online"))
                })
            },
        )
        .await;
        cluster
    }

    /// The masters now, each with its slot ranges.
    fn masters(&self) -> Vec<(u16, Vec<(u16, u16)>)> {
        let Some(any) = self
            .nodes
            .iter()
            .find_map(|(_, p)| cli(*p, &["cluster", "nodes"]).ok())
        else {
            return Vec::new();
        };
        any.lines()
            .filter(|l| l.contains("master") && !l.contains("fail"))
            .filter_map(|l| {
                let fields: Vec<&str> = l.split_whitespace().collect();
                let port = fields.get(1)?.split(['@', ':']).nth(1)?.parse().ok()?;
                let ranges = fields
                    .iter()
                    .skip(8)
                    .filter_map(|r| {
                        let (a, b) = r.split_once('-').unwrap_or((r, r));
                        Some((a.parse().ok()?, b.parse().ok()?))
                    })
                    .collect();
                Some((port, ranges))
            })
            .collect()
    }

    /// The master that holds `key`'s slot.
    fn master_of(&self, key: &str) -> u16 {
        let slot: u16 = cli(self.nodes[0].1, &["cluster", "keyslot", key])
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        self.masters()
            .into_iter()
            .find(|(_, ranges)| ranges.iter().any(|(a, b)| (*a..=*b).contains(&slot)))
            .map(|(p, _)| p)
            .expect("a master holds every slot")
    }

    /// Starts a killed node again: it comes back as a replica of the master that replaced it.
    async fn restart(&mut self, port: u16) {
        let node = self
            .nodes
            .iter_mut()
            .find(|(_, p)| *p == port)
            .expect("a node of the cluster");
        node.0 = cluster_node(&self.dir, port);
        until(
            Duration::from_secs(30),
            "the old master is a replica again",
            || {
                cli(port, &["info", "replication"])
                    .is_ok_and(|i| i.contains("role:slave") && i.contains("master_link_status:up"))
            },
        )
        .await;
    }

    fn kill(&mut self, port: u16) {
        let (child, _) = self
            .nodes
            .iter_mut()
            .find(|(_, p)| *p == port)
            .expect("a node of the cluster");
        child.kill().expect("SIGKILL");
        let _ = child.wait();
    }
}

impl Drop for ReplicatedCluster {
    fn drop(&mut self) {
        for (child, _) in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Sends a request until it is answered with something other than 503 (or `within` passes);
/// every answer must come within the HTTP client's bound.
async fn patiently(
    app: &App,
    send: impl Fn() -> reqwest::RequestBuilder,
    within: Duration,
) -> (u16, Value, u32) {
    let deadline = Instant::now() + within;
    let mut refused = 0;
    loop {
        let resp = send()
            .timeout(Duration::from_secs(40))
            .send()
            .await
            .expect("every request is answered within 40 s");
        let status = resp.status().as_u16();
        let body: Value = resp.json().await.unwrap_or(Value::Null);
        if status != 503 || Instant::now() > deadline {
            return (status, body, refused);
        }
        refused += 1;
        let _ = app;
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Under load, the master holding a busy part of the sessions is SIGKILLed and its replica
/// takes over (with `APTIX_REDIS_MIN_REPLICAS=1`), then the old master is started again as the
/// new one's replica: every turn a client submitted completes, once, in order within its
/// session; every request is answered within its bound (a 503 is sent again, as a client
/// does).
#[tokio::test]
async fn a_redis_cluster_master_killed_under_load_is_replaced_and_every_turn_completes_once() {
    let mut cluster = ReplicatedCluster::start().await;
    let app = std::sync::Arc::new(
        spawn(AppOptions {
            redis_url: Some(cluster.urls.clone()),
            fake: aptix_worker::fake_llm::FakeOptions {
                latency: Duration::from_millis(300),
                ..Default::default()
            },
            extra_env: vec![
                ("APTIX_REDIS_CLUSTER", "true".into()),
                ("APTIX_REDIS_MIN_REPLICAS", "1".into()),
                ("APTIX_REDIS_REPLICA_TIMEOUT_MS", "500".into()),
                ("APTIX_MAX_ATTEMPTS", "1000".into()),
            ],
            ..AppOptions::default()
        })
        .await,
    );
    const SESSIONS: usize = 24;
    const TURNS: usize = 6;
    let run = uuid::Uuid::new_v4().simple().to_string();
    let sessions: Vec<String> = (0..SESSIONS).map(|i| format!("fo-{run}-{i}")).collect();
    let victim = cluster.master_of(&format!("{{{}}}", sessions[0]));
    let on_victim = sessions
        .iter()
        .filter(|s| cluster.master_of(&format!("{{{s}}}")) == victim)
        .count();
    let clients: Vec<_> = sessions
        .iter()
        .map(|sid| {
            let (app, sid) = (app.clone(), sid.clone());
            tokio::spawn(async move {
                let mut refused = 0;
                for t in 0..TURNS {
                    let body =
                        json!({"sessionId": sid, "turnId": format!("t{t}"), "instruction": "x"});
                    let (status, answer, r) = patiently(
                        &app,
                        || {
                            app.http
                                .post(format!("{}/v1/turns", app.base))
                                .bearer_auth("tok-a")
                                .body(body.to_string())
                        },
                        Duration::from_secs(60),
                    )
                    .await;
                    refused += r;
                    assert!(
                        status == 202 || status == 200,
                        "{sid} t{t}: {status} {answer}"
                    );
                    let deadline = Instant::now() + Duration::from_secs(90);
                    loop {
                        let (status, view, r) = patiently(
                            &app,
                            || {
                                app.http
                                    .get(format!(
                                        "{}/v1/sessions/{sid}/turns/t{t}?wait=10",
                                        app.base
                                    ))
                                    .bearer_auth("tok-a")
                            },
                            Duration::from_secs(60),
                        )
                        .await;
                        refused += r;
                        if status == 200 && view["result"]["status"] == "completed" {
                            break;
                        }
                        assert!(
                            Instant::now() < deadline,
                            "{sid} t{t} did not complete: {status} {view}"
                        );
                    }
                }
                refused
            })
        })
        .collect();
    // Every session is in its second or third turn when the master dies.
    tokio::time::sleep(Duration::from_millis(800)).await;
    cluster.kill(victim);
    let killed = Instant::now();
    // A replica takes over; then, as an operator would, the old master is started again and
    // becomes the new one's replica (until then, with APTIX_REDIS_MIN_REPLICAS=1, the turns of
    // its slots wait: a master without a replica cannot make a turn count).
    until(Duration::from_secs(30), "a replica took over", || {
        let masters = cluster.masters();
        masters.len() == 3 && masters.iter().all(|(p, _)| *p != victim)
    })
    .await;
    let failed_over = killed.elapsed();
    cluster.restart(victim).await;
    let mut refused = 0;
    for c in clients {
        refused += c.await.expect("a client");
    }
    eprintln!(
        "{SESSIONS} sessions × {TURNS} turns; {on_victim} sessions on the killed master; \
         replaced after {failed_over:?}; {refused} requests answered 503 and sent again; \
         all done {:?} after the kill",
        killed.elapsed()
    );
    // Every session holds its turns once each, in order, each completed.
    for sid in &sessions {
        let (status, view) = app.get(Some("tok-a"), &format!("/v1/sessions/{sid}")).await;
        assert_eq!(status, 200, "{view}");
        let turns: Vec<(&str, &str)> = view["result"]["turns"]
            .as_array()
            .unwrap_or_else(|| panic!("{view}"))
            .iter()
            .map(|t| {
                (
                    t["turnId"].as_str().unwrap_or_default(),
                    t["status"].as_str().unwrap_or_default(),
                )
            })
            .collect();
        let expected: Vec<(String, &str)> =
            (0..TURNS).map(|t| (format!("t{t}"), "completed")).collect();
        let turns: Vec<(String, &str)> =
            turns.into_iter().map(|(t, s)| (t.to_string(), s)).collect();
        assert_eq!(turns, expected, "{sid}: {view}");
    }
}
