//! What each worker tells of itself, for the system page (`GET /v1/admin/system`, the
//! console's System view): a heartbeat it writes to the store every [`BEAT`] — who it is, what
//! it runs now, and, per [`BEAT`]-long slot of the last [`KEPT_SLOTS`], how many turns it
//! settled and how long they took.
//!
//! Owns: counting settled turns into slots ([`Pulse`], a few atomic adds per turn, nothing
//! else on a turn's path), the heartbeat's shape, and folding every worker's heartbeat into
//! one view of the system ([`SystemLoad::of`]). Must not: run or decide anything (the worker
//! writes its heartbeat: `worker::heartbeat`).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::state::TurnStatus;

/// How often a worker writes its heartbeat, and how long one slot of counts lasts.
pub const BEAT: Duration = Duration::from_secs(5);
/// Slots a heartbeat carries: five minutes of them.
pub const KEPT_SLOTS: usize = 60;
/// A heartbeat older than this is a worker that is gone (three beats missed).
pub const GONE_AFTER: Duration = Duration::from_secs(16);

/// The upper bounds, in milliseconds, of the latency buckets a slot counts turns in (the last
/// bucket holds everything longer).
pub const LATENCY_BOUNDS_MS: [u64; 14] = [
    25, 50, 100, 250, 500, 1_000, 2_500, 5_000, 10_000, 30_000, 60_000, 120_000, 300_000, 600_000,
];
const BUCKETS: usize = LATENCY_BOUNDS_MS.len() + 1;

/// The counts of the slot now being filled. Shared by a process's parts through its
/// [`crate::metrics::Metrics`]; the heartbeat takes (and empties) it once a beat.
#[derive(Debug, Default)]
pub struct Pulse {
    completed: AtomicU64,
    failed: AtomicU64,
    cancelled: AtomicU64,
    awaiting: AtomicU64,
    latency: [AtomicU64; BUCKETS],
    /// Turns running now, by tenant (`""` for turns without one).
    running: Mutex<HashMap<String, u32>>,
}

impl Pulse {
    /// A run published this status; `took` is the time from the request the client sent (a
    /// user turn's submission, a continuation's run start) to the result.
    pub fn settled(&self, status: TurnStatus, took: Duration) {
        let counter = match status {
            TurnStatus::Completed => &self.completed,
            TurnStatus::Failed => &self.failed,
            TurnStatus::Cancelled => &self.cancelled,
            // A run publishes no other status; one that did would be counted as waiting.
            TurnStatus::AwaitingClientTools | TurnStatus::Queued | TurnStatus::Running => {
                &self.awaiting
            }
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let ms = u64::try_from(took.as_millis()).unwrap_or(u64::MAX);
        let bucket = LATENCY_BOUNDS_MS
            .iter()
            .position(|bound| ms <= *bound)
            .unwrap_or(BUCKETS - 1);
        self.latency[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// A turn of `tenant` runs until the guard is dropped.
    pub fn running<'a>(&'a self, tenant: Option<&'a str>) -> Running<'a> {
        let tenant = tenant.unwrap_or_default();
        if let Ok(mut by) = self.running.lock() {
            match by.get_mut(tenant) {
                Some(n) => *n += 1,
                None => {
                    by.insert(tenant.to_string(), 1);
                }
            }
        }
        Running {
            pulse: self,
            tenant,
        }
    }

    /// The slot filled since the last take, which starts a new one.
    pub(crate) fn take(&self, at: i64) -> Slot {
        let take = |c: &AtomicU64| c.swap(0, Ordering::Relaxed);
        Slot {
            at,
            completed: take(&self.completed),
            failed: take(&self.failed),
            cancelled: take(&self.cancelled),
            awaiting_client_tools: take(&self.awaiting),
            latency_ms: self.latency.iter().map(take).collect(),
        }
    }

    /// Turns running now, by tenant.
    pub(crate) fn running_now(&self) -> BTreeMap<String, u32> {
        self.running
            .lock()
            .map(|by| {
                by.iter()
                    .filter(|(_, n)| **n > 0)
                    .map(|(t, n)| (t.clone(), *n))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// A running turn, counted until dropped.
#[derive(Debug)]
pub struct Running<'a> {
    pulse: &'a Pulse,
    tenant: &'a str,
}

impl Drop for Running<'_> {
    fn drop(&mut self) {
        if let Ok(mut by) = self.pulse.running.lock()
            && let Some(n) = by.get_mut(self.tenant)
        {
            *n = n.saturating_sub(1);
        }
    }
}

/// One slot of a worker's counts.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Slot {
    /// When the slot ended (Unix seconds, a multiple of [`BEAT`]).
    pub at: i64,
    /// Turns completed.
    pub completed: u64,
    /// Turns failed.
    pub failed: u64,
    /// Turns cancelled.
    pub cancelled: u64,
    /// Runs that ended waiting for client tools.
    pub awaiting_client_tools: u64,
    /// Results by latency bucket ([`LATENCY_BOUNDS_MS`], then the rest).
    pub latency_ms: Vec<u64>,
}

impl Slot {
    fn results(&self) -> u64 {
        self.completed + self.failed + self.cancelled + self.awaiting_client_tools
    }
}

/// One agent context as one worker sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ContextLoad {
    /// The agent context.
    pub context: String,
    /// Model calls in flight.
    pub in_flight: i64,
    /// `maxConcurrentCalls`, if the context has one (shared by every worker).
    pub capacity: Option<u32>,
    /// Calls that waited for capacity since the worker started.
    pub capacity_waits: u64,
}

/// A worker's heartbeat.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Heartbeat {
    /// The worker (host, process and a random part).
    pub worker: String,
    /// Its host name.
    pub host: String,
    /// Its process id.
    pub pid: u32,
    /// When it started (RFC 3339).
    pub started_at: String,
    /// When this heartbeat was written (Unix milliseconds).
    pub at_ms: i64,
    /// Turns it runs at once at most.
    pub concurrency: u16,
    /// Turns running now, by tenant.
    pub running: BTreeMap<String, u32>,
    /// Its agent contexts.
    pub contexts: Vec<ContextLoad>,
    /// Its latest slots, oldest first.
    pub slots: Vec<Slot>,
}

/// Who a worker is, for its heartbeat.
#[derive(Debug, Clone)]
pub struct Identity {
    pub(crate) worker: String,
    pub(crate) host: String,
    pub(crate) pid: u32,
    pub(crate) started_at: String,
    pub(crate) concurrency: u16,
}

impl Identity {
    /// This process, running at most `concurrency` turns at once.
    pub fn of_this_process(concurrency: u16) -> Self {
        let host = std::env::var("HOSTNAME")
            .ok()
            .filter(|h| !h.is_empty())
            .or_else(|| {
                std::fs::read_to_string("/proc/sys/kernel/hostname")
                    .ok()
                    .map(|h| h.trim().to_string())
            })
            .unwrap_or_else(|| "unknown".into());
        let pid = std::process::id();
        let worker = format!("{host}/{pid}/{:08x}", fastrand::u32(..));
        let started_at = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap_or_default();
        Self {
            worker,
            host,
            pid,
            started_at,
            concurrency,
        }
    }

    /// The worker's id in heartbeats.
    pub fn worker(&self) -> &str {
        &self.worker
    }
}

/// Now, in Unix milliseconds.
pub(crate) fn unix_ms() -> i64 {
    (time::OffsetDateTime::now_utc().unix_timestamp_nanos() / 1_000_000) as i64
}

/// The heartbeats of the workers alive now, read from what the store holds (unreadable and
/// stale ones left out).
pub fn alive(raw: Vec<Vec<u8>>) -> Vec<Heartbeat> {
    let now = unix_ms();
    let gone = GONE_AFTER.as_millis() as i64;
    let mut out: Vec<Heartbeat> = raw
        .iter()
        .filter_map(|b| serde_json::from_slice::<Heartbeat>(b).ok())
        .filter(|h| now - h.at_ms <= gone)
        .collect();
    out.sort_by(|a, b| a.worker.cmp(&b.worker));
    out
}

/// One slot of the whole system: every worker's counts added up.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct LoadPoint {
    /// When the slot ended (Unix seconds).
    pub at: i64,
    /// Turn results published per second (every status, continuations included).
    pub results_per_second: f64,
    /// Turns completed in the slot.
    pub completed: u64,
    /// Turns failed in the slot.
    pub failed: u64,
    /// Turns cancelled in the slot.
    pub cancelled: u64,
    /// Runs that ended waiting for client tools.
    pub awaiting_client_tools: u64,
    /// Latency percentiles of the slot's results, in milliseconds (absent without results):
    /// the upper bound of the bucket that holds the percentile, so an upper estimate.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p50_ms: Option<u64>,
    /// 95th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p95_ms: Option<u64>,
    /// 99th percentile.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub p99_ms: Option<u64>,
}

/// The system's load over the last minutes, from every live worker's heartbeat.
#[derive(Debug, Clone, PartialEq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct SystemLoad {
    /// One point per slot, oldest first; a slot no worker reported reads as zero.
    pub points: Vec<LoadPoint>,
    /// Model calls by agent context, over every worker.
    pub contexts: Vec<ContextTotal>,
    /// Turns running now, by tenant, over every worker (`""`: turns without a tenant).
    pub running_by_tenant: BTreeMap<String, u32>,
}

/// One agent context over every worker.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct ContextTotal {
    /// The agent context.
    pub context: String,
    /// Model calls in flight now.
    pub in_flight: i64,
    /// `maxConcurrentCalls`, if set.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capacity: Option<u32>,
    /// Calls that waited for capacity, since each worker started.
    pub capacity_waits: u64,
}

impl SystemLoad {
    /// Adds up `workers`' heartbeats; the series ends at the latest slot `now_s` (Unix
    /// seconds) has closed and covers [`KEPT_SLOTS`] slots.
    pub fn of(workers: &[Heartbeat], now_s: i64) -> Self {
        let beat = BEAT.as_secs() as i64;
        let last = now_s / beat * beat;
        let first = last - beat * (KEPT_SLOTS as i64 - 1);
        let mut by_at: BTreeMap<i64, Slot> = (0..KEPT_SLOTS as i64)
            .map(|i| {
                let at = first + i * beat;
                (
                    at,
                    Slot {
                        at,
                        latency_ms: vec![0; BUCKETS],
                        ..Slot::default()
                    },
                )
            })
            .collect();
        let mut contexts: BTreeMap<String, ContextTotal> = BTreeMap::new();
        let mut running_by_tenant: BTreeMap<String, u32> = BTreeMap::new();
        for w in workers {
            for s in &w.slots {
                let Some(sum) = by_at.get_mut(&s.at) else {
                    continue;
                };
                sum.completed += s.completed;
                sum.failed += s.failed;
                sum.cancelled += s.cancelled;
                sum.awaiting_client_tools += s.awaiting_client_tools;
                for (total, n) in sum.latency_ms.iter_mut().zip(&s.latency_ms) {
                    *total += n;
                }
            }
            for c in &w.contexts {
                let total = contexts
                    .entry(c.context.clone())
                    .or_insert_with(|| ContextTotal {
                        context: c.context.clone(),
                        in_flight: 0,
                        capacity: c.capacity,
                        capacity_waits: 0,
                    });
                total.in_flight += c.in_flight;
                total.capacity_waits += c.capacity_waits;
            }
            for (tenant, n) in &w.running {
                *running_by_tenant.entry(tenant.clone()).or_default() += n;
            }
        }
        let points = by_at
            .into_values()
            .map(|s| LoadPoint {
                at: s.at,
                results_per_second: s.results() as f64 / beat as f64,
                completed: s.completed,
                failed: s.failed,
                cancelled: s.cancelled,
                awaiting_client_tools: s.awaiting_client_tools,
                p50_ms: percentile(&s.latency_ms, 0.50),
                p95_ms: percentile(&s.latency_ms, 0.95),
                p99_ms: percentile(&s.latency_ms, 0.99),
            })
            .collect();
        Self {
            points,
            contexts: contexts.into_values().collect(),
            running_by_tenant,
        }
    }
}

/// The upper bound of the bucket holding quantile `q` of `counts` (the last, unbounded
/// bucket reads as twice the last bound).
fn percentile(counts: &[u64], q: f64) -> Option<u64> {
    let total: u64 = counts.iter().sum();
    if total == 0 {
        return None;
    }
    let rank = ((total as f64) * q).ceil().max(1.0) as u64;
    let mut seen = 0;
    for (i, n) in counts.iter().enumerate() {
        seen += n;
        if seen >= rank {
            return Some(
                LATENCY_BOUNDS_MS
                    .get(i)
                    .copied()
                    .unwrap_or(LATENCY_BOUNDS_MS[LATENCY_BOUNDS_MS.len() - 1] * 2),
            );
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pulse_counts_results_into_latency_buckets_and_empties_when_taken() {
        let p = Pulse::default();
        p.settled(TurnStatus::Completed, Duration::from_millis(20));
        p.settled(TurnStatus::Completed, Duration::from_millis(400));
        p.settled(TurnStatus::Failed, Duration::from_secs(2_000));
        p.settled(TurnStatus::AwaitingClientTools, Duration::from_millis(50));
        let s = p.take(100);
        assert_eq!((s.completed, s.failed, s.awaiting_client_tools), (2, 1, 1));
        assert_eq!(s.latency_ms[0], 1, "20 ms is in the first bucket");
        assert_eq!(s.latency_ms[1], 1, "50 ms is at the second bound");
        assert_eq!(s.latency_ms[4], 1, "400 ms is under 500");
        assert_eq!(s.latency_ms[BUCKETS - 1], 1, "past the last bound");
        assert_eq!(p.take(105).results(), 0);
    }

    #[test]
    fn running_turns_are_counted_by_tenant_while_their_guards_live() {
        let p = Pulse::default();
        let a = p.running(Some("acme"));
        let b = p.running(Some("acme"));
        let c = p.running(None);
        assert_eq!(
            p.running_now(),
            BTreeMap::from([("".to_string(), 1), ("acme".to_string(), 2)])
        );
        drop((a, c));
        assert_eq!(p.running_now(), BTreeMap::from([("acme".to_string(), 1)]));
        drop(b);
        assert!(p.running_now().is_empty());
    }

    #[test]
    fn the_system_load_adds_up_workers_slot_by_slot() {
        let slot = |at, completed, bucket: usize| {
            let mut latency_ms = vec![0; BUCKETS];
            latency_ms[bucket] = completed;
            Slot {
                at,
                completed,
                latency_ms,
                ..Slot::default()
            }
        };
        let worker = |name: &str, slots, in_flight| Heartbeat {
            worker: name.into(),
            host: "h".into(),
            pid: 1,
            started_at: String::new(),
            at_ms: 0,
            concurrency: 4,
            running: BTreeMap::from([("acme".to_string(), 2)]),
            contexts: vec![ContextLoad {
                context: "default".into(),
                in_flight,
                capacity: Some(8),
                capacity_waits: 3,
            }],
            slots,
        };
        let a = worker("a", vec![slot(1000, 10, 2), slot(1005, 5, 5)], 1);
        let b = worker("b", vec![slot(1005, 95, 2), slot(700, 1, 0)], 2);
        let load = SystemLoad::of(&[a, b], 1007);
        assert_eq!(load.points.len(), KEPT_SLOTS);
        let last = load.points.last().expect("points");
        assert_eq!(last.at, 1005);
        assert_eq!(last.completed, 100);
        assert!((last.results_per_second - 20.0).abs() < 1e-9);
        assert_eq!(last.p50_ms, Some(100), "95 of 100 in the 100 ms bucket");
        assert_eq!(last.p99_ms, Some(1_000), "the slowest 5 in the 1 s bucket");
        let before = &load.points[KEPT_SLOTS - 2];
        assert_eq!((before.at, before.completed), (1000, 10));
        assert!(
            load.points.iter().all(|p| p.at >= 1005 - 5 * 59),
            "a slot older than the window is left out"
        );
        assert_eq!(load.points.iter().map(|p| p.completed).sum::<u64>(), 110);
        assert_eq!(
            load.contexts,
            vec![ContextTotal {
                context: "default".into(),
                in_flight: 3,
                capacity: Some(8),
                capacity_waits: 6
            }]
        );
        assert_eq!(load.running_by_tenant["acme"], 4);
        assert_eq!(load.points[0].p50_ms, None, "no results, no percentile");
    }

    #[test]
    fn stale_and_unreadable_heartbeats_are_not_alive() {
        let fresh = Heartbeat {
            worker: "w".into(),
            host: "h".into(),
            pid: 1,
            started_at: String::new(),
            at_ms: unix_ms(),
            concurrency: 1,
            running: BTreeMap::new(),
            contexts: vec![],
            slots: vec![],
        };
        let stale = Heartbeat {
            worker: "old".into(),
            at_ms: unix_ms() - GONE_AFTER.as_millis() as i64 - 1_000,
            ..fresh.clone()
        };
        let raw = vec![
            serde_json::to_vec(&fresh).expect("encodes"),
            serde_json::to_vec(&stale).expect("encodes"),
            b"not json".to_vec(),
        ];
        assert_eq!(alive(raw), vec![fresh]);
    }
}
