//! The broker's connection and its channels: one confirm-mode channel for persistent
//! publishes (jobs, reply-queue statuses), one without confirms for transient messages, and
//! four for declaring reply queues; each reopened when it closed, the whole connection when it
//! dropped. And the confirmed publish itself.
//!
//! Owns: connecting (to the first node of a cluster that answers; TLS, heartbeat, the topology
//! declared on connect) and the channels, a nacked publishing channel retired. Must not: know
//! what the messages mean.

use lapin::Confirmation;
use lapin::options::{BasicPublishOptions, ConfirmSelectOptions};
use lapin::types::LongString;
use lapin::{BasicProperties, Channel, Connection, ConnectionProperties};
use std::sync::atomic::Ordering;

use tokio::sync::{MappedMutexGuard, MutexGuard};

use super::{RabbitBroker, unavailable};
use crate::queue::QueueError;

pub(super) struct Live {
    pub(super) connection: Connection,
    pub(super) publisher: Channel,
    /// Reply queues are declared here, not on the publisher: a declaration the broker refuses
    /// (a queue declared earlier with other arguments) closes only this channel.
    /// ([`DECLARING_CHANNELS`] of them, taken in turn: the broker works through one channel's
    /// declarations one at a time.)
    declarers: Vec<Declarer>,
    /// Declarations made so far (which declarer is next).
    declarations: u64,
    /// Transient messages (live events, the direct and broadcast copies of a status) go out
    /// here, without publisher confirms: in one order, at no confirm cost, and without lapin
    /// keeping an unawaited confirm of each until the channel closes.
    transient: Channel,
}

/// A channel reply queues are declared on.
struct Declarer {
    channel: Channel,
    /// Declarations made on it so far.
    declarations: u32,
}

/// Channels reply queues are declared on, side by side.
const DECLARING_CHANNELS: usize = 4;

/// Declarations made on one declaring channel before it is replaced: lapin remembers every
/// queue declared on a channel (to recover the topology) until the channel closes, so a channel
/// kept for good would grow with the sessions served.
const DECLARATIONS_PER_CHANNEL: u32 = 1000;

/// What the broker did with a confirmed, mandatory publish.
pub(super) enum Routed {
    /// It reached a queue.
    Delivered,
    /// No queue took it; it came back (why).
    Returned(String),
}

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

impl RabbitBroker {
    pub(super) async fn open(&self) -> Result<Live, QueueError> {
        let props = ConnectionProperties::default()
            .with_connection_name(LongString::from(self.connection_name.as_str()));
        let tls = lapin::tcp::OwnedTLSConfig {
            identity: None,
            cert_chain: self.ca.as_ref().map(|ca| ca.pem().to_string()),
        };
        let connection = self.connect_any(props, tls).await?;
        let publisher = connection.create_channel().await.map_err(unavailable)?;
        publisher
            .confirm_select(ConfirmSelectOptions::default())
            .await
            .map_err(unavailable)?;
        self.declare(&publisher).await?;
        let mut declarers = Vec::with_capacity(DECLARING_CHANNELS);
        for _ in 0..DECLARING_CHANNELS {
            declarers.push(Declarer {
                channel: connection.create_channel().await.map_err(unavailable)?,
                declarations: 0,
            });
        }
        let transient = connection.create_channel().await.map_err(unavailable)?;
        if let Ok(mut q) = self.reply_queues.lock() {
            q.clear();
        }
        tracing::info!(connection = %self.connection_name, "connected to RabbitMQ");
        Ok(Live {
            connection,
            publisher,
            declarers,
            declarations: 0,
            transient,
        })
    }

    /// A connection to the first node that answers, starting from the one connected to last;
    /// the error of the last node tried when none does.
    async fn connect_any(
        &self,
        props: ConnectionProperties,
        tls: lapin::tcp::OwnedTLSConfig,
    ) -> Result<Connection, QueueError> {
        let nodes = self.urls.len().max(1);
        let first = self.first.load(Ordering::Relaxed);
        let mut last_error = None;
        for i in 0..nodes {
            let at = (first + i) % nodes;
            let Some(url) = self.urls.get(at) else {
                continue;
            };
            let runtime = lapin::runtime::default_runtime().map_err(|e| {
                QueueError::Unavailable(format!("no async runtime for RabbitMQ: {e}"))
            })?;
            match Connection::connect_with_config(
                &with_heartbeat(url),
                props.clone(),
                tls.clone(),
                runtime,
            )
            .await
            {
                Ok(connection) => {
                    self.first.store(at, Ordering::Relaxed);
                    if nodes > 1 {
                        tracing::info!(node = at + 1, of = nodes, "connected to a RabbitMQ node");
                    }
                    return Ok(connection);
                }
                Err(e) => {
                    if nodes > 1 {
                        tracing::warn!(node = at + 1, of = nodes, error = %e, "a RabbitMQ node did not answer; trying the next");
                    }
                    last_error = Some(unavailable(e));
                }
            }
        }
        Err(last_error.unwrap_or_else(|| QueueError::Unavailable("no RabbitMQ URL".into())))
    }

    /// The confirm-mode publishing channel, reconnecting when the old one is gone.
    pub(super) async fn publisher(&self) -> Result<Channel, QueueError> {
        Ok(self.connected().await?.publisher.clone())
    }

    /// The connection, held while the caller picks or opens a channel: one lock, and a new
    /// connection first when the old one (or its publishing channel) is gone.
    async fn connected(&self) -> Result<MappedMutexGuard<'_, Live>, QueueError> {
        let mut live = self.live.lock().await;
        let healthy = live
            .as_ref()
            .is_some_and(|l| l.connection.status().connected() && l.publisher.status().connected());
        if !healthy {
            if live.is_some() {
                tracing::warn!("RabbitMQ connection lost; reconnecting");
            }
            *live = Some(self.open().await?);
        }
        MutexGuard::try_map(live, Option::as_mut)
            .map_err(|_| QueueError::Unavailable("not connected".into()))
    }

    /// The channel reply queues are declared on: opened again when a refused declaration
    /// closed it, and replaced by a fresh one every [`DECLARATIONS_PER_CHANNEL`] declarations
    /// (the worn one closes once what is in flight on it has had its time).
    pub(super) async fn declarer(&self) -> Result<Channel, QueueError> {
        let mut live = self.connected().await?;
        let l = &mut *live;
        let turn = (l.declarations % DECLARING_CHANNELS as u64) as usize;
        l.declarations += 1;
        let connection = &l.connection;
        let Some(d) = l.declarers.get_mut(turn) else {
            return Err(QueueError::Unavailable("no declaring channel".into()));
        };
        let worn = d.declarations >= DECLARATIONS_PER_CHANNEL;
        if worn || !d.channel.status().connected() {
            let fresh = connection.create_channel().await.map_err(unavailable)?;
            let old = std::mem::replace(&mut d.channel, fresh);
            d.declarations = 0;
            if worn {
                let linger = self.timeout * 2;
                tokio::spawn(async move {
                    tokio::time::sleep(linger).await;
                    let _ = old.close(200, "replaced".into()).await;
                });
            }
        }
        d.declarations += 1;
        Ok(d.channel.clone())
    }

    /// The channel of transient messages, opened again when it closed.
    pub(super) async fn transient(&self) -> Result<Channel, QueueError> {
        let mut l = self.connected().await?;
        if !l.transient.status().connected() {
            l.transient = l.connection.create_channel().await.map_err(unavailable)?;
        }
        Ok(l.transient.clone())
    }

    pub(super) async fn consumer_channel(&self) -> Result<Channel, QueueError> {
        let l = self.connected().await?;
        l.connection.create_channel().await.map_err(unavailable)
    }

    /// A persistent, mandatory, confirmed publish; a returned message is an error.
    pub(super) async fn publish(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
    ) -> Result<(), QueueError> {
        match self
            .publish_routed(exchange, routing_key, body, props, true)
            .await?
        {
            Routed::Delivered => Ok(()),
            Routed::Returned(why) => Err(QueueError::Rejected(why)),
        }
    }

    /// A persistent, confirmed publish within the operation timeout. `mandatory`: a message no
    /// queue takes comes back ([`Routed::Returned`]); otherwise the broker drops it and the
    /// publish reads as delivered.
    ///
    /// A nack retires the publishing channel and the message is published once more on a fresh
    /// one: a channel keeps, per quorum queue, the leader it last knew, and one that met a
    /// leader as it died goes on being refused after a new leader is elected (seen on a
    /// three-node cluster: every publish nacked for as long as the old leader's node was down)
    /// while a fresh channel is taken at once.
    pub(super) async fn publish_routed(
        &self,
        exchange: &str,
        routing_key: &str,
        body: &[u8],
        props: BasicProperties,
        mandatory: bool,
    ) -> Result<Routed, QueueError> {
        self.bounded("a publish", async {
            let mut tries = 0;
            loop {
                tries += 1;
                let ch = self.publisher().await?;
                let confirm = ch
                    .basic_publish(
                        exchange.into(),
                        routing_key.into(),
                        BasicPublishOptions {
                            mandatory,
                            ..Default::default()
                        },
                        body,
                        props.clone().with_delivery_mode(2),
                    )
                    .await
                    .map_err(unavailable)?
                    .await
                    .map_err(unavailable)?;
                return match confirm {
                    Confirmation::Ack(None) => Ok(Routed::Delivered),
                    Confirmation::Ack(Some(returned)) | Confirmation::Nack(Some(returned)) => {
                        Ok(Routed::Returned(format!(
                            "returned as unroutable ({} {})",
                            returned.reply_code, returned.reply_text
                        )))
                    }
                    Confirmation::Nack(None) => {
                        self.retire_publisher(&ch).await;
                        if tries < 2 {
                            tracing::warn!(
                                exchange,
                                routing_key,
                                "a publish was nacked; publishing it again on a fresh channel"
                            );
                            continue;
                        }
                        Err(QueueError::Rejected("nacked by the broker".into()))
                    }
                    Confirmation::NotRequested => Err(QueueError::Unavailable(
                        "the channel is not in confirm mode".into(),
                    )),
                };
            }
        })
        .await
    }

    /// Replaces the publishing channel `nacked` (unless another caller did already) with a
    /// fresh confirm-mode channel; the old one is closed once what is in flight on it has had
    /// its time. Nothing is replaced when the connection itself is gone (the next publish
    /// reconnects).
    async fn retire_publisher(&self, nacked: &Channel) {
        let mut live = self.live.lock().await;
        let Some(l) = live.as_mut() else { return };
        if l.publisher.id() != nacked.id() || !l.connection.status().connected() {
            return;
        }
        let fresh = match l.connection.create_channel().await {
            Ok(ch) => ch,
            Err(e) => {
                tracing::warn!(error = %e, "could not open a publishing channel; reconnecting at the next publish");
                return;
            }
        };
        if let Err(e) = fresh.confirm_select(ConfirmSelectOptions::default()).await {
            tracing::warn!(error = %e, "could not put a new publishing channel in confirm mode");
            return;
        }
        let old = std::mem::replace(&mut l.publisher, fresh);
        let linger = self.timeout * 2;
        tokio::spawn(async move {
            tokio::time::sleep(linger).await;
            let _ = old.close(200, "replaced".into()).await;
        });
    }
}
