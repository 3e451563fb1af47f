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
use crate::state::{TurnStatus, TurnStatusView};
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
                    Waited::Settled(view) => match current(store, (sid, tid), *view).await? {
                        Some(view) => return Ok(Some(view)),
                        // A late copy of an earlier run's status: the turn has moved on.
                        None => continue,
                    },
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

/// A settled status heard on a subscription, checked where it can be stale. Every settled
/// status but one is final; `awaiting_client_tools` may be the late copy of a run whose calls
/// were answered meanwhile (a client that polled the store can submit its continuation between
/// the run's save and its publish). For that one the store decides: `None` when the turn has
/// moved on (its continuation is queued or running), the stored status otherwise.
pub(crate) async fn current(
    store: &dyn SessionStore,
    (sid, tid): (&SessionId, &TurnId),
    view: TurnStatusView,
) -> Result<Option<TurnStatusView>, StoreError> {
    if view.status != TurnStatus::AwaitingClientTools {
        return Ok(Some(view));
    }
    Ok(match store.get_turn(sid, tid).await? {
        Some(record) if record.status.is_settled() => Some(TurnStatusView::from(&record)),
        Some(_) => None,
        // Gone from the store (expired): what was heard is all there is.
        None => Some(view),
    })
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use tokio::time::Instant;

    use super::{Subscription, settled_or_deadline};
    use crate::contract::{SessionId, TurnId};
    use crate::queue::{MemoryBroker, ReplyBus as _};
    use crate::replies::{Audience, publish_status};
    use crate::state::{TurnRecord, TurnStatus, TurnStatusView};
    use crate::store::{MemoryStore, SessionStore as _};

    /// A waiter for a turn whose continuation was accepted does not answer with the late copy
    /// of the earlier run's `awaiting_client_tools`: it waits for the continuation's status.
    #[tokio::test]
    async fn a_late_awaiting_status_of_an_earlier_run_is_not_the_answer() {
        let store = MemoryStore::new();
        let broker = MemoryBroker::new();
        let (sid, tid) = (SessionId::parse("s").unwrap(), TurnId::parse("t").unwrap());
        // The continuation was accepted: the stored turn is queued again.
        let mut record =
            TurnRecord::queued(sid.clone(), tid.clone(), "fp".into(), "general".into());
        record.attempts = 1;
        store
            .create_turn(&crate::store::Grant::for_tests(), &record)
            .await
            .unwrap();
        let replies = broker.subscribe_replies(&sid).await.unwrap();
        // The earlier run's status arrives late, ahead of the continuation's.
        let mut stale = TurnStatusView::from(&record);
        stale.status = TurnStatus::AwaitingClientTools;
        publish_status(&broker, &stale, None, Audience::ANYONE)
            .await
            .unwrap();
        let mut done = TurnStatusView::from(&record);
        done.status = TurnStatus::Completed;
        done.attempts = 2;
        publish_status(&broker, &done, None, Audience::ANYONE)
            .await
            .unwrap();
        let got = settled_or_deadline(
            &store,
            (&sid, &tid),
            Some(Subscription::Session(replies)),
            Instant::now() + Duration::from_secs(5),
        )
        .await
        .unwrap()
        .expect("a status");
        assert_eq!((got.status, got.attempts), (TurnStatus::Completed, 2));
    }
}
