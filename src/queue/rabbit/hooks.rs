//! The webhook queues on RabbitMQ: `<ns>.webhooks` (quorum), one quorum retry queue per delay
//! of the schedule (`<ns>.webhooks.retry.<ms>ms`, dead-lettering back, at-least-once) and
//! `<ns>.webhooks.dead`. Declared the first time a process uses them, so a deployment without
//! webhooks has none.
//!
//! Owns: those queues. Must not: know what a delivery says.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::{AMQPValue, ShortString};

use super::{REASON_HEADER, RabbitBroker, table, text, unavailable};
use crate::queue::{Deliveries, HookQueue, QueueError};

impl RabbitBroker {
    /// Declares the webhook queues unless this process did already.
    async fn hook_queues(&self) -> Result<(), QueueError> {
        let mut declared = self.hooks_declared.lock().await;
        if *declared {
            return Ok(());
        }
        let declare = async {
            let ch = self.declarer().await?;
            let t = &self.topology;
            let durable = QueueDeclareOptions {
                durable: true,
                ..Default::default()
            };
            let quorum = || vec![("x-queue-type", text("quorum"))];
            for queue in [t.hooks(), t.hooks_dead()] {
                ch.queue_declare(queue.as_str().into(), durable, table(quorum()))
                    .await
                    .map_err(unavailable)?;
            }
            for delay in &t.hook_delays {
                let mut args = quorum();
                args.push((
                    "x-message-ttl",
                    AMQPValue::LongLongInt(delay.as_millis() as i64),
                ));
                args.push(("x-dead-letter-exchange", text("")));
                args.push(("x-dead-letter-routing-key", text(&t.hooks())));
                args.push(("x-dead-letter-strategy", text("at-least-once")));
                args.push(("x-overflow", text("reject-publish")));
                ch.queue_declare(t.hook_retry(*delay).as_str().into(), durable, table(args))
                    .await
                    .map_err(unavailable)?;
            }
            Ok(())
        };
        self.bounded("declaring the webhook queues", declare)
            .await?;
        *declared = true;
        Ok(())
    }

    /// Whether the webhook queue exists (declared by any process), asked on a channel of its
    /// own: the broker closes a channel whose passive declaration finds nothing.
    pub(super) async fn hook_queues_exist(&self) -> Result<bool, QueueError> {
        if *self.hooks_declared.lock().await {
            return Ok(true);
        }
        let ask = async {
            let ch = self.consumer_channel().await?;
            let found = ch
                .queue_declare(
                    self.topology.hooks().as_str().into(),
                    QueueDeclareOptions {
                        passive: true,
                        ..Default::default()
                    },
                    lapin::types::FieldTable::default(),
                )
                .await;
            match found {
                Ok(_) => {
                    let _ = ch.close(200, "done".into()).await;
                    Ok(true)
                }
                Err(e) if not_found(&e) => Ok(false),
                Err(e) => Err(unavailable(e)),
            }
        };
        self.bounded("looking for the webhook queue", ask).await
    }

    fn hook_props() -> BasicProperties {
        BasicProperties::default().with_content_type(ShortString::from("application/json"))
    }
}

#[async_trait::async_trait]
impl HookQueue for RabbitBroker {
    async fn enqueue_hook(&self, body: &[u8]) -> Result<(), QueueError> {
        self.hook_queues().await?;
        self.publish("", &self.topology.hooks(), body, Self::hook_props())
            .await
    }

    async fn retry_hook(&self, body: &[u8], delay: Duration) -> Result<(), QueueError> {
        self.hook_queues().await?;
        let delays = &self.topology.hook_delays;
        let chosen = delays
            .iter()
            .copied()
            .find(|d| *d >= delay)
            .or_else(|| delays.last().copied())
            .ok_or_else(|| QueueError::Rejected("no webhook retry queues are configured".into()))?;
        self.publish(
            "",
            &self.topology.hook_retry(chosen),
            body,
            Self::hook_props(),
        )
        .await
    }

    async fn dead_hook(&self, body: &[u8], reason: &str) -> Result<(), QueueError> {
        self.hook_queues().await?;
        let props = Self::hook_props().with_headers(table(vec![(REASON_HEADER, text(reason))]));
        self.publish("", &self.topology.hooks_dead(), body, props)
            .await
    }

    async fn hooks_exist(&self) -> Result<bool, QueueError> {
        self.hook_queues_exist().await
    }

    async fn consume_hooks(&self, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.hook_queues().await?;
        self.consume_queue(self.topology.hooks(), None, prefetch)
            .await
    }

    async fn dead_hooks(
        &self,
        max: usize,
        take: bool,
    ) -> Result<Vec<(Vec<u8>, String)>, QueueError> {
        self.hook_queues().await?;
        let ch = self.consumer_channel().await?;
        let mut out = Vec::new();
        while out.len() < max {
            let Some(msg) = ch
                .basic_get(
                    self.topology.hooks_dead().as_str().into(),
                    BasicGetOptions::default(),
                )
                .await
                .map_err(unavailable)?
            else {
                break;
            };
            let reason =
                super::text_header(&msg.delivery.properties, REASON_HEADER).unwrap_or_default();
            if take {
                msg.delivery
                    .acker
                    .ack(BasicAckOptions::default())
                    .await
                    .map_err(unavailable)?;
            }
            out.push((msg.delivery.data, reason));
        }
        // Closing the channel gives back what was read and not taken.
        let _ = ch.close(200, "done".into()).await;
        Ok(out)
    }
}

/// Whether the broker refused an operation because the queue does not exist.
fn not_found(e: &lapin::Error) -> bool {
    matches!(e.kind(), lapin::ErrorKind::ProtocolError(amqp) if amqp.get_id() == 404)
}
