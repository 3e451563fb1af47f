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
//! Owns: the order of those steps on both sides, and the waits. Must not: parse requests,
//! speak HTTP, or change a turn (a status is stored by whoever settled the turn, before it is
//! delivered).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::contract::{SessionId, TurnId};
use crate::live::{LiveEvent, LiveOutlet};
use crate::queue::{Audience, Broker, QueueError, Replies, SessionEvent, SessionEvents};
use crate::state::{TurnStatus, TurnStatusView};
use crate::store::{SessionStore, StoreError};
use crate::webhooks::{Target, batch_jobs, turn_jobs};

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
    store: Arc<dyn SessionStore>,
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

/// What a settled status of a batch line has to do for its batch's completion
/// ([`ResultDelivery::deliver_settled`]).
pub struct BatchOf<'a, F> {
    /// The batch.
    pub id: &'a str,
    /// Who hears of the batch's completion.
    pub completion: F,
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
    pub fn new(store: Arc<dyn SessionStore>, broker: Arc<dyn Broker>) -> Self {
        Self { store, broker }
    }

    /// The store statuses are delivered from.
    pub(crate) fn store(&self) -> &Arc<dyn SessionStore> {
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

    /// [`ResultDelivery::deliver`] for a turn that may be a line of a batch whose completion
    /// is told of (`batch`), then the line noted towards it: at once when its status goes to no
    /// webhook, else by the webhook sender once each of the line's events is delivered or given
    /// up on — so a receiver never gets `batch.completed` before a line's event.
    pub async fn deliver_settled<F>(
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

    /// Subscribes this process directly to `turn`'s statuses (and live events when `live`)
    /// before it is submitted: the job must name [`Listener::address`].
    pub async fn expect(
        &self,
        session: &SessionId,
        turn: &TurnId,
        live: bool,
    ) -> Result<Listener, QueueError> {
        let direct = self.broker.subscribe_direct(session, live).await?;
        Ok(self.listener((session, turn), direct.address, Some(direct.events), None))
    }

    /// This process's direct address, for a turn it submits and may be asked about later (a
    /// long-poll here after a `202` then costs no binding); `None` when there is none.
    pub async fn address(&self) -> Option<String> {
        self.broker.direct_address().await.unwrap_or_else(|e| {
            tracing::debug!(error = %e, "no direct reply address; long-polls bind instead");
            None
        })
    }

    /// A turn submitted earlier, by any front door: settled already, gone, or unsettled with a
    /// listener that hears of it — directly when its job named this process, else through a
    /// binding to its session (marked watched first). A turn that cannot be subscribed to is
    /// listened for in the store.
    pub async fn turn(&self, session: &SessionId, turn: &TurnId) -> Result<Turn, StoreError> {
        // Subscribed before the first read, so a status published in between is not missed.
        let direct = self
            .broker
            .subscribe_direct(session, false)
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "cannot subscribe to the session's results; the wait reads the store instead"))
            .ok();
        let record = match self.store.get_turn(session, turn).await? {
            None => return Ok(Turn::Gone),
            Some(r) if r.status.is_settled() => {
                return Ok(Turn::Settled(Box::new(TurnStatusView::from(&r))));
            }
            Some(r) => r,
        };
        let ids = (session, turn);
        match direct {
            Some(d) if d.address.is_none() || d.address == record.reply_to => Ok(Turn::Unsettled(
                self.listener(ids, d.address, Some(d.events), None),
            )),
            _ => {
                drop(record);
                self.through_the_session(ids).await
            }
        }
    }

    /// Hears of a turn whose statuses do not come here directly (its job named another front
    /// door, or none): marks the session watched, so that a worker broadcasts what it stores
    /// from now on, binds this process to the session, and reads the turn again, since it may
    /// have settled before the binding.
    async fn through_the_session(
        &self,
        (session, turn): (&SessionId, &TurnId),
    ) -> Result<Turn, StoreError> {
        let mark = WatchMark::hold(self.store.clone(), session.clone(), EVENT_WATCH_LINGER).await?;
        let events = self
            .broker
            .subscribe_session(session, false)
            .await
            .inspect_err(|e| tracing::warn!(error = %e, "cannot subscribe to the session's results; the wait reads the store instead"))
            .ok();
        Ok(match self.store.get_turn(session, turn).await? {
            None => Turn::Gone,
            Some(r) if r.status.is_settled() => Turn::Settled(Box::new(TurnStatusView::from(&r))),
            Some(_) => Turn::Unsettled(self.listener((session, turn), None, events, Some(mark))),
        })
    }

    fn listener(
        &self,
        (session, turn): (&SessionId, &TurnId),
        address: Option<String>,
        events: Option<SessionEvents>,
        mark: Option<WatchMark>,
    ) -> Listener {
        Listener {
            store: self.store.clone(),
            session: session.clone(),
            turn: turn.clone(),
            address,
            events,
            pause: Duration::from_millis(50),
            _mark: mark,
        }
    }

    /// Follows every status and live event of `session` from now on (marked watched first, so
    /// a status stored after the mark is sent, one stored before it is in the store), after
    /// what a reconnecting client missed of the turn it names: its live events after the
    /// index it last had, as far as the store keeps them, and its status if it has settled.
    pub async fn follow(
        &self,
        session: &SessionId,
        resume: Option<Resume>,
    ) -> Result<Following, Unavailable> {
        let mark = WatchMark::hold(self.store.clone(), session.clone(), EVENT_WATCH_LINGER).await?;
        let events = self.broker.subscribe_session(session, true).await?;
        // Subscribed first: an event kept after these reads is sent live.
        let mut first = VecDeque::new();
        let mut sent = None;
        if let Some(Resume { turn, after }) = resume {
            if let Some(after) = after {
                let kept = self.store.kept_live(session, &turn).await?;
                let missed = missed_since(&kept, after);
                let upto = missed.last().map_or(after, |e| e.index);
                first.extend(
                    missed
                        .iter()
                        .filter_map(|e| serde_json::to_vec(e).ok())
                        .map(SessionEvent::Live),
                );
                sent = Some((turn.to_string(), upto));
            }
            if let Some(record) = self.store.get_turn(session, &turn).await?
                && record.status.is_settled()
                && let Ok(body) = serde_json::to_vec(&TurnStatusView::from(&record))
            {
                first.push_back(SessionEvent::Status(body));
            }
        }
        Ok(Following {
            first,
            events,
            sent,
            _mark: mark,
        })
    }

    /// Consumes `session`'s reply queue, the session marked watched meanwhile and for `linger`
    /// after (as long as the queue outlives its last consumer), so that workers send its
    /// statuses there whatever the topology declares for them.
    pub async fn read_reply_queue(
        &self,
        session: &SessionId,
        linger: Duration,
    ) -> Result<QueueReader, Unavailable> {
        let mark = WatchMark::hold(self.store.clone(), session.clone(), linger).await?;
        let replies = self.broker.subscribe_replies(session).await?;
        Ok(QueueReader {
            replies,
            _mark: mark,
        })
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

/// What [`ResultDelivery::turn`] found.
#[derive(Debug)]
pub enum Turn {
    /// The turn has settled.
    Settled(Box<TurnStatusView>),
    /// The turn no longer exists (or never did).
    Gone,
    /// Not settled yet: listen for it.
    Unsettled(Listener),
}

/// What a listener heard next.
#[derive(Debug)]
pub enum Heard {
    /// A live event of the turn (only a listener that asked for them).
    Live(LiveEvent),
    /// The turn settled: its status.
    Settled(Box<TurnStatusView>),
    /// The deadline came first: the turn's status then.
    Unsettled(Box<TurnStatusView>),
    /// The turn no longer exists.
    Gone,
}

/// Listens for one turn: on its subscription while it lasts (reading the store every
/// [`RECHECK`] all the same), on the store alone after that.
pub struct Listener {
    store: Arc<dyn SessionStore>,
    session: SessionId,
    turn: TurnId,
    address: Option<String>,
    events: Option<SessionEvents>,
    /// The next pause between store reads without a subscription.
    pause: Duration,
    _mark: Option<WatchMark>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("session", &self.session)
            .field("turn", &self.turn)
            .field("address", &self.address)
            .field("subscribed", &self.events.is_some())
            .finish_non_exhaustive()
    }
}

impl Listener {
    /// The direct address the turn's job must name (`None`: the broker delivers to every
    /// subscriber anyway, or the listener hears of the turn through its session).
    pub fn address(&self) -> Option<&str> {
        self.address.as_deref()
    }

    /// The next live event of the turn, or its settled status, or what it is at `deadline`.
    pub async fn next(&mut self, deadline: Instant) -> Result<Heard, StoreError> {
        loop {
            match self.events.as_mut() {
                Some(events) => {
                    let until = deadline.min(Instant::now() + RECHECK);
                    match next_of(events, &self.turn, until).await {
                        Next::Live(event) => return Ok(Heard::Live(event)),
                        Next::Settled(view) => match self.current(*view).await? {
                            Some(view) => return Ok(Heard::Settled(Box::new(view))),
                            // A late copy of an earlier run's status: the turn has moved on.
                            None => continue,
                        },
                        Next::TimedOut => {}
                        // The broker connection behind it was lost: the store tells from now on.
                        Next::Closed => self.events = None,
                    }
                }
                None => {
                    tokio::time::sleep_until(deadline.min(Instant::now() + self.pause)).await;
                    self.pause = (self.pause * 3 / 2).min(LONGEST_POLL);
                }
            }
            let Some(record) = self.store.get_turn(&self.session, &self.turn).await? else {
                return Ok(Heard::Gone);
            };
            let view = Box::new(TurnStatusView::from(&record));
            if record.status.is_settled() {
                return Ok(Heard::Settled(view));
            }
            if Instant::now() >= deadline {
                return Ok(Heard::Unsettled(view));
            }
        }
    }

    /// Waits until the turn settles or `deadline` passes, and returns its status then
    /// (`None`: the turn no longer exists). Live events are passed over.
    pub async fn settled(
        &mut self,
        deadline: Instant,
    ) -> Result<Option<TurnStatusView>, StoreError> {
        loop {
            match self.next(deadline).await? {
                Heard::Live(_) => continue,
                Heard::Settled(view) | Heard::Unsettled(view) => return Ok(Some(*view)),
                Heard::Gone => return Ok(None),
            }
        }
    }

    /// A settled status heard on the subscription, checked where it can be stale. Every
    /// settled status but one is final; `awaiting_client_tools` may be the late copy of a run
    /// whose calls were answered meanwhile (a client that polled the store can submit its
    /// continuation between the run's save and its publish). For that one the store decides:
    /// `None` when the turn has moved on, the stored status otherwise.
    async fn current(&self, view: TurnStatusView) -> Result<Option<TurnStatusView>, StoreError> {
        if view.status != TurnStatus::AwaitingClientTools {
            return Ok(Some(view));
        }
        Ok(
            match self.store.get_turn(&self.session, &self.turn).await? {
                Some(record) if record.status.is_settled() => Some(TurnStatusView::from(&record)),
                Some(_) => None,
                // Gone from the store (expired): what was heard is all there is.
                None => Some(view),
            },
        )
    }
}

/// What a subscription gave next for one turn.
enum Next {
    Live(LiveEvent),
    Settled(Box<TurnStatusView>),
    TimedOut,
    Closed,
}

/// The next live event or settled status of `turn` on `events`, until `until`; events of other
/// turns, unsettled statuses and bodies that cannot be read are passed over.
async fn next_of(events: &mut SessionEvents, turn: &TurnId, until: Instant) -> Next {
    loop {
        match tokio::time::timeout_at(until, events.recv()).await {
            Err(_elapsed) => return Next::TimedOut,
            Ok(None) => return Next::Closed,
            Ok(Some(SessionEvent::Live(body))) => {
                if let Ok(event) = serde_json::from_slice::<LiveEvent>(&body)
                    && event.turn_id == turn.as_str()
                {
                    return Next::Live(event);
                }
            }
            Ok(Some(SessionEvent::Status(body))) => {
                if let Ok(view) = serde_json::from_slice::<TurnStatusView>(&body)
                    && &view.turn_id == turn
                    && view.status.is_settled()
                {
                    return Next::Settled(Box::new(view));
                }
            }
        }
    }
}

/// Where a reconnecting follower of a session left off: the turn its `Last-Event-ID` names,
/// and the index of the last live event it had of it (`None`: its last event was the
/// turn's status).
#[derive(Debug, Clone)]
pub struct Resume {
    /// The turn.
    pub turn: TurnId,
    /// The last live event's index.
    pub after: Option<u64>,
}

/// A session followed ([`ResultDelivery::follow`]): what the follower missed, then what is
/// published, each live event once.
pub struct Following {
    first: VecDeque<SessionEvent>,
    events: SessionEvents,
    /// The resumed turn and the last index sent from the store: the same events arriving live
    /// are not sent again.
    sent: Option<(String, u64)>,
    _mark: WatchMark,
}

impl Following {
    /// The next event; `None` once the subscription ended (the broker connection was lost:
    /// the follower reconnects with its `Last-Event-ID`).
    pub async fn next(&mut self) -> Option<SessionEvent> {
        if let Some(event) = self.first.pop_front() {
            return Some(event);
        }
        loop {
            let event = self.events.recv().await?;
            if let SessionEvent::Live(body) = &event
                && let Some((turn, upto)) = &self.sent
                && let Ok(live) = serde_json::from_slice::<LiveEvent>(body)
                && live.turn_id == *turn
                && live.index <= *upto
            {
                continue;
            }
            return Some(event);
        }
    }
}

/// The kept live events (JSON, oldest first) after `index`, once each and in order.
fn missed_since(kept: &[Vec<u8>], index: u64) -> Vec<LiveEvent> {
    let mut missed: Vec<LiveEvent> = kept
        .iter()
        .filter_map(|body| serde_json::from_slice::<LiveEvent>(body).ok())
        .filter(|e| e.index > index)
        .collect();
    missed.sort_by_key(|e| e.index);
    missed.dedup_by_key(|e| e.index);
    missed
}

/// A session's reply queue being read ([`ResultDelivery::read_reply_queue`]).
pub struct QueueReader {
    replies: Replies,
    _mark: WatchMark,
}

/// What reading a reply queue for one turn came to.
#[derive(Debug)]
pub enum Waited {
    /// A settled status of the turn (completed, failed, cancelled or awaiting client tools).
    Settled(Box<TurnStatusView>),
    /// The deadline passed first.
    TimedOut,
    /// The queue's consumer ended first (the broker connection went away).
    Closed,
}

impl QueueReader {
    /// The first settled status of `turn` in the queue, until `deadline`; statuses of other
    /// turns of the session, and bodies that are not a status, are passed over (and taken).
    pub async fn settled(&mut self, turn: &TurnId, deadline: Instant) -> Waited {
        loop {
            match tokio::time::timeout_at(deadline, self.replies.recv()).await {
                Err(_elapsed) => return Waited::TimedOut,
                Ok(None) => return Waited::Closed,
                Ok(Some(body)) => {
                    if let Ok(view) = serde_json::from_slice::<TurnStatusView>(&body)
                        && &view.turn_id == turn
                        && view.status.is_settled()
                    {
                        return Waited::Settled(Box::new(view));
                    }
                }
            }
        }
    }
}

/// A session kept marked as watched ([`SessionStore::mark_watched`]): marked once before
/// [`WatchMark::hold`] returns, then again every half `linger` while the mark is held, so that
/// after it is dropped (or its process dies) the mark lasts at least `linger` more.
#[derive(Debug)]
pub struct WatchMark {
    refresh: tokio::task::JoinHandle<()>,
}

impl WatchMark {
    /// Marks `session` and keeps it marked while the returned value lives. Fails when the
    /// store cannot be written: the caller's subscription would not be sent anything.
    pub async fn hold(
        store: Arc<dyn SessionStore>,
        session: SessionId,
        linger: Duration,
    ) -> Result<Self, StoreError> {
        let every = (linger / 2).max(Duration::from_millis(100));
        // Marked for `linger` beyond the next refresh: a refresh that is late or fails once
        // does not let the mark lapse while it is held.
        let ttl = linger + every;
        store.mark_watched(&session, ttl).await?;
        let refresh = tokio::spawn(async move {
            let mut tick = tokio::time::interval_at(Instant::now() + every, every);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                if let Err(e) = store.mark_watched(&session, ttl).await {
                    tracing::warn!(session_id = %session, error = %e, "cannot renew the session's watch mark; trying again");
                }
            }
        });
        Ok(Self { refresh })
    }
}

impl Drop for WatchMark {
    fn drop(&mut self) {
        self.refresh.abort();
    }
}

mod batch_lines;
pub use batch_lines::BatchLines;

#[cfg(test)]
mod tests;
