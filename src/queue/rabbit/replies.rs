//! The reply side of the RabbitMQ broker: per-session durable reply queues (declared again when
//! they may have expired, remembered within a bound), and the process's one event hub that fans
//! a session's published results out to its in-process subscribers (SSE, long-polls, the
//! synchronous endpoint).
//!
//! Owns: reply queue declaration and consumption, the event hub and its bindings. Must not:
//! touch the job queues.

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

use super::{RabbitBroker, table, unavailable};
use crate::contract::SessionId;
use crate::queue::QueueError;
use crate::queue::{Replies, ReplyBus, SessionEvent, SessionEvents};

/// An in-process subscriber of a session: of results only, or of results and live events.
pub(super) enum Subscriber {
    Status(mpsc::Sender<Vec<u8>>),
    All(mpsc::Sender<SessionEvent>),
}

impl Subscriber {
    fn is_closed(&self) -> bool {
        match self {
            Self::Status(tx) => tx.is_closed(),
            Self::All(tx) => tx.is_closed(),
        }
    }

    /// Hands over a message; `false` when the subscriber is gone, or too far behind on results.
    /// A live event a full subscriber has no room for is skipped.
    fn offer(&self, live: bool, data: &[u8]) -> bool {
        match (self, live) {
            (Self::Status(tx), false) => tx.try_send(data.to_vec()).is_ok(),
            (Self::Status(tx), true) => !tx.is_closed(),
            (Self::All(tx), false) => tx.try_send(SessionEvent::Status(data.to_vec())).is_ok(),
            (Self::All(tx), true) => {
                let _ = tx.try_send(SessionEvent::Live(data.to_vec()));
                !tx.is_closed()
            }
        }
    }
}

/// Session id → its event subscribers.
pub(super) type Subscribers = Arc<StdMutex<HashMap<String, Vec<Subscriber>>>>;

/// The process's one consumer of session events.
pub(super) struct EventHub {
    pub(super) channel: Channel,
    pub(super) queue: String,
    pub(super) subscribers: Subscribers,
    /// Sessions whose live events the hub's queue is bound to (those with a live subscriber).
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
    /// Declares this process's event queue, starts its consumer (fan-out by routing key) and
    /// the task that unbinds sessions nobody watches any more.
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
                let live = d.exchange.as_str() == live_exchange;
                let Ok(mut subs) = fan_out.lock() else { break };
                if let Some(list) = subs.get_mut(d.routing_key.as_str()) {
                    // A subscriber that is gone or too far behind is dropped; its stream ends.
                    list.retain(|s| s.offer(live, &d.data));
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
        let live_bound: Arc<StdMutex<HashSet<String>>> = Arc::default();
        let watched_live = live_bound.clone();
        let (exchange, live_exchange) = (self.topology.replies(), self.topology.live());
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
                    let was_live = watched_live.lock().is_ok_and(|mut l| l.remove(&sid));
                    let from = if was_live {
                        vec![exchange.as_str(), live_exchange.as_str()]
                    } else {
                        vec![exchange.as_str()]
                    };
                    for ex in from {
                        if let Err(e) = prune_channel
                            .queue_unbind(
                                prune_queue.as_str().into(),
                                ex.into(),
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
        });
        Ok(EventHub {
            channel: ch,
            queue,
            subscribers,
            live_bound,
        })
    }

    /// Subscribes to a session's events through the process's one event consumer; a live
    /// subscriber also gets the session's live events.
    pub(super) async fn subscribe_now(
        &self,
        session: &SessionId,
        subscriber: Subscriber,
    ) -> Result<(), QueueError> {
        let live = matches!(subscriber, Subscriber::All(_));
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
        let first = {
            let mut subs = hub
                .subscribers
                .lock()
                .map_err(|_| QueueError::Unavailable("event subscribers lock poisoned".into()))?;
            let list = subs.entry(session.to_string()).or_default();
            list.retain(|s| !s.is_closed());
            list.push(subscriber);
            list.len() == 1
        };
        let first_live = live
            && hub
                .live_bound
                .lock()
                .is_ok_and(|mut l| l.insert(session.to_string()));
        // Bound before returning (under the hub lock), so nothing published afterwards is
        // missed; the bindings already exist when the session has other subscribers.
        let mut exchanges = Vec::new();
        if first {
            exchanges.push(self.topology.replies());
        }
        if first_live {
            exchanges.push(self.topology.live());
        }
        for exchange in exchanges {
            if let Err(e) = hub
                .channel
                .queue_bind(
                    hub.queue.as_str().into(),
                    exchange.as_str().into(),
                    session.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
            {
                if let Ok(mut subs) = hub.subscribers.lock() {
                    subs.remove(session.as_str());
                }
                if let Ok(mut l) = hub.live_bound.lock() {
                    l.remove(session.as_str());
                }
                return Err(unavailable(e));
            }
        }
        Ok(())
    }

    pub(super) async fn ensure_reply_queue(
        &self,
        session: &SessionId,
    ) -> Result<String, QueueError> {
        self.bounded("declaring a reply queue", self.declare_reply_queue(session))
            .await
    }

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

#[async_trait::async_trait]
impl ReplyBus for RabbitBroker {
    /// Publishes a reply to the session's reply queue, declaring it (again) when needed.
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
            self.subscribe_now(session, Subscriber::Status(tx)),
        )
        .await?;
        Ok(rx)
    }
    async fn publish_live(&self, session: &SessionId, body: &[u8]) -> Result<(), QueueError> {
        // On the confirm channel that later carries the turn's result, so a subscriber gets
        // them in that order; the confirm is not awaited and nothing is persisted.
        let send = async {
            let ch = self.publisher().await?;
            ch.basic_publish(
                self.topology.live().as_str().into(),
                session.as_str().into(),
                BasicPublishOptions::default(),
                body,
                BasicProperties::default()
                    .with_content_type(ShortString::from("application/json"))
                    .with_delivery_mode(1),
            )
            .await
            .map(|_confirm| ())
            .map_err(unavailable)
        };
        self.bounded("a live event", send).await
    }
    async fn subscribe_live(&self, session: &SessionId) -> Result<SessionEvents, QueueError> {
        let (tx, rx) = mpsc::channel(LIVE_SUBSCRIBER_BUFFER);
        self.bounded(
            "subscribing to a session",
            self.subscribe_now(session, Subscriber::All(tx)),
        )
        .await?;
        Ok(rx)
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
