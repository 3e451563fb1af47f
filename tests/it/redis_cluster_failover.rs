//! A Redis Cluster master killed under load: replaced, and every turn completes once.

use super::redis_failover::*;
use crate::app::{App, AppOptions, spawn};
use serde_json::{Value, json};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

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
