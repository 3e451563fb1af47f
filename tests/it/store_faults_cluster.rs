//! Cuts at every write on a Redis Cluster, and a cancel whose answer is lost.

use super::store_faults::*;
use crate::support::request;
use aptix_worker::contract::SessionId;
use aptix_worker::frontdoor::Pickup;
use aptix_worker::store::redis::{RedisOptions, RedisStore};
use aptix_worker::store::{Retention, SessionStore};
use serde_json::{Value, json};
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[tokio::test]
async fn a_cut_at_any_write_of_a_turn_loses_nothing_on_a_redis_cluster() {
    let dir = std::env::temp_dir().join(format!(
        "aptix-cut-cluster-{}",
        uuid::Uuid::new_v4().simple()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    let mut listeners = Vec::new();
    for _ in 0..3 {
        listeners.push(listener().await);
    }
    let mut ports: Vec<u16> = Vec::new();
    while ports.len() < 3 {
        let p = crate::support::free_port();
        let bus_free = std::net::TcpListener::bind(("127.0.0.1", p + 10_000)).is_ok();
        if p < 55_000 && bus_free && !ports.contains(&p) {
            ports.push(p);
        }
    }
    let mut cluster = ProxiedCluster {
        children: Vec::new(),
        dir: dir.clone(),
        ports: ports.clone(),
    };
    for (port, (_, proxy_port)) in ports.iter().zip(&listeners) {
        let child = Command::new("redis-server")
            .args([
                "--port",
                &port.to_string(),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
            ])
            .args(["--appendonly", "no", "--cluster-enabled", "yes"])
            .args(["--cluster-config-file", &format!("nodes-{port}.conf")])
            .args(["--cluster-node-timeout", "2000"])
            .args(["--cluster-announce-ip", "127.0.0.1"])
            .args(["--cluster-announce-port", &proxy_port.to_string()])
            .args(["--cluster-announce-bus-port", &(port + 10_000).to_string()])
            .arg("--dir")
            .arg(&dir)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("redis-server must be installed");
        cluster.children.push(child);
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    for port in &cluster.ports {
        while redis_ping(*port).is_err() {
            assert!(Instant::now() < deadline, "node {port} did not start");
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    let probe = RedisStore::connect(
        &format!("redis://127.0.0.1:{}/", ports[0]),
        "probe",
        Retention::default(),
    )
    .await
    .unwrap();
    let mut proxies = Proxies::new(write_scripts(&probe));
    let mut urls = Vec::new();
    for ((l, proxy_port), port) in listeners.into_iter().zip(&ports) {
        proxies.serve(l, format!("127.0.0.1:{port}"));
        urls.push(format!("redis://127.0.0.1:{proxy_port}/"));
    }
    let nodes: Vec<String> = ports.iter().map(|p| format!("127.0.0.1:{p}")).collect();
    let created = tokio::task::spawn_blocking(move || {
        Command::new("redis-cli")
            .args(["--cluster", "create"])
            .args(&nodes)
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .output()
    })
    .await
    .unwrap()
    .expect("redis-cli must be installed");
    assert!(
        created.status.success(),
        "cluster create: {}",
        String::from_utf8_lossy(&created.stdout)
    );
    for port in &ports {
        loop {
            let info: String = redis::cmd("CLUSTER")
                .arg("INFO")
                .query(
                    &mut redis::Client::open(format!("redis://127.0.0.1:{port}/"))
                        .unwrap()
                        .get_connection()
                        .unwrap(),
                )
                .unwrap();
            if info.contains("cluster_state:ok") {
                break;
            }
            assert!(
                Instant::now() < deadline + Duration::from_secs(20),
                "node {port}: {info}"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    let url = urls.join(",");
    let preload_all = || async {
        for port in &ports {
            preload(&format!("redis://127.0.0.1:{port}/")).await;
        }
    };
    preload_all().await;
    every_cut(&proxies, &url, true).await;
    drop(cluster);
}

/// A cancel of a queued turn whose compare-and-set ran but whose answer was lost: the front
/// door reads the record back, finds the turn cancelled by its own step, and still publishes
/// the cancelled status (before, the client got an error, a second cancel found the turn
/// cancelled, and no subscriber ever heard of it).
#[tokio::test]
async fn a_cancel_whose_answer_is_lost_still_publishes_the_cancelled_status() {
    use aptix_worker::contract::{RequestLimits, TurnId};
    use aptix_worker::frontdoor::FrontDoor;
    use aptix_worker::frontdoor::cancel::Cancelled;
    use aptix_worker::queue::{MemoryBroker, ReplyBus as _};
    use aptix_worker::trace::TraceContext;

    let target = crate::support::redis_url();
    preload(&target).await;
    let probe = RedisStore::connect(&target, "probe", Retention::default())
        .await
        .expect("Redis must be running for this test");
    let mut proxies = Proxies::new(write_scripts(&probe));
    let (l, port) = listener().await;
    proxies.serve(
        l,
        target
            .trim_start_matches("redis://")
            .trim_end_matches('/')
            .to_string(),
    );
    let ns = format!("aptix-test-{}", uuid::Uuid::new_v4().simple());
    let store: Arc<dyn SessionStore> = Arc::new(
        RedisStore::connect_with(
            &format!("redis://127.0.0.1:{port}/"),
            &ns,
            Retention::default(),
            &RedisOptions {
                timeout: Duration::from_secs(2),
                ..RedisOptions::default()
            },
        )
        .await
        .unwrap(),
    );
    let broker = Arc::new(MemoryBroker::new());
    let door = FrontDoor::new(store.clone(), broker.clone(), RequestLimits::default());
    let sid = SessionId::parse("cancel-lost").unwrap();
    let tid = TurnId::parse("t1").unwrap();
    let turn = request(json!({"sessionId": sid.as_str(), "turnId": "t1", "instruction": "hi"}));
    proxies.arm(None);
    door.submit(
        "tenant-a",
        &turn,
        &TraceContext::new_root(),
        Pickup::later(None),
    )
    .await
    .expect("accepted");
    let mut replies = broker
        .subscribe_replies(&sid.within("tenant-a"))
        .await
        .unwrap();
    // The writes so far: the admission. The next is the cancel's compare-and-set.
    let admitted = proxies.seen().len();
    assert_eq!(proxies.seen(), ["admit_turn"]);
    proxies.arm(Some((1, Cut::After)));
    let cancelled = door
        .cancel("tenant-a", &sid, &tid)
        .await
        .expect("the cancel is answered: its step was applied");
    assert!(proxies.fired() && admitted == 1);
    let Cancelled::Done(view) = cancelled else {
        panic!("a queued turn is cancelled at once: {cancelled:?}");
    };
    assert_eq!(view.status, aptix_worker::store::TurnStatus::Cancelled);
    let published = tokio::time::timeout(Duration::from_secs(5), replies.recv())
        .await
        .expect("the cancelled status is published")
        .expect("a reply");
    let published: Value = serde_json::from_slice(&published).unwrap();
    assert_eq!(published["status"], "cancelled", "{published}");
    assert_eq!(published["turnId"], "t1", "{published}");
}
