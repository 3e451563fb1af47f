//! The call limiter's stores (memory, Redis, Redis Cluster) pass one suite: slots are capped, expire unless
//! renewed and come back when released; calls are spaced; a slow-down holds every caller; and
//! [`CallLimiter`] waits within its bound, then gives up with `NoCapacity`.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use aptix_worker::limiter::{CallLimiter, CallLimits, LimitStore, MemoryLimits, RedisLimits};
use aptix_worker::metrics::Metrics;
use aptix_worker::store::redis::RedisOptions;

use crate::support::{RedisGuard, redis_store};

/// A limit store, and the guard that removes its Redis keys.
type Limits = (Arc<dyn LimitStore>, Option<RedisGuard>);

fn memory() -> Limits {
    (Arc::new(MemoryLimits::new()), None)
}

async fn redis() -> Limits {
    let guard = redis_store().await;
    let limits = RedisLimits::connect(
        &crate::support::redis_url(),
        guard.store.namespace(),
        &RedisOptions {
            timeout: Duration::from_secs(3),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    (Arc::new(limits), Some(guard))
}

/// On the tests' three-master Redis Cluster, under a fresh namespace (the cluster goes away
/// with the test process).
async fn cluster() -> Limits {
    let limits = RedisLimits::connect(
        &crate::redis_cluster::cluster().await.urls,
        &format!("aptix-test-{}", uuid::Uuid::new_v4().simple()),
        &RedisOptions {
            cluster: true,
            ..RedisOptions::default()
        },
    )
    .await
    .unwrap();
    (Arc::new(limits), None)
}

const TTL: Duration = Duration::from_secs(30);

async fn slots_are_capped_and_come_back_when_released((limits, _g): Limits) {
    assert!(limits.try_slot("c", "a", 2, TTL).await.unwrap());
    assert!(limits.try_slot("c", "b", 2, TTL).await.unwrap());
    assert!(
        !limits.try_slot("c", "x", 2, TTL).await.unwrap(),
        "over the cap"
    );
    assert!(
        limits.try_slot("other", "x", 2, TTL).await.unwrap(),
        "contexts are counted apart"
    );
    assert_eq!(limits.slots_in_use("c").await.unwrap(), 2);
    limits.release_slot("c", "a").await.unwrap();
    assert_eq!(limits.slots_in_use("c").await.unwrap(), 1);
    assert!(limits.try_slot("c", "x", 2, TTL).await.unwrap());
}

async fn a_slot_expires_unless_renewed((limits, _g): Limits) {
    let ttl = Duration::from_millis(400);
    assert!(limits.try_slot("c", "kept", 2, ttl).await.unwrap());
    assert!(limits.try_slot("c", "dropped", 2, ttl).await.unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    assert!(limits.renew_slot("c", "kept", ttl).await.unwrap());
    tokio::time::sleep(Duration::from_millis(250)).await;
    // 500 ms after taking: "dropped" expired, "kept" was renewed 250 ms ago.
    assert_eq!(limits.slots_in_use("c").await.unwrap(), 1);
    assert!(!limits.renew_slot("c", "dropped", ttl).await.unwrap());
    assert!(limits.try_slot("c", "new", 2, ttl).await.unwrap());
    assert!(!limits.try_slot("c", "over", 2, ttl).await.unwrap());
}

async fn calls_are_spaced_by_the_interval((limits, _g): Limits) {
    let interval = Duration::from_millis(300);
    assert_eq!(limits.try_rate("c", interval).await.unwrap(), None);
    let wait = limits
        .try_rate("c", interval)
        .await
        .unwrap()
        .expect("too soon");
    assert!(
        wait <= interval && wait >= Duration::from_millis(200),
        "{wait:?}"
    );
    assert_eq!(
        limits.try_rate("other", interval).await.unwrap(),
        None,
        "contexts are counted apart"
    );
    tokio::time::sleep(wait).await;
    assert_eq!(limits.try_rate("c", interval).await.unwrap(), None);
}

async fn a_slow_down_holds_the_next_call((limits, _g): Limits) {
    limits
        .slow_down("c", Duration::from_millis(400))
        .await
        .unwrap();
    let wait = limits
        .try_rate("c", Duration::ZERO)
        .await
        .unwrap()
        .expect("held back");
    assert!(wait > Duration::from_millis(300), "{wait:?}");
    // A shorter slow-down does not shorten a longer one.
    limits
        .slow_down("c", Duration::from_millis(50))
        .await
        .unwrap();
    assert!(
        limits.try_rate("c", Duration::ZERO).await.unwrap().unwrap() > Duration::from_millis(250)
    );
}

fn limiter(limits: &Arc<dyn LimitStore>, call_limits: CallLimits) -> CallLimiter {
    CallLimiter::new(limits.clone(), "ctx", call_limits, Arc::new(Metrics::new()))
}

async fn the_limiter_waits_for_a_slot_then_gives_up((limits, _g): Limits) {
    let capped = limiter(
        &limits,
        CallLimits {
            max_concurrent: Some(1),
            per_window: None,
            window: Duration::from_secs(60),
            wait: Duration::from_millis(300),
            slot_ttl: Duration::from_secs(5),
        },
    );
    let held = capped.acquire().await.unwrap();
    let started = Instant::now();
    let refused = capped.acquire().await.unwrap_err();
    assert!(
        started.elapsed() >= Duration::from_millis(250),
        "it waited first"
    );
    assert_eq!(
        (refused.context.as_str(), refused.why),
        ("ctx", "maxConcurrentCalls")
    );
    // Released: the next caller gets it.
    let waiter = {
        let capped = capped.clone();
        tokio::spawn(async move { capped.acquire().await.map(|_| ()) })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(held);
    waiter
        .await
        .unwrap()
        .expect("the released slot went to the waiter");
}

async fn a_held_permit_keeps_its_slot_past_the_slot_ttl((limits, _g): Limits) {
    let short = CallLimits {
        max_concurrent: Some(1),
        per_window: None,
        window: Duration::from_secs(60),
        wait: Duration::from_millis(100),
        slot_ttl: Duration::from_millis(300),
    };
    let capped = limiter(&limits, short);
    let held = capped.acquire().await.unwrap();
    // A model call that takes three times the slot's time to live: the holder renews it.
    tokio::time::sleep(Duration::from_millis(900)).await;
    assert_eq!(limits.slots_in_use("ctx").await.unwrap(), 1);
    assert!(capped.acquire().await.is_err(), "the slot is still taken");
    drop(held);
}

async fn the_limiter_keeps_concurrency_and_spacing((limits, _g): Limits) {
    let limited = limiter(
        &limits,
        CallLimits {
            max_concurrent: Some(2),
            per_window: Some(5),
            window: Duration::from_millis(500),
            wait: Duration::from_secs(10),
            slot_ttl: Duration::from_secs(5),
        },
    );
    let running = Arc::new(AtomicU32::new(0));
    let peak = Arc::new(AtomicU32::new(0));
    let started = Instant::now();
    let calls: Vec<_> = (0..8)
        .map(|_| {
            let (limited, running, peak) = (limited.clone(), running.clone(), peak.clone());
            tokio::spawn(async move {
                let _permit = limited.acquire().await.unwrap();
                let at = started.elapsed();
                let now = running.fetch_add(1, Ordering::SeqCst) + 1;
                peak.fetch_max(now, Ordering::SeqCst);
                tokio::time::sleep(Duration::from_millis(150)).await;
                running.fetch_sub(1, Ordering::SeqCst);
                at
            })
        })
        .collect();
    let mut times = Vec::new();
    for c in calls {
        times.push(c.await.unwrap());
    }
    times.sort();
    assert_eq!(peak.load(Ordering::SeqCst), 2);
    // Five per 500 ms: 100 ms apart at the limiter (the times here are taken after `acquire`
    // returns, so scheduling can move one a little); eight calls span at least seven intervals.
    for pair in times.windows(2) {
        assert!(pair[1] - pair[0] >= Duration::from_millis(60), "{times:?}");
    }
    assert!(
        times[7] - times[0] >= Duration::from_millis(650),
        "{times:?}"
    );
    // Slots are given back in the background as permits drop.
    let deadline = Instant::now() + Duration::from_secs(2);
    while limits.slots_in_use("ctx").await.unwrap() > 0 {
        assert!(Instant::now() < deadline, "a slot was not given back");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

for_each_backend!(
    backends: [
        memory => super::memory(),
        redis => super::redis().await,
        cluster => super::cluster().await,
    ],
    tests: [
        slots_are_capped_and_come_back_when_released,
        a_slot_expires_unless_renewed,
        calls_are_spaced_by_the_interval,
        a_slow_down_holds_the_next_call,
        the_limiter_waits_for_a_slot_then_gives_up,
        the_limiter_keeps_concurrency_and_spacing,
        a_held_permit_keeps_its_slot_past_the_slot_ttl,
    ],
);

/// A day's tally expires a keep after the write that made it (a day's tally is made that
/// day), set by that write alone: a later call's count neither sets nor stretches the expiry
/// (one command fewer on every call but the day's first), a field new to the tally sets it
/// again, and the counts add up. A count an earlier version kept in a key of its own is read
/// back as it is (what the quotas take when larger than the tally's sum).
#[tokio::test]
async fn a_days_tally_expires_a_keep_after_the_write_that_made_it() {
    let (limits, guard) = redis().await;
    let ns = guard
        .as_ref()
        .map(|g| g.store.namespace().to_string())
        .unwrap();
    let tally_key = format!("{ns}:limit:{{t}}:usage:2026-11-29");
    let mut conn = crate::support::redis_connection().await;
    let keep = Duration::from_secs(60);
    let count = |ctx: &str, calls: u64, input: u64| {
        vec![
            (format!("{ctx}/calls"), calls),
            (format!("{ctx}/input"), input),
        ]
    };
    let reader = conn.clone();
    let ttl = |key: String| {
        let mut conn = reader.clone();
        async move {
            let ms: i64 = ::redis::cmd("PTTL")
                .arg(&key)
                .query_async(&mut conn)
                .await
                .unwrap();
            ms
        }
    };
    limits
        .add_tally("t", "2026-11-29", &count("a", 1, 7), keep)
        .await
        .unwrap();
    let ms = ttl(tally_key.clone()).await;
    assert!(
        ms > 50_000 && ms <= 60_000,
        "the first write keeps it: {ms}"
    );
    // Shortened by hand: a later count of the same fields leaves the expiry alone.
    let _: i64 = ::redis::cmd("PEXPIRE")
        .arg(&tally_key)
        .arg(5_000)
        .query_async(&mut conn)
        .await
        .unwrap();
    limits
        .add_tally("t", "2026-11-29", &count("a", 1, 3), keep)
        .await
        .unwrap();
    let ms = ttl(tally_key.clone()).await;
    assert!(
        ms > 0 && ms <= 5_000,
        "a later count stretched the expiry: {ms}"
    );
    // A context new to the day's tally makes fields: the tally's expiry is set again.
    limits
        .add_tally("t", "2026-11-29", &count("b", 1, 1), keep)
        .await
        .unwrap();
    let ms = ttl(tally_key.clone()).await;
    assert!(ms > 50_000, "a new field sets the tally's expiry: {ms}");
    // The count an earlier version kept beside the tally, where there is one.
    assert_eq!(limits.earlier_count("t", "2026-11-29").await.unwrap(), 0);
    let _: () = ::redis::cmd("SET")
        .arg(format!("{ns}:limit:{{t}}:tokens:2026-11-29"))
        .arg(16)
        .query_async(&mut conn)
        .await
        .unwrap();
    assert_eq!(limits.earlier_count("t", "2026-11-29").await.unwrap(), 16);
    let tally = limits.tally("t", "2026-11-29").await.unwrap();
    assert_eq!(
        tally.into_iter().collect::<Vec<_>>(),
        [
            ("a/calls".to_string(), 2),
            ("a/input".to_string(), 10),
            ("b/calls".to_string(), 1),
            ("b/input".to_string(), 1),
        ]
    );
}
