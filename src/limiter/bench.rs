//! `aptix-bench limiter`: what the per-context limiter adds to each model call, against the
//! bare component measured in the same run — a `tokio` semaphore for the in-memory limiter, one
//! Redis round trip (`PING`, pipelined by the same multiplexed connection when callers overlap)
//! for the Redis one. Limits are set so that no call ever waits: what is measured is the cost
//! of asking, not the waiting.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{CallLimiter, CallLimits, LimitStore, LimitStoreError, MemoryLimits, RedisLimits};
use crate::metrics::Metrics;
use crate::store::redis::RedisOptions;

/// Limits that are checked on every call and never reached.
fn never_reached() -> CallLimits {
    CallLimits {
        max_concurrent: Some(1_000_000),
        per_window: Some(100_000_000),
        window: Duration::from_secs(60),
        wait: Duration::from_secs(10),
        slot_ttl: Duration::from_secs(30),
    }
}

/// CPU seconds the live threads of this process have used (Linux `schedstat` of every task,
/// nanosecond resolution; the runtime's worker threads live as long as the run).
fn own_cpu() -> Option<f64> {
    let mut ns = 0u64;
    for task in std::fs::read_dir("/proc/self/task").ok()?.flatten() {
        let text = std::fs::read_to_string(task.path().join("schedstat")).ok()?;
        ns += text.split_whitespace().next()?.parse::<u64>().ok()?;
    }
    Some(ns as f64 / 1e9)
}

/// CPU seconds the Redis server has used, from `INFO cpu`.
async fn redis_cpu(conn: &mut redis::aio::MultiplexedConnection) -> Option<f64> {
    let info: String = redis::cmd("INFO").arg("cpu").query_async(conn).await.ok()?;
    let field = |name: &str| -> Option<f64> {
        info.lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(field("used_cpu_sys:")? + field("used_cpu_user:")?)
}

/// One limited call: a permit taken and dropped at once.
fn acquire_and_release(
    limiter: CallLimiter,
) -> impl Fn()
    -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), LimitStoreError>> + Send>>
+ Send
+ Sync
+ Clone
+ 'static {
    move || {
        let limiter = limiter.clone();
        Box::pin(async move {
            limiter
                .acquire()
                .await
                .map(drop)
                .map_err(|e| LimitStoreError(e.to_string()))
        })
    }
}

/// One measured run: wall time and CPU seconds of this process and of Redis.
struct Measured {
    wall: Duration,
    own_cpu: f64,
    redis_cpu: Option<f64>,
}

async fn measure<F, Fut>(
    redis: Option<&mut redis::aio::MultiplexedConnection>,
    callers: usize,
    calls: usize,
    one: F,
) -> Result<Measured, LimitStoreError>
where
    F: Fn() -> Fut + Send + Sync + Clone + 'static,
    Fut: std::future::Future<Output = Result<(), LimitStoreError>> + Send,
{
    let mut redis = redis;
    let cpu_before = own_cpu().unwrap_or(0.0);
    let redis_before = match redis.as_deref_mut() {
        Some(c) => redis_cpu(c).await,
        None => None,
    };
    let started = Instant::now();
    let per_caller = calls / callers.max(1);
    let tasks: Vec<_> = (0..callers)
        .map(|_| {
            let one = one.clone();
            tokio::spawn(async move {
                for _ in 0..per_caller {
                    one().await?;
                }
                Ok::<(), LimitStoreError>(())
            })
        })
        .collect();
    for t in tasks {
        t.await
            .map_err(|e| LimitStoreError(format!("a caller stopped: {e}")))??;
    }
    let wall = started.elapsed();
    let redis_cpu = match (redis, redis_before) {
        (Some(c), Some(before)) => redis_cpu(c).await.map(|after| after - before),
        _ => None,
    };
    Ok(Measured {
        wall,
        own_cpu: own_cpu().unwrap_or(0.0) - cpu_before,
        redis_cpu,
    })
}

fn row(label: &str, m: &Measured, calls: usize, baseline: Option<&Measured>) {
    let per = |s: f64| s * 1e6 / calls as f64;
    let ratio = baseline.map_or(String::from("1.00x (baseline)"), |b| {
        format!(
            "{:.2}x",
            m.wall.as_secs_f64() / b.wall.as_secs_f64().max(f64::EPSILON)
        )
    });
    println!(
        "  {label:<34} {:>10.1} {:>12.0} {:>14.1} {:>14} {:>18}",
        per(m.wall.as_secs_f64()),
        calls as f64 / m.wall.as_secs_f64().max(f64::EPSILON),
        per(m.own_cpu),
        m.redis_cpu
            .map_or("-".to_string(), |c| format!("{:.1}", per(c))),
        ratio
    );
}

fn header(title: &str) {
    println!("{title}");
    println!(
        "  {:<34} {:>10} {:>12} {:>14} {:>14} {:>18}",
        "", "us/call", "calls/s", "aptix cpu us", "redis cpu us", "wall vs baseline"
    );
}

/// Runs the benchmark and prints its report; `redis_url` adds the Redis limiter.
pub async fn run(
    redis_url: Option<&str>,
    calls: usize,
    callers: usize,
) -> Result<(), LimitStoreError> {
    // Every caller makes the same number of calls, so the count per call is exact.
    let callers = callers.max(1);
    let calls = (calls / callers).max(1) * callers;
    let metrics = Arc::new(Metrics::new());
    let limiter_over = |store: Arc<dyn LimitStore>| {
        CallLimiter::new(store, "bench", never_reached(), metrics.clone())
    };
    println!(
        "limiter benchmark: {calls} calls, each taking a slot and a rate turn and giving the slot back; limits never reached"
    );
    for width in [1, callers] {
        header(&format!("in memory, {width} caller(s)"));
        let semaphore = Arc::new(tokio::sync::Semaphore::new(1_000_000));
        let base = measure(None, width, calls, move || {
            let semaphore = semaphore.clone();
            async move {
                let _permit = semaphore
                    .acquire()
                    .await
                    .map_err(|e| LimitStoreError(e.to_string()))?;
                Ok(())
            }
        })
        .await?;
        row("baseline: tokio semaphore", &base, calls, None);
        let limiter = limiter_over(Arc::new(MemoryLimits::new()));
        let m = measure(None, width, calls, acquire_and_release(limiter)).await?;
        row("limiter (slot + rate)", &m, calls, Some(&base));
    }
    let Some(url) = redis_url else {
        println!("(set APTIX_REDIS_URL to measure the Redis limiter too)");
        return Ok(());
    };
    let client = redis::Client::open(url).map_err(|e| LimitStoreError(e.to_string()))?;
    let mut probe = client
        .get_multiplexed_async_connection()
        .await
        .map_err(|e| LimitStoreError(e.to_string()))?;
    let namespace = format!("aptix-bench-{}", uuid::Uuid::new_v4().simple());
    let options = RedisOptions {
        timeout: Duration::from_secs(5),
        ..RedisOptions::default()
    };
    let store: Arc<dyn LimitStore> =
        Arc::new(RedisLimits::connect(url, &namespace, &options).await?);
    for width in [1, callers] {
        header(&format!("Redis, {width} caller(s)"));
        let conn = probe.clone();
        let base = measure(Some(&mut probe), width, calls, move || {
            let mut conn = conn.clone();
            async move {
                let _: String = redis::cmd("PING")
                    .query_async(&mut conn)
                    .await
                    .map_err(|e| LimitStoreError(e.to_string()))?;
                Ok(())
            }
        })
        .await?;
        row("baseline: one round trip (PING)", &base, calls, None);
        let limiter = limiter_over(store.clone());
        let m = measure(Some(&mut probe), width, calls, acquire_and_release(limiter)).await?;
        row("limiter (slot + rate + release)", &m, calls, Some(&base));
    }
    // Releases run in the background: give them a moment, then remove the run's keys.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let keys: Vec<String> = redis::cmd("KEYS")
        .arg(format!("{namespace}:*"))
        .query_async(&mut probe)
        .await
        .unwrap_or_default();
    if !keys.is_empty() {
        let _: Result<i64, _> = redis::cmd("DEL").arg(&keys).query_async(&mut probe).await;
    }
    println!(
        "  (the limiter costs three Redis round trips per call: take a slot, take a rate turn, give the slot back; a model call takes 100s of ms)"
    );
    Ok(())
}
