//! Every wait for a turn: the listener a submitting front door holds (directly addressed, or
//! bound to the session), a long-poll's or a stream's following of a turn submitted earlier
//! (live events resumed after the last one a client saw), `aptix run`'s reply queue, and the
//! watched mark that keeps a session's statuses published.
//!
//! Owns: hearing of a turn's statuses. Must not: publish them (the rest of delivery does).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Duration;

use tokio::time::Instant;

use crate::contract::{SessionId, TurnId};
use crate::live::LiveEvent;
use crate::queue::{QueueError, Replies, SessionEvent, SessionEvents};
use crate::state::{TurnStatus, TurnStatusView};
use crate::store::{RecordWriter, StoreError};

use super::published::{PublishedStatus, Settled};
use super::*;

impl ResultDelivery {
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
                return Ok(Turn::Settled(Box::new(TurnStatusView::from(r))));
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
            Some(r) if r.status.is_settled() => Turn::Settled(Box::new(TurnStatusView::from(r))),
            Some(_) => Turn::Unsettled(self.listener((session, turn), None, events, Some(mark))),
        })
    }

    pub(super) fn listener(
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
    Settled(Settled),
    /// The deadline came first: the turn's status then.
    Unsettled(Box<TurnStatusView>),
    /// The turn no longer exists.
    Gone,
}

/// Listens for one turn: on its subscription while it lasts (reading the store every
/// [`RECHECK`] all the same), on the store alone after that.
pub struct Listener {
    store: Arc<dyn RecordWriter>,
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
                        Next::Settled(heard) => match self.current(heard).await? {
                            Some(settled) => return Ok(Heard::Settled(settled)),
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
            if record.status.is_settled() {
                return Ok(Heard::Settled(TurnStatusView::from(record).into()));
            }
            if Instant::now() >= deadline {
                return Ok(Heard::Unsettled(Box::new(TurnStatusView::from(record))));
            }
        }
    }

    /// Waits until the turn settles or `deadline` passes, and returns its status then
    /// (`None`: the turn no longer exists). Live events are passed over.
    pub async fn settled(&mut self, deadline: Instant) -> Result<Option<Settled>, StoreError> {
        loop {
            match self.next(deadline).await? {
                Heard::Live(_) => continue,
                Heard::Settled(settled) => return Ok(Some(settled)),
                Heard::Unsettled(view) => return Ok(Some(Settled::Read(view))),
                Heard::Gone => return Ok(None),
            }
        }
    }

    /// A settled status heard on the subscription, checked where it can be stale. Every
    /// settled status but one is final; `awaiting_client_tools` may be the late copy of a run
    /// whose calls were answered meanwhile (a client that polled the store can submit its
    /// continuation between the run's save and its publish). For that one the store decides:
    /// `None` when the turn has moved on, the stored status otherwise.
    async fn current(&self, heard: PublishedStatus) -> Result<Option<Settled>, StoreError> {
        if heard.status() != TurnStatus::AwaitingClientTools {
            return Ok(Some(Settled::Published(heard)));
        }
        Ok(
            match self.store.get_turn(&self.session, &self.turn).await? {
                Some(record) if record.status.is_settled() => {
                    Some(TurnStatusView::from(record).into())
                }
                Some(_) => None,
                // Gone from the store (expired): what was heard is all there is.
                None => Some(Settled::Published(heard)),
            },
        )
    }
}

/// What a subscription gave next for one turn.
enum Next {
    Live(LiveEvent),
    Settled(PublishedStatus),
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
                // Only the head is read: the result is passed on as the worker wrote it.
                if let Some(heard) = PublishedStatus::of_turn(body, turn)
                    && heard.status().is_settled()
                {
                    return Next::Settled(heard);
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

/// A session kept marked as watched ([`RecordWriter::mark_watched`]): marked once before
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
        store: Arc<dyn RecordWriter>,
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
