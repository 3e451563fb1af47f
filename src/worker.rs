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
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use futures_util::StreamExt as _;
use futures_util::stream::{self, BoxStream, SelectAll, select_all};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use tracing::{Instrument as _, debug, error, info, info_span, warn};

use crate::contract::{
    AgentExecuteRequest, AgentExecuteResponse, ErrorMessage, InvokeResult, LOCAL_TENANT,
    RequestLimits, SessionId, TurnId, parse_request,
};
use crate::delivery::{Addressee, BatchOf, ResultDelivery, Webhooks};
use crate::metrics::Metrics;
use crate::pipeline::{JobOutcome, Origin, Pipeline, Settled};
use crate::queue::{Broker, Delivery, QueueError, Topology};
use crate::store::TurnStatusView;
use crate::tenants::Quotas;
use crate::trace::TraceContext;
use crate::webhooks::EventType;

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
                            tracker.spawn(Box::pin(self.turn_task(delivery, shutdown.clone(), abandon.clone())));
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
    fn turn_task(
        &self,
        delivery: Delivery,
        shutdown: CancellationToken,
        abandon: CancellationToken,
    ) -> impl Future<Output = ()> + Send + 'static {
        let worker = self.clone();
        async move {
            tokio::select! {
                _ = worker.admit(delivery, shutdown) => {}
                _ = abandon.cancelled() => {
                    warn!("turn abandoned at shutdown; it will be redelivered");
                }
            }
        }
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
    async fn admit(&self, delivery: Delivery, shutdown: CancellationToken) {
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

    /// Handles one delivery to its ack or requeue.
    pub async fn handle(&self, delivery: Delivery) {
        if delivery.redelivered {
            self.stats.redeliveries.fetch_add(1, Ordering::Relaxed);
            self.metrics.redelivered();
        }
        let disposition = match parse_request(&delivery.body, &self.settings.limits) {
            // Boxed: a rare path, kept out of every turn's task (see `worker::tests`).
            Err(rejected) => Box::pin(self.unreadable(&delivery, rejected.errors)).await,
            Ok(mut parsed) => {
                // The session is the submitting tenant's: every key and queue of the turn is
                // made from the scoped id.
                parsed
                    .request
                    .scope_to(delivery.tenant.as_deref().unwrap_or(LOCAL_TENANT));
                // The trace the front door started (or joined) goes on here; a job published
                // without one starts its own.
                let parent = TraceContext::from_header(delivery.traceparent.as_deref());
                let span = info_span!(
                    "job",
                    session_id = %parsed.request.session_id(),
                    turn_id = %parsed.request.turn_id(),
                    attempt = delivery.attempt + 1,
                    redelivered = delivery.redelivered,
                    trace_id = %parent.trace_id(),
                );
                parent.adopt(&span);
                let trace = parent.within(&span);
                trace
                    .scope(self.run_job(&parsed.request, &delivery).instrument(span))
                    .await
            }
        };
        let acked = match disposition {
            Disposition::Ack => delivery.ack().await,
            Disposition::Requeue => delivery.requeue().await,
        };
        if let Err(e) = acked {
            // The channel is gone; the broker redelivers the message and the store makes the
            // second run return the committed result.
            warn!(error = %e, "could not acknowledge a delivery; it will be redelivered");
        }
    }

    /// A job this worker cannot read: dead-lettered. When it names a turn that was accepted
    /// and is still queued or was running (the front door read it under other limits, say),
    /// that turn is failed first with the reasons and its status published, so it does not stay
    /// `queued` behind a job that is gone.
    async fn unreadable(&self, delivery: &Delivery, errors: Vec<ErrorMessage>) -> Disposition {
        let reason = errors
            .first()
            .map(|e| format!("unparseable job: {}: {}", e.error_code, e.message))
            .unwrap_or_else(|| "unparseable job".into());
        error!(%reason, bytes = delivery.body.len(), "poison message; dead-lettering it");
        let ids = crate::queue::named_turn(&delivery.body, delivery.tenant.as_deref());
        let settled = match &ids {
            Some((sid, tid)) => {
                let why = "the front door accepted this turn, but the worker cannot read its job \
                           (are the two configured with the same APTIX_MAX_* limits?)";
                let errors = errors.into_iter().map(|e| e.with_details(why)).collect();
                match self.pipeline.fail_unreadable(sid, tid, errors).await {
                    Ok(settled) => settled,
                    Err(e) => {
                        warn!(code = %e.error.error_code, message = %e.error.message, "could not fail the turn of an unreadable job; trying again later");
                        let next = delivery.attempt + 1;
                        return self
                            .republish(delivery, delivery.attempt, self.topology.delay_for(next))
                            .await;
                    }
                }
            }
            None => None,
        };
        // The turn's status goes out before the job is dead-lettered: a publish that fails
        // runs the job again (its turn has ended: the stored status is published then), and the
        // dead-letter queue gets one copy, once the status is out.
        if let (Some((sid, tid)), Some(settled)) = (&ids, settled) {
            let turn = TurnOf {
                session: sid,
                turn: tid,
                user_turn: false,
            };
            if let Err(later) = self.publish_settled(turn, delivery, settled, None).await {
                return later;
            }
        }
        if let Err(e) = self
            .broker
            .publish_dead(&delivery.body, &delivery.meta(), &reason)
            .await
        {
            error!(error = %e, "could not dead-letter a poison message");
            // Held a moment first, as a refused retry is: no loop of failed publishes.
            tokio::time::sleep(self.settings.busy_delay).await;
            return Disposition::Requeue;
        }
        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        self.metrics.dead_lettered();
        Disposition::Ack
    }

    async fn run_job(&self, request: &AgentExecuteRequest, delivery: &Delivery) -> Disposition {
        let started = Started::now();
        let outcome = {
            let _in_flight = self.metrics.run_started();
            let _running = self.metrics.pulse().running(delivery.tenant.as_deref());
            self.pipeline
                .execute_as(
                    Origin {
                        tenant: delivery.tenant.as_deref(),
                        reply_to: delivery.reply_to.as_deref(),
                    },
                    request,
                    self.settings.turn_deadline,
                )
                .await
        };
        let failure = match outcome {
            JobOutcome::Done(settled) => {
                return self
                    .reply(request.into(), delivery, *settled, Some(started))
                    .await;
            }
            // A duplicate or a race the front door could not see must not publish a "failed"
            // status over the turn's real one: the run that produced that status published it.
            JobOutcome::NotTheTurns(reasons) => {
                for e in &reasons {
                    warn!(code = %e.error_code, message = %e.message, "job does not apply to its turn; dropping it without a reply");
                }
                return Disposition::Ack;
            }
            JobOutcome::Busy => {
                self.stats.busy.fetch_add(1, Ordering::Relaxed);
                self.metrics.job_retry("session_busy");
                return self
                    .republish(delivery, delivery.attempt, self.settings.busy_delay)
                    .await;
            }
            JobOutcome::NoCapacity(why) => {
                info!(message = %why.message, "no model capacity; the job runs again shortly at the same attempt");
                self.metrics.job_retry("model_capacity");
                return self
                    .republish(delivery, delivery.attempt, self.settings.busy_delay)
                    .await;
            }
            JobOutcome::Retry(failure) => failure,
        };
        let next = delivery.attempt + 1;
        if next < self.settings.max_attempts {
            let delay = self.topology.delay_for(next);
            warn!(code = %failure.error_code, message = %failure.message, retry = next, delay_ms = delay.as_millis() as u64, "transient failure; retrying later");
            self.stats.retried.fetch_add(1, Ordering::Relaxed);
            self.metrics.job_retry("transient");
            return self.republish(delivery, next, delay).await;
        }
        let reason = format!(
            "gave up after {next} attempts; last error {}: {}",
            failure.error_code, failure.message
        );
        error!(%reason, "retry limit reached; failing the turn and dead-lettering the job");
        let final_error = ErrorMessage::new(failure.error_code, reason.clone());
        // Boxed: a rare path, kept out of every turn's task (see `worker::tests`).
        let result = match Box::pin(self.pipeline.give_up(request, final_error)).await {
            Ok(r) => r,
            // The failure cannot be stored, and nothing is published that is not stored: try
            // again later, at the same attempt, until the store answers.
            Err(e) => {
                warn!(code = %e.error.error_code, message = %e.error.message, "could not store the turn's failure; trying again later");
                return self
                    .republish(delivery, delivery.attempt, self.topology.delay_for(next))
                    .await;
            }
        };
        if let Err(e) = self
            .broker
            .publish_dead(&delivery.body, &delivery.meta().at_attempt(next), &reason)
            .await
        {
            error!(error = %e, "could not dead-letter the job; requeueing it");
            return Disposition::Requeue;
        }
        self.stats.dead_lettered.fetch_add(1, Ordering::Relaxed);
        self.metrics.dead_lettered();
        self.reply(request.into(), delivery, result, None).await
    }

    async fn republish(&self, delivery: &Delivery, attempt: u32, delay: Duration) -> Disposition {
        match self
            .broker
            .publish_retry(&delivery.body, delay, &delivery.meta().at_attempt(attempt))
            .await
        {
            Ok(()) => Disposition::Ack,
            Err(e) => {
                // Held a moment before it goes back: a broker that takes nothing would
                // otherwise see the same job again at once, over and over.
                warn!(error = %e, "could not schedule the retry; requeueing");
                tokio::time::sleep(self.settings.busy_delay).await;
                Disposition::Requeue
            }
        }
    }

    /// Publishes the turn's status, as stored, to the session's replies. Only a result the
    /// store holds is published: a client told of a result can always read it back. A result
    /// this run stored goes out with the status it was stored with; a stored result found
    /// again (a duplicate job) is read back first, in case the turn has moved on since.
    async fn reply(
        &self,
        request: TurnOf<'_>,
        delivery: &Delivery,
        settled: Settled,
        started: Option<Started>,
    ) -> Disposition {
        match self
            .publish_settled(request, delivery, settled, started)
            .await
        {
            Ok(()) => Disposition::Ack,
            Err(later) => later,
        }
    }

    /// [`Worker::reply`] without the ack: `Ok` once the status is published (or there is
    /// nothing of this job's to publish), else what to do with the job instead (run it again
    /// later, which publishes the stored result then).
    async fn publish_settled(
        &self,
        request: TurnOf<'_>,
        delivery: &Delivery,
        settled: Settled,
        started: Option<Started>,
    ) -> Result<(), Disposition> {
        let reply_to = delivery.reply_to.as_deref();
        let view = match settled.status {
            Some(view) => view,
            None => match self.current_status(request, &settled.result).await {
                Ok(Some(view)) => view,
                Ok(None) => return Ok(()),
                Err(requeue) => return Err(requeue),
            },
        };
        let status = view.status;
        let targets = match EventType::of(status) {
            Some(event) => self.quotas.tenants().webhook_targets(
                delivery.tenant.as_deref(),
                delivery.webhook.as_deref(),
                event,
            ),
            None => Vec::new(),
        };
        let to = Addressee {
            reply_to,
            audience: crate::queue::Audience {
                watched: settled.watched,
                reply_queue_wanted: delivery.reply_queue_wanted,
            },
            webhooks: Webhooks {
                targets: &targets,
                tenant: delivery.tenant.as_deref(),
                traceparent: delivery.traceparent.as_deref(),
            },
        };
        // A line of a batch whose completion is told of: this may be its last line.
        let tenants = self.quotas.tenants();
        let batch = delivery.batch.as_deref().map(|id| BatchOf {
            id,
            completion: |b: &crate::state::BatchRecord| tenants.batch_targets(b),
        });
        let delivered = self.delivery.deliver_settled(&view, to, batch).await;
        match delivered {
            Ok(()) => {
                self.stats.completed.fetch_add(1, Ordering::Relaxed);
                self.metrics.turn_finished(status.as_str());
                if let Some(started) = started {
                    let ran = started.at.elapsed();
                    self.metrics.observe_turn_duration(ran);
                    // A continuation's record dates from the user turn, before the client ran
                    // its tools; only a user turn's wait is time spent queued.
                    let user_turn = request.user_turn;
                    let waited = Some(&view)
                        .filter(|_| user_turn)
                        .and_then(|v| started.since_rfc3339(&v.submitted_at));
                    if let Some(wait) = waited {
                        self.metrics.observe_queue_wait(wait);
                    }
                    self.metrics
                        .pulse()
                        .settled(status, waited.unwrap_or_default() + ran);
                }
                debug!(status = status.as_str(), "result published");
                Ok(())
            }
            Err(e) => {
                // The job runs again after the first retry delay and delivers the stored
                // result then: once the store's replicas hold it (a failover now could lose
                // it, so nobody is told yet), or once the broker takes it (a reply queue whose
                // node is down, say, until the node is back) — never at once, which would turn
                // an outage into a loop of failed publishes.
                let delay = self.topology.delay_for(1);
                warn!(error = %e, reason = e.reason(), delay_ms = delay.as_millis() as u64, "could not deliver the result; the job will run again and deliver it");
                self.metrics.job_retry(e.reason());
                Err(self.republish(delivery, delivery.attempt, delay).await)
            }
        }
    }

    /// The turn's status if it still holds `result` (settled); `None` when it moved on (a
    /// continuation was accepted, or it expired): the run that settles it publishes its
    /// result. `Err` (requeue, after a pause) when the store cannot be read.
    async fn current_status(
        &self,
        request: TurnOf<'_>,
        result: &InvokeResult<AgentExecuteResponse>,
    ) -> Result<Option<TurnStatusView>, Disposition> {
        let (sid, tid) = (request.session, request.turn);
        let record = match self.pipeline.store().get_turn(sid, tid).await {
            Ok(r) => r,
            Err(e) => {
                // The store is down: hold the delivery a moment before giving it back, so an
                // outage does not turn into a redelivery loop.
                warn!(error = %e, "cannot read the turn back before publishing its result; the job will run again");
                tokio::time::sleep(self.settings.busy_delay).await;
                return Err(Disposition::Requeue);
            }
        };
        match record.filter(|r| r.status.is_settled() && r.result.as_ref() == Some(result)) {
            Some(r) => Ok(Some(TurnStatusView::from(&r))),
            None => {
                warn!("the turn no longer holds this result; not publishing it");
                Ok(None)
            }
        }
    }
}

/// The turn a job is for, as its reply needs it.
#[derive(Clone, Copy)]
struct TurnOf<'a> {
    session: &'a SessionId,
    turn: &'a TurnId,
    /// A user turn (its queue wait is measured), not a continuation.
    user_turn: bool,
}

impl<'a> From<&'a AgentExecuteRequest> for TurnOf<'a> {
    fn from(request: &'a AgentExecuteRequest) -> Self {
        Self {
            session: request.session_id(),
            turn: request.turn_id(),
            user_turn: matches!(request, AgentExecuteRequest::UserTurn(_)),
        }
    }
}

mod heartbeat;
#[cfg(test)]
mod tests;
