//! Webhook deliveries on the embedded broker: queued, retried on their schedule, and
//! dead-lettered like jobs.

use std::time::Duration;

use crate::queue::{Deliveries, HookQueue, QueueError};

use super::*;

#[async_trait::async_trait]
impl HookQueue for MemoryBroker {
    async fn enqueue_hook(&self, body: &[u8]) -> Result<(), QueueError> {
        self.push(Lane::Hooks, Job::fresh(body))
    }

    async fn retry_hook(&self, body: &[u8], delay: Duration) -> Result<(), QueueError> {
        let broker = self.clone();
        let job = Job::fresh(body);
        tokio::spawn(async move {
            tokio::time::sleep(delay).await;
            if let Err(e) = broker.push(Lane::Hooks, job) {
                tracing::error!(error = %e, "in-memory broker lost a webhook retry");
            }
        });
        Ok(())
    }

    async fn dead_hook(&self, body: &[u8], reason: &str) -> Result<(), QueueError> {
        self.lock()?
            .dead_hooks
            .push_back((body.to_vec(), reason.to_string()));
        Ok(())
    }

    async fn hooks_waiting(&self) -> Result<u64, QueueError> {
        Ok(self
            .lock()?
            .ready
            .get(&Lane::Hooks)
            .map_or(0, |q| q.len() as u64))
    }

    async fn consume_hooks(&self, prefetch: u16) -> Result<Deliveries, QueueError> {
        self.start_consumer(Lane::Hooks, prefetch)
    }

    async fn dead_hooks(
        &self,
        max: usize,
        take: bool,
    ) -> Result<Vec<(Vec<u8>, String)>, QueueError> {
        let mut state = self.lock()?;
        let n = max.min(state.dead_hooks.len());
        Ok(if take {
            state.dead_hooks.drain(..n).collect()
        } else {
            state.dead_hooks.iter().take(n).cloned().collect()
        })
    }
}
