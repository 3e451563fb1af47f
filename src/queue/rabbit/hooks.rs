//! The webhook queues on RabbitMQ: `<ns>.webhooks` (quorum), one quorum retry queue per delay
//! of the schedule (`<ns>.webhooks.retry.<ms>ms`, dead-lettering back, at-least-once) and
//! `<ns>.webhooks.dead`. The first is declared by every sender (it consumes it); the others
//! by the first delivery enqueued, so a deployment without webhooks has only the first.
//!
//! Owns: those queues. Must not: know what a delivery says.

use std::time::Duration;

use lapin::BasicProperties;
use lapin::options::{BasicAckOptions, BasicGetOptions, QueueDeclareOptions};
use lapin::types::ShortString;

use super::{REASON_HEADER, RabbitBroker, delay_queue_args, table, text, unavailable};
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
                ch.queue_declare(
                    t.hook_retry(*delay).as_str().into(),
                    durable,
                    delay_queue_args(*delay, &t.hooks()),
                )
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

    /// Declares the queue of deliveries itself (what a sender consumes) unless this process
    /// did already: one quorum queue, so a deployment whose workers wait for webhooks that
    /// never come has only that one.
    async fn hook_queue(&self) -> Result<(), QueueError> {
        let mut declared = self.hook_queue_declared.lock().await;
        if *declared {
            return Ok(());
        }
        let declare = async {
            let ch = self.declarer().await?;
            ch.queue_declare(
                self.topology.hooks().as_str().into(),
                QueueDeclareOptions {
                    durable: true,
                    ..Default::default()
                },
                table(vec![("x-queue-type", text("quorum"))]),
            )
            .await
            .map_err(unavailable)
            .map(|_| ())
        };
        self.bounded("declaring the webhook queue", declare).await?;
        *declared = true;
        Ok(())
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

    async fn hooks_waiting(&self) -> Result<u64, QueueError> {
        self.hook_queue().await?;
        let count = async {
            let ch = self.declarer().await?;
            ch.queue_declare(
                self.topology.hooks().as_str().into(),
                QueueDeclareOptions {
                    passive: true,
                    ..Default::default()
                },
                lapin::types::FieldTable::default(),
            )
            .await
            .map(|q| u64::from(q.message_count()))
            .map_err(unavailable)
        };
        self.bounded("counting the webhook queue", count).await
    }

    async fn consume_hooks(&self, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.hook_queue().await?;
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
