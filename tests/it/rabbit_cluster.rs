//! A RabbitMQ cluster of three nodes of the test's own (their own node names, AMQP and
//! distribution ports, data directories and Erlang cookie; the machine's own node is never
//! touched), and the guarantees that must hold on it: every quorum queue replicated on the
//! three nodes, and submissions accepted while the node leading the job queue is down. A
//! broker of one such node serves the tests that restart the broker (`broker_restart`).
//!
//! The nodes stop by themselves once the test binary has exited (each runs under a shell that
//! watches the test process).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::json;

use crate::app::{AppOptions, spawn};

/// One node: its name and ports.
struct Node {
    name: String,
    amqp_port: u16,
    dist_port: u16,
}

/// Joined nodes (three, or one for a broker of the test's own).
pub struct RabbitCluster {
    dir: PathBuf,
    nodes: Vec<Node>,
    /// The range the CLI's own distribution ports come from.
    cli_ports: (u16, u16),
}

fn free_port_pair() -> u16 {
    loop {
        let p = crate::support::free_port();
        if p < 60_000 && std::net::TcpListener::bind(("127.0.0.1", p + 1000)).is_ok() {
            return p;
        }
    }
}

impl RabbitCluster {
    /// Starts three nodes and joins them (about 15-20 s on two cores).
    pub fn start() -> Result<Self, String> {
        Self::start_nodes(3)
    }

    /// Starts one node: a broker of the test's own, which it may stop and start.
    pub fn single() -> Result<Self, String> {
        Self::start_nodes(1)
    }

    fn start_nodes(count: usize) -> Result<Self, String> {
        let dir = std::env::temp_dir().join(format!("aptix-rmq-{}", uuid::Uuid::new_v4().simple()));
        let home = dir.join("home");
        std::fs::create_dir_all(&home).map_err(|e| e.to_string())?;
        let cookie = home.join(".erlang.cookie");
        std::fs::write(&cookie, uuid::Uuid::new_v4().simple().to_string())
            .map_err(|e| e.to_string())?;
        std::process::Command::new("chmod")
            .args(["400"])
            .arg(&cookie)
            .status()
            .map_err(|e| e.to_string())?;
        std::fs::write(dir.join("plugins"), "[].").map_err(|e| e.to_string())?;
        std::fs::write(dir.join("env.conf"), "").map_err(|e| e.to_string())?;
        std::fs::write(dir.join("rabbitmq.conf"), "").map_err(|e| e.to_string())?;
        let tag = uuid::Uuid::new_v4().simple().to_string()[..6].to_string();
        let nodes: Vec<Node> = (1..=count)
            .map(|i| {
                let amqp_port = free_port_pair();
                Node {
                    name: format!("aptix{tag}n{i}@localhost"),
                    amqp_port,
                    dist_port: amqp_port + 1000,
                }
            })
            .collect();
        let cli = free_port_pair();
        let mut cluster = Self {
            dir,
            nodes,
            cli_ports: (cli, cli + 5),
        };
        for i in 0..count {
            cluster.launch(i)?;
        }
        for i in 0..count {
            // A node that died while booting (seen once in CI, on a loaded host: a port
            // taken between picking it and binding it is the likely cause) is booted again,
            // on fresh ports and a fresh data directory, before the cluster is formed.
            let mut boots = 1;
            while let Err(e) = cluster.await_startup(i) {
                if boots == 3 {
                    return Err(e);
                }
                boots += 1;
                eprintln!("node {i} of the test cluster did not boot ({e}); booting it again");
                let amqp_port = free_port_pair();
                cluster.nodes[i].amqp_port = amqp_port;
                cluster.nodes[i].dist_port = amqp_port + 1000;
                let _ = std::fs::remove_dir_all(cluster.dir.join(format!("n{i}")));
                cluster.launch(i)?;
            }
        }
        let first = cluster.nodes[0].name.clone();
        for i in 1..count {
            cluster.ctl(i, &["stop_app"])?;
            cluster.ctl(i, &["join_cluster", &first])?;
            cluster.ctl(i, &["start_app"])?;
        }
        Ok(cluster)
    }

    /// Starts node `i` (again, after a kill: it rejoins the cluster from its data directory).
    fn launch(&self, i: usize) -> Result<(), String> {
        let node = &self.nodes[i];
        let base = self.dir.join(format!("n{i}"));
        std::fs::create_dir_all(base.join("mnesia")).map_err(|e| e.to_string())?;
        std::fs::create_dir_all(base.join("log")).map_err(|e| e.to_string())?;
        let parent = std::process::id();
        // `detached=1` makes the script exec the VM: `$!` is the node itself.
        let script = format!(
            "/usr/lib/rabbitmq/bin/rabbitmq-server & node=$!; \
             while kill -0 {parent} 2>/dev/null; do sleep 1; done; kill -9 $node"
        );
        Command::new("sh")
            .args(["-c", &script])
            .env_clear()
            .env("PATH", std::env::var("PATH").unwrap_or_default())
            .env("HOME", self.dir.join("home"))
            .env("detached", "1")
            .env("RABBITMQ_NODENAME", &node.name)
            .env("RABBITMQ_NODE_PORT", node.amqp_port.to_string())
            .env("RABBITMQ_DIST_PORT", node.dist_port.to_string())
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("ERL_EPMD_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_MNESIA_BASE", base.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", base.join("log"))
            .env("RABBITMQ_PID_FILE", base.join("pid"))
            .env("RABBITMQ_CONFIG_FILE", self.dir.join("rabbitmq"))
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", self.dir.join("plugins"))
            .env("RABBITMQ_CONF_ENV_FILE", self.dir.join("env.conf"))
            .env("ERL_CRASH_DUMP", base.join("erl_crash.dump"))
            .current_dir(&base)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("starting rabbitmq-server: {e}"))?;
        Ok(())
    }

    /// `rabbitmqctl -n <node i> args…`, with the cluster's own cookie.
    fn ctl(&self, i: usize, args: &[&str]) -> Result<String, String> {
        let out = Command::new("/usr/lib/rabbitmq/bin/rabbitmqctl")
            .args(["-n", &self.nodes[i].name])
            .args(args)
            // A CLI that cannot reach a node (one the test killed) may leave a crash dump:
            // in the cluster's directory, not the repository.
            .current_dir(&self.dir)
            .env("ERL_CRASH_DUMP", self.dir.join("erl_crash.dump"))
            .env("HOME", self.dir.join("home"))
            .env("RABBITMQ_CTL_DIST_PORT_MIN", self.cli_ports.0.to_string())
            .env("RABBITMQ_CTL_DIST_PORT_MAX", self.cli_ports.1.to_string())
            .output()
            .map_err(|e| format!("rabbitmqctl: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() {
            Ok(text)
        } else {
            Err(format!(
                "rabbitmqctl {args:?} on {}: {text}{}",
                self.nodes[i].name,
                String::from_utf8_lossy(&out.stderr)
            ))
        }
    }

    /// `APTIX_AMQP_URL` naming every node.
    pub fn urls(&self) -> String {
        self.nodes
            .iter()
            .map(|n| format!("amqp://guest:guest@127.0.0.1:{}/%2f", n.amqp_port))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// The queue's members and leader (node names), as a running node lists them.
    pub fn members_and_leader(&self, queue: &str) -> Result<(Vec<String>, String), String> {
        let alive = (0..self.nodes.len())
            .find(|i| self.ctl(*i, &["ping"]).is_ok())
            .ok_or("no node answers")?;
        let table = self.ctl(
            alive,
            &[
                "list_queues",
                "name",
                "members",
                "leader",
                "--no-table-headers",
                "-q",
            ],
        )?;
        let line = table
            .lines()
            .find(|l| l.split_whitespace().next() == Some(queue))
            .ok_or_else(|| format!("{queue} is not listed: {table}"))?;
        // `name [n1, n2, n3] leader`
        let members: Vec<String> = line
            .split('[')
            .nth(1)
            .and_then(|rest| rest.split(']').next())
            .map(|list| {
                list.split(',')
                    .map(|m| m.trim().trim_matches('\'').to_string())
                    .filter(|m| !m.is_empty())
                    .collect()
            })
            .unwrap_or_default();
        let leader = line
            .rsplit(']')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        Ok((members, leader))
    }

    /// SIGKILLs node `i`.
    pub fn kill(&self, i: usize) -> Result<(), String> {
        let pid = std::fs::read_to_string(self.dir.join(format!("n{i}")).join("pid"))
            .map_err(|e| format!("the pid file of node {i}: {e}"))?;
        let status = Command::new("kill")
            .args(["-9", pid.trim()])
            .status()
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("kill -9 {pid} failed"));
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", self.nodes[i].amqp_port)).is_ok() {
            if Instant::now() > deadline {
                return Err(format!("node {i} still listens after SIGKILL"));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops the RabbitMQ application of node `i` (its Erlang VM keeps running): every
    /// connection to it is closed, as in a broker restart.
    pub fn stop_app(&self, i: usize) -> Result<(), String> {
        self.ctl(i, &["stop_app"]).map(drop)
    }

    /// Starts the application of node `i` again and waits until it runs.
    pub fn start_app(&self, i: usize) -> Result<(), String> {
        self.ctl(i, &["start_app"])?;
        self.await_startup(i)
    }

    /// Starts node `i` again and waits until it runs.
    pub fn restart(&self, i: usize) -> Result<(), String> {
        let _ = std::fs::remove_file(self.dir.join(format!("n{i}")).join("pid"));
        self.launch(i)?;
        self.await_startup(i)
    }

    /// Waits until node `i` runs (the CLI cannot reach it until it is registered with epmd).
    /// A node that epmd still does not know 30 s after its launch has died booting: that is
    /// an error at once rather than after the whole wait.
    fn await_startup(&self, i: usize) -> Result<(), String> {
        let launched = Instant::now();
        let deadline = launched + Duration::from_secs(90);
        loop {
            match self.ctl(i, &["await_startup", "--timeout", "60"]) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(e)
                    if e.contains("not running at all")
                        && launched.elapsed() > Duration::from_secs(30) =>
                {
                    return Err(e);
                }
                Err(_) => std::thread::sleep(Duration::from_millis(500)),
            }
        }
    }
}

impl Drop for RabbitCluster {
    fn drop(&mut self) {
        for i in 0..self.nodes.len() {
            let _ = self.kill(i);
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// The most channels any connection of the cluster has open now.
fn most_channels(cluster: &RabbitCluster) -> usize {
    (0..3)
        .filter_map(|i| {
            cluster
                .ctl(
                    i,
                    &["list_connections", "channels", "--no-table-headers", "-q"],
                )
                .ok()
        })
        .flat_map(|t| {
            t.lines()
                .filter_map(|l| l.trim().parse::<usize>().ok())
                .collect::<Vec<_>>()
        })
        .max()
        .unwrap_or(0)
}

/// Submits a turn; `true` when it was accepted.
async fn submit(app: &crate::app::App, sid: &str, tid: &str) -> Result<(), String> {
    let body = json!({"sessionId": sid, "turnId": tid, "instruction": "hi"}).to_string();
    match app.post(Some("tok-a"), body).await {
        (202, _) => Ok(()),
        (status, body) => Err(format!("{status} {body}")),
    }
}

/// Serialises the tests that start a cluster.
pub static ONE_CLUSTER_AT_A_TIME: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());

/// Which node a test kills.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Victim {
    /// The node the app is connected to (its first URL): it leads the job queue (declared from
    /// there) and hosts the reply queues of the sessions that started before.
    Connected,
    /// Only the job queue's leader: the queues were declared from the third node before the
    /// app connected to the first.
    LeaderOnly,
}

/// A node of the cluster (see [`Victim`]) is SIGKILLed for `outage`; meanwhile new sessions
/// and the next turns of sessions that started before are submitted. Checked: every quorum
/// queue has a member on each node; submissions are accepted throughout but for an
/// election's seconds; no connection nears the channel limit; every accepted turn completes;
/// after the node returns, each old session's reply queue holds its next turn's result.
async fn a_node_down_for(outage: Duration, victim: Victim) {
    // One cluster at a time: three Erlang VMs each are a lot for the two cores CI has, beside
    // the rest of the suite, and these tests bound how long things may take.
    let _turn = ONE_CLUSTER_AT_A_TIME.lock().await;
    // The product's logs of this test (shown when it fails), on this test's thread only.
    let _logs = tracing::subscriber::set_default(
        tracing_subscriber::fmt()
            .with_env_filter("aptix_worker=info,lapin=warn")
            .with_test_writer()
            .finish(),
    );
    let cluster = tokio::task::spawn_blocking(RabbitCluster::start)
        .await
        .unwrap()
        .unwrap_or_else(|e| panic!("the RabbitMQ cluster for the test did not start: {e}"));
    let ns = format!("aptix-test-{}", uuid::Uuid::new_v4().simple());
    let victim_index = match victim {
        Victim::Connected => 0,
        Victim::LeaderOnly => {
            // The queues are declared from the third node: their leaders live there.
            let mut topology = aptix_worker::queue::Topology::new(&ns);
            topology.retry_delays = crate::support::test_topology().retry_delays;
            let third = cluster.urls().split(',').nth(2).unwrap().to_string();
            let declarer = aptix_worker::queue::RabbitBroker::new(&third, topology, "declarer");
            aptix_worker::queue::JobQueue::check(&declarer)
                .await
                .expect("the third node declares the topology");
            2
        }
    };
    let app = spawn(AppOptions {
        amqp_url: Some(cluster.urls()),
        extra_env: vec![("APTIX_NAMESPACE", ns)],
        // Unused reply queues expire; the tests' 30 s would let the old sessions' queues go
        // (with what they hold) before the outage ends. Production keeps them an hour.
        reply_queue_ttl: Some(Duration::from_secs(600)),
        ..AppOptions::default()
    })
    .await;
    let old: Vec<String> = (0..8).map(|i| format!("old{i}")).collect();
    for sid in &old {
        submit(&app, sid, "t1").await.unwrap();
    }
    for sid in &old {
        let result = app.settled("tok-a", sid, "t1").await;
        assert_eq!(result["status"], "completed", "{sid}: {result}");
    }
    let jobs = app.topology.jobs();
    let mut queues = vec![jobs.clone(), app.topology.dead()];
    queues.extend(
        app.topology
            .retry_delays
            .iter()
            .map(|d| app.topology.retry(*d)),
    );
    for q in &queues {
        let (members, _) = cluster.members_and_leader(q).unwrap();
        assert_eq!(
            members.len(),
            3,
            "{q} is replicated on every node: {members:?}"
        );
    }
    let (_, leader) = cluster.members_and_leader(&jobs).unwrap();
    eprintln!("the job queue's leader: {leader}; killing node {victim_index} ({victim:?})");
    if victim == Victim::LeaderOnly {
        assert!(leader.ends_with("n3@localhost"), "{leader}");
    }
    cluster.kill(victim_index).unwrap();
    let started = Instant::now();
    let (mut accepted, mut refused) = (Vec::new(), Vec::new());
    let (mut n, mut next_old) = (0, 0);
    let mut channels = 0;
    while started.elapsed() < outage {
        n += 1;
        // The old sessions' next turns first (each sent again until accepted, as a client
        // does), then new sessions.
        let (sid, tid) = match old.get(next_old) {
            Some(sid) => (sid.clone(), "t2"),
            None => (format!("new{n}"), "t1"),
        };
        match submit(&app, &sid, tid).await {
            Ok(()) => {
                next_old += usize::from(tid == "t2");
                accepted.push((sid, tid));
            }
            Err(why) => refused.push((started.elapsed(), why)),
        }
        if n % 20 == 0 {
            channels = channels.max(most_channels(&cluster));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "{} accepted, {} refused (first: {:?}); most channels on a connection: {channels}",
        accepted.len(),
        refused.len(),
        refused.first()
    );
    let connections = (1..3)
        .filter_map(|i| {
            cluster
                .ctl(i, &["list_connections", "name", "--no-table-headers", "-q"])
                .ok()
        })
        .map(|t| t.lines().count())
        .sum::<usize>();
    cluster.restart(victim_index).unwrap();
    for (sid, tid) in &accepted {
        let result = app.settled("tok-a", sid, tid).await;
        assert_eq!(result["status"], "completed", "{sid}/{tid}: {result}");
    }
    // Results bound for the reply queues on the dead node were published again after a retry
    // delay, not in a loop: at most a few times a second per job.
    let metrics = app.metrics_text().await;
    let unpublished: f64 = metrics
        .lines()
        .find(|l| l.starts_with("aptix_job_retries_total{reason=\"reply_unpublished\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .and_then(|v| v.parse().ok())
        .unwrap_or(0.0);
    let per_job_per_second = unpublished / old.len() as f64 / outage.as_secs_f64();
    eprintln!(
        "results not yet publishable, tried again: {unpublished} ({per_job_per_second:.1} per job per second); connections on the live nodes: {connections}"
    );
    assert!(
        per_job_per_second <= 6.0,
        "a result's publish was retried {per_job_per_second:.1} times a second"
    );
    // Once the node is back, every old session's reply queue has its next turn's result.
    assert_eq!(
        next_old,
        old.len(),
        "every old session's next turn was accepted"
    );
    for sid in &old {
        let mut replies = app
            .broker
            .subscribe_replies(&crate::support::sid_a(sid))
            .await
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            let body = tokio::time::timeout(left, replies.recv())
                .await
                .unwrap_or_else(|_| panic!("{sid}: t2's result never reached its reply queue"))
                .expect("the reply stream stays open");
            let status: serde_json::Value = serde_json::from_slice(&body).unwrap();
            if status["turnId"] == "t2" {
                assert_eq!(status["status"], "completed", "{sid}: {status}");
                break;
            }
        }
    }
    let last_refusal = refused.iter().map(|(at, _)| *at).max();
    assert!(
        last_refusal.is_none_or(|at| at < Duration::from_secs(10)),
        "submissions refused for longer than an election: {} refused, the last at {last_refusal:?}: {:?}",
        refused.len(),
        refused.last()
    );
    assert!(channels < 100, "a connection holds {channels} channels");
}

#[tokio::test]
async fn a_node_down_for_20_s_stops_nothing() {
    a_node_down_for(Duration::from_secs(20), Victim::Connected).await;
}

#[tokio::test]
async fn a_node_down_for_60_s_stops_nothing() {
    a_node_down_for(Duration::from_secs(60), Victim::Connected).await;
}

#[tokio::test]
async fn the_job_queue_s_leader_down_for_20_s_elsewhere_stops_nothing() {
    a_node_down_for(Duration::from_secs(20), Victim::LeaderOnly).await;
}
