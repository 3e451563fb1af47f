//! Replies: how a turn's settled status travels from the worker that produced it to whoever
//! waits for it — the session's durable reply queue (polled by `aptix watch`, kept for clients
//! that come back later), the front door that submitted the turn and waits for it (directly,
//! by the address the job names: the synchronous endpoint, long-polls), and the session's
//! event broadcast (SSE streams, long-polls of turns submitted elsewhere). The transport is the
//! broker's reply half ([`ReplyBus`], beside the job queue in [`crate::queue`]); what a reply
//! means lives here.
//!
//! Owns: publishing a status ([`publish_status`]) and waiting for one turn's settled status on
//! a subscription ([`next_settled`]). Must not: read or write the store (a status is published
//! only after it is stored; that order is the worker's).

use tokio::time::Instant;

use crate::contract::TurnId;
use crate::live::LiveEvent;
use crate::queue::QueueError;
pub use crate::queue::{Audience, Direct, Replies, ReplyBus, SessionEvent, SessionEvents};
use crate::state::TurnStatusView;

/// Publishes `view` as the session's latest news of its turn, correlated by the turn id, and
/// sends it to the front door at `reply_to` (the one that waits for it) when there is one.
/// `audience` says who else may want it ([`Audience`]): with `watched` false (the store knew
/// of no watcher when the status was stored) only `reply_to` and a reply queue the topology
/// keeps for the session get it.
pub async fn publish_status(
    bus: &dyn ReplyBus,
    view: &TurnStatusView,
    reply_to: Option<&str>,
    audience: Audience,
) -> Result<(), QueueError> {
    let body = serde_json::to_vec(view).map_err(|e| QueueError::Encode(std::sync::Arc::new(e)))?;
    bus.publish_reply(
        &view.session_id,
        view.turn_id.as_str(),
        reply_to,
        audience,
        &body,
    )
    .await
}

/// A subscription statuses can be read from: the bodies of [`ReplyBus::subscribe_events`] or
/// [`ReplyBus::subscribe_replies`], or the statuses among a session's events.
pub trait Statuses: Send {
    /// The next status body; `None` once the subscription ended.
    fn next_status(&mut self) -> impl std::future::Future<Output = Option<Vec<u8>>> + Send;
}

impl Statuses for Replies {
    async fn next_status(&mut self) -> Option<Vec<u8>> {
        self.recv().await
    }
}

impl Statuses for SessionEvents {
    async fn next_status(&mut self) -> Option<Vec<u8>> {
        loop {
            match self.recv().await? {
                SessionEvent::Status(body) => return Some(body),
                SessionEvent::Live(_) => continue,
            }
        }
    }
}

/// What waiting on a subscription for one turn came to.
#[derive(Debug)]
pub enum Waited {
    /// A settled status of the turn (completed, failed, or awaiting client tools).
    Settled(Box<TurnStatusView>),
    /// The deadline passed first.
    TimedOut,
    /// The subscription ended first (the broker connection went away).
    Closed,
}

/// Waits on `replies` for the first settled status of `turn`, until `deadline`. Statuses of
/// other turns of the session, and bodies that are not a status, are passed over.
pub async fn next_settled(replies: &mut impl Statuses, turn: &TurnId, deadline: Instant) -> Waited {
    loop {
        match tokio::time::timeout_at(deadline, replies.next_status()).await {
            Err(_elapsed) => return Waited::TimedOut,
            Ok(None) => return Waited::Closed,
            Ok(Some(body)) => {
                let Ok(view) = serde_json::from_slice::<TurnStatusView>(&body) else {
                    continue;
                };
                if &view.turn_id == turn && view.status.is_settled() {
                    return Waited::Settled(Box::new(view));
                }
            }
        }
    }
}

/// What watching a live subscription for one turn came to.
#[derive(Debug)]
pub enum Watched {
    /// A live event of the turn.
    Live(LiveEvent),
    /// The turn's settled status.
    Settled(Box<TurnStatusView>),
    /// The deadline passed first.
    TimedOut,
    /// The subscription ended first.
    Closed,
}

/// Waits on a live subscription for the next live event of `turn` (any turn when `None`), or
/// a settled status of `turn` (of any turn when `None`), until `deadline`.
pub async fn next_watched(
    events: &mut SessionEvents,
    turn: Option<&TurnId>,
    deadline: Instant,
) -> Watched {
    let ours = |t: &str| turn.is_none_or(|turn| turn.as_str() == t);
    loop {
        match tokio::time::timeout_at(deadline, events.recv()).await {
            Err(_elapsed) => return Watched::TimedOut,
            Ok(None) => return Watched::Closed,
            Ok(Some(SessionEvent::Live(body))) => {
                if let Ok(event) = serde_json::from_slice::<LiveEvent>(&body)
                    && ours(&event.turn_id)
                {
                    return Watched::Live(event);
                }
            }
            Ok(Some(SessionEvent::Status(body))) => {
                if let Ok(view) = serde_json::from_slice::<TurnStatusView>(&body)
                    && ours(view.turn_id.as_str())
                    && view.status.is_settled()
                {
                    return Watched::Settled(Box::new(view));
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::{Waited, next_settled};
    use crate::contract::{SessionId, TurnId};
    use crate::state::{TurnStatus, TurnStatusView};

    fn status(turn: &str, status: TurnStatus) -> Vec<u8> {
        let view = TurnStatusView {
            session_id: SessionId::parse("s").unwrap(),
            turn_id: TurnId::parse(turn).unwrap(),
            status,
            attempts: 1,
            submitted_at: "2026-11-22T00:00:00Z".into(),
            completed_at: None,
            result: None,
        };
        serde_json::to_vec(&view).unwrap()
    }

    #[tokio::test(start_paused = true)]
    async fn waits_for_the_settled_status_of_its_turn_only() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(8);
        let turn = TurnId::parse("t").unwrap();
        tx.send(b"not a status".to_vec()).await.unwrap();
        tx.send(status("other", TurnStatus::Completed))
            .await
            .unwrap();
        tx.send(status("t", TurnStatus::Running)).await.unwrap();
        tx.send(status("t", TurnStatus::AwaitingClientTools))
            .await
            .unwrap();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        let Waited::Settled(view) = next_settled(&mut rx, &turn, deadline).await else {
            panic!("the settled status of t is found");
        };
        assert_eq!(view.status, TurnStatus::AwaitingClientTools);
        // Nothing more arrives: the deadline ends the wait (the clock is paused, so no real
        // waiting), and a closed subscription says so.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        assert!(matches!(
            next_settled(&mut rx, &turn, deadline).await,
            Waited::TimedOut
        ));
        drop(tx);
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        assert!(matches!(
            next_settled(&mut rx, &turn, deadline).await,
            Waited::Closed
        ));
    }
}
