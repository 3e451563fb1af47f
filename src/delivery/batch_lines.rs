//! A batch's lines counted towards its `batch.completed` as the webhook sender finishes their
//! events: a line whose turn event goes to webhooks counts once each of its deliveries is
//! delivered or dead-lettered, so the batch's completion never reaches a receiver before a
//! line's event does (see [`super::ResultDelivery::settle`]).
//!
//! Owns: what a finished line event means for its batch. Must not: send anything itself.

use std::sync::Arc;

use super::ResultDelivery;
use crate::tenants::Tenants;
use crate::webhooks::LineOf;
use crate::webhooks::send::LineFinished;

/// Notes batch lines' finished events in the store and tells of a batch once its last line
/// is in (to the batch's webhook and its tenant's).
pub struct BatchLines {
    delivery: Arc<ResultDelivery>,
    tenants: Tenants,
}

impl BatchLines {
    /// Over `delivery`, with the tenants' webhooks of `tenants`.
    pub fn new(delivery: Arc<ResultDelivery>, tenants: Tenants) -> Self {
        Self { delivery, tenants }
    }
}

#[async_trait::async_trait]
impl LineFinished for BatchLines {
    async fn finished(&self, line: &LineOf, url: &str) -> Result<(), String> {
        let turn = (&line.session_id, &line.turn_id);
        let all_out = self
            .delivery
            .store()
            .line_event_finished(&line.batch, turn, url)
            .await
            .map_err(|e| e.to_string())?;
        if !all_out {
            return Ok(());
        }
        self.delivery
            .batch_settled(&line.batch, (Some(turn), None), |b| {
                self.tenants.batch_targets(b)
            })
            .await
            .map_err(|e| e.to_string())
    }
}
