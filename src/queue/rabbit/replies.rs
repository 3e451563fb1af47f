//! The reply side of the RabbitMQ broker: per-session durable reply queues (declared once, again
//! only when they may have expired, remembered within a bound), and the process's one event hub
//! that fans a session's statuses and live events out to its in-process subscribers — those
//! that came directly (jobs naming the hub's queue) and those of sessions the hub is bound to.
//!
//! Owns: reply queue declaration and consumption, the event hub, its bindings and direct
//! address. Must not: touch the job queues.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use lapin::options::{
    BasicAckOptions, BasicConsumeOptions, BasicNackOptions, BasicPublishOptions, QueueBindOptions,
    QueueDeclareOptions,
};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use lapin::{BasicProperties, Channel};
use tokio::sync::mpsc;

use super::{RabbitBroker, Routed, table, text, text_header, unavailable};
use crate::contract::SessionId;
use crate::queue::QueueError;
use crate::queue::{Direct, Replies, ReplyBus, ReplyQueues, SessionEvent, SessionEvents};

/// The session a direct message belongs to (direct messages travel through the default
/// exchange, whose routing key is the hub's queue).
const SESSION_HEADER: &str = "x-aptix-session";
/// What a direct message is: `status` or `live`.
const EVENT_HEADER: &str = "x-aptix-event";

/// An in-process subscriber of a session: of results only (as bodies or as events), or of
/// results and live events.
pub(super) enum Subscriber {
    Status(mpsc::Sender<Vec<u8>>),
    Results(mpsc::Sender<SessionEvent>),
    All(mpsc::Sender<SessionEvent>),
}

impl Subscriber {
    fn is_closed(&self) -> bool {
        match self {
            Self::Status(tx) => tx.is_closed(),
            Self::Results(tx) | Self::All(tx) => tx.is_closed(),
        }
    }

    fn wants_live(&self) -> bool {
        matches!(self, Self::All(_))
    }

    /// Hands over a message; `false` when the subscriber is gone, or too far behind on results.
    /// A live event a full subscriber has no room for is skipped.
    fn offer(&self, live: bool, data: &[u8]) -> bool {
        match (self, live) {
            (Self::Status(tx), false) => tx.try_send(data.to_vec()).is_ok(),
            (Self::Status(tx), true) => !tx.is_closed(),
            (Self::Results(tx) | Self::All(tx), false) => {
                tx.try_send(SessionEvent::Status(data.to_vec())).is_ok()
            }
            (Self::Results(tx), true) => !tx.is_closed(),
            (Self::All(tx), true) => {
                let _ = tx.try_send(SessionEvent::Live(data.to_vec()));
                !tx.is_closed()
            }
        }
    }
}

/// A subscriber and how it hears of the session.
pub(super) struct Subscription {
    /// Through the hub's direct address (only jobs that named it), not a binding.
    direct: bool,
    subscriber: Subscriber,
}

/// Session id → its event subscribers.
pub(super) type Subscribers = Arc<StdMutex<HashMap<String, Vec<Subscription>>>>;

/// The process's one consumer of session events.
pub(super) struct EventHub {
    pub(super) channel: Channel,
    /// The hub's queue: also its direct address.
    pub(super) queue: String,
    pub(super) subscribers: Subscribers,
    /// Sessions the hub's queue is bound to on the events exchange (those with a subscriber
    /// that is not direct).
    pub(super) bound: Arc<StdMutex<HashSet<String>>>,
    /// Sessions the hub's queue is bound to on the live exchange.
    pub(super) live_bound: Arc<StdMutex<HashSet<String>>>,
}

/// Events a subscriber may fall behind by before it is dropped.
pub(super) const SUBSCRIBER_BUFFER: usize = 256;

/// Events a live subscriber may fall behind by before it misses live events.
pub(super) const LIVE_SUBSCRIBER_BUFFER: usize = 1024;

/// How often bindings of sessions nobody watches any more are removed.
pub(super) const PRUNE_EVERY: Duration = Duration::from_secs(2);

/// Reply queues a process remembers having declared, at most this many (the oldest are
/// forgotten first and simply declared again when used).
pub(super) const DECLARED_QUEUES_CAP: usize = 100_000;

/// The reply queues this process declared recently. A reply queue expires when unused for the
/// topology's `reply_queue_ttl`, and publishing to it does not count as use; declaring it does.
/// So a queue is remembered for half that time only: past it, the next reply declares the queue
/// again, which re-creates an expired queue or restarts the expiry of a live one. Memory is
/// bounded by the cap and by that age, whatever the number of sessions served.
#[derive(Debug)]
pub(super) struct DeclaredQueues {
    max_age: Duration,
    cap: usize,
    declared: HashMap<SessionId, Instant>,
    /// Declarations oldest first; entries superseded by a later declaration are skipped.
    order: VecDeque<(SessionId, Instant)>,
}

impl DeclaredQueues {
    pub(super) fn new(max_age: Duration, cap: usize) -> Self {
        Self {
            max_age,
            cap: cap.max(1),
            declared: HashMap::new(),
            order: VecDeque::new(),
        }
    }

    /// Whether the session's queue was declared less than `max_age` ago.
    pub(super) fn fresh(&mut self, session: &SessionId, now: Instant) -> bool {
        self.forget_older_than(now);
        self.declared
            .get(session)
            .is_some_and(|at| now.saturating_duration_since(*at) < self.max_age)
    }

    /// Remembers a declaration made at `now`.
    pub(super) fn insert(&mut self, session: SessionId, now: Instant) {
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
    pub(super) fn clear(&mut self) {
        self.declared.clear();
        self.order.clear();
    }

    pub(super) fn forget_older_than(&mut self, now: Instant) {
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
    pub(super) fn forget(&mut self, session: &SessionId) {
        self.declared.remove(session);
    }

    pub(super) fn sessions(&self) -> impl Iterator<Item = &SessionId> {
        self.declared.keys()
    }

    #[cfg(test)]
    pub(super) fn len(&self) -> usize {
        self.declared.len()
    }
}

impl RabbitBroker {
    /// Declares this process's event queue, starts its consumer (fan-out by session) and the
    /// task that forgets subscribers that are gone and unbinds sessions nobody watches any more.
    pub(super) async fn open_event_hub(&self) -> Result<EventHub, QueueError> {
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
        let live_exchange = self.topology.live();
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                // A direct message names its session in a header; a broadcast is routed by it.
                let (direct, session, live) = if d.exchange.as_str().is_empty() {
                    let Some(session) = text_header(&d.properties, SESSION_HEADER) else {
                        continue;
                    };
                    let live = text_header(&d.properties, EVENT_HEADER).as_deref() == Some("live");
                    (true, session, live)
                } else {
                    let live = d.exchange.as_str() == live_exchange;
                    (false, d.routing_key.to_string(), live)
                };
                let Ok(mut subs) = fan_out.lock() else { break };
                if let Some(list) = subs.get_mut(&session) {
                    // A subscriber that is gone or too far behind is dropped; its stream ends.
                    list.retain(|s| s.direct != direct || s.subscriber.offer(live, &d.data));
                }
            }
            // The connection or channel is gone: end every stream (subscribers re-subscribe,
            // or read the store).
            if let Ok(mut subs) = fan_out.lock() {
                subs.clear();
            }
        });
        let bound: Arc<StdMutex<HashSet<String>>> = Arc::default();
        let live_bound: Arc<StdMutex<HashSet<String>>> = Arc::default();
        tokio::spawn(prune(
            Arc::downgrade(&self.events),
            ch.clone(),
            queue.clone(),
            subscribers.clone(),
            [
                (self.topology.events(), bound.clone()),
                (self.topology.live(), live_bound.clone()),
            ],
        ));
        Ok(EventHub {
            channel: ch,
            queue,
            subscribers,
            bound,
            live_bound,
        })
    }

    /// Adds a subscriber of a session to the process's event hub (opening it if needed) and
    /// returns the hub's direct address. A subscriber that is not direct has the hub bound to
    /// the session first (on the live exchange too for a live subscriber).
    pub(super) async fn subscribe_now(
        &self,
        session: &SessionId,
        subscriber: Subscriber,
        direct: bool,
    ) -> Result<String, QueueError> {
        let live = subscriber.wants_live();
        let mut slot = self.events.lock().await;
        let hub = self.hub(&mut slot).await?;
        let sid = session.to_string();
        // Bound before the subscriber is added and before returning (under the hub lock), so
        // nothing published afterwards is missed; a binding that exists already is kept.
        let mut bindings = Vec::new();
        if !direct {
            if hub.bound.lock().is_ok_and(|b| !b.contains(&sid)) {
                bindings.push((self.topology.events(), &hub.bound));
            }
            if live && hub.live_bound.lock().is_ok_and(|b| !b.contains(&sid)) {
                bindings.push((self.topology.live(), &hub.live_bound));
            }
        }
        for (exchange, set) in bindings {
            hub.channel
                .queue_bind(
                    hub.queue.as_str().into(),
                    exchange.as_str().into(),
                    sid.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(unavailable)?;
            if let Ok(mut set) = set.lock() {
                set.insert(sid.clone());
            }
        }
        hub.subscribers
            .lock()
            .map_err(|_| QueueError::Unavailable("event subscribers lock poisoned".into()))?
            .entry(sid)
            .or_default()
            .push(Subscription { direct, subscriber });
        Ok(hub.queue.clone())
    }

    /// The event hub in `slot`, opened (again) when there is none or its channel is gone.
    async fn hub<'a>(&self, slot: &'a mut Option<EventHub>) -> Result<&'a EventHub, QueueError> {
        if !slot
            .as_ref()
            .is_some_and(|h| h.channel.status().connected())
        {
            *slot = Some(self.open_event_hub().await?);
        }
        slot.as_ref()
            .ok_or_else(|| QueueError::Unavailable("no event consumer".into()))
    }

    pub(super) async fn ensure_reply_queue(
        &self,
        session: &SessionId,
    ) -> Result<String, QueueError> {
        self.bounded("declaring a reply queue", self.declare_reply_queue(session))
            .await
    }

    /// Declares the session's reply queue unless this process did so recently. A queue
    /// declared earlier with other arguments (an older version, another expiry setting) is
    /// used as it is until it expires and comes back with ours.
    pub(super) async fn declare_reply_queue(
        &self,
        session: &SessionId,
    ) -> Result<String, QueueError> {
        let name = self.topology.reply_queue(session);
        let known = self
            .reply_queues
            .lock()
            .map(|mut q| q.fresh(session, Instant::now()))
            .unwrap_or(false);
        if known {
            return Ok(name);
        }
        let ch = self.declarer().await?;
        let args = table(vec![
            (
                "x-expires",
                AMQPValue::LongLongInt(self.topology.reply_queue_ttl.as_millis() as i64),
            ),
            (
                "x-max-length",
                AMQPValue::LongLongInt(i64::from(self.topology.reply_queue_max_length)),
            ),
            ("x-overflow", text("drop-head")),
        ]);
        let declared = ch
            .queue_declare(
                name.as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                args,
            )
            .await;
        match declared {
            Ok(_) => {}
            Err(e) if precondition_failed(&e) => {
                // The queue exists with other arguments: it is there to publish to. The
                // refusal closed the declaring channel; the next declaration opens another.
                tracing::debug!(queue = %name, "reply queue exists with other arguments; using it as it is");
            }
            Err(e) => return Err(unavailable(e)),
        }
        if let Ok(mut q) = self.reply_queues.lock() {
            q.insert(session.clone(), Instant::now());
        }
        Ok(name)
    }

    /// Sends a transient, unconfirmed message of a session straight to a waiting process's
    /// event hub (`address`).
    async fn publish_direct(
        &self,
        address: &str,
        session: &SessionId,
        event: &str,
        body: &[u8],
    ) -> Result<(), QueueError> {
        let ch = self.transient().await?;
        let headers = table(vec![
            (SESSION_HEADER, text(session.as_str())),
            (EVENT_HEADER, text(event)),
        ]);
        ch.basic_publish(
            "".into(),
            address.into(),
            BasicPublishOptions::default(),
            body,
            BasicProperties::default()
                .with_content_type(ShortString::from("application/json"))
                .with_delivery_mode(1)
                .with_headers(headers),
        )
        .await
        .map(|_confirm| ())
        .map_err(unavailable)
    }

    /// Broadcasts a transient, unconfirmed message of a session to the event hubs bound to it
    /// on `exchange`.
    async fn broadcast(
        &self,
        exchange: &str,
        session: &SessionId,
        props: BasicProperties,
        body: &[u8],
    ) -> Result<(), QueueError> {
        let ch = self.transient().await?;
        ch.basic_publish(
            exchange.into(),
            session.as_str().into(),
            BasicPublishOptions::default(),
            body,
            props.with_delivery_mode(1),
        )
        .await
        .map(|_confirm| ())
        .map_err(unavailable)
    }
}

/// Whether the broker refused a declaration because the queue exists with other arguments.
fn precondition_failed(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 406)
}

/// Every [`PRUNE_EVERY`]: forgets subscribers that are gone, and unbinds the hub's queue from
/// sessions left without a subscriber that needs the binding. Ends with the hub.
async fn prune(
    hub_slot: std::sync::Weak<tokio::sync::Mutex<Option<EventHub>>>,
    channel: Channel,
    queue: String,
    subscribers: Subscribers,
    bindings: [(String, Arc<StdMutex<HashSet<String>>>); 2],
) {
    loop {
        tokio::time::sleep(PRUNE_EVERY).await;
        let Some(slot) = hub_slot.upgrade() else {
            return; // the broker is gone
        };
        // Under the hub lock, so no subscription re-binds a session while it is unbound.
        let slot = slot.lock().await;
        if slot.as_ref().is_none_or(|h| h.queue != queue) {
            return; // a newer hub replaced this one
        }
        // What each session still needs: a broadcast binding, a live one.
        let mut needs: HashMap<String, (bool, bool)> = HashMap::new();
        {
            let Ok(mut subs) = subscribers.lock() else {
                return;
            };
            subs.retain(|sid, list| {
                list.retain(|s| !s.subscriber.is_closed());
                for s in list.iter().filter(|s| !s.direct) {
                    let need = needs.entry(sid.clone()).or_default();
                    need.0 = true;
                    need.1 |= s.subscriber.wants_live();
                }
                !list.is_empty()
            });
        }
        for (i, (exchange, set)) in bindings.iter().enumerate() {
            let idle: Vec<String> = {
                let Ok(mut set) = set.lock() else { return };
                let idle: Vec<String> = set
                    .iter()
                    .filter(|sid| {
                        !needs
                            .get(*sid)
                            .is_some_and(|n| if i == 0 { n.0 } else { n.1 })
                    })
                    .cloned()
                    .collect();
                for sid in &idle {
                    set.remove(sid);
                }
                idle
            };
            for sid in idle {
                if let Err(e) = channel
                    .queue_unbind(
                        queue.as_str().into(),
                        exchange.as_str().into(),
                        sid.as_str().into(),
                        FieldTable::default(),
                    )
                    .await
                {
                    tracing::warn!(session_id = %sid, error = %e, "could not unbind an unwatched session");
                }
            }
        }
        drop(slot);
    }
}

#[async_trait::async_trait]
impl ReplyBus for RabbitBroker {
    /// Sends the status to the waiting front door (when the job named one) and to the
    /// session's watchers, then to the session's reply queue, confirmed — declaring the queue
    /// (again) when needed.
    async fn publish_reply(
        &self,
        session: &SessionId,
        correlation_id: &str,
        reply_to: Option<&str>,
        body: &[u8],
    ) -> Result<(), QueueError> {
        let props = || {
            BasicProperties::default()
                .with_content_type(ShortString::from("application/json"))
                .with_correlation_id(ShortString::from(correlation_id))
        };
        let notify = async {
            if let Some(address) = reply_to {
                self.publish_direct(address, session, "status", body)
                    .await?;
            }
            self.broadcast(&self.topology.events(), session, props(), body)
                .await
        };
        self.bounded("a status broadcast", notify).await?;
        let queue = self.topology.reply_queue(session);
        if self.topology.reply_queues == ReplyQueues::OnSubscribe {
            // Only a session a client subscribed to has a queue; without one, the broker drops
            // the status (the store has it).
            return self.publish_if_routed("", &queue, body, props()).await;
        }
        self.ensure_reply_queue(session).await?;
        match self.publish_routed("", &queue, body, props()).await? {
            Routed::Delivered => Ok(()),
            // The reply queue expired since we declared it: declare it again, once.
            Routed::Returned(_) => {
                if let Ok(mut q) = self.reply_queues.lock() {
                    q.forget(session);
                }
                self.ensure_reply_queue(session).await?;
                self.publish("", &queue, body, props()).await
            }
        }
    }
    /// Consumes the session's reply queue, acknowledging what the subscriber took.
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
        let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
        self.bounded(
            "subscribing to a session",
            self.subscribe_now(session, Subscriber::Status(tx), false),
        )
        .await?;
        Ok(rx)
    }
    async fn publish_live(
        &self,
        session: &SessionId,
        reply_to: Option<&str>,
        body: &[u8],
    ) -> Result<(), QueueError> {
        // On the transient channel that later carries the turn's status to its waiters and
        // watchers, so they get them in that order; nothing is confirmed or persisted.
        let send = async {
            if let Some(address) = reply_to {
                self.publish_direct(address, session, "live", body).await?;
            }
            let props =
                BasicProperties::default().with_content_type(ShortString::from("application/json"));
            self.broadcast(&self.topology.live(), session, props, body)
                .await
        };
        self.bounded("a live event", send).await
    }
    async fn subscribe_live(&self, session: &SessionId) -> Result<SessionEvents, QueueError> {
        let (tx, rx) = mpsc::channel(LIVE_SUBSCRIBER_BUFFER);
        self.bounded(
            "subscribing to a session",
            self.subscribe_now(session, Subscriber::All(tx), false),
        )
        .await?;
        Ok(rx)
    }
    async fn subscribe_direct(
        &self,
        session: &SessionId,
        live: bool,
    ) -> Result<Direct, QueueError> {
        let (tx, events) = if live {
            let (tx, rx) = mpsc::channel(LIVE_SUBSCRIBER_BUFFER);
            (Subscriber::All(tx), rx)
        } else {
            let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
            (Subscriber::Results(tx), rx)
        };
        let address = self
            .bounded(
                "subscribing to a session",
                self.subscribe_now(session, tx, true),
            )
            .await?;
        Ok(Direct {
            address: Some(address),
            events,
        })
    }
    async fn direct_address(&self) -> Result<Option<String>, QueueError> {
        let open = async {
            let mut slot = self.events.lock().await;
            self.hub(&mut slot).await.map(|hub| Some(hub.queue.clone()))
        };
        self.bounded("opening the event hub", open).await
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
