//! The RabbitMQ broker (lapin).
//!
//! Topology, declared idempotently by whoever connects first (all names under the namespace):
//! - `<ns>.turns` — durable **quorum** queue of turn jobs;
//! - `<ns>.turns.retry.<ms>ms` — one quorum queue per retry delay; messages wait there for
//!   their TTL and are dead-lettered (at-least-once) back to `<ns>.turns`;
//! - `<ns>.turns.dead` — the dead-letter queue (poison messages, jobs past the retry limit),
//!   each message carrying `x-aptix-reason`;
//! - `<ns>.replies` — direct exchange; routing key = session id; each session's durable reply
//!   queue `<ns>.reply.<sid>` is bound to it and expires when unused.
//!
//! Every publish uses publisher confirms and the mandatory flag; a nack or a returned message is
//! an error for the caller. Messages are persistent. Deliveries are acknowledged manually.
//!
//! Event subscribers (SSE, the synchronous endpoint) share one consumer per process: an
//! exclusive, server-named queue bound to the reply exchange once per watched session, with the
//! messages fanned out in process. A session's binding is removed once its last subscriber is
//! gone; a subscriber that falls more than 256 events behind is dropped (its stream ends and it
//! re-reads state over HTTP).

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use lapin::Confirmation;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicGetOptions, BasicNackOptions, BasicPublishOptions,
    BasicQosOptions, ConfirmSelectOptions, ExchangeDeclareOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, LongString, ShortString};
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties, ExchangeKind};
use tokio::sync::{Mutex, mpsc};

use super::{Acker, Broker, Deliveries, Delivery, QueueError, Replies, Topology};
use crate::contract::SessionId;

const ATTEMPT_HEADER: &str = "x-aptix-attempt";
const REASON_HEADER: &str = "x-aptix-reason";

fn unavailable(e: lapin::Error) -> QueueError {
    QueueError::Unavailable(e.to_string())
}

struct Live {
    connection: Connection,
    publisher: Channel,
}

/// Session id → the senders of its event subscribers.
type Subscribers = Arc<StdMutex<HashMap<String, Vec<mpsc::Sender<Vec<u8>>>>>>;

/// The process's one consumer of session events.
struct EventHub {
    channel: Channel,
    queue: String,
    subscribers: Subscribers,
}

/// Events a subscriber may fall behind by before it is dropped.
const SUBSCRIBER_BUFFER: usize = 256;

/// How often bindings of sessions nobody watches any more are removed.
const PRUNE_EVERY: Duration = Duration::from_secs(2);

/// How long one broker operation may take unless configured otherwise.
pub const DEFAULT_AMQP_TIMEOUT: Duration = Duration::from_secs(3);

/// Heartbeat interval asked of the broker unless the URL names one: a connection that goes
/// silent (a network partition) is detected within about two intervals.
const DEFAULT_HEARTBEAT_SECS: u16 = 10;

/// The URL with a `heartbeat` query parameter, unless it already has one.
fn with_heartbeat(url: &str) -> String {
    if url.contains("heartbeat=") {
        return url.to_string();
    }
    let sep = if url.contains('?') { '&' } else { '?' };
    format!("{url}{sep}heartbeat={DEFAULT_HEARTBEAT_SECS}")
}

/// Reply queues a process remembers having declared, at most this many (the oldest are
/// forgotten first and simply declared again when used).
const DECLARED_QUEUES_CAP: usize = 100_000;

/// The reply queues this process declared recently. A reply queue expires when unused for the
/// topology's `reply_queue_ttl`, and publishing to it does not count as use; declaring it does.
/// So a queue is remembered for half that time only: past it, the next reply declares the queue
/// again, which re-creates an expired queue or restarts the expiry of a live one. Memory is
/// bounded by the cap and by that age, whatever the number of sessions served.
#[derive(Debug)]
struct DeclaredQueues {
    max_age: Duration,
    cap: usize,
    declared: HashMap<SessionId, Instant>,
    /// Declarations oldest first; entries superseded by a later declaration are skipped.
    order: VecDeque<(SessionId, Instant)>,
}

impl DeclaredQueues {
    fn new(max_age: Duration, cap: usize) -> Self {
        Self {
            max_age,
            cap: cap.max(1),
            declared: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether the session's queue was declared less than `max_age` ago.
    fn fresh(&mut self, session: &SessionId, now: Instant) -> bool {
        self.forget_older_than(now);
        self.declared
            .get(session)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.max_age)
    }

    /// Remembers a declaration made at `now`.
    fn insert(&mut self, session: SessionId, now: Instant) {
        self.declared.insert(session.clone(), now);
        self.order.push_back((session, now));
        self.forget_older_than(now);
        while self.declared.len() > self.cap || self.order.len() > 2 * self.cap {
            let Some((oldest, at)) = self.order.pop_front() else {
                break;
            };
            if self.declared.get(&oldest) == Some(&at) {
                self.declared.remove(&oldest);
            }
        }
    }

    /// Forgets everything (after a reconnect nothing is known to exist).
    fn clear(&mut self) {
        self.declared.clear();
        self.order.clear();
    }

    fn forget_older_than(&mut self, now: Instant) {
        while let Some((session, at)) = self.order.front() {
            if now.saturating_duration_since(*at) < self.max_age {
                break;
            }
            if self.declared.get(session) == Some(at) {
                self.declared.remove(session);
            }
            self.order.pop_front();
        }
    }

    /// Forgets one session's queue (it turned out not to exist).
    fn forget(&mut self, session: &SessionId) {
        self.declared.remove(session);
    }

    fn sessions(&self) -> impl Iterator<Item = &SessionId> {
        self.declared.keys()
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.declared.len()
    }
}

/// Turn jobs and replies on RabbitMQ.
pub struct RabbitBroker {
    url: String,
    topology: Topology,
    connection_name: String,
    live: Mutex<Option<Live>>,
    reply_queues: StdMutex<DeclaredQueues>,
    timeout: Duration,
    ca: Option<crate::tls::ExtraCa>,
    events: Arc<Mutex<Option<EventHub>>>,
}

fn table(pairs: Vec<(&str, AMQPValue)>) -> FieldTable {
    let mut t = FieldTable::default();
    for (k, v) in pairs {
        t.insert(ShortString::from(k), v);
    }
    t
}

fn text(s: &str) -> AMQPValue {
    AMQPValue::LongString(LongString::from(s))
}

/// A job message's headers: its retry count and, when known, its trace context.
fn job_headers(attempt: u32, traceparent: Option<&str>) -> FieldTable {
    let mut headers = vec![(ATTEMPT_HEADER, AMQPValue::LongUInt(attempt))];
    if let Some(t) = traceparent {
        headers.push((crate::trace::TRACEPARENT, text(t)));
    }
    table(headers)
}

/// The `traceparent` header of a delivered job, if it has one.
fn traceparent_of(props: &BasicProperties) -> Option<String> {
    match props
        .headers()
        .as_ref()?
        .inner()
        .get(crate::trace::TRACEPARENT)?
    {
        AMQPValue::LongString(s) => Some(s.to_string()),
        _ => None,
    }
}

fn attempt_of(props: &BasicProperties) -> u32 {
    props
        .headers()
        .as_ref()
        .and_then(|h| h.inner().get(ATTEMPT_HEADER).cloned())
        .and_then(|v| match v {
            AMQPValue::LongUInt(n) => Some(n),
            AMQPValue::LongLongInt(n) => u32::try_from(n).ok(),
            AMQPValue::LongInt(n) => u32::try_from(n).ok(),
            AMQPValue::ShortUInt(n) => Some(u32::from(n)),
            _ => None,
        })
        .unwrap_or(0)
}

impl RabbitBroker {
    /// A broker for `url`; connects lazily and again after any connection loss.
    pub fn new(url: &str, topology: Topology, connection_name: &str) -> Self {
        Self {
            url: url.to_string(),
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
        if let Ok(known) = self.reply_queues.lock() {
            queues.extend(known.sessions().map(|s| t.reply_queue(s)));
        }
        for q in queues {
            ch.queue_delete(q.into(), lapin::options::QueueDeleteOptions::default())
                .await
                .map_err(unavailable)?;
        }
        ch.exchange_delete(
            t.replies().into(),
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

    /// Declares this process's event queue, starts its consumer (fan-out by routing key) and
    /// the task that unbinds sessions nobody watches any more.
    async fn open_event_hub(&self) -> Result<EventHub, QueueError> {
        let ch = self.consumer_channel().await?;
        let queue = ch
            .queue_declare(
                "".into(),
                QueueDeclareOptions {
                    exclusive: true,
                    auto_delete: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(unavailable)?
            .name()
            .to_string();
        let mut consumer = ch
            .basic_consume(
                queue.as_str().into(),
                format!("events-{}", self.connection_name).into(),
                BasicConsumeOptions {
                    no_ack: true,
                    ..Default::default()
                },
                FieldTable::default(),
            )
            .await
            .map_err(unavailable)?;
        let subscribers: Subscribers = Arc::default();
        let fan_out = subscribers.clone();
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                let Ok(mut subs) = fan_out.lock() else { break };
                if let Some(list) = subs.get_mut(d.routing_key.as_str()) {
                    // A subscriber that is gone or too far behind is dropped; its stream ends.
                    list.retain(|s| s.try_send(d.data.clone()).is_ok());
                }
            }
            // The connection or channel is gone: end every stream (subscribers re-subscribe).
            if let Ok(mut subs) = fan_out.lock() {
                subs.clear();
            }
        });
        let hub_slot = Arc::downgrade(&self.events);
        let (prune_channel, prune_queue) = (ch.clone(), queue.clone());
        let watched = subscribers.clone();
        let exchange = self.topology.replies();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(PRUNE_EVERY).await;
                let Some(slot) = hub_slot.upgrade() else {
                    return; // the broker is gone
                };
                // Under the hub lock, so no subscription re-binds a session while it is unbound.
                let slot = slot.lock().await;
                if slot.as_ref().is_none_or(|h| h.queue != prune_queue) {
                    return; // a newer hub replaced this one
                }
                let idle: Vec<String> = {
                    let Ok(mut subs) = watched.lock() else { return };
                    let idle: Vec<String> = subs
                        .iter_mut()
                        .filter_map(|(sid, list)| {
                            list.retain(|s| !s.is_closed());
                            list.is_empty().then(|| sid.clone())
                        })
                        .collect();
                    for sid in &idle {
                        subs.remove(sid);
                    }
                    idle
                };
                for sid in idle {
                    if let Err(e) = prune_channel
                        .queue_unbind(
                            prune_queue.as_str().into(),
                            exchange.as_str().into(),
                            sid.as_str().into(),
                            FieldTable::default(),
                        )
                        .await
                    {
                        tracing::warn!(session_id = %sid, error = %e, "could not unbind an unwatched session");
                    }
                }
                drop(slot);
            }
        });
        Ok(EventHub {
            channel: ch,
            queue,
            subscribers,
        })
    }

    /// Connects now (and declares the topology); errors if the broker is unreachable.
    pub async fn connect(&self) -> Result<(), QueueError> {
        self.bounded("connecting", async { self.publisher().await.map(|_| ()) })
            .await
    }

    async fn open(&self) -> Result<Live, QueueError> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.connection_name.as_str()));
        let tls = lapin::tcp::OwnedTLSConfig {
            identity: None,
            cert_chain: self.ca.as_ref().map(|ca| ca.pem().to_string()),
        };
        let runtime = lapin::runtime::default_runtime()
            .map_err(|e| QueueError::Unavailable(format!("no async runtime for RabbitMQ: {e}")))?;
        let connection =
            Connection::connect_with_config(&with_heartbeat(&self.url), props, tls, runtime)
                .await
                .map_err(unavailable)?;
        let publisher = connection.create_channel().await.map_err(unavailable)?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
        self.declare(&publisher).await?;
        if let Ok(mut q) = self.reply_queues.lock() {
            q.clear();
        }
        tracing::info!(connection = %self.connection_name, "connected to RabbitMQ");
        Ok(Live {
            connection,
            publisher,
        })
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
        for delay in &t.retry_delays {
            let mut args = quorum();
            args.push((
                "x-message-ttl",
                AMQPValue::LongLongInt(delay.as_millis() as i64),
            ));
            args.push(("x-dead-letter-exchange", text("")));
            args.push(("x-dead-letter-routing-key", text(&t.jobs())));
            args.push(("x-dead-letter-strategy", text("at-least-once")));
            args.push(("x-overflow", text("reject-publish")));
            ch.queue_declare(t.retry(*delay).into(), durable, table(args))
                .await
                .map_err(unavailable)?;
        }
        ch.exchange_declare(
            t.replies().into(),
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

    /// The confirm-mode publishing channel, reconnecting when the old one is gone.
    async fn publisher(&self) -> Result<Channel, QueueError> {
        let mut live = self.live.lock().await;
        if let Some(l) = live.as_ref()
            && l.connection.status().connected()
            && l.publisher.status().connected()
        {
            return Ok(l.publisher.clone());
        }
        if live.is_some() {
            tracing::warn!("RabbitMQ connection lost; reconnecting");
        }
        let fresh = self.open().await?;
        let ch = fresh.publisher.clone();
        *live = Some(fresh);
        Ok(ch)
    }

    async fn consumer_channel(&self) -> Result<Channel, QueueError> {
        self.publisher().await?;
        let live = self.live.lock().await;
        let l = live
            .as_ref()
            .ok_or_else(|| QueueError::Unavailable("not connected".into()))?;
        l.connection.create_channel().await.map_err(unavailable)
    }

    async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), QueueError> {
        self.bounded(
            "a publish",
            self.publish_confirmed(exchange, routing_key, body, props),
        )
        .await
    }

    async fn publish_confirmed(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), QueueError> {
        let ch = self.publisher().await?;
        let confirm = ch
            .basic_publish(
                exchange.into(),
                routing_key.into(),
                BasicPublishOptions {
                    mandatory: true,
                    ..Default::default()
                },
                body,
                props.with_delivery_mode(2),
            )
            .await
            .map_err(unavailable)?
            .await
            .map_err(unavailable)?;
        match confirm {
            Confirmation::Ack(None) => Ok(()),
            Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                Err(QueueError::Rejected(format!(
                    "returned as unroutable ({} {})",
                    returned.reply_code, returned.reply_text
                )))
            }
            Confirmation::Nack(None) => Err(QueueError::Rejected("nacked by the broker".into())),
            Confirmation::NotRequested => Err(QueueError::Unavailable(
                "the channel is not in confirm mode".into(),
            )),
        }
    }

    /// Subscribes to a session's events through the process's one event consumer.
    async fn subscribe_events_now(&self, session: &SessionId) -> Result<Replies, QueueError> {
        let mut slot = self.events.lock().await;
        if !slot
            .as_ref()
            .is_some_and(|h| h.channel.status().connected())
        {
            *slot = Some(self.open_event_hub().await?);
        }
        let Some(hub) = slot.as_ref() else {
            return Err(QueueError::Unavailable("no event consumer".into()));
        };
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        let first = {
            let mut subs = hub
                .subscribers
                .lock()
                .map_err(|_| QueueError::Unavailable("event subscribers lock poisoned".into()))?;
            let list = subs.entry(session.to_string()).or_default();
            list.retain(|s| !s.is_closed());
            list.push(tx);
            list.len() == 1
        };
        // Bound before returning (under the hub lock), so nothing published afterwards is
        // missed; the binding already exists when the session has other subscribers.
        if first
            && let Err(e) = hub
                .channel
                .queue_bind(
                    hub.queue.as_str().into(),
                    self.topology.replies().into(),
                    session.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
        {
            if let Ok(mut subs) = hub.subscribers.lock() {
                subs.remove(session.as_str());
            }
            return Err(unavailable(e));
        }
        Ok(rx)
    }

    async fn ensure_reply_queue(&self, session: &SessionId) -> Result<String, QueueError> {
        self.bounded("declaring a reply queue", self.declare_reply_queue(session))
            .await
    }

    async fn declare_reply_queue(&self, session: &SessionId) -> Result<String, QueueError> {
        let name = self.topology.reply_queue(session);
        let known = self
            .reply_queues
            .lock()
            .map(|mut q| q.fresh(session, Instant::now()))
            .unwrap_or(false);
        if !known {
            let ch = self.publisher().await?;
            ch.queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                table(vec![(
                    "x-expires",
                    AMQPValue::LongLongInt(self.topology.reply_queue_ttl.as_millis() as i64),
                )]),
            )
            .await
            .map_err(unavailable)?;
            ch.queue_bind(
                name.as_str().into(),
                self.topology.replies().into(),
                session.as_str().into(),
                QueueBindOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(unavailable)?;
            if let Ok(mut q) = self.reply_queues.lock() {
                q.insert(session.clone(), Instant::now());
            }
        }
        Ok(name)
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
impl Broker for RabbitBroker {
    async fn publish_traced_job(
        &self,
        body: &[u8],
        traceparent: Option<&str>,
    ) -> Result<(), QueueError> {
        let props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_headers(job_headers(0, traceparent));
        self.publish("", &self.topology.jobs(), body, props).await
    }

    async fn publish_retry(
        &self,
        body: &[u8],
        attempt: u32,
        delay: Duration,
        traceparent: Option<&str>,
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
            .with_headers(job_headers(attempt, traceparent));
        self.publish("", &self.topology.retry(chosen), body, props)
            .await
    }

    async fn publish_dead(
        &self,
        body: &[u8],
        attempt: u32,
        reason: &str,
    ) -> Result<(), QueueError> {
        let props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_headers(table(vec![
                (ATTEMPT_HEADER, AMQPValue::LongUInt(attempt)),
                (REASON_HEADER, text(reason)),
            ]));
        self.publish("", &self.topology.dead(), body, props).await
    }

    async fn publish_reply(
        &self,
        session: &SessionId,
        correlation_id: &str,
        body: &[u8],
    ) -> Result<(), QueueError> {
        let props = || {
            BasicProperties::default()
                .with_content_type(ShortString::from("application/json"))
                .with_correlation_id(ShortString::from(correlation_id))
        };
        self.ensure_reply_queue(session).await?;
        let exchange = self.topology.replies();
        match self
            .publish(&exchange, session.as_str(), body, props())
            .await
        {
            // The reply queue expired since we declared it: declare it again, once.
            Err(QueueError::Rejected(_)) => {
                if let Ok(mut q) = self.reply_queues.lock() {
                    q.forget(session);
                }
                self.ensure_reply_queue(session).await?;
                self.publish(&exchange, session.as_str(), body, props())
                    .await
            }
            other => other,
        }
    }

    async fn consume(&self, prefetch: u16) -> Result<Deliveries, QueueError> {
        let start = async {
            let ch = self.consumer_channel().await?;
            ch.basic_qos(prefetch.max(1), BasicQosOptions::default())
                .await
                .map_err(unavailable)?;
            let consumer = ch
                .basic_consume(
                    self.topology.jobs().into(),
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
                        let attempt = attempt_of(&d.properties);
                        let trace = traceparent_of(&d.properties);
                        let delivery = Delivery::new(
                            d.data,
                            attempt,
                            d.redelivered,
                            Box::new(RabbitAcker(d.acker)),
                        )
                        .with_traceparent(trace);
                        if let Err(unsent) = tx.send(delivery).await {
                            // The worker stopped consuming: give the message back and close
                            // the channel so nothing stays unacked on it.
                            let _ = unsent.0.requeue().await;
                            let _ = _channel.close(200, "consumer stopped".into()).await;
                            return;
                        }
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "RabbitMQ consumer stopped");
                        return;
                    }
                }
            }
        });
        Ok(rx)
    }

    async fn subscribe_replies(&self, session: &SessionId) -> Result<Replies, QueueError> {
        let queue = self.ensure_reply_queue(session).await?;
        let ch = self.consumer_channel().await?;
        let mut consumer = ch
            .basic_consume(
                queue.as_str().into(),
                format!("watch-{}", uuid::Uuid::new_v4().simple()).into(),
                BasicConsumeOptions::default(),
                FieldTable::default(),
            )
            .await
            .map_err(unavailable)?;
        let (tx, rx) = mpsc::channel(256);
        tokio::spawn(async move {
            loop {
                let d = tokio::select! {
                    // The subscriber went away while nothing arrived: do not keep the channel.
                    _ = tx.closed() => break,
                    next = consumer.next() => match next {
                        Some(Ok(d)) => d,
                        _ => break,
                    },
                };
                if tx.send(d.data).await.is_err() {
                    let _ = d
                        .acker
                        .nack(BasicNackOptions {
                            requeue: true,
                            ..Default::default()
                        })
                        .await;
                    break;
                }
                let _ = d.acker.ack(BasicAckOptions::default()).await;
            }
            let _ = ch.close(200, "watcher gone".into()).await;
        });
        Ok(rx)
    }

    async fn subscribe_events(&self, session: &SessionId) -> Result<Replies, QueueError> {
        self.bounded(
            "subscribing to a session",
            self.subscribe_events_now(session),
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sid(s: &str) -> SessionId {
        SessionId::parse(s).expect("valid id")
    }

    #[test]
    fn a_declared_queue_is_remembered_for_half_its_expiry_only() {
        let t0 = Instant::now();
        let mut q = DeclaredQueues::new(Duration::from_secs(30), 10);
        assert!(!q.fresh(&sid("a"), t0));
        q.insert(sid("a"), t0);
        assert!(q.fresh(&sid("a"), t0 + Duration::from_secs(29)));
        assert!(!q.fresh(&sid("a"), t0 + Duration::from_secs(30)));
        assert_eq!(q.len(), 0, "forgotten, not just hidden");
        // Declared again: remembered from the new declaration on.
        q.insert(sid("a"), t0 + Duration::from_secs(31));
        assert!(q.fresh(&sid("a"), t0 + Duration::from_secs(60)));
    }

    #[test]
    fn memory_is_bounded_by_the_cap_whatever_the_sessions() {
        let t0 = Instant::now();
        let mut q = DeclaredQueues::new(Duration::from_secs(3600), 100);
        for i in 0..10_000 {
            q.insert(sid(&format!("s{i}")), t0 + Duration::from_millis(i));
            // The same session declared again does not grow the queue of declarations
            // without bound either.
            q.insert(sid("hot"), t0 + Duration::from_millis(i));
        }
        assert!(q.len() <= 100);
        assert!(q.order.len() <= 200);
        assert!(q.fresh(&sid("s9999"), t0 + Duration::from_secs(10)));
        assert!(!q.fresh(&sid("s0"), t0 + Duration::from_secs(10)));
    }
}
