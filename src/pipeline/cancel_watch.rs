//! Watching the turns that wait on the model for a request to stop. One poller per pipeline asks
//! the store about every watched turn at once (one request for hundreds of turns where the store
//! can batch), instead of each waiting turn asking on its own timer: with thousands of turns in
//! a slow model call, per-turn polling was thousands of store round trips a second.
//!
//! Owns: the set of watched turns and the poller. Must not: decide what a stop means (the
//! caller drops its work when [`Watched::cancelled`] fires).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::{debug, warn};

use super::until_cancelled::{UntilCancelled, until_cancelled};
use crate::contract::{SessionId, TurnId};
use crate::store::StoreReader;

/// The watched turns of one pipeline (clones share them).
#[derive(Clone)]
pub(super) struct CancelWatch {
    inner: Arc<Inner>,
}

struct Inner {
    store: Arc<dyn StoreReader>,
    every: Duration,
    watched: Mutex<HashMap<u64, Entry>>,
    next_id: AtomicU64,
    started: AtomicBool,
}

struct Entry {
    turn: (SessionId, TurnId),
    token: CancellationToken,
}

/// One turn being watched; dropping it stops the watch.
pub(super) struct Watched {
    id: u64,
    token: CancellationToken,
    inner: Arc<Inner>,
}

impl CancelWatch {
    /// Watches turns in `store`, looking every `every` (the poller starts with the first watch).
    pub(super) fn new(store: Arc<dyn StoreReader>, every: Duration) -> Self {
        Self {
            inner: Arc::new(Inner {
                store,
                every,
                watched: Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(0),
                started: AtomicBool::new(false),
            }),
        }
    }

    /// Watches one turn until the returned handle is dropped.
    pub(super) fn watch(&self, session: &SessionId, turn: &TurnId) -> Watched {
        if !self.inner.started.swap(true, Ordering::AcqRel) {
            tokio::spawn(poll(Arc::downgrade(&self.inner)));
        }
        let id = self.inner.next_id.fetch_add(1, Ordering::Relaxed);
        let token = CancellationToken::new();
        let entry = Entry {
            turn: (session.clone(), turn.clone()),
            token: token.clone(),
        };
        // A poisoned lock only means another turn panicked while holding it: the map is
        // still whole (every change to it is one insert or one remove).
        let mut watched = self.inner.watched.lock().unwrap_or_else(|p| p.into_inner());
        watched.insert(id, entry);
        Watched {
            id,
            token,
            inner: self.inner.clone(),
        }
    }

    /// How many turns are watched now.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.inner
            .watched
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len()
    }
}

impl Watched {
    /// Completes once the turn was asked to stop.
    #[cfg(test)]
    async fn cancelled(&self) {
        self.token.cancelled().await;
    }

    /// Runs `work` unless the turn is asked to stop first; the turn is watched until the
    /// returned future is done or dropped.
    pub(super) fn unless_cancelled<F: Future>(self, work: F) -> UnlessCancelled<F> {
        UnlessCancelled {
            race: until_cancelled(self.token.clone(), work),
            _watched: self,
        }
    }
}

pin_project_lite::pin_project! {
    /// A turn's work raced against a request to stop it ([`Watched::unless_cancelled`]);
    /// the turn is watched while it runs.
    pub(super) struct UnlessCancelled<F> {
        #[pin]
        race: UntilCancelled<F>,
        _watched: Watched,
    }
}

impl<F: Future> Future for UnlessCancelled<F> {
    type Output = Option<F::Output>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        self.project().race.poll(cx)
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        let mut watched = self.inner.watched.lock().unwrap_or_else(|p| p.into_inner());
        watched.remove(&self.id);
    }
}

/// Every `every`: asks the store about every watched turn and fires the tokens of those asked
/// to stop. Ends when the pipeline (and every watch) is gone.
async fn poll(inner: Weak<Inner>) {
    let mut failing = false;
    loop {
        let Some(every) = inner.upgrade().map(|i| i.every) else {
            return;
        };
        tokio::time::sleep(every).await;
        // Hold the set only to copy it: the pipeline may go away while the store answers.
        let Some((store, turns, tokens)) = inner.upgrade().map(|i| {
            let watched = i.watched.lock().unwrap_or_else(|p| p.into_inner());
            let (turns, tokens): (Vec<_>, Vec<_>) = watched
                .values()
                .filter(|e| !e.token.is_cancelled())
                .map(|e| (e.turn.clone(), e.token.clone()))
                .unzip();
            (i.store.clone(), turns, tokens)
        }) else {
            return;
        };
        if turns.is_empty() {
            continue;
        }
        match store.cancels_requested(&turns).await {
            Ok(asked) => {
                if failing {
                    debug!("cancellation requests can be read again");
                    failing = false;
                }
                for (asked, token) in asked.into_iter().zip(tokens) {
                    if asked {
                        token.cancel();
                    }
                }
            }
            Err(e) => {
                // Once per outage: the turns go on, and stop at their next safe point.
                if !failing {
                    warn!(error = %e, watched = turns.len(), "cannot read cancellation requests; waiting turns go on");
                    failing = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::{MemoryStore, RecordWriter as _};

    fn ids(s: &str, t: &str) -> (SessionId, TurnId) {
        (SessionId::parse(s).unwrap(), TurnId::parse(t).unwrap())
    }

    #[tokio::test]
    async fn a_requested_stop_fires_only_its_turns_watch_and_dropped_watches_leave() {
        let store = Arc::new(MemoryStore::new());
        let watch = CancelWatch::new(store.clone(), Duration::from_millis(10));
        let (s1, t1) = ids("s1", "t1");
        let (s2, t2) = ids("s2", "t2");
        let one = watch.watch(&s1, &t1);
        let two = watch.watch(&s2, &t2);
        assert_eq!(watch.len(), 2);
        store.request_cancel(&s1, &t1).await.unwrap();
        tokio::time::timeout(Duration::from_secs(5), one.cancelled())
            .await
            .expect("the stop reaches the watched turn");
        // The other turn was asked nothing: several polls later it still waits.
        assert!(
            tokio::time::timeout(Duration::from_millis(100), two.cancelled())
                .await
                .is_err()
        );
        drop(one);
        drop(two);
        assert_eq!(watch.len(), 0, "dropped watches are forgotten");
    }

    #[tokio::test]
    async fn a_race_gives_the_works_output_or_none_once_asked_to_stop_and_unwatches() {
        let store = Arc::new(MemoryStore::new());
        let watch = CancelWatch::new(store.clone(), Duration::from_millis(5));
        let (s, t) = ids("s", "t");
        let done = watch.watch(&s, &t).unless_cancelled(async { 7 });
        assert_eq!(watch.len(), 1, "watched from the race's making");
        assert_eq!(done.await, Some(7));
        assert_eq!(watch.len(), 0, "a finished race is no longer watched");

        // Work that never ends gives way to the stop, and is dropped.
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let never = async move {
            let _held = tx;
            std::future::pending::<u32>().await
        };
        let race = watch.watch(&s, &t).unless_cancelled(never);
        store.request_cancel(&s, &t).await.unwrap();
        let out = tokio::time::timeout(Duration::from_secs(5), race)
            .await
            .expect("the stop ends the race");
        assert_eq!(out, None);
        assert!(rx.await.is_err(), "the unfinished work was dropped");
        assert_eq!(watch.len(), 0);
    }

    #[tokio::test]
    async fn the_poller_does_not_keep_the_watched_turns_alive() {
        let store = Arc::new(MemoryStore::new());
        let watch = CancelWatch::new(store, Duration::from_millis(5));
        let (s, t) = ids("s", "t");
        let w = watch.watch(&s, &t);
        let weak = Arc::downgrade(&watch.inner);
        drop(w);
        drop(watch);
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert!(weak.upgrade().is_none(), "nothing keeps the set alive");
    }
}
