//! `aptix-bench turns --webhooks N`: what sending webhook deliveries costs. A receiver on loopback
//! answers 204 to every POST; the baseline is the bare HTTP client POSTing the same signed
//! body with the sender's concurrency (the best sending can do here); the product is the
//! sender taking N deliveries from the webhook queue (RabbitMQ with `APTIX_AMQP_URL`, else the
//! embedded one) at default settings. Printed: deliveries per second of each and their ratio,
//! the CPU per delivery of this process (sender, and receiver in both runs) and of RabbitMQ.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use futures_util::StreamExt as _;

use aptix_worker::config::Config;
use aptix_worker::metrics::Metrics;
use aptix_worker::queue::{Broker, MemoryBroker, RabbitBroker};
use aptix_worker::webhooks::guard::Guard;
use aptix_worker::webhooks::send::Sender;
use aptix_worker::webhooks::sign::{Secrets, SigningKey};
use aptix_worker::webhooks::{EventType, HookJob, Target};

use super::procfs::{cpu_seconds, pids_named};

const SECRET_ENV: &str = "APTIX_BENCH_WEBHOOK_SECRET";
const SECRET: &str = "whsec_YmVuY2htYXJrLXNlY3JldC1vZi0zMi1ieXRlcy4uLg==";

/// A receiver on loopback that answers 204 and counts.
async fn receiver() -> anyhow::Result<(String, Arc<AtomicUsize>)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/hook", listener.local_addr()?);
    let count = Arc::new(AtomicUsize::new(0));
    let counted = count.clone();
    let app = axum::Router::new().route(
        "/hook",
        axum::routing::post(move |_body: axum::body::Bytes| {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::Relaxed);
                axum::http::StatusCode::NO_CONTENT
            }
        }),
    );
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((url, count))
}

/// A `turn.completed` body the size of a short answer's.
fn event_body() -> String {
    let data = serde_json::json!({
        "sessionId": "bench", "turnId": "t", "status": "completed", "attempts": 1,
        "submittedAt": "2026-11-26T00:00:00Z", "completedAt": "2026-11-26T00:00:01Z",
        "result": {"successful": true, "errors": [], "warnings": [], "result": {
            "kind": "final", "primaryOutputText": "x".repeat(900)}}
    });
    aptix_worker::webhooks::event_body(
        EventType::TurnCompleted,
        "2026-11-26T00:00:01Z",
        "bench",
        &data,
    )
}

/// CPU seconds of this process and of RabbitMQ's (`beam.smp`) processes.
fn cpu_now() -> (f64, f64) {
    let own = cpu_seconds(std::process::id()).unwrap_or(0.0);
    let rabbit = pids_named("beam.smp")
        .into_iter()
        .filter_map(cpu_seconds)
        .sum();
    (own, rabbit)
}

struct Measured {
    per_second: f64,
    own_cpu_ms: f64,
    rabbit_cpu_ms: f64,
}

impl Measured {
    fn of(n: usize, took: Duration, before: (f64, f64), after: (f64, f64)) -> Self {
        let n = n.max(1) as f64;
        Self {
            per_second: n / took.as_secs_f64(),
            own_cpu_ms: (after.0 - before.0) * 1000.0 / n,
            rabbit_cpu_ms: (after.1 - before.1) * 1000.0 / n,
        }
    }
}

/// Runs the benchmark with `n` deliveries.
pub async fn run(config: &Config, n: usize) -> anyhow::Result<()> {
    let concurrency = config.webhooks.send.concurrency;
    let (url, count) = receiver().await?;
    let body = event_body();
    let key = SigningKey::parse(SECRET).context("the bench secret")?;

    // The baseline: the bare client, the same body and headers, `concurrency` in flight.
    let http = aptix_worker::tls::http_client_builder(None)?.build()?;
    let before = cpu_now();
    let started = Instant::now();
    futures_util::stream::iter(0..n)
        .map(|i| {
            let (http, url, body, key) = (&http, &url, &body, &key);
            async move {
                let id = format!("evt_bench{i}");
                let mut req = http
                    .post(url.as_str())
                    .header("content-type", "application/json");
                for (name, value) in key.headers(&id, 1_764_115_200, body.as_bytes()) {
                    req = req.header(name, value);
                }
                req.body(body.clone()).send().await.map(|r| r.status())
            }
        })
        .buffer_unordered(usize::from(concurrency))
        .for_each(|r| async move {
            if !r.is_ok_and(|s| s.is_success()) {
                tracing::warn!("a baseline POST failed");
            }
        })
        .await;
    let baseline = Measured::of(n, started.elapsed(), before, cpu_now());
    count.store(0, Ordering::Relaxed);

    // The product: N deliveries on the webhook queue, the sender at default settings.
    let mut topology = config.topology();
    topology.namespace = format!("bench-webhooks-{}", uuid::Uuid::new_v4().simple());
    let (broker, rabbit): (Arc<dyn Broker>, Option<Arc<RabbitBroker>>) = match &config.broker.url {
        Some(amqp) => {
            let r = Arc::new(RabbitBroker::new(
                amqp.expose(),
                topology.clone(),
                "aptix-bench-webhooks",
            ));
            r.connect().await?;
            (r.clone(), Some(r))
        }
        None => (Arc::new(MemoryBroker::new()), None),
    };
    let job = |i: usize| HookJob {
        id: format!("evt_bench{i}"),
        event: EventType::TurnCompleted,
        target: Target {
            url: url.clone(),
            secret_env: SECRET_ENV.into(),
        },
        tenant: "bench".into(),
        body: body.clone(),
        traceparent: None,
        attempts: 0,
        first_at: time::OffsetDateTime::now_utc().unix_timestamp(),
        line: None,
        last_error: None,
    };
    let enqueue_started = Instant::now();
    futures_util::stream::iter(0..n)
        .map(|i| {
            let broker = broker.clone();
            let bytes = serde_json::to_vec(&job(i));
            async move {
                broker
                    .enqueue_hook(&bytes?)
                    .await
                    .map_err(anyhow::Error::from)
            }
        })
        .buffer_unordered(64)
        .collect::<Vec<_>>()
        .await
        .into_iter()
        .collect::<anyhow::Result<Vec<()>>>()?;
    let enqueue_rate = n as f64 / enqueue_started.elapsed().as_secs_f64();
    let mut secrets = Secrets::new();
    secrets.insert(SECRET_ENV.to_string(), key);
    let guard = Guard::new(true, "127.0.0.0/8".parse().map_err(anyhow::Error::msg)?);
    let sender = Sender::new(
        broker.clone(),
        (guard, Arc::new(secrets)),
        config.webhooks.send.clone(),
        Arc::new(Metrics::new()),
        None,
    )?;
    let stop = tokio_util::sync::CancellationToken::new();
    let before = cpu_now();
    let started = Instant::now();
    let task = sender.spawn(stop.clone());
    let deadline = started + Duration::from_secs(600);
    while count.load(Ordering::Relaxed) < n {
        anyhow::ensure!(
            Instant::now() < deadline,
            "only {} of {n} deliveries in 10 minutes",
            count.load(Ordering::Relaxed)
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let product = Measured::of(n, started.elapsed(), before, cpu_now());
    stop.cancel();
    let _ = task.await;
    if let Some(r) = rabbit {
        r.delete_topology().await?;
    }

    let on = if config.broker.url.is_some() {
        "RabbitMQ"
    } else {
        "the embedded queue"
    };
    println!(
        "webhook deliveries: {n}, {concurrency} in flight, {}-byte body, queue on {on}",
        body.len()
    );
    println!(
        "  baseline (bare HTTP client, same body and signature): {:>8.0} deliveries/s, {:.3} ms CPU per delivery in this process",
        baseline.per_second, baseline.own_cpu_ms
    );
    println!(
        "  sender (queue → sign → POST → ack):                   {:>8.0} deliveries/s, {:.3} ms CPU per delivery in this process, {:.3} ms in RabbitMQ",
        product.per_second, product.own_cpu_ms, product.rabbit_cpu_ms
    );
    println!(
        "  ratio sender/baseline: {:.2} of the throughput, {:.2}x the CPU in this process (the receiver's share is in both)",
        product.per_second / baseline.per_second,
        product.own_cpu_ms / baseline.own_cpu_ms.max(f64::EPSILON)
    );
    println!("  enqueueing (what a worker does per delivery): {enqueue_rate:.0} deliveries/s");
    Ok(())
}
