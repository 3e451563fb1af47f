//! The reply bus: turn statuses and live events back to the front doors waiting for them and
//! to each session's watchers, directly addressed or through a binding to the session.

use crate::contract::SessionId;

use super::*;

/// A stream of reply bodies (turn status JSON) of one session.
pub type Replies = tokio::sync::mpsc::Receiver<Vec<u8>>;

/// What a live subscriber of a session receives, in the order it was published.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SessionEvent {
    /// A published turn status (JSON).
    Status(Vec<u8>),
    /// A running turn's live event (JSON, see [`crate::live`]).
    Live(Vec<u8>),
}

/// A stream of a session's statuses and live events.
pub type SessionEvents = tokio::sync::mpsc::Receiver<SessionEvent>;

/// A subscription of the waiting front door that hears of a session's turns directly: only
/// results (and live events) of jobs that named [`Direct::address`] in their `reply_to` reach
/// it, without any per-session routing in the broker.
#[derive(Debug)]
pub struct Direct {
    /// What the job must name (`None`: the broker delivers to every subscriber anyway, as the
    /// embedded one does).
    pub address: Option<String>,
    /// The session's statuses (and live events, if asked for) from jobs that named it. Ends
    /// when the broker connection behind it is lost: the waiter then reads the store.
    pub events: SessionEvents,
}

/// Who, besides a front door waiting at a direct address, a status may be for
/// ([`ReplyBus::publish_reply`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Audience {
    /// Somebody announced themselves as a watcher of the session (see
    /// [`crate::store::RecordWriter::mark_watched`]) when the status was stored: `false` lets a
    /// broker that pays for a publish reaching nobody skip the broadcast and an on-subscribe
    /// reply queue.
    pub watched: bool,
    /// The job's submitter may come back for the session's reply queue
    /// ([`JobMeta::reply_queue_wanted`]).
    pub reply_queue_wanted: bool,
}

impl Audience {
    /// Anyone who may want it: watchers, and a reply queue wherever the topology keeps one.
    pub const ANYONE: Self = Self {
        watched: true,
        reply_queue_wanted: true,
    };
}

/// The reply side of the broker: per-session reply queues and event broadcasts (what a reply
/// means, and waiting for one, is [`crate::delivery`]).
#[async_trait::async_trait]
pub trait ReplyBus: Send + Sync + 'static {
    /// Publishes a turn status to the session's reply queue (confirmed), to the front doors
    /// watching the session, and to the direct address `reply_to` when the job named one.
    /// The session's reply queue is declared for it when the topology's [`ReplyQueues`] says
    /// so for `audience`; otherwise the status reaches a queue a client subscribed to, if the
    /// session is watched. An unwatched session's status is not broadcast.
    async fn publish_reply(
        &self,
        session: &SessionId,
        correlation_id: &str,
        reply_to: Option<&str>,
        audience: Audience,
        body: &[u8],
    ) -> Result<(), QueueError>;
    /// Consumes a session's reply queue (what `aptix run` reads its results from).
    async fn subscribe_replies(&self, session: &SessionId) -> Result<Replies, QueueError>;
    /// Publishes a live event of a session: transient, unconfirmed, only to the subscribers of
    /// this moment (and to `reply_to`'s), never to the session's reply queue.
    async fn publish_live(
        &self,
        session: &SessionId,
        reply_to: Option<&str>,
        body: &[u8],
    ) -> Result<(), QueueError>;
    /// Subscribes to a session's statuses (and its live events when `live`) as a broadcast,
    /// one ordered stream: every subscriber gets every status published from now on, without
    /// taking it from the session's reply queue, and what one worker published (live events,
    /// then the status) arrives in that order. A subscriber too slow for live events misses
    /// some of them (never a status).
    async fn subscribe_session(
        &self,
        session: &SessionId,
        live: bool,
    ) -> Result<SessionEvents, QueueError>;
    /// Subscribes this process directly to the session's results (with live events when
    /// `live`) of the jobs that name the returned address: what a front door that submits a
    /// turn and waits for it uses, at no broker cost per session.
    async fn subscribe_direct(&self, session: &SessionId, live: bool)
    -> Result<Direct, QueueError>;
    /// This process's direct reply address, for a job it may wait for later (a long-poll after
    /// a `202`); `None` where the broker delivers to every subscriber anyway.
    async fn direct_address(&self) -> Result<Option<String>, QueueError>;
}
