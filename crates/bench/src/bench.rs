//! `aptix-bench turns`: turns pushed through the real job path (front door → broker → worker →
//! pipeline → store → reply) against the fake model at a fixed latency, compared with a bare
//! publish/consume baseline of same-sized messages measured in the same run.
//!
//! With `APTIX_AMQP_URL` / `APTIX_REDIS_URL` set it runs on RabbitMQ and Redis (under a fresh
//! namespace it deletes afterwards); otherwise on the embedded in-memory parts.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use tokio::sync::mpsc;
use tokio_util::sync::CancellationToken;

use aptix_worker::app::App;
use aptix_worker::config::Config;
use aptix_worker::contract::{SessionId, TurnId};
use aptix_worker::delivery::WatchMark;
use aptix_worker::fake_llm::{FakeLlm, FakeOptions};
use aptix_worker::frontdoor::FrontDoor;
use aptix_worker::queue::{Broker, RabbitBroker, Topology};
use aptix_worker::store::{RedisStore, SessionStore, TurnStatus, TurnStatusView};
use aptix_worker::worker::WorkerSettings;

/// What to run.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    /// Turns to push.
    pub turns: usize,
    /// Sessions they are spread over (turns of one session run one after another).
    pub sessions: usize,
    /// The fake model's latency.
    pub latency: Duration,
    /// Worker concurrency.
    pub concurrency: u16,
    /// Submit at this many turns per second instead of as fast as possible (to measure latency
    /// below saturation).
    pub rate: Option<f64>,
}

pub(super) struct Parts {
    broker: Arc<dyn Broker>,
    store: Arc<dyn SessionStore>,
    topology: Topology,
    pub(super) config: Config,
    pub(super) app: App,
    pub(super) fake: FakeLlm,
}

impl Parts {
    /// A worker over these parts, running until the token is cancelled.
    pub(super) fn start_worker(
        &self,
        settings: WorkerSettings,
    ) -> (CancellationToken, tokio::task::JoinHandle<()>) {
        let worker = self.app.worker_with(settings);
        let stop = CancellationToken::new();
        let task = worker.spawn(stop.clone());
        (stop, task)
    }
}

/// The parts of a real deployment, built by [`App::build`] under a namespace of the run's own,
/// against a fake model with `latency`.
async fn parts(config: &Config, latency: Duration) -> anyhow::Result<Parts> {
    let fake = FakeOptions {
        latency,
        ..FakeOptions::default()
    };
    parts_with(config, fake).await
}

/// [`parts`] against a fake model answering as `fake` says.
pub(super) async fn parts_with(config: &Config, fake: FakeOptions) -> anyhow::Result<Parts> {
    let fake = FakeLlm::start("127.0.0.1:0".parse()?, fake, None).await?;
    let mut config = config.clone();
    config.namespace = format!(
        "{}-bench-{}",
        config.namespace,
        uuid::Uuid::new_v4().simple()
    );
    // Left-over reply queues (if the run is interrupted) vanish soon.
    config.broker.reply_queue_ttl = Duration::from_secs(60);
    config.model.base_url = Some(fake.base_url());
    config.model.api_key = None;
    config.model.name = "bench-model".into();
    config.model.connect_timeout = Duration::from_secs(5);
    config.model.timeout = Duration::from_secs(60);
    let app = App::build(&config).await?;
    Ok(Parts {
        broker: app.broker.clone(),
        store: app.store.clone(),
        topology: app.topology.clone(),
        config,
        app,
        fake,
    })
}

/// Removes the run's queues and keys.
pub(super) async fn cleanup(p: &Parts) {
    if let Some(url) = &p.config.broker.url {
        let r = RabbitBroker::new(url.expose(), p.topology.clone(), "aptix-bench-cleanup");
        let _ = r.delete_topology().await;
    }
    if let Some(url) = &p.config.store.url
        && let Ok(r) =
            RedisStore::connect(url.expose(), &p.config.namespace, p.config.store.retention).await
    {
        let _ = r.delete_namespace().await;
    }
}

pub(super) fn percentile(sorted: &[Duration], p: f64) -> Duration {
    if sorted.is_empty() {
        return Duration::ZERO;
    }
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

pub(super) fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// `p50 … ms  p95 … ms  p99 … ms` of sorted durations.
pub(super) fn percentiles(sorted: &[Duration]) -> String {
    format!(
        "p50 {:>7.2} ms  p95 {:>7.2} ms  p99 {:>7.2} ms",
        ms(percentile(sorted, 0.5)),
        ms(percentile(sorted, 0.95)),
        ms(percentile(sorted, 0.99))
    )
}

/// The throughput/latency benchmark.
pub async fn run(config: &Config, opts: &BenchOptions) -> anyhow::Result<()> {
    let p = parts(config, opts.latency).await?;
    let result = throughput(&p, opts).await;
    cleanup(&p).await;
    result
}

async fn throughput(p: &Parts, opts: &BenchOptions) -> anyhow::Result<()> {
    let sessions: Vec<SessionId> = (0..opts.sessions.max(1))
        .map(|i| SessionId::parse(format!("bench-{i}")))
        .collect::<Result<_, _>>()?;
    // One merged stream of replies, stamped on arrival.
    let (tx, mut rx) = mpsc::unbounded_channel::<(Instant, TurnStatusView)>();
    let mut marks = Vec::with_capacity(sessions.len());
    for sid in &sessions {
        // Watched, as a client that subscribes marks its session (see `WatchMark`).
        marks.push(
            WatchMark::hold(
                p.store.clone(),
                sid.clone(),
                p.config.broker.reply_queue_ttl,
            )
            .await?,
        );
        let mut replies = p.broker.subscribe_replies(sid).await?;
        let tx = tx.clone();
        tokio::spawn(async move {
            while let Some(body) = replies.recv().await {
                if let Ok(view) = serde_json::from_slice::<TurnStatusView>(&body) {
                    let _ = tx.send((Instant::now(), view));
                }
            }
        });
    }
    let settings = WorkerSettings {
        concurrency: opts.concurrency,
        busy_delay: Duration::from_millis(50),
        ..WorkerSettings::default()
    };
    let (stop, worker_task) = p.start_worker(settings);
    let door = FrontDoor::new(p.store.clone(), p.broker.clone(), Default::default());

    let mut submitted: HashMap<(SessionId, TurnId), Instant> = HashMap::new();
    let mut job_size = 0usize;
    let started = Instant::now();
    for i in 0..opts.turns {
        if let Some(rate) = opts.rate.filter(|r| *r > 0.0) {
            let due = started + Duration::from_secs_f64(i as f64 / rate);
            tokio::time::sleep_until(due.into()).await;
        }
        let sid = &sessions[i % sessions.len()];
        let tid = TurnId::parse(format!("t{i}"))?;
        let body = serde_json::json!({
            "sessionId": sid, "turnId": tid,
            "instruction": format!("Summarise design record {i} in three bullet points."),
        })
        .to_string();
        job_size = body.len();
        submitted.insert((sid.clone(), tid), Instant::now());
        submit(&door, body.as_bytes()).await?;
    }
    let mut latencies = Vec::with_capacity(opts.turns);
    let mut failed = 0usize;
    let deadline = Instant::now() + Duration::from_secs(600);
    while latencies.len() + failed < opts.turns {
        let (at, view) = tokio::time::timeout_at(deadline.into(), rx.recv())
            .await
            .context("the benchmark did not finish within 10 minutes")?
            .context("reply streams ended")?;
        if let Some(sent) = submitted.remove(&(view.session_id.clone(), view.turn_id.clone())) {
            match view.status {
                TurnStatus::Completed => latencies.push(at - sent),
                _ => failed += 1,
            }
        }
    }
    let elapsed = started.elapsed();
    stop.cancel();
    let _ = worker_task.await;
    latencies.sort();
    let rate = opts.turns as f64 / elapsed.as_secs_f64();

    // Baseline: bare publish + consume + ack of same-sized messages on the same broker kind.
    let payload = vec![b'x'; job_size];
    let total = opts.turns;
    let mut deliveries = p.broker.consume(opts.concurrency).await?;
    let base_start = Instant::now();
    let consume = tokio::spawn(async move {
        let mut n = 0usize;
        while n < total {
            match deliveries.recv().await {
                Some(d) => {
                    let _ = d.ack().await;
                    n += 1;
                }
                None => break,
            }
        }
        n
    });
    for _ in 0..total {
        p.broker.publish_job(&payload).await?;
    }
    let consumed = tokio::time::timeout(Duration::from_secs(300), consume)
        .await
        .context("baseline did not finish")??;
    anyhow::ensure!(consumed == total, "baseline consumed {consumed} of {total}");
    let base_elapsed = base_start.elapsed();
    let base_rate = total as f64 / base_elapsed.as_secs_f64();

    let overhead: Vec<Duration> = latencies
        .iter()
        .map(|l| l.saturating_sub(opts.latency))
        .collect();
    println!(
        "aptix-bench turns: {} turns over {} sessions, model latency {} ms, worker concurrency {}, {}",
        opts.turns,
        sessions.len(),
        opts.latency.as_millis(),
        opts.concurrency,
        if p.config.broker.url.is_some() {
            "RabbitMQ"
        } else {
            "in-memory broker"
        },
    );
    println!(
        "  submitted {}",
        match opts.rate {
            Some(r) => format!("at {r} turns/s"),
            None => "as fast as possible".into(),
        }
    );
    println!(
        "  store: {}",
        if p.config.store.url.is_some() {
            "Redis"
        } else {
            "in-memory"
        }
    );
    println!(
        "  completed {} / failed {} in {:.2} s",
        latencies.len(),
        failed,
        elapsed.as_secs_f64()
    );
    println!("  worker path        {:>10.1} turns/s", rate);
    println!(
        "  bare publish+consume {:>8.1} msgs/s ({} B messages)",
        base_rate, job_size
    );
    println!(
        "  ratio (bare / worker path) {:>6.2}x",
        base_rate / rate.max(f64::EPSILON)
    );
    println!(
        "  end-to-end latency  p50 {:>7.1} ms  p95 {:>7.1} ms  p99 {:>7.1} ms",
        ms(percentile(&latencies, 0.50)),
        ms(percentile(&latencies, 0.95)),
        ms(percentile(&latencies, 0.99))
    );
    println!(
        "  queue+state overhead (end-to-end minus model latency)  p50 {:>7.1} ms  p95 {:>7.1} ms  p99 {:>7.1} ms",
        ms(percentile(&overhead, 0.50)),
        ms(percentile(&overhead, 0.95)),
        ms(percentile(&overhead, 0.99))
    );
    Ok(())
}

/// Resident memory of this process, in bytes (Linux).
fn rss_bytes() -> Option<u64> {
    let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
    let pages: u64 = statm.split_whitespace().nth(1)?.parse().ok()?;
    Some(pages * 4096)
}

/// Holds `in_flight` turns in flight against a slow model and reports memory per turn.
pub async fn memory(config: &Config, in_flight: usize, latency: Duration) -> anyhow::Result<()> {
    let p = parts(config, latency).await?;
    let result = memory_inner(&p, in_flight, latency).await;
    cleanup(&p).await;
    result
}

async fn memory_inner(p: &Parts, in_flight: usize, latency: Duration) -> anyhow::Result<()> {
    let before = rss_bytes().context("cannot read /proc/self/statm")?;
    let settings = WorkerSettings {
        concurrency: u16::try_from(in_flight).unwrap_or(u16::MAX),
        ..WorkerSettings::default()
    };
    let (stop, task) = p.start_worker(settings);
    let door = FrontDoor::new(p.store.clone(), p.broker.clone(), Default::default());
    let started = Instant::now();
    for i in 0..in_flight {
        let body = serde_json::json!({"sessionId": format!("mem-{i}"), "turnId": "t", "instruction": "hold"}).to_string();
        submit(&door, body.as_bytes()).await?;
    }
    // Sample while the turns wait for the model.
    let mut peak = before;
    while started.elapsed() < latency.mul_f64(0.9) {
        peak = peak.max(rss_bytes().unwrap_or(0));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.cancel();
    let _ = task.await;
    let per = (peak.saturating_sub(before)) as f64 / in_flight as f64;
    println!(
        "aptix-bench turns --in-flight: {in_flight} turns held against a {} ms model; resident memory {:.1} MiB -> {:.1} MiB; {:.1} KiB per in-flight turn (includes the fake model's share of the process)",
        latency.as_millis(),
        before as f64 / 1048576.0,
        peak as f64 / 1048576.0,
        per / 1024.0
    );
    Ok(())
}

/// Submits a request body as the local tenant's, the way `aptix run` does.
async fn submit(door: &aptix_worker::frontdoor::FrontDoor, body: &[u8]) -> anyhow::Result<()> {
    let request = door
        .parse(body)
        .map_err(|e| anyhow::anyhow!("submit: {e}"))?;
    let trace = aptix_worker::trace::TraceContext::new_root();
    let pickup = aptix_worker::frontdoor::Pickup::later(None);
    door.submit(aptix_worker::config::LOCAL_TENANT, &request, &trace, pickup)
        .await
        .map_err(|e| anyhow::anyhow!("submit: {e}"))?;
    Ok(())
}
