//! The process's one event hub: an exclusive, server-named queue and its consumer, fanning a
//! session's statuses and live events out to the in-process subscribers — those that came
//! directly (jobs naming the hub's queue, through the default exchange) and those of sessions
//! the hub is bound to on the events exchange (one binding per session, whatever its
//! subscribers want). Also the two transient sends that reach hubs: a direct message to one
//! hub, and a broadcast to the hubs bound to a session.
//!
//! Owns: the hub, its bindings (made for a watcher, removed a few seconds after the last one
//! left) and its direct address. Must not: touch reply queues or job queues.

use std::collections::{HashMap, HashSet};
use std::sync::{Arc, Mutex as StdMutex};
use std::time::Duration;

use futures_util::StreamExt as _;
use lapin::options::{
    BasicConsumeOptions, BasicPublishOptions, QueueBindOptions, QueueDeclareOptions,
};
use lapin::types::{FieldTable, ShortString};
use lapin::{BasicProperties, Channel};
use tokio::sync::mpsc;

use super::{RabbitBroker, table, text, text_header, unavailable};
use crate::contract::SessionId;
use crate::queue::{QueueError, SessionEvent, SessionEvents};

/// The session a direct message belongs to (direct messages travel through the default
/// exchange, whose routing key is the hub's queue).
const SESSION_HEADER: &str = "x-aptix-session";
/// What a message is: `status` or `live` (a broadcast without it, from an older worker, is a
/// status).
const EVENT_HEADER: &str = "x-aptix-event";

/// An in-process subscriber of a session: of statuses only, or of statuses and live events.
pub(super) enum Subscriber {
    Results(mpsc::Sender<SessionEvent>),
    All(mpsc::Sender<SessionEvent>),
}

impl Subscriber {
    /// A subscriber (of live events too when `live`) and its stream.
    pub(super) fn new(live: bool) -> (Self, SessionEvents) {
        if live {
            let (tx, rx) = mpsc::channel(LIVE_SUBSCRIBER_BUFFER);
            (Self::All(tx), rx)
        } else {
            let (tx, rx) = mpsc::channel(SUBSCRIBER_BUFFER);
            (Self::Results(tx), rx)
        }
    }

    fn is_closed(&self) -> bool {
        match self {
            Self::Results(tx) | Self::All(tx) => tx.is_closed(),
        }
    }

    /// Hands over a message; `false` when the subscriber is gone, or too far behind on
    /// statuses. A live event a full subscriber has no room for is skipped; one a subscriber
    /// of statuses did not ask for is passed over.
    fn offer(&self, live: bool, data: &[u8]) -> bool {
        match (self, live) {
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
}

/// Events a subscriber may fall behind by before it is dropped.
pub(super) const SUBSCRIBER_BUFFER: usize = 256;

/// Events a live subscriber may fall behind by before it misses live events.
pub(super) const LIVE_SUBSCRIBER_BUFFER: usize = 1024;

/// How often bindings of sessions nobody watches any more are removed.
pub(super) const PRUNE_EVERY: Duration = Duration::from_secs(2);

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
        tokio::spawn(async move {
            while let Some(Ok(d)) = consumer.next().await {
                // A direct message names its session in a header; a broadcast is routed by it.
                let live = text_header(&d.properties, EVENT_HEADER).as_deref() == Some("live");
                let (direct, session) = if d.exchange.as_str().is_empty() {
                    let Some(session) = text_header(&d.properties, SESSION_HEADER) else {
                        continue;
                    };
                    (true, session)
                } else {
                    (false, d.routing_key.to_string())
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
        tokio::spawn(prune(
            Arc::downgrade(&self.events),
            ch.clone(),
            queue.clone(),
            subscribers.clone(),
            (self.topology.events(), bound.clone()),
        ));
        Ok(EventHub {
            channel: ch,
            queue,
            subscribers,
            bound,
        })
    }

    /// Adds a subscriber of a session to the process's event hub (opening it if needed) and
    /// returns the hub's direct address. A subscriber that is not direct has the hub bound to
    /// the session first.
    pub(super) async fn subscribe_now(
        &self,
        session: &SessionId,
        subscriber: Subscriber,
        direct: bool,
    ) -> Result<String, QueueError> {
        let mut slot = self.events.lock().await;
        let hub = self.hub(&mut slot).await?;
        let sid = session.to_string();
        // Bound before the subscriber is added and before returning (under the hub lock), so
        // nothing published afterwards is missed; a binding that exists already is kept.
        if !direct && hub.bound.lock().is_ok_and(|b| !b.contains(&sid)) {
            hub.channel
                .queue_bind(
                    hub.queue.as_str().into(),
                    self.topology.events().as_str().into(),
                    sid.as_str().into(),
                    QueueBindOptions::default(),
                    FieldTable::default(),
                )
                .await
                .map_err(unavailable)?;
            if let Ok(mut set) = hub.bound.lock() {
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
    pub(super) async fn hub<'a>(
        &self,
        slot: &'a mut Option<EventHub>,
    ) -> Result<&'a EventHub, QueueError> {
        if !slot
            .as_ref()
            .is_some_and(|h| h.channel.status().connected())
        {
            *slot = Some(self.open_event_hub().await?);
        }
        slot.as_ref()
            .ok_or_else(|| QueueError::Unavailable("no event consumer".into()))
    }
}

/// Sends a transient, unconfirmed message of a session on `ch` (the transient channel) straight
/// to a waiting process's event hub (`address`).
pub(super) async fn publish_direct(
    ch: &Channel,
    address: &str,
    session: &SessionId,
    event: &str,
    body: &[u8],
) -> Result<(), QueueError> {
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

/// Broadcasts a transient, unconfirmed message of a session (`event`: `status` or `live`) on
/// `ch` (the transient channel) to the event hubs bound to it on `exchange`.
pub(super) async fn broadcast(
    ch: &Channel,
    exchange: &str,
    session: &SessionId,
    (event, props): (&str, BasicProperties),
    body: &[u8],
) -> Result<(), QueueError> {
    ch.basic_publish(
        exchange.into(),
        session.as_str().into(),
        BasicPublishOptions::default(),
        body,
        props
            .with_delivery_mode(1)
            .with_headers(table(vec![(EVENT_HEADER, text(event))])),
    )
    .await
    .map(|_confirm| ())
    .map_err(unavailable)
}

/// Every [`PRUNE_EVERY`]: forgets subscribers that are gone, and unbinds the hub's queue from
/// sessions left without a subscriber that needs the binding. Ends with the hub.
async fn prune(
    hub_slot: std::sync::Weak<tokio::sync::Mutex<Option<EventHub>>>,
    channel: Channel,
    queue: String,
    subscribers: Subscribers,
    (exchange, bound): (String, Arc<StdMutex<HashSet<String>>>),
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
        // The sessions that still need the binding: those with a subscriber that is not
        // direct.
        let mut needed: HashSet<String> = HashSet::new();
        {
            let Ok(mut subs) = subscribers.lock() else {
                return;
            };
            subs.retain(|sid, list| {
                list.retain(|s| !s.subscriber.is_closed());
                if list.iter().any(|s| !s.direct) {
                    needed.insert(sid.clone());
                }
                !list.is_empty()
            });
        }
        let idle: Vec<String> = {
            let Ok(mut set) = bound.lock() else { return };
            let idle: Vec<String> = set.difference(&needed).cloned().collect();
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
        drop(slot);
    }
}
