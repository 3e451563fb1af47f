//! `aptix-bench turns --closed-loop`: the services path as clients drive it. `--sessions` clients,
//! each sending its next turn through the synchronous endpoint (over HTTP) when the previous
//! one answered — ten turns per session, or with `--new-session-per-turn` a fresh session each
//! time (what `aptix batch` does) — against the fake model at `--latency-ms`, on RabbitMQ and
//! Redis. It prints turns/s, latency percentiles (first turns of sessions apart), and the CPU
//! seconds per turn of every process it can see: this one (front door, worker and the fake
//! model), RabbitMQ and Redis. In the same run, the baseline: a turn's two broker legs done
//! bare — the job (quorum queue, pipelined publisher confirms, acks) and the reply (transient,
//! to an exclusive queue, no acks) — and RabbitMQ's CPU per message of each.
//! Each run ends with its verdict against the throughput target and what bounds the figure
//! ([`super::bench_verdict`]).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicCancelOptions, BasicConsumeOptions, BasicPublishOptions, BasicQosOptions,
    ConfirmSelectOptions, QueueDeclareOptions, QueueDeleteOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use tokio_util::sync::CancellationToken;

use aptix_worker::config::Config;
use aptix_worker::contract::SessionId;
use aptix_worker::fake_llm::FakeOptions;
use aptix_worker::queue::{QueueError, RabbitBroker, ReplyBus as _};
use aptix_worker::worker::WorkerSettings;

use super::bench::{cleanup, parts_with, percentile, percentiles};
use super::bench_verdict::{Measured, verdict};
use super::procfs::*;

/// What to run.
#[derive(Debug, Clone)]
pub struct LoopOptions {
    /// Concurrent clients (one session each, or a fresh one per turn).
    pub sessions: usize,
    /// Turns in all.
    pub turns: usize,
    /// A fresh session for every turn.
    pub new_session_per_turn: bool,
    /// The fake model's latency.
    pub latency: Duration,
    /// Worker concurrency.
    pub concurrency: u16,
    /// The clients' first turns are spread evenly over this (zero: all at once).
    pub ramp_up: Duration,
    /// Messages of the baseline.
    pub baseline_messages: usize,
    /// With processes: the one whose instructions per turn callgrind counts.
    pub callgrind: Option<super::bench_callgrind::Counted>,
    /// With callgrind: a directory to keep its profile in (else it is removed after the run).
    pub callgrind_out: Option<std::path::PathBuf>,
    /// The clients call the front door over HTTP/2 by prior knowledge, each call a stream.
    pub http2: bool,
}

/// Calls one of the clients' HTTP/2 connections carries (under the front door's
/// `HTTP2_STREAMS`, past which calls would wait in the client).
const STREAMS_PER_CONNECTION: usize = 500;

/// Declares `n` session reply queues the way a worker does (one status of a typical size
/// each), lets them sit idle, and prints RabbitMQ's resident memory per queue; deletes them
/// afterwards.
pub async fn idle_reply_queues(config: &Config, n: usize) -> anyhow::Result<()> {
    let url = config.broker.url.as_ref().context("no APTIX_AMQP_URL")?;
    let mut topology = config.topology();
    topology.namespace = format!(
        "{}-bench-{}",
        config.namespace,
        uuid::Uuid::new_v4().simple()
    );
    topology.reply_queues = aptix_worker::queue::ReplyQueues::EverySession;
    let broker = Arc::new(
        RabbitBroker::new(url.expose(), topology, "aptix-bench-reply-queues")
            .with_tls_ca(config.tls_ca.clone()),
    );
    broker.connect().await?;
    let status = serde_json::json!({
        "sessionId": "s", "turnId": "t", "status": "completed", "attempts": 1,
        "submittedAt": "2026-11-23T00:00:00Z", "completedAt": "2026-11-23T00:00:01Z",
        "result": {"successful": true, "result": {"kind": "final", "primaryOutputText": "x".repeat(600)}}
    })
    .to_string();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let before = rss_kib("beam.smp");
    let next = Arc::new(AtomicUsize::new(0));
    let workers = (0..32).map(|_| {
        let (broker, next, body) = (broker.clone(), next.clone(), status.clone());
        tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    return Ok::<_, QueueError>(());
                }
                let sid = SessionId::parse(format!("idle-{i}"))
                    .map_err(|e| QueueError::Rejected(e.to_string()))?;
                broker
                    .publish_reply(
                        &sid,
                        "t",
                        None,
                        aptix_worker::queue::Audience::ANYONE,
                        body.as_bytes(),
                    )
                    .await?;
            }
        })
    });
    let started = Instant::now();
    for w in futures_util::future::join_all(workers).await {
        w??;
    }
    let took = started.elapsed();
    tokio::time::sleep(Duration::from_secs(5)).await;
    let after = rss_kib("beam.smp");
    println!(
        "aptix-bench turns --reply-queues: {n} idle reply queues of one {} B status each, declared in {:.1} s ({:.0}/s)",
        status.len(),
        took.as_secs_f64(),
        n as f64 / took.as_secs_f64()
    );
    println!(
        "  RabbitMQ resident memory {} MiB -> {} MiB: {:.1} KiB per idle reply queue",
        before / 1024,
        after / 1024,
        after.saturating_sub(before) as f64 / n.max(1) as f64
    );
    broker.delete_topology().await?;
    Ok(())
}

/// Runs the closed loop, then the baseline.
pub async fn run(config: &Config, opts: &LoopOptions) -> anyhow::Result<()> {
    anyhow::ensure!(
        config.broker.url.is_some() && config.store.url.is_some(),
        "the closed loop measures the services path: set APTIX_AMQP_URL and APTIX_REDIS_URL"
    );
    let fake = FakeOptions {
        latency: opts.latency,
        forget_requests: true,
        ..FakeOptions::default()
    };
    let p = parts_with(config, fake).await?;
    let result = closed_loop(&p, opts).await;
    cleanup(&p).await;
    result?;
    baseline(config, opts.baseline_messages.max(1), &in_process()).await
}

async fn closed_loop(p: &super::bench::Parts, opts: &LoopOptions) -> anyhow::Result<()> {
    let settings = WorkerSettings {
        concurrency: opts.concurrency,
        busy_delay: Duration::from_millis(50),
        ..WorkerSettings::default()
    };
    let (stop_worker, worker) = p.start_worker(settings);
    let stop = CancellationToken::new();
    let listener = aptix_worker::net::listen(std::net::SocketAddr::from(([127, 0, 0, 1], 0)))?;
    let base = format!("http://{}", listener.local_addr()?);
    p.app.spawn_http(&p.config, listener, stop.clone());
    let resident_before = status_kib(std::process::id(), "VmRSS:").unwrap_or(0);
    let watched = in_process();
    let before = cpu_snapshot(&watched);
    let driven = drive(&base, opts).await?;
    let after = cpu_snapshot(&watched);
    stop.cancel();
    stop_worker.cancel();
    let _ = worker.await;
    driven.report(
        opts,
        p.config.broker.reply_queues.as_str(),
        "one process",
        &before,
        &after,
    );
    let peak = status_kib(std::process::id(), "VmHWM:").unwrap_or(0);
    println!(
        "  memory: resident {} MiB before, peak {} MiB with {} turns in flight: {:.1} KiB per turn in flight (front door, worker, fake model and HTTP clients together)",
        resident_before / 1024,
        peak / 1024,
        opts.sessions,
        peak.saturating_sub(resident_before) as f64 / opts.sessions.max(1) as f64
    );
    Ok(())
}

/// What the clients of a closed loop saw.
pub(super) struct Driven {
    first: Vec<Duration>,
    later: Vec<Duration>,
    failed: usize,
    elapsed: Duration,
}

/// `opts.sessions` clients, each sending its next turn through the synchronous endpoint of the
/// front door at `base` as soon as the previous one answered, until `opts.turns` were sent.
pub(super) async fn drive(base: &str, opts: &LoopOptions) -> anyhow::Result<Driven> {
    // Over HTTP/1.1 one client keeps a connection per session; over HTTP/2 each client is a
    // connection, carrying the calls of up to `STREAMS_PER_CONNECTION` sessions.
    let connections = if opts.http2 {
        opts.sessions.max(1).div_ceil(STREAMS_PER_CONNECTION)
    } else {
        1
    };
    let https = (0..connections)
        .map(|_| {
            let builder = if opts.http2 {
                aptix_worker::tls::client_builder(None)?.http2_prior_knowledge()
            } else {
                aptix_worker::tls::http_client_builder(None)?.pool_max_idle_per_host(opts.sessions)
            };
            builder.timeout(Duration::from_secs(120)).build()
        })
        .collect::<Result<Vec<_>, _>>()?;
    let next = Arc::new(AtomicUsize::new(0));
    let started = Instant::now();
    let clients = (0..opts.sessions.max(1)).map(|client| {
        let http = https[client % https.len()].clone();
        let (base, next) = (base.to_string(), next.clone());
        let (turns, fresh) = (opts.turns, opts.new_session_per_turn);
        let start = started
            + opts
                .ramp_up
                .mul_f64(client as f64 / opts.sessions.max(1) as f64);
        tokio::spawn(async move {
            tokio::time::sleep_until(start.into()).await;
            let mut first = Vec::new();
            let mut later = Vec::new();
            let mut failed = 0usize;
            let mut k = 0usize;
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= turns {
                    break;
                }
                let session = if fresh {
                    format!("loop-{i}")
                } else {
                    format!("loop-c{client}")
                };
                let body = serde_json::json!({"sessionId": session, "turnId": format!("t{i}"),
                    "instruction": format!("Summarise design record {i} in three bullet points.")});
                let sent = Instant::now();
                let ok = match http
                    .post(format!("{base}/api/ai/agent/execute"))
                    .body(body.to_string())
                    .send()
                    .await
                {
                    Ok(r) => r
                        .json::<serde_json::Value>()
                        .await
                        .is_ok_and(|v| v["successful"] == true),
                    Err(_) => false,
                };
                let took = sent.elapsed();
                match (ok, fresh || k == 0) {
                    (false, _) => failed += 1,
                    (true, true) => first.push(took),
                    (true, false) => later.push(took),
                }
                k += 1;
            }
            (first, later, failed)
        })
    });
    let mut driven = Driven {
        first: Vec::new(),
        later: Vec::new(),
        failed: 0,
        elapsed: Duration::ZERO,
    };
    for c in futures_util::future::join_all(clients).await {
        let (f, l, n) = c.context("a client task failed")?;
        driven.first.extend(f);
        driven.later.extend(l);
        driven.failed += n;
    }
    driven.elapsed = started.elapsed();
    driven.first.sort();
    driven.later.sort();
    Ok(driven)
}

impl Driven {
    /// Turns that completed.
    pub(super) fn done(&self) -> usize {
        self.first.len() + self.later.len()
    }

    /// Prints the run's shape, throughput, latencies and CPU per turn.
    pub(super) fn report(
        &self,
        opts: &LoopOptions,
        reply_queues: &str,
        layout: &str,
        before: &CpuSnapshot,
        after: &CpuSnapshot,
    ) {
        let done = self.done();
        let mut all: Vec<Duration> = self.first.iter().chain(&self.later).copied().collect();
        all.sort();
        println!(
            "aptix-bench turns --closed-loop: {} clients (started {}, over {}), {} turns, {}, model latency {} ms, worker concurrency {}, reply queues {reply_queues}, RabbitMQ + Redis, {layout}",
            opts.sessions,
            if opts.ramp_up.is_zero() {
                "at once".to_string()
            } else {
                format!("over {} ms", opts.ramp_up.as_millis())
            },
            if opts.http2 {
                "HTTP/2, a stream each"
            } else {
                "HTTP/1.1, a connection each"
            },
            opts.turns,
            if opts.new_session_per_turn {
                "a new session per turn"
            } else {
                "one session per client"
            },
            opts.latency.as_millis(),
            opts.concurrency,
        );
        println!(
            "  completed {done} / failed {} in {:.2} s: {:.1} turns/s",
            self.failed,
            self.elapsed.as_secs_f64(),
            done as f64 / self.elapsed.as_secs_f64()
        );
        println!("  latency, all turns            {}", percentiles(&all));
        println!(
            "  latency, first turn of a session {}",
            percentiles(&self.first)
        );
        if !self.later.is_empty() {
            println!(
                "  latency, later turns          {}",
                percentiles(&self.later)
            );
        }
        println!("  CPU per turn: {}", cpu_per(before, after, done));
        println!(
            "  context switches per turn: {}",
            switches_per(before, after, done)
        );
        let measured = Measured {
            split: split_per(before, after, done),
            rate: done as f64 / self.elapsed.as_secs_f64(),
            clients: opts.sessions,
            model: opts.latency,
            p50: percentile(&all, 0.5),
            cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        for line in verdict(&measured) {
            println!("  {line}");
        }
    }
}

/// Bare quorum-queue publish + consume of `n` small messages: confirms pipelined (awaited in
/// windows, not one by one), acks as they come — the best the broker does for this traffic.
pub(super) async fn baseline(config: &Config, n: usize, watched: &[Watched]) -> anyhow::Result<()> {
    let url = config.broker.url.as_ref().context("no APTIX_AMQP_URL")?;
    let conn = lapin::Connection::connect(url.expose(), lapin::ConnectionProperties::default())
        .await
        .context("connecting to RabbitMQ for the baseline")?;
    let mut services = 0.0;
    for leg in [Leg::Job, Leg::Reply] {
        let (rate, before, after) = leg.run(&conn, n, watched).await?;
        println!(
            "  baseline, {}, {n} messages of 300 B: {rate:.0} msg/s",
            leg.describe()
        );
        println!(
            "  baseline CPU per message ({}): {}",
            leg.name(),
            cpu_per(&before, &after, n)
        );
        services += split_per(&before, &after, n).services;
    }
    println!(
        "  (a turn is a job and a reply: the two legs' RabbitMQ and Redis CPU, {services:.3} ms, is the floor of the services' CPU per turn)"
    );
    let _ = conn.close(200, "baseline done".into()).await;
    Ok(())
}

/// One leg of a turn's broker traffic, measured bare.
#[derive(Debug, Clone, Copy)]
enum Leg {
    /// The job: persistent, into a quorum queue, publisher-confirmed, consumed with acks.
    Job,
    /// The reply to a waiting front door: transient, unconfirmed, into an exclusive
    /// server-named classic queue, consumed without acks.
    Reply,
}

impl Leg {
    fn name(self) -> &'static str {
        match self {
            Self::Job => "job",
            Self::Reply => "reply",
        }
    }

    fn describe(self) -> &'static str {
        match self {
            Self::Job => "the job leg (quorum queue, persistent, pipelined confirms, acked)",
            Self::Reply => {
                "the reply leg (exclusive classic queue, transient, unconfirmed, no-ack consumer)"
            }
        }
    }

    /// Publishes and consumes `n` messages; the rate and the CPU snapshots around the work.
    async fn run(
        self,
        conn: &lapin::Connection,
        n: usize,
        watched: &[Watched],
    ) -> anyhow::Result<(f64, CpuSnapshot, CpuSnapshot)> {
        let publisher = conn.create_channel().await?;
        let consumer_ch = conn.create_channel().await?;
        let (queue, no_ack) = match self {
            Self::Job => {
                publisher
                    .confirm_select(ConfirmSelectOptions::default())
                    .await?;
                let queue = format!("aptix-bench-baseline-{}", uuid::Uuid::new_v4().simple());
                let mut args = FieldTable::default();
                args.insert(
                    ShortString::from("x-queue-type"),
                    AMQPValue::LongString(LongString::from("quorum")),
                );
                publisher
                    .queue_declare(
                        queue.as_str().into(),
                        QueueDeclareOptions {
                            durable: true,
                            ..Default::default()
                        },
                        args,
                    )
                    .await?;
                consumer_ch
                    .basic_qos(256, BasicQosOptions::default())
                    .await?;
                (queue, false)
            }
            Self::Reply => {
                let declared = consumer_ch
                    .queue_declare(
                        "".into(),
                        QueueDeclareOptions {
                            exclusive: true,
                            auto_delete: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await?;
                (declared.name().to_string(), true)
            }
        };
        let mut consumer = consumer_ch
            .basic_consume(
                queue.as_str().into(),
                "baseline".into(),
                BasicConsumeOptions {
                    no_ack,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await?;
        let cancel_on = consumer_ch.clone();
        let consumed = tokio::spawn(async move {
            let mut got = 0usize;
            while got < n {
                match consumer.next().await {
                    Some(Ok(d)) => {
                        if !no_ack {
                            let _ = d.acker.ack(BasicAckOptions::default()).await;
                        }
                        got += 1;
                    }
                    _ => break,
                }
            }
            // Cancel here and wait for the broker's answer while the consumer still exists:
            // a consumer merely dropped is cancelled in the background, and that cancel racing
            // the channel's close or the queue's deletion (which cancels it from the broker's
            // side) once made lapin see a cancel-ok it was not waiting for and drop the
            // connection (UNEXPECTED-FRAME).
            let _ = cancel_on
                .basic_cancel("baseline".into(), BasicCancelOptions::default())
                .await;
            drop(consumer);
            got
        });
        let payload = vec![b'x'; 300];
        let mode = match self {
            Self::Job => 2,
            Self::Reply => 1,
        };
        let before = cpu_snapshot(watched);
        let started = Instant::now();
        let mut window = Vec::with_capacity(1000);
        for _ in 0..n {
            let confirm = publisher
                .basic_publish(
                    "".into(),
                    queue.as_str().into(),
                    BasicPublishOptions::default(),
                    &payload,
                    lapin::BasicProperties::default().with_delivery_mode(mode),
                )
                .await?;
            window.push(confirm);
            if window.len() == 1000 {
                for c in window.drain(..) {
                    c.await?;
                }
            }
        }
        for c in window.drain(..) {
            c.await?;
        }
        let got = tokio::time::timeout(Duration::from_secs(300), consumed)
            .await
            .with_context(|| format!("the baseline's {} leg did not finish", self.name()))??;
        let rate = n as f64 / started.elapsed().as_secs_f64();
        let after = cpu_snapshot(watched);
        // The consumer is cancelled and its channel closed before the queue goes, so the
        // broker has no consumer to cancel from its side.
        let _ = consumer_ch.close(200, "baseline leg done".into()).await;
        if matches!(self, Self::Job) {
            let _ = publisher
                .queue_delete(queue.as_str().into(), QueueDeleteOptions::default())
                .await;
        }
        let _ = publisher.close(200, "baseline leg done".into()).await;
        anyhow::ensure!(
            got == n,
            "the baseline's {} leg consumed {got} of {n}",
            self.name()
        );
        Ok((rate, before, after))
    }
}
