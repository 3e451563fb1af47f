//! A Redis Cluster of three masters, started by the tests (`redis-server --cluster-enabled yes`
//! on three free ports, joined by `redis-cli --cluster create`), shared by every test of the
//! binary that needs it; and a turn end to end with the store and the index on it.
//!
//! The nodes keep nothing on disk and stop by themselves once the test binary has exited (each
//! runs under a shell that watches the test process).

use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use aptix_worker::store::Retention;
use aptix_worker::store::redis::{RedisOptions, RedisStore};
use serde_json::json;

use crate::app::{AppOptions, spawn};

/// The running cluster: its nodes as `APTIX_REDIS_URL` names them.
pub struct Cluster {
    pub urls: String,
}

static CLUSTER: OnceLock<Result<Cluster, String>> = OnceLock::new();

/// The shared cluster, started on first use.
pub async fn cluster() -> &'static Cluster {
    let started = tokio::task::spawn_blocking(|| {
        CLUSTER
            .get_or_init(start)
            .as_ref()
            .map(|c| c.urls.clone())
            .map_err(Clone::clone)
    })
    .await
    .expect("cluster start-up task");
    if let Err(why) = started {
        panic!("the Redis Cluster for the tests did not start: {why}");
    }
    match CLUSTER.get() {
        Some(Ok(c)) => c,
        _ => unreachable!("initialised above"),
    }
}

/// Three ports whose cluster bus ports (+10000) are free too.
fn free_ports() -> Vec<u16> {
    let mut ports = Vec::new();
    let mut candidate = 20_000 + (std::process::id() % 20_000) as u16;
    while ports.len() < 3 {
        candidate = if candidate >= 40_000 {
            20_000
        } else {
            candidate + 7
        };
        let free = |p: u16| std::net::TcpListener::bind(("127.0.0.1", p)).is_ok();
        if free(candidate) && free(candidate + 10_000) {
            ports.push(candidate);
        }
    }
    ports
}

fn redis_cli(args: &[String]) -> Result<String, String> {
    let out = Command::new("redis-cli")
        .args(args)
        .output()
        .map_err(|e| format!("redis-cli: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if out.status.success() {
        Ok(text)
    } else {
        Err(format!(
            "redis-cli {args:?}: {text}{}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

fn start() -> Result<Cluster, String> {
    let dir = std::env::temp_dir().join(format!("aptix-cluster-{}", uuid::Uuid::new_v4().simple()));
    std::fs::create_dir_all(&dir).map_err(|e| e.to_string())?;
    let ports = free_ports();
    let parent = std::process::id();
    for port in &ports {
        let server = format!(
            "redis-server --port {port} --bind 127.0.0.1 --cluster-enabled yes \
             --cluster-config-file nodes-{port}.conf --cluster-node-timeout 2000 \
             --save '' --appendonly no --dir {dir}",
            dir = dir.display()
        );
        // The node lives as long as the test process: the shell stops it when that is gone.
        let watch = format!(
            "{server} & node=$!; while kill -0 {parent} 2>/dev/null; do sleep 1; done; kill $node"
        );
        Command::new("sh")
            .args(["-c", &watch])
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .map_err(|e| format!("starting redis-server: {e}"))?;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for port in &ports {
        while redis_cli(&["-p".into(), port.to_string(), "ping".into()]).is_err() {
            if Instant::now() > deadline {
                return Err(format!("node {port} did not answer"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let mut create = vec!["--cluster".to_string(), "create".to_string()];
    create.extend(ports.iter().map(|p| format!("127.0.0.1:{p}")));
    create.extend(["--cluster-replicas", "0", "--cluster-yes"].map(String::from));
    redis_cli(&create)?;
    for port in &ports {
        loop {
            let info = redis_cli(&[
                "-p".into(),
                port.to_string(),
                "cluster".into(),
                "info".into(),
            ])?;
            if info.contains("cluster_state:ok") {
                break;
            }
            if Instant::now() > deadline {
                return Err(format!("node {port}: {info}"));
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
    let urls = ports
        .iter()
        .map(|p| format!("redis://127.0.0.1:{p}/"))
        .collect::<Vec<_>>()
        .join(",");
    Ok(Cluster { urls })
}

/// A session store on the shared cluster under a fresh namespace.
pub async fn cluster_store() -> RedisStore {
    let c = cluster().await;
    RedisStore::connect_with(
        &c.urls,
        &format!("aptix-test-{}", uuid::Uuid::new_v4().simple()),
        Retention::default(),
        &RedisOptions {
            cluster: true,
            ..RedisOptions::default()
        },
    )
    .await
    .expect("the cluster is reachable")
}

#[tokio::test]
async fn a_session_s_keys_share_one_slot_and_sessions_land_on_many_slots() {
    let c = cluster().await;
    let store = cluster_store().await;
    let first = c.urls.split(',').next().unwrap().to_string();
    let port = first
        .trim_start_matches("redis://127.0.0.1:")
        .trim_end_matches('/');
    let slot = |key: &str| {
        redis_cli(&[
            "-p".into(),
            port.into(),
            "cluster".into(),
            "keyslot".into(),
            key.into(),
        ])
        .unwrap()
        .trim()
        .to_string()
    };
    let ns = store.namespace();
    for kind in ["session", "turns", "lease", "owner"] {
        assert_eq!(
            slot(&format!("{ns}:{kind}:{{s1}}")),
            slot(&format!("{ns}:turn:{{s1}}:t1")),
            "{kind}"
        );
    }
    let slots: std::collections::HashSet<String> = (0..50)
        .map(|i| slot(&format!("{ns}:session:{{s{i}}}")))
        .collect();
    assert!(slots.len() > 10, "sessions land on many slots: {slots:?}");
}

#[tokio::test]
async fn a_turn_runs_end_to_end_with_the_store_on_a_redis_cluster() {
    let c = cluster().await;
    let app = spawn(AppOptions {
        redis_url: Some(c.urls.clone()),
        extra_env: vec![("APTIX_REDIS_CLUSTER", "true".into())],
        ..AppOptions::default()
    })
    .await;
    let mut sessions = Vec::new();
    for i in 0..6 {
        let sid = format!("cluster-{i}-{}", uuid::Uuid::new_v4().simple());
        let body = json!({"sessionId": sid, "turnId": "t", "instruction": "hi"});
        let (status, accepted) = app.post(Some("tok-a"), body.to_string()).await;
        assert_eq!(status, 202, "{accepted}");
        sessions.push(sid);
    }
    for sid in &sessions {
        let result = app.settled("tok-a", sid, "t").await;
        assert_eq!(result["status"], "completed", "{result}");
        let stored = app
            .store
            .get_turn(
                &crate::support::sid_a(sid),
                &aptix_worker::contract::TurnId::parse("t").unwrap(),
            )
            .await
            .unwrap()
            .expect("stored on the cluster");
        assert_eq!(stored.status, aptix_worker::store::TurnStatus::Completed);
    }
    // A second turn of a session sees the first (the session's state is on the cluster).
    let body = json!({"sessionId": sessions[0], "turnId": "t2", "instruction": "again"});
    let (status, _) = app.post(Some("tok-a"), body.to_string()).await;
    assert_eq!(status, 202);
    let result = app.settled("tok-a", &sessions[0], "t2").await;
    assert_eq!(result["status"], "completed", "{result}");
    let (status, view) = app
        .get(Some("tok-a"), &format!("/v1/sessions/{}", sessions[0]))
        .await;
    assert_eq!(status, 200, "{view}");
    assert_eq!(
        view["result"]["turns"].as_array().map(Vec::len),
        Some(2),
        "{view}"
    );
}
