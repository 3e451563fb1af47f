//! Result delivery: how a turn's statuses and live output travel from the process that
//! produced them to everyone who waits for them — the one place that answers "tell me when
//! (session, turn) settles, or what it streams, until a deadline".
//!
//! Publishing is one call, [`ResultDelivery::deliver`] (a worker's settled turn, a front
//! door's cancel; the turn's webhooks are one more waiter: their deliveries are enqueued
//! there, after the status is published), plus the live outlet ([`ResultDelivery`] is the pipeline's
//! [`LiveOutlet`]). Waiting:
//! - [`ResultDelivery::expect`]: a front door about to submit a turn it will wait for (the
//!   synchronous endpoint, streamed or not). The job names the listener's address.
//! - [`ResultDelivery::turn`]: a turn submitted earlier, by anyone (a long-poll, a
//!   synchronous call sent again while its turn runs).
//! - [`ResultDelivery::follow`]: every status and live event of a session (Server-Sent
//!   Events, and so `aptix watch`), resuming after a `Last-Event-ID` at any front door.
//! - [`ResultDelivery::read_reply_queue`]: the session's durable reply queue (`aptix run`).
//!
//! What carries what, and why each is needed:
//! - **The store** holds every status before anyone is told of it, so every waiter falls back
//!   on it: when its subscription ends (a lost broker connection), and every [`RECHECK`]
//!   otherwise (a status sent nowhere near this waiter: a cancel through another front door
//!   while the turn was queued). The store also keeps a streaming turn's latest live events,
//!   for a client that reconnects elsewhere.
//! - **The direct address** (this process's event hub, named in the job): the turn's
//!   statuses and live events reach the front door that submitted it at no broker cost per
//!   session — the synchronous endpoint and the batch shape.
//! - **One session binding per front door** on the events exchange, statuses and live events
//!   alike: watchers of turns submitted anywhere (SSE, a long-poll at another front door).
//! - **The watch mark** ([`WatchMark`]): a watcher marks the session in the store before it
//!   binds, and the worker reads the mark in the script that stores the result; an unwatched
//!   session's status is not broadcast (the batch shape pays no publish that reaches nobody).
//! - **The reply queue**: statuses kept for a client that reads them later.
//!
//! A status a waiter hears from the worker is read only as far as the waiter decides by
//! ([`PublishedStatus`]: the turn, its status, where its result lies); the synchronous
//! endpoint answers with the result's bytes as the worker wrote them.
//!
//! Owns: the order of those steps on both sides, and the waits. Must not: parse requests,
//! speak HTTP, or change a turn (a status is stored by whoever settled the turn, before it is
//! delivered).

use std::sync::Arc;
use std::time::Duration;

use crate::contract::{SessionId, TurnId};
use crate::live::LiveOutlet;
use crate::queue::{Audience, Broker, QueueError};
use crate::state::BatchRecord;
use crate::state::TurnStatusView;
use crate::store::{RecordWriter, StoreError};
use crate::tenants::Tenants;
use crate::webhooks::{EventType, Target, batch_jobs, turn_jobs};

/// The longest a waiter listening to a subscription goes without reading the store: a status
/// that never reaches the subscription is still found within this.
pub const RECHECK: Duration = Duration::from_secs(15);

/// How long a watcher of a session's events (an SSE stream, a long-poll of a turn accepted
/// elsewhere) keeps the session marked after it has gone.
pub const EVENT_WATCH_LINGER: Duration = Duration::from_secs(60);

/// The longest the store is left unread by a waiter that has no subscription (any more).
const LONGEST_POLL: Duration = Duration::from_secs(1);

/// Delivers turns' statuses and live output, and waits for them. Cheap to clone.
#[derive(Clone)]
pub struct ResultDelivery {
    store: Arc<dyn RecordWriter>,
    broker: Arc<dyn Broker>,
}

impl std::fmt::Debug for ResultDelivery {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResultDelivery").finish_non_exhaustive()
    }
}

/// Who a status is for, besides the store.
#[derive(Debug, Clone, Copy)]
pub struct Addressee<'a> {
    /// The direct address of the front door that waits for the turn (the job's `reply_to`).
    pub reply_to: Option<&'a str>,
    /// Who else may want it.
    pub audience: Audience,
    /// The webhooks it goes to (most turns have none).
    pub webhooks: Webhooks<'a>,
}

/// The webhooks a status goes to, and what their deliveries carry.
#[derive(Debug, Clone, Copy, Default)]
pub struct Webhooks<'a> {
    /// The endpoints.
    pub targets: &'a [Target],
    /// The tenant the turn belongs to.
    pub tenant: Option<&'a str>,
    /// The turn's trace context.
    pub traceparent: Option<&'a str>,
}

/// A settled turn as its delivery needs it ([`ResultDelivery::settle`]).
#[derive(Debug, Clone, Copy)]
pub struct Settling<'a> {
    /// The direct address of the front door that waits for the turn (the job's `reply_to`).
    pub reply_to: Option<&'a str>,
    /// Who else may want the status.
    pub audience: Audience,
    /// The tenant the turn belongs to.
    pub tenant: Option<&'a str>,
    /// The turn's own webhook (besides its tenant's), if it names one.
    pub webhook: Option<&'a str>,
    /// The turn's trace context.
    pub traceparent: Option<&'a str>,
    /// The batch the turn is a line of, if any.
    pub batch: Option<&'a str>,
}

/// What a settled status of a batch line has to do for its batch's completion
/// ([`ResultDelivery::deliver_settled`]).
struct BatchOf<'a, F> {
    /// The batch.
    id: &'a str,
    /// Who hears of the batch's completion.
    completion: F,
}

/// A status that was stored but could not be delivered yet; whoever holds the turn's job
/// delivers it again later (the store keeps it meanwhile).
#[derive(Debug, thiserror::Error)]
pub enum Undelivered {
    /// Not on as many store replicas as the deployment requires: a failover could lose it, so
    /// nobody was told.
    #[error("{0}")]
    NotReplicated(StoreError),
    /// The broker did not take it.
    #[error("{0}")]
    Unpublished(QueueError),
    /// The store could not record or read what it takes (a batch's completion).
    #[error("{0}")]
    Unrecorded(StoreError),
}

impl Undelivered {
    /// The reason as the retry metric names it.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::NotReplicated(_) => "result_unreplicated",
            Self::Unpublished(_) => "reply_unpublished",
            Self::Unrecorded(_) => "batch_unrecorded",
        }
    }
}

/// A waiter that could not be set up: the store or the broker is unavailable.
#[derive(Debug, thiserror::Error)]
pub enum Unavailable {
    /// The store.
    #[error("{0}")]
    Store(#[from] StoreError),
    /// The broker.
    #[error("{0}")]
    Queue(#[from] QueueError),
}

impl ResultDelivery {
    /// Delivery over `store` (the truth) and `broker` (the news).
    pub fn new(store: Arc<dyn RecordWriter>, broker: Arc<dyn Broker>) -> Self {
        Self { store, broker }
    }

    /// The store statuses are delivered from.
    pub(crate) fn store(&self) -> &Arc<dyn RecordWriter> {
        &self.store
    }

    /// Tells everyone who may wait of `view`, a status already stored: once the store's
    /// replicas hold it (as many as the deployment requires), to the session's reply queue
    /// (confirmed), the front door at `to.reply_to` and the session's watchers.
    pub async fn deliver(
        &self,
        view: &TurnStatusView,
        to: Addressee<'_>,
    ) -> Result<(), Undelivered> {
        self.deliver_as_line(view, to, None).await.map(|_| ())
    }

    /// Delivers a settled turn's status wherever it goes: the waiting front door and the
    /// session's watchers, the webhooks of its event (its tenant's and its own, as `tenants`
    /// says), and — for a line of a batch — the batch's completion once the line's events are
    /// out. The one call the worker and a cancel make.
    pub async fn settle(
        &self,
        tenants: &Tenants,
        view: &TurnStatusView,
        turn: Settling<'_>,
    ) -> Result<(), Undelivered> {
        let targets = match EventType::of(view.status) {
            Some(event) => tenants.webhook_targets(turn.tenant, turn.webhook, event),
            None => Vec::new(),
        };
        let to = Addressee {
            reply_to: turn.reply_to,
            audience: turn.audience,
            webhooks: Webhooks {
                targets: &targets,
                tenant: turn.tenant,
                traceparent: turn.traceparent,
            },
        };
        let batch = turn.batch.map(|id| BatchOf {
            id,
            completion: |b: &BatchRecord| tenants.batch_targets(b),
        });
        self.deliver_settled(view, to, batch).await
    }

    /// [`ResultDelivery::deliver`] for a turn that may be a line of a batch whose completion
    /// is told of (`batch`), then the line noted towards it: at once when its status goes to no
    /// webhook, else by the webhook sender once each of the line's events is delivered or given
    /// up on — so a receiver never gets `batch.completed` before a line's event.
    async fn deliver_settled<F>(
        &self,
        view: &TurnStatusView,
        to: Addressee<'_>,
        batch: Option<BatchOf<'_, F>>,
    ) -> Result<(), Undelivered>
    where
        F: FnOnce(&crate::state::BatchRecord) -> Vec<Target>,
    {
        let batch = batch.filter(|_| view.status.is_settled());
        let tracked = self
            .deliver_as_line(view, to, batch.as_ref().map(|b| b.id))
            .await?;
        match batch {
            Some(b) if !tracked => {
                let line = Some((&view.session_id, &view.turn_id));
                self.batch_settled(b.id, (line, None), b.completion).await
            }
            _ => Ok(()),
        }
    }

    /// [`ResultDelivery::deliver`]; when `line_of` names a batch, its webhook jobs carry the
    /// line and are noted as expected before they are enqueued. `true` when there were any.
    async fn deliver_as_line(
        &self,
        view: &TurnStatusView,
        to: Addressee<'_>,
        line_of: Option<&str>,
    ) -> Result<bool, Undelivered> {
        self.store
            .confirm_replicated(&view.session_id)
            .await
            .map_err(Undelivered::NotReplicated)?;
        let body = serde_json::to_vec(view)
            .map_err(|e| Undelivered::Unpublished(QueueError::Encode(Arc::new(e))))?;
        self.broker
            .publish_reply(
                &view.session_id,
                view.turn_id.as_str(),
                to.reply_to,
                to.audience,
                &body,
            )
            .await
            .map_err(Undelivered::Unpublished)?;
        // The webhooks after the status is published: a delivery never tells of a status
        // its turn's waiters could not see. Confirmed before this returns, so the job that
        // settled the turn is acked only once they are enqueued (a crash before it runs the
        // job again, which enqueues them again: the same event ids).
        let hooks = to.webhooks;
        let mut jobs = turn_jobs(
            view,
            hooks.tenant.unwrap_or_default(),
            hooks.targets,
            hooks.traceparent,
        );
        let tracked = !jobs.is_empty() && line_of.is_some();
        if let Some(batch) = line_of.filter(|_| tracked) {
            let urls: Vec<&str> = jobs.iter().map(|j| j.target.url.as_str()).collect();
            self.store
                .expect_line_events(batch, (&view.session_id, &view.turn_id), &urls)
                .await
                .map_err(Undelivered::Unrecorded)?;
            let line = crate::webhooks::LineOf {
                batch: batch.to_string(),
                session_id: view.session_id.clone(),
                turn_id: view.turn_id.clone(),
            };
            for job in &mut jobs {
                job.line = Some(line.clone());
            }
        }
        for job in jobs {
            let body = serde_json::to_vec(&job)
                .map_err(|e| Undelivered::Unpublished(QueueError::Encode(Arc::new(e))))?;
            self.broker
                .enqueue_hook(&body)
                .await
                .map_err(Undelivered::Unpublished)?;
        }
        Ok(tracked)
    }

    /// Notes what is known of batch `id`'s completion (a line's turn that settled, or the
    /// number of lines with turns) and, when that completes it, enqueues `batch.completed` for
    /// the targets `targets` gives for the batch, then marks the batch told of. A failure
    /// leaves it untold; noting again tells of it.
    pub async fn batch_settled(
        &self,
        id: &str,
        (settled, lines): (Option<(&SessionId, &TurnId)>, Option<usize>),
        targets: impl FnOnce(&crate::state::BatchRecord) -> Vec<Target>,
    ) -> Result<(), Undelivered> {
        let complete = self
            .store
            .note_batch(id, settled, lines)
            .await
            .map_err(Undelivered::Unrecorded)?;
        if !complete {
            return Ok(());
        }
        let Some(batch) = self
            .store
            .get_batch(id)
            .await
            .map_err(Undelivered::Unrecorded)?
        else {
            return Ok(()); // expired: nothing to tell of
        };
        let progress = crate::store::batch_progress(self.store.as_ref(), &batch)
            .await
            .map_err(Undelivered::Unrecorded)?;
        for job in batch_jobs(&progress, &batch.tenant, &targets(&batch)) {
            let body = serde_json::to_vec(&job)
                .map_err(|e| Undelivered::Unpublished(QueueError::Encode(Arc::new(e))))?;
            self.broker
                .enqueue_hook(&body)
                .await
                .map_err(Undelivered::Unpublished)?;
        }
        tracing::info!(batch_id = %id, "every line of the batch settled; batch.completed enqueued");
        self.store
            .batch_done(id)
            .await
            .map_err(Undelivered::Unrecorded)
    }
}

#[async_trait::async_trait]
impl LiveOutlet for ResultDelivery {
    /// Keeps the event in the store for a while (a client that reconnects to any front door
    /// gets what it missed from there), then publishes it. Kept first: a reconnecting client
    /// subscribes before it reads what is kept, so every event is in one or the other. Best
    /// effort: the turn's result is stored and delivered as always.
    async fn publish_live(
        &self,
        session: &SessionId,
        turn: &TurnId,
        reply_to: Option<&str>,
        event: Vec<u8>,
    ) {
        if let Err(e) = self.store.keep_live(session, turn, &event).await {
            tracing::debug!(session_id = %session, error = %e, "a live event was not kept");
        }
        if let Err(e) = self.broker.publish_live(session, reply_to, &event).await {
            tracing::debug!(session_id = %session, error = %e, "a live event was not published");
        }
    }
}

mod batch_lines;
mod published;
mod waits;
pub use batch_lines::BatchLines;
pub use published::{PublishedStatus, Settled};
pub use waits::{Following, Heard, Listener, QueueReader, Resume, Turn, Waited, WatchMark};

#[cfg(test)]
mod tests;
