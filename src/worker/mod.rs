//! The worker: consumes turn jobs, runs each in its own task, and decides from the type of the
//! outcome what happens to the message.
//!
//! Owns: consume → run → reply → ack, concurrency (prefetch = concurrency, plus each capped
//! tenant's lane, which waits for the tenant's running slots), reconnection with backoff,
//! graceful shutdown. Must not: build prompts or touch Redis directly (the pipeline and
//! the store do).
//!
//! | outcome | what happens |
//! |---|---|
//! | result (final, continuation, or a permanent failure) | stored by the pipeline, published to the session's replies, acked |
//! | session busy | republished with a short delay (not counted as a retry), acked |
//! | transient failure (model, store, tool unavailable; turn deadline) | republished with a growing delay, acked; past the retry limit: failed for good, result published, dead-lettered |
//! | unparseable message | dead-lettered at once, acked; when it names a queued turn (the front door read it under other limits), that turn is failed with the parser's reasons and published first |
//! | result stored but not publishable (a reply queue whose node is down), or not yet on the replicas `APTIX_REDIS_MIN_REPLICAS` requires | republished after the first retry delay (not counted), acked; it publishes the stored result then |
//!
//! A message is acked only after the result is committed and the reply (or the retry, or the
//! dead-letter copy) is confirmed by the broker; otherwise it is requeued (after a pause when
//! the broker refused the retry itself).

use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::{self, BoxStream, SelectAll, select_all};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{debug, info, warn};

use crate::contract::RequestLimits;
use crate::delivery::ResultDelivery;
use crate::metrics::Metrics;
use crate::pipeline::Pipeline;
use crate::pipeline::until_cancelled::until_cancelled;
use crate::queue::{Broker, Delivery, QueueError, Topology};
use crate::tenants::Quotas;

/// Worker settings.
#[derive(Debug, Clone)]
pub struct WorkerSettings {
    /// Turns run at once (and the consumer prefetch).
    pub concurrency: u16,
    /// Runs of a job before it is dead-lettered (the first run included).
    pub max_attempts: u32,
    /// The longest one run of a turn may take; keep it well below RabbitMQ's
    /// `consumer_timeout`.
    pub turn_deadline: Duration,
    /// How long shutdown waits for in-flight turns.
    pub shutdown_grace: Duration,
    /// Delay before a job for a busy session is tried again.
    pub busy_delay: Duration,
    /// The longest a capped tenant's job waits in this worker for one of the tenant's running
    /// slots before it goes back to its lane (keep well below RabbitMQ's `consumer_timeout`).
    pub lane_wait: Duration,
    /// Request size limits (jobs are parsed again on the worker).
    pub limits: RequestLimits,
}

impl Default for WorkerSettings {
    fn default() -> Self {
        Self {
            concurrency: 16,
            max_attempts: 5,
            turn_deadline: Duration::from_secs(600),
            shutdown_grace: Duration::from_secs(30),
            busy_delay: Duration::from_secs(1),
            lane_wait: Duration::from_secs(60),
            limits: RequestLimits::default(),
        }
    }
}

/// Counters of what this worker did (the process-wide view is [`Metrics`]).
#[derive(Debug, Default)]
pub struct WorkerStats {
    /// Jobs that ended with a published result.
    pub completed: AtomicU64,
    /// Jobs sent to a delayed retry because of a transient failure.
    pub retried: AtomicU64,
    /// Jobs sent back because their session was busy.
    pub busy: AtomicU64,
    /// Jobs dead-lettered.
    pub dead_lettered: AtomicU64,
    /// Deliveries the broker marked as redelivered.
    pub redeliveries: AtomicU64,
}

/// Consumes and runs turn jobs.
#[derive(Clone)]
pub struct Worker {
    broker: Arc<dyn Broker>,
    /// Where settled turns' statuses go.
    delivery: ResultDelivery,
    pipeline: Pipeline,
    topology: Topology,
    settings: WorkerSettings,
    stats: Arc<WorkerStats>,
    metrics: Arc<Metrics>,
    quotas: Quotas,
    /// Turns running now in this worker (at most `concurrency`).
    running: Arc<Semaphore>,
    /// Sends webhook deliveries beside the turns, on a consumer of its own.
    webhooks: Option<crate::webhooks::send::Sender>,
}

/// When a run started, by the monotonic and the wall clock.
#[derive(Clone, Copy)]
struct Started {
    at: std::time::Instant,
    wall: time::OffsetDateTime,
}

impl Started {
    fn now() -> Self {
        Self {
            at: std::time::Instant::now(),
            wall: time::OffsetDateTime::now_utc(),
        }
    }

    /// Time from an RFC 3339 timestamp to this start (none if unreadable or in the future).
    fn since_rfc3339(&self, ts: &str) -> Option<Duration> {
        let then =
            time::OffsetDateTime::parse(ts, &time::format_description::well_known::Rfc3339).ok()?;
        Duration::try_from(self.wall - then).ok()
    }
}

enum Disposition {
    Ack,
    Requeue,
}

impl Worker {
    /// A worker over a broker and a pipeline.
    pub fn new(
        broker: Arc<dyn Broker>,
        pipeline: Pipeline,
        topology: Topology,
        settings: WorkerSettings,
    ) -> Self {
        Self {
            delivery: ResultDelivery::new(pipeline.store().clone(), broker.clone()),
            broker,
            pipeline,
            topology,
            running: Arc::new(Semaphore::new(usize::from(settings.concurrency.max(1)))),
            settings,
            stats: Arc::new(WorkerStats::default()),
            metrics: Arc::default(),
            quotas: Quotas::default(),
            webhooks: None,
        }
    }

    /// Runs `sender` beside the turns, for as long as the worker runs.
    pub fn with_webhooks(mut self, sender: crate::webhooks::send::Sender) -> Self {
        self.webhooks = Some(sender);
        self
    }

    /// Holds each tenant to its `maxRunningTurns` (consuming the tenants' lanes) and counts
    /// their tokens.
    pub fn with_quotas(mut self, quotas: Quotas) -> Self {
        self.quotas = quotas;
        self
    }

    /// Records what the worker does in `metrics` (in addition to [`Worker::stats`]).
    pub fn with_metrics(mut self, metrics: Arc<Metrics>) -> Self {
        self.metrics = metrics;
        self
    }

    /// What the worker did so far.
    pub fn stats(&self) -> &WorkerStats {
        &self.stats
    }

    /// Runs [`Worker::run`] on its own task.
    pub fn spawn(&self, shutdown: CancellationToken) -> tokio::task::JoinHandle<()> {
        let worker = self.clone();
        tokio::spawn(async move { worker.run(shutdown).await })
    }

    /// Consumes until `shutdown` fires, reconnecting with backoff whenever the broker goes away;
    /// then waits up to the grace period for in-flight turns. Whatever is still unacked then is
    /// redelivered by the broker to another worker.
    pub async fn run(&self, shutdown: CancellationToken) {
        let webhooks = self.webhooks.as_ref().map(|s| s.spawn(shutdown.clone()));
        // The heartbeat lasts as long as the worker consumes (it stops with the turns).
        let beating = CancellationToken::new();
        let heartbeat = tokio::spawn(heartbeat::beat(
            self.pipeline.store().clone(),
            self.metrics.clone(),
            crate::vitals::Identity::of_this_process(self.settings.concurrency),
            self.pipeline.context_capacities(),
            beating.clone(),
        ));
        self.run_turns(shutdown).await;
        beating.cancel();
        let _ = heartbeat.await;
        if let Some(webhooks) = webhooks {
            let _ = webhooks.await;
        }
    }

    async fn run_turns(&self, shutdown: CancellationToken) {
        let tracker = TaskTracker::new();
        // Fired when the grace period is over: abandons what is still running, which drops its
        // deliveries unacked so the broker hands them to another worker.
        let abandon = CancellationToken::new();
        // What each turn's task holds of the worker.
        let this = Arc::new(self.clone());
        let mut backoff = Duration::from_millis(200);
        'outer: while !shutdown.is_cancelled() {
            let mut deliveries = match self.consume_all().await {
                Ok(d) => {
                    info!(
                        concurrency = self.settings.concurrency,
                        lanes = self.quotas.tenants().capped().count(),
                        "consuming turn jobs"
                    );
                    backoff = Duration::from_millis(200);
                    d
                }
                Err(e) => {
                    warn!(error = %e, retry_in_ms = backoff.as_millis() as u64, "cannot consume; retrying");
                    tokio::select! {
                        _ = shutdown.cancelled() => break 'outer,
                        _ = tokio::time::sleep(backoff + Duration::from_millis(fastrand::u64(0..=backoff.as_millis() as u64 / 4))) => {}
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(30));
                    continue;
                }
            };
            loop {
                tokio::select! {
                    _ = shutdown.cancelled() => break 'outer,
                    next = deliveries.next() => match next {
                        Some(Some(delivery)) => {
                            // Boxed: tokio copies a task's whole future into place when it
                            // spawns it and again when it finishes; a pointer is cheaper to
                            // copy than a waiting turn's state.
                            tracker.spawn(crate::pipeline::boxed::boxed(|| {
                                this.turn_task(delivery, shutdown.clone(), abandon.clone())
                            }));
                        }
                        Some(None) | None => {
                            warn!("the broker stopped delivering (connection or channel lost); reconnecting");
                            break;
                        }
                    }
                }
            }
        }
        info!(
            in_flight = tracker.len(),
            "stopping: no new jobs; waiting for in-flight turns"
        );
        tracker.close();
        if tokio::time::timeout(self.settings.shutdown_grace, tracker.wait())
            .await
            .is_err()
        {
            warn!(
                in_flight = tracker.len(),
                "shutdown grace period over; unfinished turns will be redelivered"
            );
            abandon.cancel();
            tracker.wait().await;
        }
    }

    /// The task one delivery runs on, to its ack or requeue; `abandon` drops it at once (the
    /// broker redelivers it).
    ///
    /// Each turn's task holds the worker by an `Arc` (a clone of the worker itself was 808
    /// bytes in every turn in flight, and a dozen reference counts a turn) and its turn once:
    /// raced against `abandon` in place, not moved into a `select!` of its own.
    fn turn_task(
        self: &Arc<Self>,
        delivery: Delivery,
        shutdown: CancellationToken,
        abandon: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        let turn = Arc::clone(self).admit(delivery, shutdown);
        futures_util::FutureExt::map(until_cancelled(abandon, turn), |ran| {
            if ran.is_none() {
                warn!("turn abandoned at shutdown; it will be redelivered");
            }
        })
    }

    /// Consumes the shared job queue and every capped tenant's lane, as one stream; a stream
    /// that ends yields `None` once (then the worker reconnects them all).
    async fn consume_all(
        &self,
    ) -> Result<SelectAll<BoxStream<'static, Option<Delivery>>>, QueueError> {
        let concurrency = self.settings.concurrency;
        let mut streams = vec![self.broker.consume(concurrency).await?];
        for (tenant, cap) in self.quotas.tenants().capped() {
            // More than the cap would only hold jobs another worker could start.
            let prefetch = u16::try_from(cap).unwrap_or(u16::MAX).min(concurrency);
            streams.push(self.broker.consume_lane(tenant, prefetch).await?);
        }
        Ok(select_all(streams.into_iter().map(|rx| {
            stream::unfold(Some(rx), |rx| async move {
                let mut rx = rx?;
                match rx.recv().await {
                    Some(d) => Some((Some(d), Some(rx))),
                    None => Some((None, None)),
                }
            })
            .boxed()
        })))
    }

    /// Runs one delivery once its tenant and this worker have room: a capped tenant's job
    /// that arrived on the shared queue (a retry, or a front door without the tenants file)
    /// moves to its lane; a lane's job waits for one of its tenant's running slots (without
    /// holding one of this worker's) and is given back at shutdown.
    ///
    /// Returned as an `async move` block: an `async fn` would hold the delivery twice, as the
    /// argument it came in and in its body.
    #[expect(
        clippy::manual_async_fn,
        reason = "an async fn would hold the delivery twice"
    )]
    fn admit(
        self: Arc<Self>,
        delivery: Delivery,
        shutdown: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        async move {
            if delivery.lane.is_none()
                && let Some(lane) = self.quotas.lane_of(delivery.tenant.as_deref())
            {
                return self.move_to_lane(lane.to_string(), delivery).await;
            }
            let _slot = match delivery.lane.clone() {
                None => None,
                Some(tenant) => {
                    // Held unacknowledged while it waits; given back (to its lane, for any worker)
                    // at shutdown or after a while, well before RabbitMQ's consumer timeout.
                    let gave_up = tokio::select! {
                        slot = tokio::time::timeout(self.settings.lane_wait, self.quotas.running_slot(&tenant)) => match slot {
                            Ok(slot) => Ok(slot),
                            Err(_) => Err("waited too long for its tenant's running slot"),
                        },
                        _ = shutdown.cancelled() => Err("the worker is stopping"),
                    };
                    match gave_up {
                        Ok(slot) => slot,
                        Err(why) => {
                            debug!(%tenant, why, "giving a lane job back");
                            if let Err(e) = delivery.requeue().await {
                                warn!(error = %e, "could not give back a lane job; it will be redelivered");
                            }
                            return;
                        }
                    }
                }
            };
            let Ok(_running) = self.running.acquire().await else {
                return;
            };
            self.handle(delivery).await;
        }
    }

    async fn move_to_lane(&self, lane: String, delivery: Delivery) {
        let moved = self
            .broker
            .enqueue(Some(&lane), &delivery.body, &delivery.meta())
            .await;
        let done = match moved {
            Ok(()) => {
                info!(tenant = %lane, "job moved to its tenant's lane");
                delivery.ack().await
            }
            Err(e) => {
                warn!(tenant = %lane, error = %e, "could not move a job to its tenant's lane; requeueing it");
                tokio::time::sleep(self.settings.busy_delay).await;
                delivery.requeue().await
            }
        };
        if let Err(e) = done {
            warn!(error = %e, "could not acknowledge a delivery; it will be redelivered");
        }
    }
}

mod heartbeat;
mod job;
#[cfg(test)]
mod tests;
