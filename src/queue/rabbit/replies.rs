//! The reply side of the RabbitMQ broker: per-session durable reply queues (declared once, again
//! only when they may have expired, remembered within a bound) and the [`ReplyBus`] over them and
//! the event hub ([`super::hub`]).
//!
//! Owns: reply queue declaration and consumption, what a status publish sends where. Must not:
//! touch the job queues.

use std::collections::{HashMap, VecDeque};
use std::time::{Duration, Instant};

use futures_util::StreamExt as _;
use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicConsumeOptions, BasicNackOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, FieldTable, ShortString};
use tokio::sync::mpsc;

use super::hub::{Subscriber, broadcast, publish_direct};
use super::{RabbitBroker, Routed, table, text, unavailable};
use crate::contract::SessionId;
use crate::queue::QueueError;
use crate::queue::{Audience, Direct, Replies, ReplyBus, SessionEvents};

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
}

/// Whether the broker refused a declaration because the queue exists with other arguments.
fn precondition_failed(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 406)
}

#[async_trait::async_trait]
impl ReplyBus for RabbitBroker {
    /// Sends the status to the waiting front door (when the job named one) and, when the
    /// session is watched, to its watchers, then to the session's reply queue, confirmed —
    /// declaring the queue (again) when the topology keeps one for this audience. Otherwise an
    /// unwatched session's status is neither broadcast nor sent to a reply queue: a watcher or
    /// subscriber marks the session before it binds, so the broker would route those
    /// publishes nowhere.
    async fn publish_reply(
        &self,
        session: &SessionId,
        correlation_id: &str,
        reply_to: Option<&str>,
        audience: Audience,
        body: &[u8],
    ) -> Result<(), QueueError> {
        let props = || {
            BasicProperties::default()
                .with_content_type(ShortString::from("application/json"))
                .with_correlation_id(ShortString::from(correlation_id))
        };
        let watched = audience.watched;
        if reply_to.is_some() || watched {
            let notify = async {
                let ch = self.transient().await?;
                if let Some(address) = reply_to {
                    publish_direct(&ch, address, session, "status", body).await?;
                }
                if watched {
                    let status = ("status", props());
                    broadcast(&ch, &self.topology.events(), session, status, body).await?;
                }
                Ok(())
            };
            self.bounded("a status broadcast", notify).await?;
        }
        let queue = self.topology.reply_queue(session);
        if !self
            .topology
            .reply_queues
            .declared_for(audience.reply_queue_wanted)
        {
            if !watched {
                return Ok(());
            }
            // Only a session a client subscribed to has a queue; without one (a mark that
            // outlived it, or one set for watchers only), the broker drops the status (the
            // store has it).
            return self
                .publish_routed("", &queue, body, props(), false)
                .await
                .map(|_dropped_or_queued| ());
        }
        self.ensure_reply_queue(session).await?;
        match self.publish_routed("", &queue, body, props(), true).await? {
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
    async fn publish_live(
        &self,
        session: &SessionId,
        reply_to: Option<&str>,
        body: &[u8],
    ) -> Result<(), QueueError> {
        // On the transient channel that later carries the turn's status to its waiters and
        // watchers, so they get them in that order; nothing is confirmed or persisted.
        let send = async {
            let ch = self.transient().await?;
            if let Some(address) = reply_to {
                publish_direct(&ch, address, session, "live", body).await?;
            }
            let props =
                BasicProperties::default().with_content_type(ShortString::from("application/json"));
            broadcast(&ch, &self.topology.events(), session, ("live", props), body).await
        };
        self.bounded("a live event", send).await
    }
    async fn subscribe_session(
        &self,
        session: &SessionId,
        live: bool,
    ) -> Result<SessionEvents, QueueError> {
        let (subscriber, events) = Subscriber::new(live);
        self.bounded(
            "subscribing to a session",
            self.subscribe_now(session, subscriber, false),
        )
        .await?;
        Ok(events)
    }
    async fn subscribe_direct(
        &self,
        session: &SessionId,
        live: bool,
    ) -> Result<Direct, QueueError> {
        let (tx, events) = Subscriber::new(live);
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
