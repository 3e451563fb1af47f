//! The worker's heartbeat (see [`crate::vitals`]): written to the store every
//! [`BEAT`] while the worker consumes, taken back when it stops.

use std::time::Duration;

use crate::metrics::Metrics;
use crate::store::RecordWriter;
use crate::vitals::{BEAT, ContextLoad, Heartbeat, Identity, KEPT_SLOTS, Slot, unix_ms};

/// Writes the worker's heartbeat every [`BEAT`] until `stop` fires, then takes it back (the
/// worker leaves the system page at once instead of after
/// [`crate::vitals::GONE_AFTER`]). A heartbeat the
/// store does not take is logged and skipped: it is for people looking, nothing waits on it.
pub(crate) async fn beat(
    store: std::sync::Arc<dyn RecordWriter>,
    metrics: std::sync::Arc<Metrics>,
    identity: Identity,
    capacities: Vec<(String, Option<u32>)>,
    stop: tokio_util::sync::CancellationToken,
) {
    let mut slots: std::collections::VecDeque<Slot> = std::collections::VecDeque::new();
    let beat_secs = BEAT.as_secs() as i64;
    loop {
        // Beats fall on wall-clock multiples of BEAT, so every worker's slots line up.
        let now_ms = unix_ms();
        let next = (now_ms / 1000 / beat_secs + 1) * beat_secs;
        let wait = Duration::from_millis(u64::try_from(next * 1000 - now_ms).unwrap_or(0));
        tokio::select! {
            _ = stop.cancelled() => break,
            _ = tokio::time::sleep(wait) => {}
        }
        slots.push_back(metrics.pulse().take(next));
        while slots.len() > KEPT_SLOTS {
            slots.pop_front();
        }
        let heartbeat = Heartbeat {
            worker: identity.worker.clone(),
            host: identity.host.clone(),
            pid: identity.pid,
            started_at: identity.started_at.clone(),
            at_ms: unix_ms(),
            concurrency: identity.concurrency,
            running: metrics.pulse().running_now(),
            contexts: capacities
                .iter()
                .map(|(context, capacity)| ContextLoad {
                    context: context.clone(),
                    in_flight: metrics.context_calls_now(context),
                    capacity: *capacity,
                    capacity_waits: metrics.capacity_waits_so_far(context),
                })
                .collect(),
            slots: slots.iter().cloned().collect(),
        };
        let body = match serde_json::to_vec(&heartbeat) {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(error = %e, "cannot encode the heartbeat");
                continue;
            }
        };
        if let Err(e) = store.put_heartbeat(&identity.worker, &body).await {
            tracing::debug!(error = %e, "heartbeat not written");
        }
    }
    if let Err(e) = store.drop_heartbeat(&identity.worker).await {
        tracing::debug!(error = %e, "heartbeat not taken back");
    }
}
