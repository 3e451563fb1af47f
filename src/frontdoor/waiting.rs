//! Waiting for a turn to settle, as the synchronous endpoint and long-polls do: on a
//! subscription while it lasts, on the store after that. The store stays the source of truth:
//! a status is published only once stored, and the store is read again whenever the
//! subscription ends, goes quiet for [`RECHECK`], or the deadline comes.
//!
//! Owns: that wait. Must not: write anything, or subscribe (the caller chose how to hear of
//! the turn before it could settle).

use std::time::Duration;

use tokio::time::Instant;

use crate::contract::{SessionId, TurnId};
use crate::replies::{Replies, SessionEvents, Statuses, Waited, next_settled};
use crate::state::TurnStatusView;
use crate::store::{SessionStore, StoreError};

/// The longest a wait on a subscription goes without reading the store: a status that never
/// reaches the subscription (a turn cancelled through another front door while this one waits
/// for it directly) is still found within this.
pub(crate) const RECHECK: Duration = Duration::from_secs(15);

/// How a waiter hears of a session's statuses.
pub(crate) enum Subscription {
    /// Directly: the job named this process (see [`crate::queue::ReplyBus::subscribe_direct`]).
    Direct(SessionEvents),
    /// Through a binding to the session (turns submitted anywhere).
    Session(Replies),
}

impl Statuses for Subscription {
    async fn next_status(&mut self) -> Option<Vec<u8>> {
        match self {
            Self::Direct(events) => events.next_status().await,
            Self::Session(replies) => replies.next_status().await,
        }
    }
}

/// Waits, from a moment the turn was seen unsettled, until it settles or `deadline` passes,
/// and returns its status then (`None`: the turn no longer exists). Without a subscription,
/// or once it ended, the store is read with a growing pause, at most once a second.
pub(crate) async fn settled_or_deadline(
    store: &dyn SessionStore,
    (sid, tid): (&SessionId, &TurnId),
    mut events: Option<Subscription>,
    deadline: Instant,
) -> Result<Option<TurnStatusView>, StoreError> {
    let mut pause = Duration::from_millis(50);
    loop {
        match events.as_mut() {
            Some(subscription) => {
                let until = deadline.min(Instant::now() + RECHECK);
                match next_settled(subscription, tid, until).await {
                    Waited::Settled(view) => return Ok(Some(*view)),
                    Waited::TimedOut => {}
                    // The broker connection behind it was lost: the store tells from now on.
                    Waited::Closed => events = None,
                }
            }
            None => {
                tokio::time::sleep_until(deadline.min(Instant::now() + pause)).await;
                pause = (pause * 3 / 2).min(Duration::from_secs(1));
            }
        }
        let Some(record) = store.get_turn(sid, tid).await? else {
            return Ok(None);
        };
        if record.status.is_settled() || Instant::now() >= deadline {
            return Ok(Some(TurnStatusView::from(&record)));
        }
    }
}
