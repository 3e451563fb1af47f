//! The job queue: turn jobs from the front door to the workers, delayed retries and the
//! dead-letter queue (DESIGN.md §5–§6), and the reply bus that carries turn statuses back; the
//! two halves make the [`Broker`].
//!
//! Where: the job queue's types and trait here, the reply bus in `reply_bus.rs`, the queues'
//! names and settings in `topology.rs`.
//!
//! Owns: the [`JobQueue`] and [`ReplyBus`] traits and the two brokers that implement them — [`rabbit::RabbitBroker`] (RabbitMQ
//! via lapin: quorum queues, publisher confirms, mandatory publishes, manual acks) and
//! [`memory::MemoryBroker`] (the embedded single-process mode, same semantics). Must not: run
//! turns or touch session state.

pub mod memory;
pub mod rabbit;
mod reply_bus;
mod topology;

use std::time::Duration;

use crate::contract::{LOCAL_TENANT, SessionId};

pub use memory::MemoryBroker;
pub use rabbit::RabbitBroker;
pub use reply_bus::{Audience, Direct, Replies, ReplyBus, SessionEvent, SessionEvents};
pub use topology::{ReplyQueues, Topology};

/// A queue operation that failed. Publishing failures are never swallowed: the caller sees
/// them and does not report the job as accepted (or does not ack the delivery).
///
/// A variant that wraps a client's error writes it into its message and does not also return
/// it as [`source`](std::error::Error::source), so a reporter that walks the chain names each
/// cause once (as with every error type of this crate).
#[derive(Debug, Clone, thiserror::Error)]
pub enum QueueError {
    /// The broker is unreachable, did not answer in time, or the connection is not usable.
    #[error("message broker unavailable: {0}")]
    Unavailable(String),
    /// An AMQP operation failed (connection or channel closed, a refused declaration, an I/O
    /// error); the client's error is kept for callers that match on it.
    #[error("message broker unavailable: {0}")]
    Amqp(lapin::Error),
    /// A message could not be encoded.
    #[error("a message cannot be encoded: {0}")]
    Encode(std::sync::Arc<serde_json::Error>),
    /// The broker refused the message (nack) or could not route it (returned).
    #[error("message broker did not accept the message: {0}")]
    Rejected(String),
}

/// What travels with a job besides its body (message headers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct JobMeta {
    /// Retries already made (0 for a fresh job).
    pub attempt: u32,
    /// The W3C `traceparent` of the trace the job belongs to.
    pub traceparent: Option<String>,
    /// The tenant that submitted it, when the front door knew one.
    pub tenant: Option<String>,
    /// The direct reply address of the front door that waits for the result (see
    /// [`ReplyBus::subscribe_direct`]), when one does.
    pub reply_to: Option<String>,
    /// Whether the submitter may come back for the session's statuses in its reply queue
    /// (a turn submitted to be read later), so that [`ReplyQueues::AsyncTurns`] declares
    /// the queue. `false` for a synchronous call or a batch line, whose answer is read from
    /// the HTTP response or the batch. Jobs without the header (older front doors) say `true`.
    pub reply_queue_wanted: bool,
    /// The submission's own webhook URL (see [`crate::webhooks`]), when it named one.
    pub webhook: Option<String>,
    /// The batch the job is a line of, when its completion is told of (`batch.completed`).
    pub batch: Option<String>,
}

impl JobMeta {
    /// A fresh job's headers.
    pub fn new(traceparent: Option<&str>, tenant: Option<&str>) -> Self {
        Self {
            attempt: 0,
            traceparent: traceparent.map(str::to_string),
            tenant: tenant.map(str::to_string),
            reply_to: None,
            reply_queue_wanted: true,
            webhook: None,
            batch: None,
        }
    }

    /// The same headers naming the batch the job is a line of.
    pub fn in_batch(mut self, batch: Option<&str>) -> Self {
        self.batch = batch.map(str::to_string);
        self
    }

    /// The same headers naming the submission's webhook URL.
    pub fn with_webhook(mut self, url: Option<&str>) -> Self {
        self.webhook = url.map(str::to_string);
        self
    }

    /// The same headers naming a direct reply address.
    pub fn replying_to(mut self, address: Option<&str>) -> Self {
        self.reply_to = address.map(str::to_string);
        self
    }

    /// The same headers saying whether the submitter may read the session's reply queue
    /// later ([`JobMeta::reply_queue_wanted`]).
    pub fn wanting_reply_queue(mut self, wanted: bool) -> Self {
        self.reply_queue_wanted = wanted;
        self
    }

    /// The same headers at another attempt.
    pub fn at_attempt(&self, attempt: u32) -> Self {
        Self {
            attempt,
            ..self.clone()
        }
    }
}

/// Where a message came from and what to do with it.
pub struct Delivery {
    /// The job body (an `AgentExecuteRequest` in wire JSON).
    pub body: Vec<u8>,
    /// Retries already made (from the `x-aptix-attempt` header; 0 for a fresh job).
    pub attempt: u32,
    /// Whether the broker delivered it before (a previous consumer died or nacked).
    pub redelivered: bool,
    /// The W3C `traceparent` the job was published with, if any.
    pub traceparent: Option<String>,
    /// The tenant the job was submitted by, if the front door said.
    pub tenant: Option<String>,
    /// The tenant lane it was taken from (`None`: the shared job queue).
    pub lane: Option<String>,
    /// The direct reply address of a front door waiting for the result, if one is.
    pub reply_to: Option<String>,
    /// Whether the submitter may read the session's reply queue later
    /// ([`JobMeta::reply_queue_wanted`]).
    pub reply_queue_wanted: bool,
    /// The submission's own webhook URL, when it named one.
    pub webhook: Option<String>,
    /// The batch it is a line of, when that batch's completion is told of.
    pub batch: Option<String>,
    acker: Box<dyn Acker>,
}

impl std::fmt::Debug for Delivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Delivery")
            .field("bytes", &self.body.len())
            .field("attempt", &self.attempt)
            .field("redelivered", &self.redelivered)
            .field("tenant", &self.tenant)
            .field("lane", &self.lane)
            .finish()
    }
}

impl Delivery {
    /// A delivery of the shared job queue with its acknowledgement handle (for broker
    /// implementations).
    pub fn new(body: Vec<u8>, attempt: u32, redelivered: bool, acker: Box<dyn Acker>) -> Self {
        Self {
            body,
            attempt,
            redelivered,
            traceparent: None,
            tenant: None,
            lane: None,
            reply_to: None,
            reply_queue_wanted: true,
            webhook: None,
            batch: None,
            acker,
        }
    }

    /// The same delivery carrying the headers it was published with.
    pub fn with_meta(mut self, meta: JobMeta) -> Self {
        self.attempt = meta.attempt;
        self.traceparent = meta.traceparent;
        self.tenant = meta.tenant;
        self.reply_to = meta.reply_to;
        self.reply_queue_wanted = meta.reply_queue_wanted;
        self.webhook = meta.webhook;
        self.batch = meta.batch;
        self
    }

    /// The same delivery, taken from `lane`.
    pub fn from_lane(mut self, lane: Option<String>) -> Self {
        self.lane = lane;
        self
    }

    /// The headers it was published with.
    pub fn meta(&self) -> JobMeta {
        JobMeta {
            attempt: self.attempt,
            traceparent: self.traceparent.clone(),
            tenant: self.tenant.clone(),
            reply_to: self.reply_to.clone(),
            reply_queue_wanted: self.reply_queue_wanted,
            webhook: self.webhook.clone(),
            batch: self.batch.clone(),
        }
    }

    /// Done with it: the broker forgets it.
    pub async fn ack(self) -> Result<(), QueueError> {
        self.acker.ack().await
    }

    /// Not done: the broker delivers it again (to any consumer).
    pub async fn requeue(self) -> Result<(), QueueError> {
        self.acker.requeue().await
    }
}

/// Acknowledges one delivery.
#[async_trait::async_trait]
pub trait Acker: Send + Sync {
    /// Positive acknowledgement.
    async fn ack(self: Box<Self>) -> Result<(), QueueError>;
    /// Negative acknowledgement with requeue.
    async fn requeue(self: Box<Self>) -> Result<(), QueueError>;
}

/// A stream of deliveries; ends when the connection or channel is gone (reconnect and consume
/// again).
pub type Deliveries = tokio::sync::mpsc::Receiver<Delivery>;

/// The job side of the broker: turn jobs from the front door to the workers, delayed retries
/// and the dead-letter queue.
#[async_trait::async_trait]
pub trait JobQueue: Send + Sync + 'static {
    /// Enqueues a turn job with its headers on the shared job queue (`lane: None`) or on a
    /// tenant's lane; returns only once the broker has confirmed it.
    async fn enqueue(
        &self,
        lane: Option<&str>,
        body: &[u8],
        meta: &JobMeta,
    ) -> Result<(), QueueError>;
    /// Enqueues a turn job on the shared job queue carrying a W3C `traceparent`.
    async fn publish_traced_job(
        &self,
        body: &[u8],
        traceparent: Option<&str>,
    ) -> Result<(), QueueError> {
        self.enqueue(None, body, &JobMeta::new(traceparent, None))
            .await
    }
    /// Enqueues a turn job without trace context.
    async fn publish_job(&self, body: &[u8]) -> Result<(), QueueError> {
        self.publish_traced_job(body, None).await
    }
    /// Brings a job back to the shared job queue after `delay`, with its headers (the retry
    /// count in `meta.attempt`), confirmed.
    async fn publish_retry(
        &self,
        body: &[u8],
        delay: Duration,
        meta: &JobMeta,
    ) -> Result<(), QueueError>;
    /// Moves a job to the dead-letter queue with its headers (at the attempt it reached) and
    /// the reason (confirmed).
    async fn publish_dead(
        &self,
        body: &[u8],
        meta: &JobMeta,
        reason: &str,
    ) -> Result<(), QueueError>;
    /// Starts consuming the shared job queue with at most `prefetch` unacknowledged at once.
    async fn consume(&self, prefetch: u16) -> Result<Deliveries, QueueError>;
    /// Starts consuming a tenant's lane with at most `prefetch` unacknowledged at once.
    async fn consume_lane(&self, tenant: &str, prefetch: u16) -> Result<Deliveries, QueueError>;
    /// Whether the broker is reachable (for readiness checks).
    async fn check(&self) -> Result<(), QueueError>;
    /// Reads up to `max` dead-lettered jobs with their reasons, removing them.
    async fn drain_dead(&self, max: usize) -> Result<Vec<(Vec<u8>, String)>, QueueError>;
    /// How many jobs wait in each queue of the topology now (the job queue, the tenants'
    /// lanes, the retry queues, the dead letters, the webhook deliveries), with how many
    /// consumers read each where the broker says. A queue that does not exist yet is left out.
    async fn depths(&self) -> Result<Vec<QueueDepth>, QueueError>;
    /// Goes through the dead-lettered jobs, oldest first — at most `max`, and only those there
    /// when the sweep began — and puts each where `choose` says: back at the end of the
    /// dead-letter queue ([`DeadChoice::Keep`]), on the job queue as a fresh job
    /// ([`DeadChoice::Requeue`]) or nowhere ([`DeadChoice::Discard`]). Each is published
    /// where it goes before it is taken from
    /// where it was, so a sweep cut short leaves one job twice, never none. Returns the jobs
    /// swept, in order, with what became of each. A sweep that keeps every job reads the
    /// queue without changing it (when it covers the whole queue, in the same order).
    async fn sweep_dead(
        &self,
        max: usize,
        choose: &ChooseDead,
    ) -> Result<Vec<(DeadLetter, DeadChoice)>, QueueError>;
}

/// One queue's backlog.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct QueueDepth {
    /// The queue's name.
    pub name: String,
    /// What it holds: `jobs`, `lane` (a tenant's), `retry`, `dead`, `webhooks`.
    pub role: &'static str,
    /// Messages ready in it.
    pub messages: u64,
    /// Consumers reading it, where the broker tells.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub consumers: Option<u32>,
}

/// A job in the dead-letter queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetter {
    /// The job as it was published.
    pub body: Vec<u8>,
    /// Why it was dead-lettered.
    pub reason: String,
    /// Its headers: the attempt it had reached, its tenant, trace, batch, webhook.
    pub meta: JobMeta,
}

/// The session and turn ids a job's body names, when it names valid ones (a JSON object with
/// `sessionId` and `turnId`, in either spelling the request parser accepts) — also for a job
/// the parser refuses, or one in the dead-letter queue — the session scoped to the job's
/// `tenant` (the header's; none is the local tenant).
pub fn named_turn(
    body: &[u8],
    tenant: Option<&str>,
) -> Option<(SessionId, crate::contract::TurnId)> {
    let value: serde_json::Value = serde_json::from_slice(body).ok()?;
    let field = |camel: &str, pascal: &str| {
        value
            .get(camel)
            .or_else(|| value.get(pascal))
            .and_then(serde_json::Value::as_str)
            .map(str::to_string)
    };
    let sid = SessionId::parse(field("sessionId", "SessionId")?).ok()?;
    let tid = crate::contract::TurnId::parse(field("turnId", "TurnId")?).ok()?;
    Some((sid.within(tenant.unwrap_or(LOCAL_TENANT)), tid))
}

/// The headers a dead-lettered job is requeued with: a fresh attempt, no front door waiting
/// for it any more.
pub fn revived(meta: &JobMeta) -> JobMeta {
    JobMeta {
        attempt: 0,
        reply_to: None,
        ..meta.clone()
    }
}

/// How [`JobQueue::sweep_dead`] decides about each job.
pub type ChooseDead = dyn for<'a> Fn(&'a DeadLetter) -> DeadChoice + Send + Sync;

/// What [`JobQueue::sweep_dead`] does with one dead-lettered job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeadChoice {
    /// Back at the end of the dead-letter queue.
    Keep,
    /// On the job queue, as a fresh job (attempt 0) of the same tenant, trace, batch and
    /// webhook.
    Requeue,
    /// Nowhere: taken out of the dead-letter queue for good.
    Discard,
}

/// The webhook side of the broker: deliveries waiting to be sent (a durable queue of their
/// own, so that a backlog of them never stands in a turn's way), their delayed retries, and
/// those that never succeeded. A delivery's body carries everything about it (see
/// [`crate::webhooks`]); the broker only keeps it.
#[async_trait::async_trait]
pub trait HookQueue: Send + Sync + 'static {
    /// Enqueues a delivery; returns once the broker has confirmed it.
    async fn enqueue_hook(&self, body: &[u8]) -> Result<(), QueueError>;
    /// Brings a delivery back after `delay` (the retry queue with the nearest delay at or
    /// above it), confirmed.
    async fn retry_hook(&self, body: &[u8], delay: Duration) -> Result<(), QueueError>;
    /// Moves a delivery to the dead deliveries with the reason (confirmed).
    async fn dead_hook(&self, body: &[u8], reason: &str) -> Result<(), QueueError>;
    /// Deliveries waiting in the queue (not counting those waiting in a retry queue).
    async fn hooks_waiting(&self) -> Result<u64, QueueError>;
    /// Starts consuming deliveries with at most `prefetch` unacknowledged at once.
    async fn consume_hooks(&self, prefetch: u16) -> Result<Deliveries, QueueError>;
    /// Up to `max` dead deliveries with their reasons: removed when `take`, else left where
    /// they are.
    async fn dead_hooks(
        &self,
        max: usize,
        take: bool,
    ) -> Result<Vec<(Vec<u8>, String)>, QueueError>;
}

/// The broker behind the front door and the workers: the job queue, the reply bus and the
/// webhook queue of one RabbitMQ (or of the embedded broker).
pub trait Broker: JobQueue + ReplyBus + HookQueue {}

impl<T: JobQueue + ReplyBus + HookQueue> Broker for T {}
