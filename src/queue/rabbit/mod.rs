//! The RabbitMQ broker (lapin).
//!
//! Topology, declared idempotently by whoever connects first (all names under the namespace):
//! - `<ns>.turns` — durable **quorum** queue of turn jobs;
//! - `<ns>.turns.retry.<ms>ms` — one quorum queue per retry delay; messages wait there for
//!   their TTL and are dead-lettered (at-least-once) back to `<ns>.turns`;
//! - `<ns>.turns.dead` — the dead-letter queue (poison messages, jobs past the retry limit),
//!   each message carrying `x-aptix-reason`;
//! - `<ns>.reply.<sid>` — each session's durable reply queue, published to through the default
//!   exchange (no binding), declared once with an idle expiry (`x-expires`) and a length limit
//!   (`x-max-length`, oldest dropped);
//! - `<ns>.events` — direct exchange, routing key = session id: statuses and live events
//!   broadcast to the front doors that watch the session (SSE, long-polls of turns submitted
//!   elsewhere), each message's kind in its `x-aptix-event` header.
//!
//! Jobs and reply-queue statuses use publisher confirms and the mandatory flag; a nack or a
//! returned message is an error for the caller; they are persistent. Deliveries are
//! acknowledged manually. Broadcasts and direct replies are transient and unconfirmed: the
//! store holds every result, and a waiter that loses its subscription reads it there.
//!
//! Event subscribers share one consumer per process: an exclusive, server-named queue (the
//! *event hub*). A front door that submits a turn and waits for it names that queue in the job
//! (`x-aptix-reply-to`); the worker sends the turn's statuses and live events straight to it
//! through the default exchange, so waiting costs no broker operation. Watchers of a session
//! whose turns come from anywhere bind the hub queue to the session on `<ns>.events` (one
//! binding per session and front door, whatever its subscribers want); the binding is removed
//! once its last such subscriber is gone. A subscriber
//! that falls more than 256 events behind is dropped (its stream ends and it re-reads state
//! over HTTP).

use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicQosOptions,
    ExchangeDeclareOptions, QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel, ExchangeKind};
use tokio::sync::{Mutex, mpsc};

use super::{
    Acker, ChooseDead, DeadChoice, DeadLetter, Deliveries, Delivery, JobMeta, JobQueue, QueueDepth,
    QueueError, Topology,
};

mod channels;
mod headers;
mod hooks;
mod hub;
mod replies;

use channels::{Live, Routed};
use headers::*;
use hub::EventHub;
use replies::{DECLARED_QUEUES_CAP, DeclaredQueues};

fn unavailable(e: lapin::Error) -> QueueError {
    QueueError::Amqp(e)
}

/// Whether the broker answered 404 NOT_FOUND (a queue that does not exist).
fn not_found(e: &lapin::Error) -> bool {
    use lapin::protocol::{AMQPErrorKind, AMQPSoftError};
    matches!(
        e.kind(),
        lapin::ErrorKind::ProtocolError(p)
            if matches!(p.kind(), AMQPErrorKind::Soft(AMQPSoftError::NOTFOUND))
    )
}

/// How long one broker operation may take unless configured otherwise.
pub const DEFAULT_AMQP_TIMEOUT: Duration = Duration::from_secs(3);

/// The node URLs a (possibly comma-separated) `APTIX_AMQP_URL` names, in order.
fn node_urls(url: &str) -> Vec<String> {
    let urls: Vec<String> = url
        .split(',')
        .map(str::trim)
        .filter(|u| !u.is_empty())
        .map(str::to_string)
        .collect();
    if urls.is_empty() {
        vec![url.to_string()]
    } else {
        urls
    }
}

/// Turn jobs and replies on RabbitMQ.
pub struct RabbitBroker {
    /// The nodes' URLs: one, or several of one cluster (`APTIX_AMQP_URL` comma-separated).
    urls: Vec<String>,
    /// Which of `urls` to try first: the one connected to last (moved on when it fails).
    first: std::sync::atomic::AtomicUsize,
    topology: Topology,
    connection_name: String,
    live: Mutex<Option<Live>>,
    reply_queues: StdMutex<DeclaredQueues>,
    timeout: Duration,
    ca: Option<crate::tls::ExtraCa>,
    events: Arc<Mutex<Option<EventHub>>>,
    /// Whether this process declared the webhook queues (see `hooks.rs`).
    hooks_declared: Mutex<bool>,
    /// Whether this process declared the queue of webhook deliveries.
    hook_queue_declared: Mutex<bool>,
}

impl RabbitBroker {
    /// A broker for `url`; connects lazily and again after any connection loss. `url` may name
    /// several nodes of one cluster, comma-separated (`amqp://…@h1:5672/%2f,amqp://…@h2:5672/%2f`):
    /// the broker connects to the first that answers, starting from the one it was last
    /// connected to, and moves on to the next when that one goes.
    pub fn new(url: &str, topology: Topology, connection_name: &str) -> Self {
        Self {
            urls: node_urls(url),
            first: std::sync::atomic::AtomicUsize::new(0),
            reply_queues: StdMutex::new(DeclaredQueues::new(
                topology.reply_queue_ttl / 2,
                DECLARED_QUEUES_CAP,
            )),
            topology,
            connection_name: connection_name.to_string(),
            live: Mutex::new(None),
            timeout: DEFAULT_AMQP_TIMEOUT,
            ca: None,
            events: Arc::new(Mutex::new(None)),
            hooks_declared: Mutex::new(false),
            hook_queue_declared: Mutex::new(false),
        }
    }

    /// Bounds every broker operation (connecting, opening a channel, declaring, a publish and
    /// its confirm) by `timeout`: a stalled connection or a broker that blocks publishers (a
    /// resource alarm) is an `Unavailable` error after that long, never a wait without end.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Trusts `ca` in addition to the system's roots for `amqps://` URLs.
    pub fn with_tls_ca(mut self, ca: Option<crate::tls::ExtraCa>) -> Self {
        self.ca = ca;
        self
    }

    /// Runs one broker operation within the timeout.
    async fn bounded<T>(
        &self,
        what: &str,
        op: impl std::future::Future<Output = Result<T, QueueError>>,
    ) -> Result<T, QueueError> {
        match tokio::time::timeout(self.timeout, op).await {
            Ok(result) => result,
            Err(_) => Err(QueueError::Unavailable(format!(
                "RabbitMQ did not answer {what} within {} ms (connection stalled, or publishers blocked by a resource alarm)",
                self.timeout.as_millis()
            ))),
        }
    }

    /// The names in use.
    pub fn topology(&self) -> &Topology {
        &self.topology
    }

    /// Deletes every queue and the exchange of the namespace that this broker declared
    /// (tests and tear-down). Reply queues of sessions this process never used are left to
    /// expire.
    pub async fn delete_topology(&self) -> Result<(), QueueError> {
        let ch = self.consumer_channel().await?;
        let t = &self.topology;
        let mut queues = vec![t.jobs(), t.dead()];
        queues.extend(t.retry_delays.iter().map(|d| t.retry(*d)));
        queues.extend(t.lanes.iter().map(|tenant| t.lane(tenant)));
        // The webhook queues, whoever declared them (deleting a queue that does not exist is
        // not an error).
        queues.extend([t.hooks(), t.hooks_dead()]);
        queues.extend(t.hook_delays.iter().map(|d| t.hook_retry(*d)));
        if let Ok(known) = self.reply_queues.lock() {
            queues.extend(known.sessions().map(|s| t.reply_queue(s)));
        }
        for q in queues {
            ch.queue_delete(q.into(), lapin::options::QueueDeleteOptions::default())
                .await
                .map_err(unavailable)?;
        }
        ch.exchange_delete(
            t.events().into(),
            lapin::options::ExchangeDeleteOptions::default(),
        )
        .await
        .map_err(unavailable)?;
        let _ = ch.close(200, "done".into()).await;
        Ok(())
    }

    /// The name this broker's connection shows in RabbitMQ (`user_provided_name`).
    pub fn connection_name(&self) -> &str {
        &self.connection_name
    }

    /// Connects now (and declares the topology); errors if the broker is unreachable.
    pub async fn connect(&self) -> Result<(), QueueError> {
        self.bounded("connecting", async { self.publisher().await.map(|_| ()) })
            .await
    }

    async fn declare(&self, ch: &Channel) -> Result<(), QueueError> {
        let t = &self.topology;
        let durable = QueueDeclareOptions {
            durable: true,
            ..Default::default()
        };
        let quorum = || vec![("x-queue-type", text("quorum"))];
        ch.queue_declare(t.jobs().into(), durable, table(quorum()))
            .await
            .map_err(unavailable)?;
        ch.queue_declare(t.dead().into(), durable, table(quorum()))
            .await
            .map_err(unavailable)?;
        for tenant in &t.lanes {
            ch.queue_declare(t.lane(tenant).into(), durable, table(quorum()))
                .await
                .map_err(unavailable)?;
        }
        for delay in &t.retry_delays {
            ch.queue_declare(
                t.retry(*delay).into(),
                durable,
                delay_queue_args(*delay, &t.jobs()),
            )
            .await
            .map_err(unavailable)?;
        }
        ch.exchange_declare(
            t.events().into(),
            ExchangeKind::Direct,
            ExchangeDeclareOptions {
                durable: true,
                ..Default::default()
            },
            FieldTable::default(),
        )
        .await
        .map_err(unavailable)?;
        Ok(())
    }
}

impl RabbitBroker {
    /// Consumes `queue` (the shared job queue, or `lane`'s) on a channel of its own.
    async fn consume_queue(
        &self,
        queue: String,
        lane: Option<String>,
        prefetch: u16,
    ) -> Result<Deliveries, QueueError> {
        let start = async {
            let ch = self.consumer_channel().await?;
            ch.basic_qos(prefetch.max(1), BasicQosOptions::default())
                .await
                .map_err(unavailable)?;
            let consumer = ch
                .basic_consume(
                    queue.as_str().into(),
                    format!("{}-{}", self.connection_name, uuid::Uuid::new_v4().simple()).into(),
                    BasicConsumeOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(unavailable)?;
            Ok((ch, consumer))
        };
        let (ch, mut consumer) = self.bounded("starting a consumer", start).await?;
        let (tx, rx) = mpsc::channel(usize::from(prefetch.max(1)));
        tokio::spawn(async move {
            // Keeps the channel alive as long as the stream is read.
            let _channel = ch;
            while let Some(next) = consumer.next().await {
                match next {
                    Ok(d) => {
                        let meta = meta_of(&d.properties);
                        let delivery =
                            Delivery::new(d.data, 0, d.redelivered, Box::new(RabbitAcker(d.acker)))
                                .with_meta(meta)
                                .from_lane(lane.clone());
                        if let Err(unsent) = tx.send(delivery).await {
                            // The worker stopped consuming: give the message back and close
                            // the channel so nothing stays unacked on it.
                            let _ = unsent.0.requeue().await;
                            let _ = _channel.close(200, "consumer stopped".into()).await;
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(%queue, error = %e, "RabbitMQ consumer stopped");
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }
}

struct RabbitAcker(lapin::Acker);

#[async_trait::async_trait]
impl Acker for RabbitAcker {
    async fn ack(self: Box<Self>) -> Result<(), QueueError> {
        self.0
            .ack(BasicAckOptions::default())
            .await
            .map(|_| ())
            .map_err(unavailable)
    }
    async fn requeue(self: Box<Self>) -> Result<(), QueueError> {
        self.0
            .nack(BasicNackOptions {
                requeue: true,
                ..Default::default()
            })
            .await
            .map(|_| ())
            .map_err(unavailable)
    }
}

#[async_trait::async_trait]
impl JobQueue for RabbitBroker {
    async fn enqueue(
        &self,
        lane: Option<&str>,
        body: &[u8],
        meta: &JobMeta,
    ) -> Result<(), QueueError> {
        let props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_headers(job_headers(meta));
        let queue = match lane {
            None => self.topology.jobs(),
            Some(tenant) => self.topology.lane(tenant),
        };
        self.publish("", &queue, body, props).await
    }

    async fn publish_retry(
        &self,
        body: &[u8],
        delay: Duration,
        meta: &JobMeta,
    ) -> Result<(), QueueError> {
        // The retry queue with the nearest delay at or above the one asked for.
        let delays = &self.topology.retry_delays;
        let chosen = delays
            .iter()
            .copied()
            .find(|d| *d >= delay)
            .or_else(|| delays.last().copied())
            .ok_or_else(|| QueueError::Rejected("no retry queues are configured".into()))?;
        let props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_headers(job_headers(meta));
        self.publish("", &self.topology.retry(chosen), body, props)
            .await
    }

    async fn publish_dead(
        &self,
        body: &[u8],
        meta: &JobMeta,
        reason: &str,
    ) -> Result<(), QueueError> {
        let mut headers = job_headers(meta);
        headers.insert(REASON_HEADER.into(), text(reason));
        let props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_headers(headers);
        self.publish("", &self.topology.dead(), body, props).await
    }

    async fn consume(&self, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.consume_queue(self.topology.jobs(), None, prefetch)
            .await
    }

    async fn consume_lane(&self, tenant: &str, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.consume_queue(
            self.topology.lane(tenant),
            Some(tenant.to_string()),
            prefetch,
        )
        .await
    }

    async fn check(&self) -> Result<(), QueueError> {
        // A round trip, not just a look at the connection's state: a stalled link or broker
        // has to answer to count as ready.
        let probe = async {
            let ch = self.publisher().await?;
            if let Some(live) = self.live.lock().await.as_ref()
                && live.connection.status().blocked()
            {
                return Err(QueueError::Unavailable(
                    "RabbitMQ is blocking publishers (a memory or disk resource alarm)".into(),
                ));
            }
            ch.queue_declare(
                self.topology.jobs().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map(|_| ())
            .map_err(unavailable)
        };
        self.bounded("a readiness check", probe).await
    }

    async fn drain_dead(&self, max: usize) -> Result<Vec<(Vec<u8>, String)>, QueueError> {
        let ch = self.consumer_channel().await?;
        let mut out = Vec::new();
        while out.len() < max {
            let Some(msg) = ch
                .basic_get(self.topology.dead().into(), BasicGetOptions::default())
                .await
                .map_err(unavailable)?
            else {
                break;
            };
            let reason = msg
                .delivery
                .properties
                .headers()
                .as_ref()
                .and_then(|h| h.inner().get(REASON_HEADER).cloned())
                .and_then(|v| match v {
                    AMQPValue::LongString(s) => Some(s.to_string()),
                    _ => None,
                })
                .unwrap_or_default();
            msg.delivery
                .acker
                .ack(BasicAckOptions::default())
                .await
                .map_err(unavailable)?;
            out.push((msg.delivery.data, reason));
        }
        let _ = ch.close(200, "done".into()).await;
        Ok(out)
    }

    async fn depths(&self) -> Result<Vec<QueueDepth>, QueueError> {
        let t = &self.topology;
        let mut queues = vec![(t.jobs(), "jobs")];
        queues.extend(t.lanes.iter().map(|tenant| (t.lane(tenant), "lane")));
        queues.extend(t.retry_delays.iter().map(|d| (t.retry(*d), "retry")));
        queues.push((t.dead(), "dead"));
        queues.push((t.hooks(), "webhooks"));
        let mut out = Vec::with_capacity(queues.len());
        for (name, role) in queues {
            // A channel each: a passive declare of a queue that does not exist closes it.
            let ch = self.consumer_channel().await?;
            let looked = self
                .bounded("counting a queue", async {
                    ch.queue_declare(
                        name.as_str().into(),
                        QueueDeclareOptions {
                            passive: true,
                            ..Default::default()
                        },
                        FieldTable::default(),
                    )
                    .await
                    .map_err(unavailable)
                })
                .await;
            if ch.status().connected() {
                let _ = ch.close(200, "done".into()).await;
            }
            match looked {
                Ok(q) => out.push(QueueDepth {
                    name,
                    role,
                    messages: u64::from(q.message_count()),
                    consumers: Some(q.consumer_count()),
                }),
                // Not declared yet (webhooks before the first delivery, a lane before its
                // tenant's first turn).
                Err(QueueError::Amqp(e)) if not_found(&e) => {}
                Err(e) => return Err(e),
            }
        }
        Ok(out)
    }

    async fn sweep_dead(
        &self,
        max: usize,
        choose: &ChooseDead,
    ) -> Result<Vec<(DeadLetter, DeadChoice)>, QueueError> {
        let dead = self.topology.dead();
        let ch = self.consumer_channel().await?;
        let swept = async {
            // Only what is there now: what this sweep puts back is not met again.
            let there = ch
                .queue_declare(
                    dead.as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    FieldTable::default(),
                )
                .await
                .map_err(unavailable)?
                .message_count() as usize;
            let mut out = Vec::new();
            while out.len() < max.min(there) {
                let got = self
                    .bounded("reading the dead-letter queue", async {
                        ch.basic_get(dead.as_str().into(), BasicGetOptions::default())
                            .await
                            .map_err(unavailable)
                    })
                    .await?;
                let Some(msg) = got else { break };
                let props = &msg.delivery.properties;
                let letter = DeadLetter {
                    reason: text_header(props, REASON_HEADER).unwrap_or_default(),
                    meta: meta_of(props),
                    body: msg.delivery.data.clone(),
                };
                let choice = choose(&letter);
                // Published where it goes (confirmed) before it is taken from here.
                match choice {
                    DeadChoice::Keep => {
                        self.publish_dead(&letter.body, &letter.meta, &letter.reason)
                            .await?
                    }
                    DeadChoice::Requeue => {
                        self.enqueue(None, &letter.body, &super::revived(&letter.meta))
                            .await?
                    }
                    DeadChoice::Discard => {}
                }
                msg.delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .map_err(unavailable)?;
                out.push((letter, choice));
            }
            Ok(out)
        }
        .await;
        // Closing the channel gives back a job read and not yet taken (on an error).
        let _ = ch.close(200, "done".into()).await;
        swept
    }
}

#[cfg(test)]
mod tests;
