//! Dead webhook deliveries, for operators: listed as they are read (the event, where it went,
//! the tenant, how often it was tried and what the last try got), and sent again as fresh
//! deliveries of the same events (same `webhook-id`, the retry schedule from its start). The
//! same on either broker: `aptix webhooks` reads RabbitMQ directly, or any deployment —
//! the embedded one included — through `/v1/admin/webhooks/dead`.
//!
//! Owns: what a dead delivery shows and what replaying one does. Must not: send anything.

use serde::{Deserialize, Serialize};

use super::HookJob;
use crate::queue::{HookQueue, QueueError};

/// One dead delivery as an operator reads it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize, utoipa::ToSchema)]
#[serde(rename_all = "camelCase")]
pub struct DeadDelivery {
    /// The event's id (`webhook-id`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event_id: Option<String>,
    /// The event type.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub event: Option<String>,
    /// Where it was to go.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// The tenant the event belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tenant: Option<String>,
    /// Attempts made.
    #[serde(default)]
    pub attempts: u32,
    /// When the event was first enqueued (seconds since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_at: Option<i64>,
    /// Why it was dead-lettered.
    pub reason: String,
    /// What its last attempt got.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
    /// The message itself, when it is not a delivery at all.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub body: Option<String>,
}

impl DeadDelivery {
    fn of(body: &[u8], reason: String) -> Self {
        match serde_json::from_slice::<HookJob>(body) {
            Ok(job) => Self {
                event_id: Some(job.id),
                event: Some(job.event.as_str().to_string()),
                url: Some(job.target.url),
                tenant: Some(job.tenant),
                attempts: job.attempts,
                first_at: Some(job.first_at),
                reason,
                last_error: job.last_error,
                body: None,
            },
            Err(_) => Self {
                reason,
                body: Some(String::from_utf8_lossy(body).into_owned()),
                ..Self::default()
            },
        }
    }
}

/// Up to `max` dead deliveries, oldest first; they stay where they are.
pub async fn list(hooks: &dyn HookQueue, max: usize) -> Result<Vec<DeadDelivery>, QueueError> {
    let dead = hooks.dead_hooks(max, false).await?;
    Ok(dead
        .into_iter()
        .map(|(body, reason)| DeadDelivery::of(&body, reason))
        .collect())
}

/// Sends up to `max` dead deliveries again, each as a fresh delivery of the same event;
/// returns how many. What is not a delivery at all stays dead, and so does every delivery
/// not yet sent again when the broker fails (nothing taken is lost).
pub async fn replay(hooks: &dyn HookQueue, max: usize) -> Result<usize, QueueError> {
    let mut dead = hooks.dead_hooks(max, true).await?.into_iter();
    let mut replayed = 0;
    while let Some((body, reason)) = dead.next() {
        let again = serde_json::from_slice::<HookJob>(&body).map(|mut job| {
            job.attempts = 0;
            job.first_at = time::OffsetDateTime::now_utc().unix_timestamp();
            job.last_error = None;
            serde_json::to_vec(&job)
        });
        let sent = match again {
            Ok(Ok(job)) => hooks.enqueue_hook(&job).await,
            // Not a delivery at all (or not one that can be written again): it stays dead.
            _ => {
                hooks.dead_hook(&body, &reason).await?;
                continue;
            }
        };
        if let Err(e) = sent {
            hooks.dead_hook(&body, &reason).await?;
            for (body, reason) in dead {
                hooks.dead_hook(&body, &reason).await?;
            }
            return Err(e);
        }
        replayed += 1;
    }
    Ok(replayed)
}
